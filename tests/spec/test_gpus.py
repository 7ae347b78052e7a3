from __future__ import annotations

import pytest

from llmgw.spec import gpus


@pytest.mark.parametrize(
    ("driver_name", "memory_mib", "expected"),
    [
        # memory.total as nvidia-smi reports it, not the datasheet figure
        pytest.param("NVIDIA L40S", 46068, "l40s-45g", id="l40s-is-45-not-48"),
        pytest.param("NVIDIA H100 80GB HBM3", 81559, "h100-80g", id="h100-sxm"),
        pytest.param("NVIDIA H100 PCIe", 81559, "h100-80g", id="h100-pcie"),
        pytest.param("NVIDIA H100 NVL", 95830, "h100nvl-94g", id="h100-nvl"),
        pytest.param("NVIDIA A100-SXM4-80GB", 81920, "a100-80g", id="a100-80"),
        pytest.param("NVIDIA A100-PCIE-40GB", 40960, "a100-40g", id="a100-40"),
        pytest.param("NVIDIA H200", 143771, "h200-140g", id="h200"),
        pytest.param("NVIDIA L4", 23034, "l4-22g", id="l4"),
        pytest.param("NVIDIA L40", 46068, "l40-45g", id="l40-not-l40s"),
        pytest.param("Tesla T4", 15360, "t4-15g", id="t4"),
        pytest.param("NVIDIA GeForce RTX 4090", 24564, "rtx4090-24g", id="rtx4090"),
        pytest.param("NVIDIA Quadro Z9000", 8192, "quadroz9000-8g", id="unknown-family"),
    ],
)
def test_class_names_come_from_the_driver(driver_name: str, memory_mib: int, expected: str) -> None:
    assert gpus.class_for(driver_name, memory_mib) == expected


def test_every_builtin_class_is_what_its_driver_reports() -> None:
    for name, cls in gpus.BUILTIN.items():
        assert name == f"{cls.family}-{cls.memory_gib}g"


@pytest.mark.parametrize(
    ("name", "fp8"),
    [("h100-80g", True), ("l40s-45g", True), ("l4-22g", True), ("a100-80g", False),
     ("a10-22g", False), ("t4-15g", False)],
)
def test_fp8_needs_compute_capability_8_9(name: str, fp8: bool) -> None:
    assert gpus.BUILTIN[name].supports_fp8 is fp8
