"""nvidia-smi: the queries llmgw builds, and its CSV parsed from recorded output."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llmgw.discovery import gpus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NODES = FIXTURES / "nodes"


def recorded(name: str) -> str:
    return (FIXTURES / "nvidia-smi" / name).read_text()


def test_query_commands() -> None:
    assert gpus.query_command("/usr/bin/nvidia-smi") == [
        "/usr/bin/nvidia-smi",
        "--query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,compute_cap,"
        "ecc.errors.uncorrected.volatile.total,utilization.gpu",
        "--format=csv,noheader,nounits",
    ]
    assert gpus.processes_command() == [
        "nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
        "--format=csv,noheader,nounits",
    ]


@pytest.mark.parametrize("node", ["h100-ib", "a100-roce", "l40s-nofabric", "faulty", "old-driver"])
def test_each_fixture_node_answers_the_exact_queries(node: str) -> None:
    """The stand-ins answer only what discovery asks: a drifted flag fails here."""
    smi = str(NODES / node / "nvidia-smi")
    query = subprocess.run(gpus.query_command(smi), capture_output=True, text=True, check=True)
    assert query.stdout == (NODES / node / "query-gpu.csv").read_text()
    apps = subprocess.run(gpus.processes_command(smi), capture_output=True, text=True, check=True)
    assert apps.stdout == (NODES / node / "compute-apps.csv").read_text()
    wrong = subprocess.run([smi, "--query-gpu=index", "--format=csv"], capture_output=True)
    assert wrong.returncode != 0


@pytest.mark.parametrize(
    ("node", "count", "gpu_class", "utilization"),
    [
        ("h100-ib", 8, "h100-80g", 0),
        ("a100-roce", 8, "a100-80g", 0),
        ("l40s-nofabric", 4, "l40s-45g", 0),
        ("faulty", 8, "h100-80g", 0),
        ("old-driver", 4, "a100-40g", None),  # no utilization column: still GPUs
    ],
)
def test_fixture_nodes_parse(
    node: str, count: int, gpu_class: str, utilization: int | None
) -> None:
    parsed = gpus.parse_query((NODES / node / "query-gpu.csv").read_text())
    assert parsed.warnings == []
    built = gpus.build(parsed.gpus)
    assert len(built) == count
    assert {g.gpu_class for g in built} == {gpu_class}
    assert built[0].utilization_pct == utilization
    assert all(g.uuid.startswith("GPU-") and g.pci_bus_id for g in built)


def test_absent_values_stay_absent() -> None:
    geforce = gpus.parse_query(recorded("geforce-na.csv")).gpus
    assert [g.ecc_uncorrected for g in geforce] == [None, None]
    assert [g.utilization_pct for g in geforce] == [3, 0]
    assert gpus.build(geforce)[0].gpu_class == "rtx4090-24g"
    mig = gpus.parse_query(recorded("mig-not-supported.csv")).gpus
    assert (mig[0].utilization_pct, mig[0].ecc_uncorrected, mig[0].memory_used_mib) == (None, 0, 13)
    assert (mig[1].memory_used_mib, mig[1].ecc_uncorrected, mig[1].utilization_pct) == (
        None, None, None
    )
    assert mig[1].memory_total_mib == 81920 and mig[1].compute_capability == "8.0"


@pytest.mark.parametrize("name", ["no-driver.txt", "no-devices.txt"])
def test_error_text_yields_no_gpus_and_says_so(name: str) -> None:
    parsed = gpus.parse_query(recorded(name))
    assert parsed.gpus == []
    assert parsed.warnings and parsed.warnings[0].startswith("nvidia-smi: unexpected line")


def test_short_rows_that_cannot_name_a_gpu_are_warnings() -> None:
    parsed = gpus.parse_query("0, GPU-1, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 81559\n")
    assert parsed.gpus == [] and len(parsed.warnings) == 1


def test_compute_apps() -> None:
    procs = gpus.parse_processes(recorded("compute-apps-mixed.csv"))
    assert [(p.pid, p.name, p.used_memory_mib) for p in procs] == [
        (2291, "/usr/lib/xorg/Xorg", 412),
        (88412, "/usr/bin/python3", 20480),
        (90117, "", None),
    ]
    assert gpus.parse_processes(recorded("compute-apps-none.txt")) == []
    assert gpus.parse_processes("") == []


def test_processes_mark_their_gpu_unless_llmgw_owns_them() -> None:
    records = gpus.parse_query(recorded("geforce-na.csv")).gpus
    procs = gpus.parse_processes(recorded("compute-apps-mixed.csv"))
    built = gpus.build(records, procs, owned=lambda pid: pid == 88412)
    assert [(p.pid, p.owned_by_llmgw) for p in built[0].processes] == [(2291, False), (88412, True)]
    assert built[0].faults == [
        "GPU 0 has memory held by pid 2291 (/usr/lib/xorg/Xorg), not started by llmgw"
    ]
    assert built[1].faults == ["GPU 1 has memory held by pid 90117, not started by llmgw"]


def test_unknown_memory_means_unknown_class() -> None:
    [record] = gpus.parse_query("0, GPU-1, NVIDIA H100 80GB HBM3, [N/A], [N/A], 0, 9.0, 0\n").gpus
    assert record.memory_total_mib is None and gpus.class_of(record) == "unknown"
