"""NVML through pynvml: NVLink peers, absent fields, and falling back without error.

There is no GPU here, so a stand-in module answers the pynvml calls llmgw
makes with what an 8-GPU HGX H100 board (all GPUs on NVSwitch) returns.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from llmgw.discovery import nvml


class NVMLError(Exception):
    pass


class NotSupported(NVMLError):
    pass


class FakeNvml:
    NVMLError = NVMLError
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0
    NVML_P2P_STATUS_NOT_SUPPORTED = 5
    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1

    def __init__(self, count: int = 8, init_error: Exception | None = None,
                 nvlink: bool = True, ecc: bool = True) -> None:
        self.count, self.init_error, self.nvlink, self.ecc = count, init_error, nvlink, ecc
        self.shut = False

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-0000000{h}-1111-2222-3333-444444444444"

    def nvmlDeviceGetName(self, h: int) -> bytes:  # older bindings return bytes
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0")

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=81559 * 1024 * 1024, used=(512 if h == 2 else 1) * 1048576)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        if not self.ecc:
            raise NotSupported("Not Supported")
        return 2 if h == 3 else 0

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=0, memory=0)

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        if not self.ecc:  # the same cards: GeForce boards answer Not Supported
            raise NotSupported("Not Supported")
        return self.NVML_FEATURE_DISABLED if h == 5 else self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=4242, usedGpuMemory=510 * 1048576)] if h == 2 else []

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        assert index == self.NVML_P2P_CAPS_INDEX_NVLINK
        return self.NVML_P2P_STATUS_OK if self.nvlink else self.NVML_P2P_STATUS_NOT_SUPPORTED


def test_hgx_board_every_gpu_reaches_the_others_over_nvlink() -> None:
    fake = FakeNvml()
    snapshot, why = nvml.read(fake, process_name=lambda pid: "python3")
    assert why == "" and snapshot is not None and fake.shut
    peers = [g.nvlink_peers for g in snapshot.gpus]
    assert peers[:2] == [(1, 2, 3, 4, 5, 6, 7), (0, 2, 3, 4, 5, 6, 7)]
    gpu = snapshot.gpus[3]
    assert (gpu.name, gpu.memory_total_mib, gpu.compute_capability, gpu.ecc_uncorrected) == (
        "NVIDIA H100 80GB HBM3", 81559, "9.0", 2
    )
    assert snapshot.gpus[0].pci_bus_id == "00000000:18:00.0"
    assert [g.persistence_mode for g in snapshot.gpus][4:6] == ["Enabled", "Disabled"]
    [proc] = snapshot.processes
    assert (proc.gpu_uuid, proc.pid, proc.name, proc.used_memory_mib) == (
        snapshot.gpus[2].uuid, 4242, "python3", 510
    )


def test_pcie_cards_have_no_peers_and_unsupported_fields_are_absent() -> None:
    snapshot, _ = nvml.read(FakeNvml(count=2, nvlink=False, ecc=False))
    assert snapshot is not None
    assert [g.nvlink_peers for g in snapshot.gpus] == [(), ()]
    assert [g.ecc_uncorrected for g in snapshot.gpus] == [None, None]
    assert [g.persistence_mode for g in snapshot.gpus] == [None, None]


def test_nvml_that_does_not_initialise_is_a_reason_not_an_error() -> None:
    snapshot, why = nvml.read(FakeNvml(init_error=NVMLError("Driver Not Loaded")))
    assert snapshot is None and why == "NVML did not initialise: Driver Not Loaded"


def test_the_real_pynvml_on_a_machine_without_a_gpu() -> None:
    module, why = nvml.load()
    if module is None:
        assert "pynvml does not import" in why
        return
    snapshot, why = nvml.read(module)
    if snapshot is not None:  # a machine with a GPU and a driver: NVML works
        assert snapshot.gpus
        return
    assert why.startswith("NVML did not initialise")


class MigNvml(FakeNvml):
    """An A100 board on bindings with MIG: GPU 1 has MIG on; device ids as NVML packs them."""

    NVML_DEVICE_MIG_ENABLE = 1
    NVML_DEVICE_MIG_DISABLE = 0

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0", pciDeviceId=0x20B210DE)

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        on = self.NVML_DEVICE_MIG_ENABLE if h == 1 else self.NVML_DEVICE_MIG_DISABLE
        return [on, on]


def test_mig_mode_and_the_pci_device_id_come_from_nvml() -> None:
    snapshot, _ = nvml.read(MigNvml(count=2))
    assert snapshot is not None
    assert [(g.pci_device_id, g.mig_mode) for g in snapshot.gpus] == [
        ("20b2", "Disabled"), ("20b2", "Enabled")]


def test_bindings_without_mig_leave_it_unknown() -> None:
    snapshot, _ = nvml.read(FakeNvml(count=1))
    assert snapshot is not None
    assert (snapshot.gpus[0].mig_mode, snapshot.gpus[0].pci_device_id) == (None, None)
