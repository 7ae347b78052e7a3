"""Memory, CPU and disks of a node, from /proc and /sys trees (fixture roots here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmgw.discovery import disks, hosts

NODES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"

ARM64_CPUINFO = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid sve
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd4f

processor\t: 1
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid sve
CPU implementer\t: 0x41
"""


@pytest.mark.parametrize(
    ("node", "model", "count", "total_gib"),
    [
        ("h100-ib", "Intel(R) Xeon(R) Platinum 8480+", 224, 2015),
        ("a100-roce", "AMD EPYC 7763 64-Core Processor", 256, 1007),
        ("cpu-only", "Intel(R) Xeon(R) Gold 6348 CPU @ 2.60GHz", 112, 251),
    ],
)
def test_fixture_hosts(node: str, model: str, count: int, total_gib: int) -> None:
    host = hosts.read(NODES / node / "proc", NODES / node / "sys")
    assert host.warnings == ()
    assert (host.cpu.model, host.cpu.count) == (model, count)
    assert host.memory.total_bytes is not None and host.memory.total_bytes // 2**30 == total_gib
    assert host.memory.available_bytes is not None
    assert host.memory.available_bytes < host.memory.total_bytes
    assert "avx2" in host.cpu.flags


def test_meminfo_units_are_kib() -> None:
    memory = hosts.parse_meminfo("MemTotal:       16384 kB\nMemAvailable:    8192 kB\n")
    assert (memory.total_bytes, memory.available_bytes) == (16384 * 1024, 8192 * 1024)
    assert hosts.parse_meminfo("MemTotal: 1 kB\n").available_bytes is None


def test_arm64_cpuinfo_has_features_and_no_model_name() -> None:
    cpu = hosts.parse_cpuinfo(ARM64_CPUINFO)
    assert cpu.model is None and cpu.count == 2 and "sve" in cpu.flags


@pytest.mark.parametrize(
    ("text", "count"),
    [("0-223\n", 224), ("0\n", 1), ("0-3,8-11\n", 8), ("0-3,5\n", 5), ("", None), ("x", None)],
)
def test_cpu_lists(text: str, count: int | None) -> None:
    assert hosts.parse_cpu_list(text) == count


def test_missing_files_leave_facts_absent_and_say_why(tmp_path: Path) -> None:
    host = hosts.read(tmp_path / "proc", tmp_path / "sys")
    assert host.memory.total_bytes is None and host.cpu.count is None and host.cpu.model is None
    assert len(host.warnings) == 2 and "meminfo" in host.warnings[0]


def test_disks_free_space_and_missing_directories(tmp_path: Path) -> None:
    found, warnings = disks.read([str(tmp_path), str(tmp_path / "absent")])
    stat = os.statvfs(tmp_path)
    assert found[0].total_bytes == stat.f_blocks * stat.f_frsize
    assert found[0].free_bytes is not None and found[0].free_bytes > 0
    assert (found[1].free_bytes, found[1].total_bytes) == (None, None)
    assert warnings == [f"weights directory {tmp_path / 'absent'}: No such file or directory"]
