"""``nvidia-smi topo -m`` from recorded outputs (tests/fixtures/nvidia-smi/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.discovery import gpus, topologies

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"


def test_the_command() -> None:
    assert topologies.command("/usr/bin/nvidia-smi") == ["/usr/bin/nvidia-smi", "topo", "-m"]


@pytest.mark.parametrize(("name", "peers"), [
    # One NVLink bridge between GPU 0 and 1 (NV4); GPU 2 only on PCIe (NODE).
    ("topo-3x-a6000-nv4.txt", {0: (1,), 1: (0,), 2: ()}),
    # ANSI underline around the header (a TTY); NIC rows and columns ignored.
    ("topo-2x-nv12-tty-colour.txt", {0: (1,), 1: (0,)}),
    # Spaces instead of tabs; every GPU pair NV12 (NVSwitch), 8 columns, 4 rows shown.
    ("topo-dgx-a100-spaces.txt", {i: tuple(j for j in range(8) if j != i) for i in range(4)}),
    # PCIe only: PIX, PHB and SYS are no NVLink; an mlx4_0 column.
    ("topo-8x-pcie-mlx4.txt", {0: (), 1: (), 2: (), 3: ()}),
    # The same two matrices with the header's indent gone: still read, and PCIe only is
    # still "no NVLink", not "unknown".
    ("topo-3x-a6000-nv4-unindented.txt", {0: (1,), 1: (0,), 2: ()}),
    ("topo-8x-pcie-mlx4-unindented.txt", {0: (), 1: (), 2: (), 3: ()}),
])
def test_nvlink_peers_from_recorded_matrices(name: str, peers: dict[int, tuple[int, ...]]) -> None:
    assert topologies.parse((RECORDED / name).read_text()) == peers


@pytest.mark.parametrize("text", ["", "No devices were found\n",
                                  "Failed to initialize NVML: Driver/library version mismatch\n"])
def test_anything_else_is_unknown_not_no_peers(text: str) -> None:
    assert topologies.parse(text) is None


def test_topology_fills_peers_only_where_nvml_said_nothing() -> None:
    records = [gpus.GpuRecord(0, "GPU-a", "NVIDIA RTX A6000"),
               gpus.GpuRecord(1, "GPU-b", "NVIDIA RTX A6000", nvlink_peers=(0,))]
    filled = gpus.with_peers(records, {0: (1,), 1: ()})
    assert [r.nvlink_peers for r in filled] == [(1,), (0,)]
    assert [r.nvlink_peers for r in gpus.with_peers(records, None)] == [None, (0,)]
