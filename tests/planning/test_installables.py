"""Whether an engine version can be installed on a node: fixture nodes' real reports in,
one verdict out, a case per check (``llmgw.engines.installables``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
from support import nodes

from llmgw.agent import reports, settings
from llmgw.engines import installables
from llmgw.fleet.types import Gpu, InstalledEngine, NodeReport

GiB = 1 << 30
ENGINES_DIR = "/var/lib/llmgw/engines"


@cache
def fixture(hardware: str) -> NodeReport:
    """The fixture node's report as its agent makes it, with an engines directory that
    has 200 GiB free (what ``servers.py`` adds to the collector's report)."""
    chosen = settings.load(nodes.FIXTURES / hardware / "agent.yaml")
    found = asyncio.run(reports.Collector(chosen).collect(chosen.declaration()))
    assert found.host is not None
    return found.model_copy(update={"host": found.host.model_copy(update={
        "engines_dir": ENGINES_DIR, "engines_free_bytes": 200 * GiB,
        "c_compiler": "/usr/bin/gcc"})})


def host(**changes: Any) -> Callable[[NodeReport], NodeReport]:
    def edit(report: NodeReport) -> NodeReport:
        assert report.host is not None
        return report.model_copy(update={"host": report.host.model_copy(update=changes)})
    return edit


def gpus(capability: str, name: str) -> Callable[[NodeReport], NodeReport]:
    def edit(report: NodeReport) -> NodeReport:
        return report.model_copy(update={"gpus": [
            Gpu(**{**g.model_dump(), "compute_capability": capability, "name": name})
            for g in report.gpus]})
    return edit


def same(report: NodeReport) -> NodeReport:
    return report


CASES: dict[str, tuple[str, str, str, Callable[[NodeReport], NodeReport], str, str]] = {
    # name: (hardware, engine, version, edit, state, words the reason or fix holds)
    "h100 installs vllm": ("h100-ib", "vllm", "0.11.0", same, "install",
                           "driver 550.54.15 (CUDA 12.8 needs 525.60.13), compute capability "
                           "9.0"),
    "no GPU is a skip, no fault": ("cpu-only", "vllm", "0.11.0", same, "skip", "no GPU"),
    "an R418 driver cannot run CUDA 12": ("old-driver", "vllm", "0.11.0", same, "cannot",
                                          "NVIDIA driver 418.87.01; vLLM 0.11.0's CUDA 12.8 "
                                          "wheels need 525.60.13"),
    "CUDA 13 needs a 580 driver": ("h100-ib", "vllm", "0.22.0", same, "cannot",
                                   "upgrade the NVIDIA driver to 580.65.06"),
    "installed is left alone": ("h100-ib", "vllm", "0.11.0", host(installed_engines=[
        InstalledEngine(engine="vllm", version="0.11.0", path=f"{ENGINES_DIR}/vllm-0.11.0")]),
        "installed", f"in {ENGINES_DIR}/vllm-0.11.0"),
    "another version installed is not this one": ("h100-ib", "vllm", "0.11.0", host(
        installed_engines=[InstalledEngine(engine="vllm", version="0.10.2", path="x")]),
        "install", "driver 550.54.15"),
    "a Pascal GPU is too old": ("a100-roce", "vllm", "0.11.0", gpus("6.0", "Tesla P100"),
                                "cannot", "compute capability 6.0 (Tesla P100); vLLM 0.11.0 "
                                "needs 7.0"),
    "a V100 runs vllm, not sglang": ("a100-roce", "sglang", "0.5.3", gpus("7.0", "Tesla V100"),
                                     "cannot", "SGLang 0.5.3 needs 7.5"),
    "a full disk": ("h100-ib", "vllm", "0.11.0", host(engines_free_bytes=3 * GiB), "cannot",
                    f"3.0 GiB free in {ENGINES_DIR}; a vLLM environment takes 12 GiB"),
    "no C compiler": ("l40s-nofabric", "vllm", "0.11.0", host(c_compiler=""), "cannot",
                      "run `llmgw node add` for this node again, which installs gcc, or "
                      "`apt-get install gcc`"),
    "an older agent's unknown compiler is not checked": (
        "l40s-nofabric", "vllm", "0.11.0", host(c_compiler=None), "install", "GiB free"),
    "Python 3.14 has no torch wheels": ("h100-ib", "vllm", "0.11.0",
                                        host(python_version="3.14.0"), "cannot",
                                        "wheels (and torch's) exist up to Python 3.13"),
    "an agent that installs nothing": ("h100-ib", "vllm", "0.11.0", host(engines_dir=None),
                                       "cannot", "llmgw node add node-01"),
    "unreachable is unknown": ("h100-ib", "vllm", "0.11.0", lambda r: NodeReport(
        node="node-01", reachable=False, error="connection refused"), "unknown",
        "unreachable: connection refused"),
    "sglang on an h100": ("h100-ib", "sglang", "0.5.3", same, "install", "driver 550.54.15"),
    "llama.cpp is shipped, not installed here": ("h100-ib", "llama.cpp", "11434.0.0", same,
                                                 "cannot", "llmgw engine install llama.cpp"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_check_decides_and_explains(case: str) -> None:
    hardware, engine, version, edit, state, words = CASES[case]
    verdict = installables.check(engine, version, "node-01", edit(fixture(hardware)))
    assert verdict.state == state, verdict
    assert words in f"{verdict.reason} {verdict.fix}", verdict
    if state == "cannot":
        assert verdict.fix, "a refusal says what to do"


def test_the_fixture_nodes_report_their_driver_from_sysfs() -> None:
    assert {h: fixture(h).host.driver_version for h in ("h100-ib", "old-driver", "cpu-only")
            } == {"h100-ib": "550.54.15", "old-driver": "418.87.01", "cpu-only": None}


@pytest.mark.parametrize(("version", "cuda"), [("0.6.3", "12.1"), ("0.7.0", "12.4"),
                                               ("0.11.0rc1", "12.8"), ("0.21.9", "12.8"),
                                               ("0.22.0", "13.0"), ("1.0.0", "13.0")])
def test_each_release_reads_its_row(version: str, cuda: str) -> None:
    assert installables.needs("vllm", version).cuda == cuda
