"""``llmgw engine install`` refuses bad input before reaching any node, saying where."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.cli.main import main


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    directory = tmp_path / "cluster"
    directory.mkdir()
    (directory / "cluster.yaml").write_text("cluster: {name: lab}\nnodes: {}\n")
    return directory


@pytest.mark.parametrize(("argv", "text", "message"), [
    pytest.param(["vllm-0.11"], None, "'vllm-0.11': write ENGINE==VERSION", id="not-wanted"),
    pytest.param(["vllm==0.11.0"], None, "vllm needs --requirements FILE", id="no-file"),
    pytest.param(["vllm==0.11.0"], f"vllm==0.11.0 --hash=sha256:{'a' * 64}\n-e .\n",
                 "req.txt:2:1: '-e .' is not `name==version --hash=sha256:…`", id="located"),
    pytest.param(["vllm==../x"], f"vllm==0.11.0 --hash=sha256:{'a' * 64}\n",
                 "engine version '../x' is not a version", id="version"),
    pytest.param(["llama.cpp==11434.0.0", "--binary", "/nonexistent/llama-server"], None,
                 "no llama-server to ship: /nonexistent/llama-server", id="no-binary"),
    pytest.param(["vllm==0.11.0", "nowhere-01"], f"vllm==0.11.0 --hash=sha256:{'a' * 64}\n",
                 "no node nowhere-01 in the cluster", id="unknown-node"),
])
def test_bad_input_is_refused_with_a_located_error(
    cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    argv: list[str], text: str | None, message: str,
) -> None:
    extra = []
    if text is not None:
        (tmp_path / "req.txt").write_text(text)
        extra = ["--requirements", str(tmp_path / "req.txt")]
    code = main(["engine", "install", *argv, *extra, "--cluster", str(cluster)])
    err = capsys.readouterr().err
    assert code == 1
    assert message in err, err
    assert "Traceback" not in err


def test_engine_installs_are_listed_by_engine_list_not_weights_list() -> None:
    from llmgw.cli import engine_cmd, weights_cmd
    from llmgw.fleet.types import Fetch, Fleet, HostFacts, InstalledEngine, NodeReport

    report = NodeReport(
        node="gpu-01",
        fetches=[Fetch(kind="engine", target="vllm 0.11.0", state="failed", error="bad hash"),
                 Fetch(kind="weights", target="org/model", state="running", bytes_done=5)],
        host=HostFacts(engines_dir="/opt/llmgw/engines", installed_engines=[InstalledEngine(
            engine="llama.cpp", version="11434.0.0",
            path="/opt/llmgw/engines/llama.cpp-11434.0.0")]))
    fleet = Fleet(nodes={"gpu-01": report})
    assert engine_cmd.render_list(fleet) == (
        "gpu-01  engines in /opt/llmgw/engines\n"
        "  llama.cpp 11434.0.0  /opt/llmgw/engines/llama.cpp-11434.0.0\n"
        "  vllm 0.11.0  failed: bad hash\n")
    weights = weights_cmd.render_list(fleet)
    assert "org/model" in weights and "vllm" not in weights


def test_validate_names_the_requirements_file_an_engines_entry_needs(
    cluster: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    (cluster / "engines.yaml").write_text(
        "engines:\n  vllm: {version: 0.11.0, install: auto}\n"
        "  sglang: {version: 0.5.3, install: never}\n")
    assert main(["validate", "--cluster", str(cluster)]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "engines/vllm-0.11.0.txt:1:1: missing: engines.vllm (version 0.11.0, install: auto) "
        "installs from it; write it with `pip-compile --generate-hashes` (docs/engines.md)"]
    (cluster / "engines").mkdir()
    (cluster / "engines" / "vllm-0.11.0.txt").write_text(
        f"vllm==0.11.0 --hash=sha256:{'a' * 64}\n")
    assert main(["validate", "--cluster", str(cluster)]) == 0


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("vllm: {version: '0.11.0; curl x | sh'}",
                 "engines.vllm.version: invalid engine version '0.11.0; curl x | sh'",
                 id="shell-in-version"),
    pytest.param("vllm: {version: 0.11.0, install: always}",
                 "engines.vllm.install: input should be 'auto', 'profiles' or 'never'",
                 id="mode"),
    pytest.param("llama.cpp: {version: 11434.0.0}", "engines: unknown key 'llama.cpp'",
                 id="shipped-engine"),
    pytest.param("vllm: {version: 0.11.0, index_url: 'file:///etc'}",
                 "engines.vllm.index_url: invalid index URL 'file:///etc'", id="index"),
])
def test_an_engines_entry_is_checked_where_it_is_written(
    cluster: Path, capsys: pytest.CaptureFixture[str], text: str, message: str,
) -> None:
    (cluster / "engines.yaml").write_text(f"engines:\n  {text}\n")
    assert main(["validate", "--cluster", str(cluster)]) == 1
    err = capsys.readouterr().err
    assert "engines.yaml:2:" in err and message in err, err
    assert "Traceback" not in err


async def test_apply_installs_nothing_of_an_engine_whose_install_is_never() -> None:
    from llmgw.cli import engine_cmd
    failures = await engine_cmd.install_missing(
        None, Path("/nonexistent"), {("vllm", "0.11.0"): {"gpu-02", "gpu-01"}},  # type: ignore[arg-type]
        print, never=frozenset({"vllm"}))
    assert failures == ["vllm 0.11.0 on gpu-01, gpu-02: not installed by llmgw "
                        "(engines.vllm.install is never): install it there yourself, or set "
                        "install: profiles"]


def test_plan_says_per_node_what_install_auto_does(
    cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from llmgw.fleet.types import Fleet, Gpu, HostFacts, NodeReport
    (cluster / "cluster.yaml").write_text(
        "cluster: {name: lab}\nnodes:\n  gpu-01: {address: 10.0.0.1}\n"
        "  cpu-01: {address: 10.0.0.2}\n"
        "engines:\n  vllm: {version: 0.11.0, install: auto}\n")
    (cluster / "engines").mkdir()
    (cluster / "engines" / "vllm-0.11.0.txt").write_text(
        f"vllm==0.11.0 --hash=sha256:{'a' * 64}\n")
    host = HostFacts(engines_dir="/opt/llmgw/engines", driver_version="470.82.01",
                     engines_free_bytes=100 << 30, c_compiler="/usr/bin/gcc")
    fleet = Fleet(nodes={
        "gpu-01": NodeReport(node="gpu-01", collected_at=1.0, host=host, gpus=[Gpu(
            index=0, uuid="GPU-1", name="NVIDIA A100-SXM4-40GB", gpu_class="a100-40g",
            compute_capability="8.0")]),
        "cpu-01": NodeReport(node="cpu-01", collected_at=1.0, host=host)})
    snapshot = tmp_path / "fleet.json"
    snapshot.write_text(fleet.model_dump_json())
    assert main(["plan", "--observed", str(snapshot), "--cluster", str(cluster)]) == 0
    out = capsys.readouterr().out
    assert out.endswith(
        "\nEngines\n  vllm 0.11.0 (install: auto)\n"
        "    cpu-01  skip: no GPU: vLLM runs on GPUs only\n"
        "    gpu-01  cannot: NVIDIA driver 470.82.01; vLLM 0.11.0's CUDA 12.8 wheels need "
        "525.60.13 or newer (fix: upgrade the NVIDIA driver to 525.60.13 or newer)\n"), out
