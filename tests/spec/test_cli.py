"""The validate and schema commands, and the generated reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from ruamel.yaml import YAML

from llmgw.cli.main import main
from llmgw.spec import loading, models, reference

ROOT = Path(__file__).parents[2]
EXAMPLES = [ROOT / "cluster.example", ROOT / "cluster.example" / "local"]


@pytest.mark.parametrize("directory", EXAMPLES, ids=["example", "local"])
def test_examples_validate(directory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--cluster", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "is valid" in out


def test_validate_summarises_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    main(["validate", "--cluster", str(ROOT / "cluster.example")])
    out = capsys.readouterr().out
    assert "11 nodes, 72 GPUs declared, 3 fabrics, 5 models, 3 projects" in out
    assert "h100-80g         48 on 6 nodes" in out
    assert "vllm on 2 nodes × 8× h100-80g (TP 8 × PP 2)" in out
    assert "qwen-coder  (on demand, max 1, idle 30m)" in out
    assert "[cordoned]" in out


def test_validate_on_missing_directory_is_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--cluster", "/nonexistent/cluster"]) == 1
    err = capsys.readouterr().err
    assert "cluster directory does not exist" in err
    assert "Traceback" not in err


def test_validate_default_directory_is_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "c.yaml").write_text("cluster: {name: here}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["validate"]) == 0
    assert "Cluster here is valid" in capsys.readouterr().out


def test_the_installed_command_exits_1_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("cluster:\n  name: x\n  sync: sometimes\n")
    result = subprocess.run(
        [sys.executable, "-m", "llmgw", "validate", "--cluster", str(tmp_path)],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 1
    assert f"{tmp_path}/c.yaml:3:9: cluster.sync:" in result.stderr
    assert "Traceback" not in result.stderr


def test_relative_paths_resolve_against_the_cluster_directory() -> None:
    cluster = loading.load(ROOT / "cluster.example" / "local")
    source = cluster.models["gemma3-270m"].source
    assert source == str(ROOT / ".cache" / "models" / "gemma3-270m-q4_k_m.gguf")
    assert cluster.cluster.store.path == str(ROOT / ".cache" / "local" / "llmgw.db")


def _schema(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["schema"]) == 0
    schema: dict[str, object] = json.loads(capsys.readouterr().out)
    return schema


def test_schema_accepts_every_example_file(capsys: pytest.CaptureFixture[str]) -> None:
    validator = jsonschema.Draft7Validator(_schema(capsys))
    yaml = YAML(typ="safe")
    # Cluster files only: agent/ holds an agent's settings, not cluster sections.
    files = sorted([*ROOT.glob("cluster.example/*.yaml"),
                    *ROOT.glob("cluster.example/local/*.yaml")])
    assert files
    for path in files:
        errors = [e.message for e in validator.iter_errors(yaml.load(path))]
        assert errors == [], path


@pytest.mark.parametrize(
    "document",
    [
        {"nodes": {"gpu-01": {"address": "x", "weight_dirs": []}}},
        {"cluster": {"name": "x", "sync": "sometimes"}},
        {"models": {"m": {"profiles": [{"engine": "tgi", "cpu": True}]}}},
        {"nodes": {"GPU_01": {"address": "x"}}},
        {"modles": {}},
    ],
    ids=["unknown-key", "bad-enum", "bad-engine", "bad-name", "unknown-section"],
)
def test_schema_rejects_what_validate_rejects(
    document: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    validator = jsonschema.Draft7Validator(_schema(capsys))
    assert list(validator.iter_errors(document))


def test_cluster_reference_is_up_to_date() -> None:
    committed = (ROOT / "docs" / "cluster-reference.md").read_text()
    assert committed == reference.render(), "run `make docs` to regenerate the reference"


def test_reference_documents_every_field() -> None:
    text = reference.render()
    for _, model, _ in reference.SECTIONS:
        for name, info in model.model_fields.items():
            assert f"| `{info.alias or name}` |" in text
            assert info.description, f"{model.__name__}.{name} has no description"


def test_a_reader_that_goes_away_gets_no_traceback() -> None:
    result = subprocess.run(
        f"{sys.executable} -m llmgw validate --cluster {ROOT / 'cluster.example'} | head -1",
        shell=True, capture_output=True, text=True, check=False,
    )
    assert result.stdout.startswith("Cluster lab is valid")
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


def test_every_model_of_the_cluster_files_has_a_section() -> None:
    """Walked from the top-level model, not listed by hand: a model added to the spec (a
    new nested section) fails here until reference.SECTIONS renders it."""
    sectioned = [model for _, model, _ in reference.SECTIONS]
    missing = [m.__name__ for m in reference.models_under(models.Cluster) if m not in sectioned]
    assert not missing, f"no section in llmgw/spec/reference.py for {missing}"
