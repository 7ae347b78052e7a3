"""Files others write are bounded: size, nesting, aliases — refused with their place.

The YAML cases with exact messages live in ``broken/bound-*``; these cover the
file-size bound and the JSON inputs (fleet snapshots for ``plan --observed``,
saved plans for ``apply``), and show the bounds leave real files alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmgw.applying import saved
from llmgw.cli.main import main
from llmgw.spec import bounds, loading

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "cluster.example"


def test_a_cluster_file_past_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text("cluster:\n  name: lab\n")
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * (bounds.YAML_MAX_BYTES // 10 + 1))
    with pytest.raises(loading.SpecErrors) as caught:
        loading.load(tmp_path)
    [error] = caught.value.errors
    assert str(error).endswith("big.yaml:1:1: file is 1.0 MiB; llmgw reads at most 1.0 MiB "
                               "from a file of this kind")


def test_the_bounds_leave_the_example_cluster_alone() -> None:
    for path in sorted(EXAMPLE.glob("*.yaml")):
        bounds.check_yaml(path.read_text())
    bounds.check_json((EXAMPLE / "fleet-snapshot.json").read_text())


def deep(levels: int) -> str:
    """A fleet snapshot whose first node's labels nest ``levels`` lists deep."""
    return ('{"format_version": 1,\n "nodes": {"x": ' + "[" * levels + "]" * levels + "}}\n")


@pytest.mark.parametrize(("text", "where"), [
    (deep(100_000), "fleet.json:2:79: nested more than 64 levels deep"),
    ('{"a": "' + "[" * 100 + '"}', None),  # brackets inside a string are text
])
def test_plan_observed_refuses_deep_json_with_its_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str | None,
) -> None:
    snapshot = tmp_path / "fleet.json"
    snapshot.write_text(text)
    code = main(["plan", "--cluster", str(EXAMPLE), "--observed", str(snapshot)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    if where is not None:
        assert f"{tmp_path}/{where}" in err
    else:
        assert "not a fleet snapshot" in err  # parsed, then refused for its shape


def test_plan_observed_refuses_a_snapshot_past_the_size_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bounds, "JSON_MAX_BYTES", 1000)
    snapshot = tmp_path / "fleet.json"
    snapshot.write_text(json.dumps({"format_version": 1, "nodes": {}, "pad": "x" * 1000}))
    assert main(["plan", "--cluster", str(EXAMPLE), "--observed", str(snapshot)]) == 1
    err = capsys.readouterr().err
    assert f"{snapshot}:1:1: file is 1,045 bytes; llmgw reads at most 1,000 bytes" in err


def test_a_saved_plan_nested_too_deep_is_refused_with_its_place(tmp_path: Path) -> None:
    planfile = tmp_path / "plan.json"
    planfile.write_text('{\n  "changes": ' + "[" * 65 + "]" * 65 + "\n}\n")
    with pytest.raises(saved.SavedPlanError, match=r"plan\.json:2:77: nested more than 64"):
        saved.load(planfile)


def test_a_saved_plan_past_the_size_bound_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bounds, "JSON_MAX_BYTES", 100)
    planfile = tmp_path / "plan.json"
    planfile.write_text(json.dumps({"format_version": 1, "pad": "x" * 100}))
    with pytest.raises(saved.SavedPlanError, match=r"plan\.json:1:1: file is 132 bytes"):
        saved.load(planfile)


def test_files_each_under_the_bound_are_bounded_together(tmp_path: Path) -> None:
    """Seven files of 74,000 values each: the directory's budget stops the seventh."""
    levels = ['  l0: &l0 [a, a, a, a, a, a, a, a, a]']
    levels += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 5)]
    for index in range(7):
        (tmp_path / f"f{index}.yaml").write_text(f"x{index}:\n" + "\n".join(levels) + "\n")
    with pytest.raises(loading.SpecErrors) as caught:
        loading.load(tmp_path)
    bounded = [str(e) for e in caught.value.errors if "values" in str(e)]
    assert len(bounded) == 1 and "f6.yaml" in bounded[0], caught.value.errors
    assert bounded[0].endswith("alias *l3 (7,381 values) expands the cluster directory "
                               "past 500,000 values")

