"""Engine flag tables: what they hold, and every example and case checked against them.

The tables are committed data (``make engine-flags`` regenerates them from the
engines' released packages); nothing here downloads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from plan_builders import cluster_from, fleet_from
from ruamel.yaml import YAML

from llmgw.engines import launches, profiles, tables
from llmgw.planning import plans
from llmgw.spec import loading

REPO = Path(__file__).resolve().parents[2]
CASES = sorted((Path(__file__).parent / "cases").glob("*.yaml"))


@pytest.mark.parametrize("engine", tables.ENGINES)
def test_at_least_three_versions_per_engine_each_from_its_package(engine: str) -> None:
    versions = tables.available(engine)
    assert len(versions) >= 3
    for version in versions:
        data = json.loads((tables.DIRECTORY / f"{engine}-{version}.json").read_text())
        assert data["engine"] == engine and data["version"] == version
        assert data["package"].endswith(f"=={version}") and len(data["sha256"]) == 64
        assert len(data["options"]) > 100, "a parser that finds almost nothing is broken"
        for name, option in data["options"].items():
            assert name.startswith("-") and option["value"] in {"none", "required", "optional"}
            assert option.get("canonical") is None or option["canonical"] in data["options"]


@pytest.mark.parametrize(
    ("engine", "version", "option", "value", "negation", "choices"),
    [
        ("vllm", "0.33.0", "--enable-prefix-caching", "none", "--no-enable-prefix-caching", None),
        ("vllm", "0.33.0", "--max-model-len", "required", None, None),
        ("vllm", "0.33.0", "--runner", "required", None, ("auto", "draft", "generate", "pooling")),
        ("vllm", "0.12.0", "--task", "required", None, None),
        ("sglang", "0.5.23", "--tp-size", "required", None, None),
        ("sglang", "0.5.23", "--trust-remote-code", "none", None, None),
        ("llama.cpp", "11434.0.0", "--jinja", "none", "--no-jinja", None),
        ("llama.cpp", "11434.0.0", "--ctx-size", "required", None, None),
    ],
)
def test_options_as_the_engines_declare_them(
    engine: str, version: str, option: str, value: str, negation: str | None,
    choices: tuple[str, ...] | None,
) -> None:
    found = tables.load(engine, version).options[option]
    assert (found.value, found.negation) == (value, negation)
    if choices is not None:
        assert found.choices == choices


def test_short_forms_are_recorded_with_their_long_names() -> None:
    llama = tables.load("llama.cpp", "11434.0.0").options
    assert llama["-fa"].canonical == "--flash-attn" and "--fa" not in llama
    assert tables.load("vllm", "0.33.0").options["-tp"].canonical == "--tensor-parallel-size"


def test_removed_options_carry_forward_with_their_replacement() -> None:
    for version in ("0.13.0", "0.33.0"):
        removal = tables.load("vllm", version).removed["--task"]
        assert removal.since == "0.13.0" and removal.use and "runner: pooling" in removal.use


@pytest.mark.parametrize(
    ("engine", "asked", "table"),
    [
        ("vllm", None, tables.available("vllm")[-1]),
        ("vllm", "0.13.1", "0.13.0"),
        ("vllm", "0.20.0", "0.13.0"),
        ("vllm", "9.0.0", tables.available("vllm")[-1]),
        ("sglang", "0.5.10.post1", "0.5.10.post1"),
        ("sglang", "0.5.11", "0.5.10.post1"),
    ],
)
def test_a_version_uses_the_newest_table_at_or_below_it(
    engine: str, asked: str | None, table: str
) -> None:
    assert tables.select(engine, asked).table.version == table


def test_the_selection_keeps_the_version_asked_for() -> None:
    """Rendering decisions (GPU pinning) follow the version the nodes run, not its table's."""
    selection = tables.select("vllm", "0.23.5")
    assert (selection.table.version, selection.asked, selection.version) == (
        "0.23.0", "0.23.5", "0.23.5")
    assert tables.select("vllm", None).version == tables.available("vllm")[-1]


@pytest.mark.parametrize(("engine", "version", "error"), [
    ("vllm", "banana", "engine_version 'banana' is not a version such as "
                       f"{tables.available('vllm')[-1]!r}"),
    ("sglang", "0.5", "SGLang 0.5 is older than every flag table llmgw has "
                      f"({', '.join(tables.available('sglang'))}); use a newer engine, or "
                      "generate its table with `make engine-flags`"),
    ("tgi", None, "no flag tables for tgi"),
])
def test_versions_no_table_can_check(engine: str, version: str | None, error: str) -> None:
    with pytest.raises(tables.VersionError) as refused:
        tables.select(engine, version)
    assert str(refused.value) == error


@pytest.mark.parametrize(("older", "newer"), [
    ("0.5.10.dev1", "0.5.10rc1"), ("0.5.10rc1", "0.5.10"), ("0.5.10", "0.5.10.post1"),
    ("0.5.10.post1", "0.5.11"), ("0.9.9", "0.13"), ("1", "1.0.1"), ("0.13.0", "0.13.0.1"),
])
def test_versions_sort_as_releases(older: str, newer: str) -> None:
    assert tables.version_key(older) < tables.version_key(newer)


@pytest.mark.parametrize(("short", "full"), [("1", "1.0.0"), ("0.13", "0.13.0"),
                                            ("0.5.10post1", "0.5.10.post1")])
def test_missing_version_numbers_are_zeros(short: str, full: str) -> None:
    assert tables.version_key(short) == tables.version_key(full)


def test_the_example_cluster_is_valid_for_its_engine_versions() -> None:
    cluster = loading.load(REPO / "cluster.example", extra_checks=[profiles.check])
    versions = {p.engine_version for m in cluster.models.values() for p in m.profiles}
    assert versions > {None}, "the example shows engine_version"
    assert any("runner" in p.args for p in cluster.models["bge-m3"].profiles)


def _case_profiles() -> list[Any]:
    out = []
    for path in CASES:
        data = YAML(typ="safe").load(path.read_text())
        expected = "\n".join(line for u in data.get("expect", {}).get("unplaceable", [])
                             for line in u.get("why", []))
        if "collide with what llmgw sets" in data["description"]:
            expected += "\nis set by llmgw"  # the case is about exactly these
        for model, spec in data["cluster"].get("models", {}).items():
            for index in range(len(spec["profiles"])):
                out.append(pytest.param(data, model, index, expected,
                                        id=f"{path.stem}:{model}:{index}"))
    return out


@pytest.mark.parametrize(("case", "model", "index", "expected"), _case_profiles())
def test_every_planning_case_renders_flags_its_engine_accepts(
    case: dict[str, Any], model: str, index: int, expected: str
) -> None:
    cluster = cluster_from(case["cluster"])
    profile = cluster.models[model].profiles[index]
    for message in launches.problems(profile):
        allowed = message in expected or ("is set by llmgw" in expected.rsplit("\n", 1)[-1]
                                          and "is set by llmgw" in message)
        assert allowed, f"{model} profile {index}: {message}"


def test_every_rendered_argv_of_the_example_plan_passes_its_table() -> None:
    """The example cluster, planned onto its snapshot: every shard's argv is checked."""
    cluster = loading.load(REPO / "cluster.example", extra_checks=[profiles.check])
    fleet = fleet_from(cluster, {}, [], 1_700_000_000.0)
    plan = plans.plan(cluster, fleet, 1_700_000_000.0)
    shards = [s for change in plan.changes for s in change.shards]
    assert {s.engine for s in shards} >= {"vllm", "llama.cpp"}  # SGLang's model is min: 0
    for shard in shards:
        assert shard.spec["argv"], shard.unit  # built, so build() found nothing wrong


def test_a_version_that_is_not_one_is_named() -> None:
    with pytest.raises(ValueError, match=r"^not a version: 'banana'$"):
        tables.version_key("banana")
