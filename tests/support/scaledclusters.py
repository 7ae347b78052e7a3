"""``make run``'s cluster with a model that scales, served by a real ``llmgw serve``, and
the replicas it runs over time.

:func:`write` copies ``cluster.example/local`` (the local node, the supervise backend,
the real ``llama-server`` with Gemma 3 270M) with free ports, the state under ``state``,
a short ``drift_interval`` so that the loop samples load often, and the model's
``scaling``, ``routing`` and engine ``args`` replaced by the caller's. :func:`start`
runs the daemon on it (``tests/support/daemons.py``).

:class:`Replicas` polls the daemon's status on a thread of its own (so it runs beside
an asyncio load or a plain script) and keeps every sample: when each replica of the
model was seen in which state. From it: the first time a condition held, the most
replicas seen in a span, and the replica-seconds a span used (each replica counted
from its first report to its last, loading included: a loading replica holds its
GPU, or here its CPU and memory, as much as a ready one).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import daemons, nodes

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / ".cache" / "engine" / "bin" / "llama-server"
MODEL = ROOT / ".cache" / "models" / "gemma3-270m-q4_k_m.gguf"
NAME = "gemma3-270m"
# Two slots of one thread each: a replica saturates at two streams, so a burst queues.
ARGS: dict[str, Any] = {"ctx-size": 2048, "threads": 1, "parallel": 2, "no-jinja": True,
                        "chat-template": "gemma"}


def built() -> bool:
    """Whether ``make engine model`` has built the real engine and model."""
    return ENGINE.exists() and MODEL.exists()


def write(directory: Path, state: Path, *, scaling: dict[str, Any],
          routing: dict[str, Any] | None = None, args: dict[str, Any] | None = None,
          drift_interval: str = "1s") -> dict[str, int]:
    """The cluster directory; returns the listeners' ports by name."""
    directory.mkdir(parents=True)
    text = (ROOT / "cluster.example" / "local" / "cluster.yaml").read_text()
    ports = {name: nodes.free_port() for name in daemons.LISTENERS}
    for name, default in (("router", 8000), ("admin", 8001), ("metrics", 9400)):
        text = text.replace(f"{name}: 127.0.0.1:{default}", f"{name}: 127.0.0.1:{ports[name]}")
    text = text.replace("    address: local\n", "    address: local\n"
                        f"    engine_ports_from: {nodes.free_ports(32)}\n")
    text = text.replace("drift_interval: 10s", f"drift_interval: {drift_interval}")
    text = text.replace("../../.cache/models", str(MODEL.parent))
    text = text.replace("../../.cache/local/", f"{state}/")
    text = text[: text.index("models:")]  # the model is ours: JSON is YAML
    model: dict[str, Any] = {
        "source": str(MODEL), "scaling": scaling,
        "profiles": [{"engine": "llama.cpp", "cpu": True, "min_memory_gb": 1,
                      "args": ARGS if args is None else args}],
    }
    if routing is not None:
        model["routing"] = routing
    text += "models:\n  " + NAME + ": " + json.dumps(model) + "\n"
    (directory / "cluster.yaml").write_text(text)
    return ports


def start(tmp_path: Path, **settings: Any) -> daemons.Daemon:
    """``llmgw serve`` on a cluster :func:`write` made under ``tmp_path`` (``settings``
    are its keywords), the real engine on its PATH; returns at once."""
    state = tmp_path / "state"
    ports = write(tmp_path / "cluster", state, **settings)
    env = {**os.environ, "PATH": f"{ENGINE.parent}{os.pathsep}{os.environ['PATH']}"}
    daemon = daemons.Daemon(tmp_path / "cluster", tmp_path / "serve.log", env=env,
                            ports=ports)
    daemon.start()
    return daemon


@dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic()
    states: dict[str, str]  # the model's replica → its state, as the agent reports it

    def ready(self) -> int:
        return sum(1 for state in self.states.values() if state == "ready")


class Replicas:
    """The model's replicas over time, from the daemon's status every ``poll`` seconds.

    Usage::

        with scaledclusters.Replicas(daemon) as replicas:
            replicas.wait(lambda s: s.ready() == 2, "a second replica")
    """

    def __init__(self, daemon: daemons.Daemon, model: str = NAME, poll: float = 0.25) -> None:
        self.daemon = daemon
        self.model = model
        self.poll = poll
        self.samples: list[Sample] = []
        self.errors = 0  # polls the daemon did not answer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="replicas", daemon=True)
        self._lock = threading.Lock()

    def __enter__(self) -> Replicas:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                status = self.daemon.status()
            except daemons.NOT_YET:
                self.errors += 1
            else:
                states = {str(r["replica"]): r["state"] for r in status["replicas"]
                          if r["model"] == self.model}
                with self._lock:
                    self.samples.append(Sample(time.monotonic(), states))
            self._stop.wait(self.poll)

    def latest(self) -> Sample | None:
        with self._lock:
            return self.samples[-1] if self.samples else None

    def first(self, check: Callable[[Sample], bool], since: float = 0.0) -> Sample | None:
        """The first sample at or after ``since`` for which ``check`` holds."""
        with self._lock:
            return next((s for s in self.samples if s.at >= since and check(s)), None)

    def wait(self, check: Callable[[Sample], bool], what: str, timeout: float = 120.0,
             since: float = 0.0) -> Sample:
        """The first sample (at or after ``since``) for which ``check`` holds, waiting for
        it; fails when the daemon exits or ``timeout`` passes."""
        def found() -> Sample | None:
            return self.first(check, since)

        return self.daemon.until(found, what, timeout, poll=0.1)

    def span(self, start: float, end: float) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if start <= s.at <= end]

    def most(self, start: float, end: float) -> int:
        """The most replicas (in any state) seen between ``start`` and ``end``."""
        return max((len(s.states) for s in self.span(start, end)), default=0)

    def replica_seconds(self, start: float, end: float) -> float:
        """Seconds each replica existed between ``start`` and ``end``, summed: each sample
        counts its replicas for the time until the next sample."""
        samples = self.span(start, end)
        total = 0.0
        for here, after in zip(samples, samples[1:] + [Sample(end, {})], strict=True):
            total += len(here.states) * (after.at - here.at)
        return total
