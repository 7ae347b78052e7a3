"""GPUs through NVML (``pynvml``, from the nvidia-ml-py package).

NVML is the only source of NVLink topology; everything else it gives,
nvidia-smi gives too. :func:`read` returns ``None`` with the reason when the
library does not import or initialise (no driver, a container without the
NVIDIA runtime, a CI machine), so the caller falls back to nvidia-smi
without an error. Unlike the other discovery sources this is one function,
not a command and a parser: NVML is a library call, not text.

The module is passed in (``nvml=``) so the mapping from NVML calls to
records is tested on machines without a GPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from llmgw.discovery.gpus import GpuRecord, ProcessRecord, device_id

_MIB = 1024 * 1024


@dataclass
class Snapshot:
    gpus: list[GpuRecord] = field(default_factory=list)
    processes: list[ProcessRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def load() -> tuple[ModuleType | None, str]:
    """The pynvml module, or None and why it is not usable."""
    try:
        return importlib.import_module("pynvml"), ""
    except ImportError as exc:
        return None, f"pynvml does not import: {exc}"


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def read(nvml: Any, process_name: Callable[[int], str] = lambda pid: "") -> tuple[
    Snapshot | None, str
]:
    """Every GPU NVML sees, with NVLink peers; ``(None, reason)`` if NVML is unusable.

    A field NVML does not support on a GPU (ECC on a GeForce, say) is None.
    ``process_name(pid)`` names processes, which NVML does not.
    """
    error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error as exc:
        return None, f"NVML did not initialise: {exc}"
    except OSError as exc:  # the shared library itself is missing or broken
        return None, f"NVML did not initialise: {exc}"
    try:
        return _snapshot(nvml, error, process_name), ""
    finally:
        try:
            nvml.nvmlShutdown()
        except error:
            pass


def _snapshot(
    nvml: Any, error: type[BaseException], process_name: Callable[[int], str]
) -> Snapshot:
    snap = Snapshot()

    def optional(call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except error:
            return None

    try:
        count = int(nvml.nvmlDeviceGetCount())
    except error as exc:
        snap.warnings.append(f"NVML: cannot count GPUs: {exc}")
        return snap
    handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
    peers = _nvlink_peers(nvml, handles, optional)
    for index, handle in enumerate(handles):
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        memory = optional(nvml.nvmlDeviceGetMemoryInfo, handle)
        capability = optional(nvml.nvmlDeviceGetCudaComputeCapability, handle)
        ecc = optional(
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        utilization = optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        pci = optional(nvml.nvmlDeviceGetPciInfo, handle)
        mig_call = getattr(nvml, "nvmlDeviceGetMigMode", None)  # bindings before R450 lack it
        mig = None if mig_call is None else optional(mig_call, handle)  # [current, pending]
        pci_id = getattr(pci, "pciDeviceId", None)
        persistence_call = getattr(nvml, "nvmlDeviceGetPersistenceMode", None)
        persistence = None if persistence_call is None else optional(persistence_call, handle)
        snap.gpus.append(
            GpuRecord(
                index=index,
                uuid=uuid,
                name=_text(nvml.nvmlDeviceGetName(handle)),
                pci_bus_id=None if pci is None else _text(pci.busId),
                memory_total_mib=None if memory is None else int(memory.total) // _MIB,
                memory_used_mib=None if memory is None else int(memory.used) // _MIB,
                compute_capability=None if capability is None else "{}.{}".format(*capability),
                ecc_uncorrected=None if ecc is None else int(ecc),
                utilization_pct=None if utilization is None else int(utilization.gpu),
                nvlink_peers=peers[index],
                pci_device_id=None if pci_id is None else device_id(hex(int(pci_id))),
                mig_mode=None if not mig else
                ("Enabled" if mig[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1) else "Disabled"),
                persistence_mode=None if persistence is None else
                ("Enabled" if persistence == getattr(nvml, "NVML_FEATURE_ENABLED", 1)
                 else "Disabled"),
            )
        )
        for proc in optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []:
            used = getattr(proc, "usedGpuMemory", None)
            snap.processes.append(
                ProcessRecord(
                    gpu_uuid=uuid,
                    pid=int(proc.pid),
                    name=process_name(int(proc.pid)),
                    used_memory_mib=None if used is None else int(used) // _MIB,
                )
            )
    return snap


def _nvlink_peers(
    nvml: Any, handles: list[Any], optional: Callable[..., Any]
) -> list[tuple[int, ...] | None]:
    """GPU indices each GPU reaches over NVLink, directly or through NVSwitch.

    Peer-to-peer status answers both topologies in one question, where
    walking links would see only the switch on HGX boards.
    """
    peers: list[tuple[int, ...] | None] = []
    for index, handle in enumerate(handles):
        found: list[int] | None = []
        for other, other_handle in enumerate(handles):
            if other == index or found is None:
                continue
            status = optional(
                nvml.nvmlDeviceGetP2PStatus, handle, other_handle, nvml.NVML_P2P_CAPS_INDEX_NVLINK
            )
            if status is None:
                found = None  # unknown, which is not "no peers"
            elif status == nvml.NVML_P2P_STATUS_OK:
                found.append(other)
        peers.append(None if found is None else tuple(found))
    return peers
