"""NVLink peers from ``nvidia-smi topo -m``: the fallback when NVML is not usable.

NVML answers peer-to-peer status directly (:mod:`llmgw.discovery.nvml`);
without it (no ``pynvml``, a container without the library) the topology
matrix nvidia-smi prints is the only source. :func:`command` builds the
argv, :func:`parse` reads the matrix:

    <TAB>GPU0<TAB>GPU1<TAB>NIC0<TAB>CPU Affinity<TAB>NUMA Affinity
    GPU0<TAB> X <TAB>NV12<TAB>PXB<TAB>0-63<TAB>0
    GPU1<TAB>NV12<TAB> X <TAB>SYS<TAB>64-127<TAB>1

A cell ``NV#`` is a bonded set of # NVLinks; ``PIX``, ``PXB``, ``PHB``,
``NODE`` and ``SYS`` are PCIe paths of growing length, ``X`` is the GPU
itself. Attached to a terminal, nvidia-smi underlines the header with ANSI
escape codes; copied from a web page, the tabs may have become spaces and
the header's indent may be gone. All are read the same way.
"""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU = re.compile(r"^GPU(\d+)$")
LINKS = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")


def command(nvidia_smi: str = "nvidia-smi") -> list[str]:
    """argv of the topology matrix query.

    >>> command()
    ['nvidia-smi', 'topo', '-m']
    """
    return [nvidia_smi, "topo", "-m"]


def parse(stdout: str) -> dict[int, tuple[int, ...]] | None:
    """NVLink peers by GPU index; None when the output is not a topology matrix.

    Only GPU-to-GPU cells are read; NIC columns, affinities and the legend
    are skipped. A GPU with no ``NV#`` cell has no NVLink peers (an empty
    tuple), which is known, unlike a matrix that could not be read.
    This is a purely computational function with no side-effects.
    """
    lines = [_ANSI.sub("", line) for line in stdout.splitlines()]
    header: list[int | None] | None = None
    peers: dict[int, tuple[int, ...]] = {}
    for line in lines:
        cells = line.split()
        if not cells:
            if header is not None and peers:
                break  # the blank line before the legend
            continue
        if header is None:
            # The header names the columns, GPU0 first. nvidia-smi indents it (its first
            # cell, above the row names, is empty), but a copy may have lost the indent;
            # a row is told from it by its own cell, X, which no header has.
            if _GPU.match(cells[0]) and "X" not in cells:
                header = [_index(cell) for cell in cells]
            continue
        row = _GPU.match(cells[0])
        if row is None:
            continue  # a NIC row
        found = []
        for column, cell in zip(header, cells[1:], strict=False):
            if column is not None and column != int(row.group(1)) and cell.startswith("NV"):
                found.append(column)
        peers[int(row.group(1))] = tuple(sorted(found))
    return peers if header is not None and peers else None


def _index(cell: str) -> int | None:
    match = _GPU.match(cell)
    return int(match.group(1)) if match else None
