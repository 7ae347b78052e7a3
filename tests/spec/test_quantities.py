from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.spec import quantities
from llmgw.spec.quantities import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param(90, 90.0, id="bare-int-is-seconds"),
        pytest.param(1.5, 1.5, id="bare-float"),
        pytest.param("45s", 45.0, id="seconds"),
        pytest.param("30m", 1800.0, id="minutes"),
        pytest.param("1h30m", 5400.0, id="compound"),
        pytest.param("2d", 172800.0, id="days"),
        pytest.param("500ms", 0.5, id="milliseconds"),
        pytest.param(" 5m ", 300.0, id="surrounding-space"),
    ],
)
def test_durations_parse(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("30 minutes", id="words"),
        pytest.param("m30", id="unit-first"),
        pytest.param("", id="empty"),
        pytest.param("5x", id="unknown-unit"),
        pytest.param(-1, id="negative"),
        pytest.param(True, id="bool"),
        pytest.param([1], id="list"),
    ],
)
def test_bad_durations_say_what_is_accepted(text: object) -> None:
    with pytest.raises(ValueError, match=r"duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        pytest.param(1024, 1024, id="bare-bytes"),
        pytest.param("24GiB", 24 * 2**30, id="gibibytes"),
        pytest.param("24GB", 24 * 10**9, id="gigabytes"),
        pytest.param("512MiB", 512 * 2**20, id="mebibytes"),
        pytest.param("1.5TiB", int(1.5 * 2**40), id="fraction"),
        pytest.param("24gib", 24 * 2**30, id="case-insensitive"),
        pytest.param("100", 100, id="string-bytes"),
    ],
)
def test_sizes_parse(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["24 gigs", "GiB", "-5", "1e3GiB", False])
def test_bad_sizes_say_what_is_accepted(text: object) -> None:
    with pytest.raises(ValueError, match=r"size"):
        parse_size(text)


@pytest.mark.parametrize("seconds", [0.5, 1, 59, 60, 90, 1800, 5400, 86400, 90061])
def test_durations_round_trip(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize("size", [1, 1023, 2**20, 24 * 2**30, 2**40])
def test_sizes_format_readably(size: int) -> None:
    text = format_size(size)
    assert abs(parse_size(text) - size) / size < 0.001


@pytest.mark.parametrize(("n", "noun", "text"), [
    (0, "error", "0 errors"), (1, "error", "1 error"), (2, "node", "2 nodes"),
    (1, "GPU", "1 GPU"), (1, "usage row", "1 usage row"),
])
def test_counts_agree_with_their_noun(n: int, noun: str, text: str) -> None:
    assert quantities.count(n, noun) == text


def test_a_one_of_everything_cluster_is_described_in_the_singular(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmgw.cli.main import main

    (tmp_path / "cluster.yaml").write_text(
        "cluster: {name: one}\nfabrics: {ib-a: {kind: infiniband}}\n"
        "nodes:\n  gpu-01: {address: 10.0.0.1, gpus: [{class: h100-80g, count: 1}], "
        "fabrics: {ib-a: [mlx5_0]}}\n"
        "models:\n  m: {source: org/m, profiles: [{engine: vllm, gpu_class: h100-80g}]}\n"
        "projects: {p: {}}\n")
    (tmp_path / "broken.yaml").write_text("models:\n  m2: {profiles: oops}\n")
    assert main(["validate", "--cluster", str(tmp_path)]) == 1
    assert "error: 1 error in" in capsys.readouterr().err
    (tmp_path / "broken.yaml").unlink()
    assert main(["validate", "--cluster", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "is valid: 1 node, 1 GPU declared, 1 fabric, 1 model, 1 project" in out
    assert "h100-80g          1 on 1 node (compute" in out
    assert "ib-a       infiniband 1 node\n" in out
