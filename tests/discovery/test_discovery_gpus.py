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


@pytest.mark.parametrize("node", ["h100-ib", "a100-roce", "l40s-nofabric", "faulty", "old-driver",
                                  "a100-mig"])
def test_each_fixture_node_answers_the_exact_queries(node: str) -> None:
    """The stand-ins answer only what discovery asks: a drifted flag fails here."""
    smi = str(NODES / node / "nvidia-smi")
    query = subprocess.run(gpus.query_command(smi), capture_output=True, text=True, check=True)
    assert query.stdout == (NODES / node / "query-gpu.csv").read_text()
    identity = subprocess.run(gpus.identity_command(smi), capture_output=True, text=True)
    if node == "old-driver":  # before R450: the MIG field makes it refuse the whole query
        assert identity.returncode != 0
    else:
        assert identity.stdout == (NODES / node / "identity.csv").read_text()
        found = gpus.parse_identity(identity.stdout)
        assert {i.persistence_mode for i in found.values()} == (
            {"Disabled"} if node == "a100-mig" else {"Enabled"})
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


def test_unknown_memory_still_gets_a_class_from_the_name() -> None:
    [record] = gpus.parse_query("0, GPU-1, NVIDIA H100 80GB HBM3, [N/A], [N/A], 0, 9.0, 0\n").gpus
    assert record.memory_total_mib is None and gpus.class_of(record) == "h100-80g"


def test_identity_query() -> None:
    assert gpus.identity_command() == [
        "nvidia-smi", "--query-gpu=uuid,pci.device_id,mig.mode.current,persistence_mode",
        "--format=csv,nounits"]


def test_persistence_mode_read_by_column_name() -> None:
    text = ("uuid, persistence_mode\nGPU-566bf9d7-c55a-45f8-d1a6-e55e9b9b1325, Enabled\n"
            "GPU-5d96cf7f-265b-eda9-cf0c-26ef4243ed52, Disabled\n"
            "GPU-5e6a0a2e-dd70-e34d-c1d7-7cffb7decc0c, [N/A]\n")
    found = gpus.parse_identity(text)
    assert [i.persistence_mode for i in found.values()] == ["Enabled", "Disabled", None]
    [record] = gpus.with_identity([gpus.GpuRecord(0, "GPU-5d96cf7f-265b-eda9-cf0c-26ef4243ed52",
                                                  "NVIDIA H100 80GB HBM3")], found)
    assert gpus.build([record])[0].persistence_mode == "Disabled"


def test_mig_mode_from_a_recorded_query_read_by_column_name() -> None:
    found = gpus.parse_identity(recorded("mig-mode-one-enabled.csv"))
    assert [(uuid[:12], i.mig_mode) for uuid, i in found.items()] == [
        ("GPU-ec845691", "Enabled"), ("GPU-91672fbd", "Disabled"),
        ("GPU-b4199570", "Disabled"), ("GPU-1a4dff29", "Disabled")]


def test_a_gpu_without_mig_says_na_which_is_none() -> None:
    text = "uuid, mig.mode.current\nGPU-3f9a2c1e-7b45-4d2e-9a61-0c8e5f2b7d13, [N/A]\n"
    assert gpus.parse_identity(text)["GPU-3f9a2c1e-7b45-4d2e-9a61-0c8e5f2b7d13"].mig_mode is None
    assert recorded("mig-mode-geforce-na.csv").splitlines()[1] == "[N/A]"  # as recorded


@pytest.mark.parametrize(("cell", "device"), [
    ("0x1DF010DE", "1df0"), ("0x233510DE", "2335"), ("0x26B9", "26b9"),
    ("[N/A]", None), ("garbage", None),
])
def test_pci_device_ids_as_nvidia_smi_prints_them(cell: str, device: str | None) -> None:
    assert gpus.device_id(cell) == device


@pytest.mark.parametrize(("name", "memory", "device", "expected"), [
    ("Tesla PG500-216", 32768, "1df0", "v100-32g"),  # a codename: the id knows better
    ("Tesla PG500-216", 32494, "1df0", "v100-32g"),
    ("Tesla PG500-216", 32768, None, "teslapg500216-32g"),  # no id: the name is all there is
    ("NVIDIA H100 80GB HBM3", None, "2330", "h100-80g"),  # memory not reported
    ("NVIDIA L40S", None, None, "l40s-45g"),  # one size in the family
    ("NVIDIA A100-SXM4-80GB", None, None, "unknown"),  # 40 or 80: cannot tell
    ("NVIDIA A100-SXM4-80GB", 81920, "20b2", "a100-80g"),
    ("NVIDIA H200", 143771, "2335", "h200-140g"),
    ("NVIDIA B200", None, "2901", "b200-179g"),
])
def test_class_by_device_id_then_name(name: str, memory: int | None, device: str | None,
                                      expected: str) -> None:
    record = gpus.GpuRecord(0, "GPU-x", name, memory_total_mib=memory, pci_device_id=device)
    assert gpus.class_of(record) == expected


def test_a_mig_gpu_is_reported_and_is_a_fault() -> None:
    records = gpus.with_identity(
        [gpus.GpuRecord(0, "GPU-ec845691-fb46-e16d-abfb-b135308cb39f", "NVIDIA A100-SXM4-80GB",
                        memory_total_mib=81920)],
        gpus.parse_identity(recorded("mig-mode-one-enabled.csv")))
    [gpu] = gpus.build(records)
    assert gpu.mig_mode == "Enabled"
    assert gpu.faults == ["GPU 0 is in MIG mode (split into instances); engines here take "
                          "whole GPUs"]
