"""Readiness is three questions: is the socket on the port the engine's own, is
the engine up, and has it loaded its model?

The listener on the unit's port must belong to the unit's processes
(:mod:`llmgw.agent.listeners`): another program there answers ``/health``
too, while the engine behind it cannot bind. ``/health`` answering 2xx says
the process is up; the model listed by ``/v1/models`` says the weights are
loaded. Together with the process state from the backend this gives the
unit's state:

    port held by a program not llmgw's         → failed: "port 18000 is held by pid 7539 (…)"
    process running, nothing on its port yet   → starting
    port still held by another llmgw unit      → starting (the detail names it)
    /health not answering                      → starting
    /health OK, no model in /v1/models         → loading
    /health OK, model listed                   → ready
    process failed (restarts exhausted)        → failed, with the log tail
    process waiting to be restarted            → starting (the detail says why)

A unit with no ``X-Llmgw-Port`` (a rank > 0 shard without an HTTP server)
is ready once its process runs. When the unit has ``X-Llmgw-Served-Name``,
that name must be the one listed; otherwise any model will do.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from llmgw.agent.listeners import Finding
from llmgw.agent.units import Observation
from llmgw.fleet.types import UnitState


@dataclass(frozen=True)
class Probe:
    health: bool
    models: tuple[str, ...] | None = None  # None: /v1/models did not answer 200
    error: str = ""


async def probe(client: httpx.AsyncClient, port: int, timeout: float) -> Probe:
    """Ask one engine on 127.0.0.1:``port`` both questions."""
    base = f"http://127.0.0.1:{port}"
    try:
        health = await client.get(f"{base}/health", timeout=timeout)
    except httpx.HTTPError as exc:
        return Probe(False, error=f"/health: {type(exc).__name__} {exc}".strip())
    if not health.is_success:
        return Probe(False, error=f"/health answered {health.status_code}")
    try:
        listed = await client.get(f"{base}/v1/models", timeout=timeout)
        if listed.status_code != 200:
            return Probe(True, error=f"/v1/models answered {listed.status_code}")
        data = listed.json().get("data") or []
        return Probe(True, tuple(str(m.get("id")) for m in data if isinstance(m, dict)))
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return Probe(True, error=f"/v1/models: {type(exc).__name__} {exc}".strip())


def state(
    observation: Observation, found: Probe | None, listening: Finding | None = None,
) -> tuple[UnitState, str]:
    """The unit's state and a short detail. Purely computational, no side-effects.

    ``listening`` is who listens on the unit's port; None when not looked at (no
    port, or a stopped unit), and a finding that is not ``known`` (no socket table
    readable) leaves the probes to decide, as before.
    """
    if observation.labels is None:
        return "unknown", observation.detail
    if observation.process == "stopped":
        return "stopped", observation.detail
    if listening is not None and listening.foreign:
        # Not loading, not starting: the engine cannot bind while that program holds it.
        return "failed", "; ".join(p for p in (listening.foreign, observation.detail) if p)
    if observation.process == "failed":
        return "failed", observation.detail
    if observation.process == "activating":
        return "starting", observation.detail or "process starting"
    if observation.labels.port is None:
        return "ready", "running; no HTTP port to probe"
    if listening is not None and listening.other:
        return "starting", f"waiting: {listening.other}"
    if listening is not None and listening.known and not listening.listening:
        return "starting", f"waiting for the engine to listen on port {observation.labels.port}"
    if found is None or not found.health:
        why = found.error if found is not None else "not probed yet"
        return "starting", f"waiting for /health ({why})"
    wanted = observation.labels.raw.get("X-Llmgw-Served-Name")
    models = found.models or ()
    if (wanted and wanted in models) or (not wanted and models):
        return "ready", ""
    return "loading", found.error or (
        f"waiting for {wanted} in /v1/models" if wanted else "waiting for a model in /v1/models"
    )
