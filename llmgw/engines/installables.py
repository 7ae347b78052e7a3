"""Whether an engine version can be installed on a node, and if not, why.

:func:`check` reads one node's report and answers one of:

* ``installed`` — the version is there already;
* ``install`` — every check passed: the daemon (``engines.<engine>.install:
  auto``) installs it here, ``llmgw doctor`` says it can;
* ``skip`` — the node has no GPU: vLLM and SGLang do not run here, and that
  is no fault;
* ``cannot`` — a check failed; the reason says what was seen and the fix
  what to do;
* ``unknown`` — the node did not say enough (unreachable, or an agent older
  than the facts): nothing is installed and nothing is called a fault.

The checks, in order: GPUs listed by the driver (none, with none on the PCI
bus either, is a skip; cards on the bus that the driver does not list are a
fault), the driver's version against what the version's CUDA wheels need,
each GPU's compute capability, the agent's Python against what the wheels
are built for, free disk where engines are installed against the size of an
environment, and a C compiler (Triton builds its launcher with one when the
engine first loads a model). A fact the agent did not report is not checked:
absent never refuses.

A purely computational module with no side effects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from llmgw.discovery import drivers
from llmgw.fleet.types import NodeReport

State = Literal["installed", "install", "skip", "cannot", "unknown"]
ENGINES = ("vllm", "sglang")  # what installs from an index; llama.cpp is shipped by the CLI
GiB = 1 << 30
LEADING = re.compile(r"^(\d+(?:\.\d+)*)")
# As llmgw.agent.installs.no_compiler says it: node add installs gcc, root can too.
COMPILER_FIX = ("run `llmgw node add` for this node again, which installs gcc, or "
                "`apt-get install gcc`")


@dataclass(frozen=True)
class Needs:
    """What one range of an engine's releases needs of a node."""

    since: str  # the first release this row holds for (the next row's `since` ends it)
    cuda: str  # the CUDA its default wheels on PyPI are built with
    driver: str  # the oldest driver that runs that CUDA
    capability: tuple[int, int]  # the oldest GPU compute capability it runs on
    python_max: tuple[int, int] | None  # the newest Python its wheels (and torch's) exist for
    size: int  # bytes an environment takes installed


# Drivers: NVIDIA's CUDA Compatibility guide (docs.nvidia.com/deploy/cuda-compatibility,
# "Minor Version Compatibility"): a CUDA 12.x runtime, as the wheels bundle it
# (nvidia-cuda-runtime-cu12), runs on driver 525.60.13 or newer; 13.x on 580.65.06 or newer
# (the CUDA 13.0 GA driver). CUDA 13 also drops Maxwell, Pascal and Volta (CUDA 13.0 release
# notes): compute capability 7.5 from then on.
# vLLM's default wheel CUDA: 12.1 until vllm-project/vllm#12098 (12.4, v0.7.0), 12.8 from
# v0.9.0's release notes ("The default wheel has been upgraded from CUDA 12.4 to CUDA 12.8"),
# 13.0 by v0.22.0 (vllm-project/vllm#44335, #47628). Compute capability 7.0: vLLM's GPU
# install guide ("compute capability 7.0 or higher, e.g. V100, T4, RTX20xx, A100, L4, H100").
# Python: vLLM 0.9 to 0.21 require Python <3.14 on PyPI, as torch 2.7-2.9 ship wheels to 3.13.
# Sizes: a vLLM 0.11 environment with CUDA (torch 2.8 and its nvidia-* CUDA 12.8 libraries)
# takes roughly 10 GiB; not measured on a GPU machine here (the CPU build the tests install,
# `make vllm`, is 2.5 GiB). The check asks for 12 GiB, room for pip's wheels beside it.
# SGLang: its wheels follow torch's CUDA (12.4 for 0.4 on torch 2.5/2.6, 12.8 from 0.5 on
# torch 2.8); sgl-kernel is built for compute capability 7.5 and newer (not confirmed on a
# machine here); FlashInfer's wheels make its environment larger, 14 GiB asked.
TABLE: dict[str, tuple[Needs, ...]] = {
    "vllm": (
        Needs("0.0", "12.1", "525.60.13", (7, 0), (3, 12), 10 * GiB),
        Needs("0.7.0", "12.4", "525.60.13", (7, 0), (3, 12), 10 * GiB),
        Needs("0.9.0", "12.8", "525.60.13", (7, 0), (3, 13), 12 * GiB),
        Needs("0.22.0", "13.0", "580.65.06", (7, 5), None, 12 * GiB),
    ),
    "sglang": (
        Needs("0.0", "12.4", "525.60.13", (7, 5), (3, 12), 14 * GiB),
        Needs("0.5.0", "12.8", "525.60.13", (7, 5), (3, 13), 14 * GiB),
    ),
}
NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


@dataclass(frozen=True)
class Verdict:
    """One engine version on one node: what to do, why, and (``cannot``) the fix."""

    engine: str
    version: str
    node: str
    state: State
    reason: str
    fix: str = ""

    @property
    def line(self) -> str:
        """``gpu-01: vllm 0.11.0: cannot: … (fix: …)``."""
        fix = f" (fix: {self.fix})" if self.fix else ""
        return f"{self.node}: {self.engine} {self.version}: {self.state}: {self.reason}{fix}"


def _numbers(version: str) -> tuple[int, ...]:
    """A release's leading numbers: ``0.11.0rc1`` → ``(0, 11, 0)``."""
    found = LEADING.match(version)
    return tuple(int(p) for p in found.group(1).split(".")) if found else ()


def needs(engine: str, version: str) -> Needs:
    """The row of :data:`TABLE` that holds for ``engine version`` (the last for newer ones)."""
    rows = TABLE[engine]
    chosen = rows[0]
    for row in rows:
        if _numbers(version) >= _numbers(row.since):
            chosen = row
    return chosen


def _capability(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (text or "").split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def _python(text: str | None) -> tuple[int, int] | None:
    parts = (text or "").split(".")
    return (int(parts[0]), int(parts[1])) if len(parts) >= 2 and all(
        p.isdigit() for p in parts[:2]) else None


def check(engine: str, version: str, node: str, report: NodeReport | None) -> Verdict:
    """Whether ``engine version`` can be installed on ``node``, from its report."""
    def verdict(state: State, reason: str, fix: str = "") -> Verdict:
        return Verdict(engine, version, node, state, reason, fix)

    if engine not in TABLE:
        return verdict("cannot", f"{engine} is not installed from an index",
                       "llama.cpp is shipped: `llmgw engine install llama.cpp==VERSION NODE`")
    if report is None or not report.reachable:
        why = report.error if report is not None and report.error else "no report"
        return verdict("unknown", f"unreachable: {why}")
    host = report.host
    if host is None or host.engines_dir is None:
        return verdict("cannot", "its agent installs no engines (older than this llmgw)",
                       f"`llmgw node add {node}` again upgrades its agent")
    for found in host.installed_engines:
        if (found.engine, found.version) == (engine, version):
            return verdict("installed", f"in {found.path}")
    name = NAMES[engine]
    row = needs(engine, version)
    if not report.gpus:
        if report.pci_gpus:
            return verdict("cannot", f"{len(report.pci_gpus)} NVIDIA cards on the PCI bus, "
                           "none listed by the driver",
                           "check `nvidia-smi` and `dmesg | grep -i nvidia` on the node")
        return verdict("skip", f"no GPU: {name} runs on GPUs only")
    seen = [f"{len(report.gpus)} GPU{'s' if len(report.gpus) != 1 else ''}"]
    if host.driver_version is not None:
        if drivers.key(host.driver_version) < drivers.key(row.driver):
            return verdict("cannot", f"NVIDIA driver {host.driver_version}; {name} {version}'s "
                           f"CUDA {row.cuda} wheels need {row.driver} or newer",
                           f"upgrade the NVIDIA driver to {row.driver} or newer")
        seen.append(f"driver {host.driver_version} (CUDA {row.cuda} needs {row.driver})")
    capabilities = {g.index: _capability(g.compute_capability) for g in report.gpus}
    old = sorted(i for i, c in capabilities.items() if c is not None and c < row.capability)
    wanted = ".".join(map(str, row.capability))
    if old and len(old) == len(report.gpus):
        first = report.gpus[0]
        return verdict("cannot", f"compute capability {first.compute_capability} "
                       f"({first.name}); {name} {version} needs {wanted} or newer",
                       "serve these GPUs with llama.cpp, or a model's profile on another "
                       "node's GPUs")
    known = sorted({c for c in capabilities.values() if c is not None})
    if known:
        seen.append(f"compute capability {'.'.join(map(str, known[0]))}"
                    + (f" (GPUs {', '.join(map(str, old))} below {wanted}: not used)"
                       if old else ""))
    python = _python(host.python_version)
    if python is not None and row.python_max is not None and python > row.python_max:
        newest = ".".join(map(str, row.python_max))
        return verdict("cannot", f"Python {host.python_version}; {name} {version}'s wheels "
                       f"(and torch's) exist up to Python {newest}",
                       f"run the agent on Python {newest} or older")
    if python is not None:
        seen.append(f"Python {host.python_version}")
    free = host.engines_free_bytes
    if free is not None:
        if free < row.size:
            return verdict("cannot", f"{free / GiB:.1f} GiB free in {host.engines_dir}; "
                           f"a {name} environment takes {row.size / GiB:.0f} GiB",
                           "free space there, or set engines.dir in the node's agent.yaml")
        seen.append(f"{free / GiB:.0f} GiB free")
    if host.c_compiler == "":
        return verdict("cannot", "no C compiler (gcc or clang), which Triton runs when "
                       f"{name} first loads a model", COMPILER_FIX)
    if host.c_compiler:
        seen.append(f"C compiler {host.c_compiler}")
    return verdict("install", ", ".join(seen))
