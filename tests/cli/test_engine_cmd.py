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
