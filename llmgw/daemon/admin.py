"""The admin API of ``llmgw serve`` (loopback by default): status, fleet, plan.

``GET /api/v1/status``  what the daemon knows: revisions, last plan and apply,
                        a refused edit's errors, nodes and replicas.
``GET /api/v1/fleet``   the observed fleet snapshot (``llmgw plan --observed``
                        reads it; CI fetches it from here).
``GET /api/v1/plan``    the last plan: ``?format=json`` (default), ``markdown``
                        or ``text``.
``GET /ready``          200 on the leading reconciler once it has observed the
                        fleet; 503 on a standby (a load balancer in front of
                        reconcilers' admin APIs reaches the leader).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from llmgw import __version__
from llmgw.daemon.reconcilers import Daemon
from llmgw.planning import outputs

FORMATS = {"json": outputs.json_text, "markdown": outputs.markdown, "text": outputs.text}
CONTENT_TYPES = {"json": "application/json", "markdown": "text/markdown", "text": "text/plain"}


def create_app(daemon: Daemon) -> web.Application:
    app = web.Application()
    app.router.add_get("/api/v1/status", lambda r: _status(daemon))
    app.router.add_get("/api/v1/fleet", lambda r: _fleet(daemon))
    app.router.add_get("/api/v1/plan", lambda r: _plan(daemon, r))
    app.router.add_get("/health", lambda r: _health())
    app.router.add_get("/ready", lambda r: _ready(daemon))
    return app


async def _ready(daemon: Daemon) -> web.Response:
    if not daemon.leads():
        lead = daemon.leadership.leader if daemon.leadership else None
        return web.json_response({"status": "standby", "leader": lead.holder if lead else None},
                                 status=503)
    if daemon.state.fleet is None:
        return web.json_response({"status": "not ready", "reason": "no observation yet"},
                                 status=503)
    return web.json_response({"status": "ready", "role": "leader"})


async def _health() -> web.Response:
    return web.json_response({"status": "ok"})


async def _status(daemon: Daemon) -> web.Response:
    return web.json_response(status(daemon))


def status(daemon: Daemon) -> dict[str, Any]:
    state = daemon.state
    cluster = state.cluster
    doc: dict[str, Any] = {
        "version": __version__,
        "cluster": cluster.cluster.name,
        "directory": str(state.directory),
        "sync": cluster.cluster.sync,
        "revision": state.revision,
        "applied_revision": state.applied_revision,
        "started_at": state.started_at,
        "observed_at": state.observed_at,
        "iterations": state.iterations,
        "refused_edit": state.refused,
        "plan": None,
        "last_apply": None,
        "nodes": {},
        "replicas": [],
        "leadership": leadership(daemon),
    }
    if state.plan is not None:
        doc["plan"] = {"summary": state.plan.summary(), "has_changes": state.plan.has_changes,
                       "unplaceable": sum(len(u.replicas) for u in state.plan.unplaceable),
                       "at": state.planned_at}
    if state.outcome is not None:
        doc["last_apply"] = {"summary": state.outcome.summary(), "ok": state.outcome.ok,
                             "at": state.applied_at}
    if state.fleet is not None:
        for name, report in sorted(state.fleet.nodes.items()):
            doc["nodes"][name] = {"reachable": report.reachable, "error": report.error,
                                  "gpus": len(report.gpus)}
            for unit in report.units:
                doc["replicas"].append({"model": unit.model, "replica": unit.replica,
                                        "rank": unit.rank, "node": name, "unit": unit.name,
                                        "state": unit.state, "port": unit.port})
    return doc


def leadership(daemon: Daemon) -> dict[str, Any]:
    """Who leads, as this reconciler knows it."""
    lead = daemon.leadership
    if lead is None:
        return {"leading": True, "holder": None, "epoch": None, "leader": None}
    return {"leading": lead.is_leader(), "holder": lead.holder, "epoch": lead.epoch,
            "leader": lead.leader.holder if lead.leader else None,
            "leader_epoch": lead.leader.epoch if lead.leader else None,
            "lease_ttl": lead.ttl, "transitions": lead.transitions,
            "first_iteration_at": daemon.first_lead_iteration_at}


async def _fleet(daemon: Daemon) -> web.Response:
    fleet = daemon.state.fleet
    if fleet is None:
        raise web.HTTPServiceUnavailable(text='{"error": "no observation yet"}',
                                         content_type="application/json")
    return web.Response(text=fleet.model_dump_json(indent=2), content_type="application/json")


async def _plan(daemon: Daemon, request: web.Request) -> web.Response:
    kind = request.query.get("format", "json")
    if kind not in FORMATS:
        raise web.HTTPBadRequest(text=f"format must be one of {', '.join(FORMATS)}")
    plan = daemon.state.plan
    if plan is None:
        raise web.HTTPServiceUnavailable(text="no plan yet")
    return web.Response(text=FORMATS[kind](plan), content_type=CONTENT_TYPES[kind])
