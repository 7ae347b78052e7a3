"""Observed state of the fleet, as agents report it."""

from llmgw.fleet.types import (
    FORMAT_VERSION,
    Adapter,
    Demand,
    Disk,
    FabricStatus,
    Fleet,
    Gpu,
    GpuProcess,
    NodeReport,
    Port,
    Unit,
    UnitState,
    Weights,
)

__all__ = [
    "FORMAT_VERSION", "Adapter", "Demand", "Disk", "FabricStatus", "Fleet", "Gpu",
    "GpuProcess", "NodeReport", "Port", "Unit", "UnitState", "Weights",
]
