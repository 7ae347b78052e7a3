"""What the real-vLLM e2e tests share: the install, a tiny model, ``llmgw serve`` on sim nodes.

``make vllm`` installs vLLM's CPU build into ``.cache/vllm``: a venv whose
``bin/vllm`` is what a node's ``<engines dir>/vllm-<version>`` holds after
``llmgw engine install``. The tests link each simulated node's engines
directory to it (``vllm-0.32.0 -> .cache/vllm``), so that the agent finds
the version a profile pins installed, puts its ``bin/`` first on the unit's
PATH, and the unit's ``/usr/bin/env vllm`` runs it: the path a real node
takes, without a 2.5 GB install per node per test.

The daemon is the real ``llmgw serve`` process, started and watched from
outside (its admin API, the agents' reports), as an operator would.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import nodes

from llmgw.fleet.types import NodeReport, Unit
from llmgw.onboarding import simnodes
from llmgw.onboarding.processes import descendants
from llmgw.spec import loading, statedirs
from llmgw.transport import pools

ROOT = Path(__file__).parents[2]
VLLM_DIR = ROOT / ".cache" / "vllm"
VLLM = VLLM_DIR / "bin" / "vllm"
VERSION = re.search(r"^VLLM_VERSION \?= (\S+)$", (ROOT / "Makefile").read_text(),
                    re.M).group(1)  # type: ignore[union-attr]
MODEL_BUILDER = ROOT / "tests" / "support" / "tinymodel.py"
# vLLM on this CPU: imports alone take 15-70 s on two shared cores.
READY_TIMEOUT = 900.0
TEST_TIMEOUT = 3000
MISSING = "vLLM is not installed: run `make vllm` (make test does)"

Check = Callable[[dict[str, Any]], bool]


def build_model(directory: Path) -> Path:
    """The tiny Llama (tests/support/tinymodel.py), made with the vLLM venv's torch."""
    subprocess.run([str(VLLM_DIR / "bin" / "python"), str(MODEL_BUILDER), str(directory)],
                   check=True, timeout=600, capture_output=True)
    return directory


def patient_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    """Agents get two minutes to come up: beside a vLLM that is importing torch on two
    shared cores, 15 s is not always enough for a Python process to start."""
    monkeypatch.setattr(simnodes, "START_TIMEOUT", 120.0)


def install(sim: nodes.SimCluster) -> None:
    """Every node has vLLM ``VERSION`` installed: its engines dir links to ``make vllm``'s."""
    for node in sim.nodes.values():
        engines = node.root / "engines"
        engines.mkdir(exist_ok=True)
        (engines / f"vllm-{VERSION}").symlink_to(VLLM_DIR.resolve())


def profile(**extra: Any) -> dict[str, Any]:
    """A ``cpu: true`` vLLM profile for the tiny model, small in every way vLLM allows."""
    args = {"max-model-len": 512, "max-num-seqs": 4, "enforce-eager": True,
            # The KV cache: 64 MiB, and vLLM skips its whole-memory reservation.
            "kv-cache-memory-bytes": 64 * 1024 * 1024}
    args.update(extra.pop("args", {}))
    return {"engine": "vllm", "engine_version": VERSION, "cpu": True, "dtype": "float32",
            "min_memory_gb": 2, "env": {"HF_HUB_OFFLINE": "1"}, "args": args, **extra}


class Served:
    """``llmgw serve`` on a simulated cluster, and what the agents report."""

    def __init__(self, sim: nodes.SimCluster, log: Path) -> None:
        self.sim = sim
        self.log = log
        self.router = f"http://127.0.0.1:{nodes.free_port()}"
        self.admin = f"http://127.0.0.1:{nodes.free_port()}"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def directory(self) -> Path:
        return self.sim.cluster_dir

    def write(self, models: dict[str, Any]) -> None:
        # The nodes hold the model directory a test built: a path source lies in weights_dirs.
        for model in models.values():
            source = str(model.get("source", ""))
            if source.startswith("/") and str(Path(source).parent) not in self.sim.weights_dirs:
                self.sim.weights_dirs.append(str(Path(source).parent))
        self.sim.write_cluster({"cluster": {
            "sync": "auto", "drift_interval": "1s", "auth": "none",
            "store": {"path": str(self.directory.parent / "llmgw.db")},
            "listeners": {"router": self.router.removeprefix("http://"),
                          "admin": self.admin.removeprefix("http://"),
                          "metrics": f"127.0.0.1:{nodes.free_port()}"},
        }, "models": models})

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "llmgw", "serve", "--cluster", str(self.directory),
                 "--ready-timeout", "15m"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=120)
        self.process = None

    def status(self) -> dict[str, Any]:
        token = statedirs.admin_token(loading.load(self.directory).cluster).read_text().strip()
        return httpx.get(f"{self.admin}/api/v1/status",  # type: ignore[no-any-return]
                         headers={"Authorization": f"Bearer {token}"}, timeout=10).json()

    def wait(self, check: Check, what: str, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, self.tail()
            try:
                last = self.status()
                if check(last):
                    return last
            except (httpx.HTTPError, FileNotFoundError, ValueError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}; last status {last}\n{self.tail()}")

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()[-40:]
        for node in self.sim.nodes.values():
            lines += [f"--- {node.name} agent"]
            lines += node.agent_log.read_text(errors="replace").splitlines()[-30:]
        return "\n".join(lines)

    def units(self, model: str) -> list[tuple[str, Unit]]:
        """(node, unit) of ``model`` on every node, by rank, from the agents themselves."""
        cluster = loading.load(self.directory)

        async def ask() -> list[NodeReport]:
            async with pools.Pool(cluster, self.directory) as pool:
                return [await pool.report(name) for name in sorted(self.sim.nodes)]

        found = [(report.node, unit) for report in asyncio.run(ask())
                 for unit in report.units if unit.model == model]
        return sorted(found, key=lambda item: (item[1].replica, item[1].rank))


def ready(model: str, shards: int = 1) -> Check:
    """Every shard of one replica of ``model`` ready, and nothing left to do."""
    def check(status: dict[str, Any]) -> bool:
        up = [r for r in status["replicas"] if r["model"] == model and r["state"] == "ready"]
        return len(up) == shards and len(status["replicas"]) == shards and not (
            status["plan"] or {}).get("has_changes", True)
    return check


def argv(pid: int) -> list[str]:
    """The engine's command line as the kernel holds it."""
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def environment(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


def served_argv(unit: Unit) -> list[str]:
    """What the agent ran for ``unit``: the argv its spec label records."""
    spec = json.loads(unit.labels["X-Llmgw-Spec"])
    return list(spec["argv"])


def rss_mib(pid: int) -> int:
    """Resident memory of ``pid`` and every process below it, in MiB."""
    total = 0
    for member in [pid, *descendants(pid)]:
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total // 1024


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state == "Z"


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
