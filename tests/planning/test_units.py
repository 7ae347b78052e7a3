"""Rendered units: systemd accepts them, and they run exactly the planned command.

``systemd-analyze verify`` checks every rendered unit (any warning fails the
test). Then each unit's ``ExecStart=`` is read back with the agent's own
unit-file parser — what the supervise backend runs — and executed with stub
engines on PATH that record their argv: quoting survives the round trip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jinja2
import pytest
from plan_builders import cluster_from, fleet_from

from llmgw.agent import unitfiles
from llmgw.planning import plans
from llmgw.planning.types import Plan, Shard
from llmgw.rendering import quoting
from llmgw.rendering.units import UNIT_TEMPLATE, UnitSpec, render

NOW = 1_700_000_000.0
STUBS = ("vllm", "ray", "python3", "llama-server")

CLUSTER: dict[str, Any] = {
    "fabrics": {"ib-a": {"kind": "infiniband"}, "roce-a": {"kind": "roce", "gid_index": 3}},
    "nodes": {
        "gpu-a-01": {"address": "10.0.1.11", "mgmt_interface": "eno1",
                     "gpus": [{"class": "h100-80g", "count": 8}],
                     "fabrics": {"ib-a": ["mlx5_0", "mlx5_1"]}, "weights_dirs": ["/models"]},
        "gpu-a-02": {"address": "10.0.1.12", "mgmt_interface": "eno1",
                     "gpus": [{"class": "h100-80g", "count": 8}],
                     "fabrics": {"ib-a": ["mlx5_0", "mlx5_1"]}},
        "a100-01": {"address": "10.0.3.11", "mgmt_interface": "eno1",
                    "gpus": [{"class": "a100-80g", "count": 8}],
                    "fabrics": {"roce-a": ["mlx5_0"]}},
        "a100-02": {"address": "10.0.3.12", "mgmt_interface": "eno1",
                    "gpus": [{"class": "a100-80g", "count": 8}],
                    "fabrics": {"roce-a": ["mlx5_0"]}},
        "l40s-01": {"address": "10.0.4.11", "gpus": [{"class": "l40s-45g", "count": 4}]},
        "cpu-01": {"address": "local", "memory": "64GiB", "weights_dirs": ["/models"]},
    },
    "models": {
        "llama-70b": {
            "source": "meta-llama/Llama-3.1-70B-Instruct",
            "profiles": [{"engine": "vllm", "gpu_class": "h100-80g", "nodes": 2,
                          "tensor_parallel": 8, "pipeline_parallel": 2,
                          "secret_env": {"HF_TOKEN": "/etc/llmgw/secrets/hf_token"}}],
        },
        "mixtral": {
            "source": "mistralai/Mixtral-8x7B-Instruct-v0.1",
            "profiles": [{"engine": "vllm", "gpu_class": "a100-80g", "nodes": 2,
                          "tensor_parallel": 8, "pipeline_parallel": 2, "multi_node": "ray"}],
        },
        "qwen-coder": {
            "source": "Qwen/Qwen2.5-Coder-32B-Instruct",
            "profiles": [{"engine": "sglang", "gpu_class": "l40s-45g", "tensor_parallel": 2}],
        },
        "llama-8b": {
            "source": "meta-llama/Llama-3.1-8B-Instruct",
            "profiles": [{
                "engine": "vllm", "gpu_class": "l40s-45g",
                # Words systemd would otherwise split, expand or treat as specifiers.
                "args": {"chat-template": "${HOME}/templates/100% \"chat\".jinja",
                         "override-generation-config": '{"temperature": 0.5}'},
                # Not a vLLM flag: only unchecked_args may carry it.
                "unchecked_args": {"served-model-name-suffix": ";"},
                "env": {"VLLM_LOGGING_PREFIX": 'a "quoted" $VALUE with \\ and `ticks`',
                        "EMPTY": ""},
            }],
        },
        "gemma-cpu": {
            "source": "/models/gemma 2b/gemma-2-2b-it-Q4_K_M.gguf",
            "profiles": [{"engine": "llama.cpp", "cpu": True, "min_memory_gb": 8,
                          "args": {"ctx-size": 8192, "threads": 16}}],
        },
    },
}


@pytest.fixture(scope="module")
def plan() -> Plan:
    cluster = cluster_from(CLUSTER)
    return plans.plan(cluster, fleet_from(cluster, {}, [], NOW), NOW)


def shards_of(plan: Plan) -> list[Shard]:
    return [s for change in plan.changes for s in change.shards]


def test_every_engine_and_mode_is_rendered(plan: Plan) -> None:
    shards = shards_of(plan)
    assert {s.model for s in shards} == set(CLUSTER["models"])
    assert len(shards) == 7  # two 2-node replicas, three single-node ones


@pytest.fixture
def stub_bin(tmp_path: Path) -> Path:
    """Stub engines: each records its argv as a JSON line and exits 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv.jsonl"
    for name in STUBS:
        stub = bin_dir / name
        stub.write_text(
            f"#!{sys.executable}\n"
            "import json, sys\n"
            f"with open({str(record)!r}, 'a') as out:\n"
            f"    out.write(json.dumps([{name!r}, *sys.argv[1:]]) + '\\n')\n"
        )
        stub.chmod(0o755)
    return bin_dir


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed (make sysdeps)")
def test_systemd_analyze_verify_accepts_every_unit(
    plan: Plan, tmp_path: Path, stub_bin: Path,
) -> None:
    units = tmp_path / "units"
    units.mkdir()
    paths = []
    for shard in shards_of(plan):
        assert shard.files is not None
        path = units / shard.unit
        path.write_text(shard.files.unit_text)
        paths.append(str(path))
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *paths],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": f"{stub_bin}:{os.environ['PATH']}"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout == "", result.stderr + result.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed (make sysdeps)")
def test_systemd_analyze_verify_does_catch_a_bad_unit(tmp_path: Path, plan: Plan) -> None:
    shard = shards_of(plan)[0]
    assert shard.files is not None
    bad = shard.files.unit_text.replace("KillMode=control-group", "KillMode=process-group")
    path = tmp_path / shard.unit
    path.write_text(bad)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.stderr  # the check this file relies on is not blind


def test_units_carry_the_interface_keys(plan: Plan) -> None:
    for shard in shards_of(plan):
        assert shard.files is not None
        unit = unitfiles.parse(shard.unit, shard.files.unit_text)
        labels = unitfiles.labels(unit)
        assert (labels.model, labels.replica, labels.rank) == (shard.model, shard.replica,
                                                               shard.rank)
        assert labels.digest == shard.digest
        assert labels.port == shard.port
        assert json.loads(labels.raw["X-Llmgw-Spec"]) == dict(shard.spec)
        assert unit.value("Service", "KillMode") == "control-group"
        assert unit.value("Service", "Restart") == "on-failure"
        assert unit.value("Service", "TimeoutStopSec")
        assert unitfiles.environment_files(unit) == [
            (f"/etc/llmgw/env/{shard.unit}.env", True),
            (f"/etc/llmgw/env/{shard.unit}.secret.env", True),
        ]


def test_exec_start_runs_exactly_the_planned_command(
    plan: Plan, tmp_path: Path, stub_bin: Path,
) -> None:
    record = tmp_path / "argv.jsonl"
    for shard in shards_of(plan):
        assert shard.files is not None
        record.unlink(missing_ok=True)
        unit = unitfiles.parse(shard.unit, shard.files.unit_text)
        # The agent writes LLMGW_WEIGHTS (the fetched weights' local path) into the
        # env file of a unit whose source it fetches; ExecStart must expand it.
        fetched = "/models/hub/models--org--name/snapshots/abc"
        env = {**unitfiles.environment(unit), "PATH": f"{stub_bin}:/usr/bin:/bin",
               "LLMGW_WEIGHTS": fetched}
        argv = unitfiles.expand(unit.value("Service", "ExecStart") or "", env, shard.unit)
        subprocess.run(argv, env=env, check=True, timeout=30)
        ran = [json.loads(line) for line in record.read_text().splitlines()]
        planned = [
            [word.replace("${LLMGW_WEIGHTS}", fetched) for word in step]
            for step in [*shard.spec.get("prelude", []), shard.spec["argv"]]
        ]
        # /usr/bin/env resolved each program on PATH: the stub saw the rest.
        assert ran == [[step[1], *step[2:]] for step in planned], shard.unit
        assert unitfiles.environment(unit) == shard.spec["env"]


def test_env_file_reads_back_the_profile_env(plan: Plan) -> None:
    for shard in shards_of(plan):
        assert shard.files is not None
        assert unitfiles.parse_env_file(shard.files.env_text) == shard.spec["user_env"]


def test_secret_env_is_paths_only(plan: Plan) -> None:
    (shard,) = [s for s in shards_of(plan) if s.model == "llama-70b" and s.rank == 0]
    assert shard.files is not None
    assert shard.files.secret_env == (("HF_TOKEN", "/etc/llmgw/secrets/hf_token"),)
    assert "HF_TOKEN" not in shard.files.env_text


@pytest.mark.parametrize(
    ("word", "quoted"),
    [
        ("plain-word_1.0:/x,y=z", "plain-word_1.0:/x,y=z"),
        ("100%", "100%%"),
        ("$HOME", "$$HOME"),
        ("two words", '"two words"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        (";", "\\;"),
        ("", '""'),
        # systemd ends a unit line at LF, CR and CRLF: none may appear raw.
        ("a\nExecStartPre=/bin/x", '"a\\nExecStartPre=/bin/x"'),
        ("tab\there", '"tab\\there"'),
        ("cr\rlf", '"cr\\rlf"'),
        ("esc\x1b[0m del\x7f", '"esc\\x1b[0m del\\x7f"'),
        ("nel\x85 ls\u2028 ps\u2029", '"nel\\u0085 ls\\u2028 ps\\u2029"'),
        ("ünïcode", '"ünïcode"'),
    ],
)
def test_exec_quoting(word: str, quoted: str) -> None:
    assert quoting.exec_word(word) == quoted


def test_environment_and_env_file_quoting() -> None:
    assert quoting.systemd_env('A=50% "x" \\') == '"A=50%% \\"x\\" \\\\"'
    assert quoting.systemd_env("A=1\nB=2\r\t") == '"A=1\\nB=2\\r\\t"'
    assert quoting.env_file_value('$X "y" `z` \\') == '"\\$X \\"y\\" \\`z\\` \\\\"'
    # Inside double quotes an env file value may span lines; systemd keeps it whole.
    assert quoting.env_file_value("a\nb\\") == '"a\nb\\\\"'


@pytest.mark.parametrize("write", [quoting.exec_word, quoting.systemd_env,
                                   quoting.env_file_value, quoting.label])
def test_nul_never_reaches_a_unit(write: Any) -> None:
    with pytest.raises(ValueError):
        write("a\x00b")


@pytest.mark.parametrize("text", ["two\nlines", "cr\r", " padded", "tail\\", "ü", ""])
def test_labels_refuse_anything_but_one_printable_line(text: str) -> None:
    with pytest.raises(ValueError, match="cannot be a unit label"):
        quoting.label(text)


SHARD = UnitSpec(
    name="llmgw-m-r0-s0.service", model="m", replica=0, rank=0, ranks=1, node="gpu-01",
    engine="vllm", digest="0" * 16, spec_json="{}", argv=("vllm", "serve", "org/m"),
    port=18000, served_name="m", user_env=(("MAX_JOBS", "4"),))


def test_rendered_files_are_whole_lines_and_named_for_their_unit() -> None:
    files = render(SHARD)
    assert files.name == "llmgw-m-r0-s0.service"
    assert files.unit_text.endswith("LimitMEMLOCK=infinity\n")
    assert files.env_text.endswith("\nMAX_JOBS=\"4\"\n")


@pytest.mark.parametrize(("env_dir", "named"), [
    ("/srv/llmgw/env", "/srv/llmgw/env"), ("/srv/llmgw/env/", "/srv/llmgw/env"),
    ("/srv/llmgw/env//", "/srv/llmgw/env"), ("/srv/env-X/", "/srv/env-X"),
])
def test_env_files_are_named_under_env_dir(env_dir: str, named: str) -> None:
    text = render(SHARD, env_dir=env_dir).unit_text
    assert f"EnvironmentFile=-{named}/llmgw-m-r0-s0.service.env\n" in text
    assert f"EnvironmentFile=-{named}/llmgw-m-r0-s0.service.secret.env\n" in text


def test_a_template_naming_a_missing_field_fails_instead_of_rendering_nothing() -> None:
    environment = UNIT_TEMPLATE.environment
    with pytest.raises(jinja2.UndefinedError):
        environment.from_string("ExecStart={{ unit.argvs }}").render(unit=SHARD)
