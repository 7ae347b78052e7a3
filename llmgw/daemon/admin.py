"""The admin API of ``llmgw serve`` (loopback by default): status, fleet, plan.

Every path but ``/health`` and ``/ready`` (what load balancers probe) needs
an admin: ``Authorization: Bearer <token>`` with the daemon's admin token (the
file ``admin.token`` in the control host's state directory,
:mod:`llmgw.spec.statedirs`, owner-only, created at the first start; see
:func:`ensure_token`), or the session cookie of an admin logged in
on the pages.

``GET /api/v1/status``  what the daemon knows: revisions, last plan and apply,
                        what it waits for (``waiting``), a refused edit's errors,
                        nodes and replicas.
``GET /api/v1/fleet``   the observed fleet snapshot (``llmgw plan --observed``
                        reads it; CI fetches it from here), scrubbed of secrets
                        (:mod:`llmgw.fleet.redactions`).
``GET /api/v1/plan``    the last plan: ``?format=json`` (default), ``markdown``
                        or ``text``.
``GET /api/v1/history`` the apply journal, newest first: ``?model=M&limit=N``
                        (as ``llmgw history --json`` prints it).
``GET /api/v1/usage``   usage export (as ``llmgw usage export`` prints it):
                        ``?from=DATE&to=DATE&group_by=project,key,model,day``
                        ``&format=json|csv&tz=ZONE`` (JSON by default;
                        :mod:`llmgw.store.exports`).
``GET /api/v1/audit``   the audit log, newest first: ``?since=1d|ISO&limit=N``
                        (as ``llmgw audit --json`` prints it).
``GET /ready``          200 on the leading reconciler once it has observed the
                        fleet; 503 on a standby (a load balancer in front of
                        reconcilers' admin APIs reaches the leader).

Every call that is not a read (any method but GET and HEAD) and succeeds is
written to the audit log (:mod:`llmgw.store.audits`): ``admin-token`` or the
admin's name, the peer's address, ``admin.<method>`` and the route.

The pages (``/admin``, ``/chat``, ``/account``, ``/login``) are not served here:
they live on the router's listener, where routers in the HA layout show the
leader's published summary (:mod:`llmgw.daemon.publications`). A browser
that opens one on this listener gets a 404 saying where they are, not a 401
that asks for a token no person has at hand.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import re
import secrets as tokens
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from llmgw import __version__
from llmgw.applying import records
from llmgw.daemon.reconcilers import Daemon
from llmgw.fleet import redactions
from llmgw.fleet.types import Fleet
from llmgw.planning import outputs, summaries
from llmgw.spec import secrets, statedirs
from llmgw.spec.models import NAME_PATTERN
from llmgw.store import audits, exports, journals
from llmgw.store.stores import Store, StoreError
from llmgw.web import PAGE_PREFIXES, AdminView, Progress
from llmgw.web.logins import Gate

TOKEN_FILE = statedirs.ADMIN_TOKEN
log = logging.getLogger("llmgw.serve")
PAGES_ELSEWHERE = (
    "This is llmgw's admin API, not its pages. The pages (/admin, /chat, /account) are "
    "served by routers, on the router listener (this cluster's listeners.router is "
    "{router}); in the HA layout every router's /admin shows the leading reconciler's "
    "summary. The API here: /api/v1/status, /api/v1/fleet, /api/v1/plan, /api/v1/history, "
    "/api/v1/usage, /api/v1/audit (with the admin token), /health, /ready.\n")

FORMATS = {"json": outputs.json_text, "markdown": outputs.markdown, "text": outputs.text}
CONTENT_TYPES = {"json": "application/json", "markdown": "text/markdown", "text": "text/plain"}


def ensure_token(path: Path, old: Path | None = None) -> str:
    """The admin token in ``path``, created (mode 0600, its directory 0700) when absent.

    ``old`` is where an earlier llmgw kept it (next to the store: with PostgreSQL, the
    cluster directory, a git working tree). A token found there and not at ``path`` is
    moved, keeping its value, so that scripts reading it need only the new path; the
    move is logged once, since the next start finds the token in place."""
    if not path.exists() and old is not None and old.is_file() and old != path:
        _create(path, old.read_text())
        old.unlink()
        log.warning("moved the admin token from %s to %s: a secret has no place next to "
                    "the store or in the cluster directory", old, path)
    if not path.exists():
        _create(path, tokens.token_urlsafe(32) + "\n")
    return path.read_text().strip()


def _create(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # another daemon of this host made it first: read theirs
    with os.fdopen(fd, "w") as out:
        out.write(text)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _guard(token: str, gate: Gate | None, router: Callable[[], str],
           store: Callable[[], Store | None] = lambda: None) -> Middleware:
    async def audited(request: web.Request, handler: Handler, actor: str) -> web.StreamResponse:
        response = await handler(request)
        if request.method not in ("GET", "HEAD") and response.status < 400:
            resource = request.match_info.route.resource
            await audits.record(store(), actor, request.remote, f"admin.{request.method.lower()}",
                                route=resource.canonical if resource else None)
        return response

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in ("/health", "/ready"):  # what load balancers probe
            return await handler(request)
        if request.path == "/" or request.path.startswith(PAGE_PREFIXES):
            raise web.HTTPNotFound(text=PAGES_ELSEWHERE.format(router=router()))
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and presented.strip():
            if hmac.compare_digest(presented.strip().encode(), token.encode()):
                return await audited(request, handler, "admin-token")
            raise web.HTTPUnauthorized(text='{"error": "wrong admin token"}',
                                       content_type="application/json")
        visitor = await gate.visitor(request) if gate is not None else None
        if visitor is not None and visitor.user.admin:
            return await audited(request, handler, visitor.user.name)
        raise web.HTTPUnauthorized(
            text=json.dumps({"error": "the admin API needs `Authorization: Bearer <token>` "
                             f"(the file {TOKEN_FILE} in the state directory) or an admin's "
                             "session"}),
            content_type="application/json", headers={"WWW-Authenticate": "Bearer"})
    return guard


def create_app(daemon: Daemon, token: str, gate: Gate | None = None) -> web.Application:
    app = web.Application(middlewares=[_guard(
        token, gate, lambda: daemon.cluster.cluster.listeners.router, lambda: daemon.store)])
    app.router.add_get("/api/v1/status", lambda r: _status(daemon))
    app.router.add_get("/api/v1/fleet", lambda r: _fleet(daemon))
    app.router.add_get("/api/v1/plan", lambda r: _plan(daemon, r))
    app.router.add_get("/api/v1/history", lambda r: _history(daemon, r))
    app.router.add_get("/api/v1/usage", lambda r: _usage(daemon, r))
    app.router.add_get("/api/v1/audit", lambda r: _audit(daemon, r))
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
        "held": [{"model": h.model, "revision": h.revision, "reason": h.reason,
                  "held_at": h.held_at, "line": h.line()} for h in state.held],
        "waiting": waiting(daemon),
    }
    if state.plan is not None:
        # Changes still in flight (a replica loading) are changes: not converged yet.
        in_flight = len(daemon.converging.pending())
        doc["plan"] = {"summary": state.plan.summary(),
                       "has_changes": state.plan.has_changes or bool(in_flight),
                       "in_flight": in_flight,
                       "unplaceable": sum(len(u.replicas) for u in state.plan.unplaceable),
                       "at": state.planned_at,
                       "drift": [{"model": c.model, "replica": c.replica, "action": c.action,
                                  "drift": c.drift, "evidence": _scrubbed(c.evidence)}
                                 for c in state.plan.changes],
                       "held": [{"model": h.model, "replica": h.replica, "drift": h.drift,
                                 "nodes": list(h.nodes), "reasons": _scrubbed(h.reasons),
                                 "evidence": _scrubbed(h.evidence)} for h in state.plan.held]}
    if state.outcome is not None:
        doc["last_apply"] = {"summary": state.outcome.summary(), "ok": state.outcome.ok,
                             "at": state.applied_at}
    if state.fleet is not None:
        doc["summary"] = _summary_doc(summarize(daemon))
        for name, report in sorted(state.fleet.nodes.items()):
            error = secrets.scrub(report.error) if report.error else report.error
            doc["nodes"][name] = {"reachable": report.reachable, "error": error,
                                  "gpus": len(report.gpus)}
            for unit in report.units:
                doc["replicas"].append({"model": unit.model, "replica": unit.replica,
                                        "rank": unit.rank, "node": name, "unit": unit.name,
                                        "state": unit.state, "port": unit.port})
    return doc


def _scrubbed(lines: Iterable[str]) -> list[str]:
    return [secrets.scrub(line) for line in lines]


def waiting(daemon: Daemon) -> list[dict[str, Any]]:
    """The replicas the daemon waits for now, each with its deadline and a line for people
    (``gemma r3: loading 3m12s of 15m``)."""
    now = daemon.converging.now()
    return [{"model": w.change.model, "replica": w.replica, "action": w.change.action,
             "node": w.node, "state": w.state, "detail": secrets.scrub(w.detail),
             "elapsed": round(now - w.started, 1), "timeout": w.timeout, "line": w.line(now)}
            for w in daemon.waiting()]


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


async def _history(daemon: Daemon, request: web.Request) -> web.Response:
    model = request.query.get("model") or None
    if model is not None and not re.fullmatch(NAME_PATTERN, model):
        raise web.HTTPBadRequest(text='{"error": "model is not a model name"}',
                                 content_type="application/json")
    try:
        limit = int(request.query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= journals.MAX_LIMIT:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"limit must be between 1 and {journals.MAX_LIMIT}"}),
            content_type="application/json")
    if daemon.store is None:
        raise web.HTTPServiceUnavailable(text='{"error": "no store"}',
                                         content_type="application/json")
    try:
        entries = await daemon.store.history(model, limit)
    except StoreError:
        raise web.HTTPServiceUnavailable(text='{"error": "the store did not answer"}',
                                         content_type="application/json") from None
    return web.json_response([records.document(e) for e in entries])


def _refused(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"error": message}),
                              content_type="application/json")


def _store_of(daemon: Daemon) -> Store:
    if daemon.store is None:
        raise web.HTTPServiceUnavailable(text='{"error": "no store"}',
                                         content_type="application/json")
    return daemon.store


async def _usage(daemon: Daemon, request: web.Request) -> web.Response:
    q = request.query
    try:
        query = exports.parse(q.get("from"), q.get("to"), q.get("group_by", "project"),
                              q.get("format", "json"), q.get("tz"),
                              flag=lambda name: name.replace("-", "_"))
    except ValueError as exc:
        raise _refused(str(exc)) from None
    try:
        lines = await exports.export(_store_of(daemon), query)
    except StoreError:
        raise web.HTTPServiceUnavailable(text='{"error": "the store did not answer"}',
                                         content_type="application/json") from None
    if query.format == "csv":
        return web.Response(text=exports.csv_text(lines, query), content_type="text/csv")
    return web.json_response(exports.document(lines, query))


async def _audit(daemon: Daemon, request: web.Request) -> web.Response:
    try:
        since = (audits.since_of(request.query["since"], time.time())
                 if "since" in request.query else None)
    except ValueError as exc:
        raise _refused(f"since: {exc}") from None
    try:
        limit = int(request.query.get("limit", "100"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= audits.MAX_LIMIT:
        raise _refused(f"limit must be between 1 and {audits.MAX_LIMIT}")
    try:
        entries = await _store_of(daemon).audit_entries(since, limit)
    except StoreError:
        raise web.HTTPServiceUnavailable(text='{"error": "the store did not answer"}',
                                         content_type="application/json") from None
    return web.json_response([e.document() for e in entries])


async def _fleet(daemon: Daemon) -> web.Response:
    fleet = daemon.state.fleet
    if fleet is None:
        raise web.HTTPServiceUnavailable(text='{"error": "no observation yet"}',
                                         content_type="application/json")
    # Scrubbing a thousand nodes' reports takes a while: off the event loop.
    text = await asyncio.to_thread(redactions.public_json, fleet)
    return web.Response(text=text, content_type="application/json")


async def _plan(daemon: Daemon, request: web.Request) -> web.Response:
    kind = request.query.get("format", "json")
    if kind not in FORMATS:
        raise web.HTTPBadRequest(text=f"format must be one of {', '.join(FORMATS)}")
    plan = daemon.state.plan
    if plan is None:
        raise web.HTTPServiceUnavailable(text="no plan yet")
    return web.Response(text=FORMATS[kind](plan), content_type=CONTENT_TYPES[kind])


def summarize(daemon: Daemon) -> summaries.Summary:
    """The one fleet summary (:mod:`llmgw.planning.summaries`) of what the daemon observed."""
    state = daemon.state
    assert state.fleet is not None
    demand = daemon.router.demand().last_used if daemon.router is not None else {}
    return summaries.summarize(state.cluster, state.fleet, time.time(), demand)


def _summary_doc(summary: summaries.Summary) -> dict[str, Any]:
    return {
        "capacity": {name: {"total": c.total, "used": c.used, "free": c.free,
                            "faulty": c.faulty} for name, c in summary.capacity.items()},
        "free_nodes": summary.free_nodes,
        "idle": [{"model": i.replica.model, "replica": i.replica.replica,
                  "gpus": i.replica.gpu_count, "unused_for": i.unused_for}
                 for i in summary.idle],
        "by_state": summary.by_state,
    }


def admin_view(daemon: Daemon) -> AdminView | None:
    """What /admin shows; None before the first observation."""
    state = daemon.state
    if state.fleet is None:
        return None
    plan, outcome = state.plan, state.outcome
    return AdminView(
        summary=summarize(daemon), fleet=state.fleet, observed_at=state.observed_at,
        revision=state.revision, applied_revision=state.applied_revision,
        sync=state.cluster.cluster.sync,
        plan_summary=plan.summary() if plan else None,
        plan_text=outputs.text(plan) if plan else None, planned_at=state.planned_at,
        last_apply=outcome.summary() if outcome else None,
        last_apply_ok=outcome.ok if outcome else None, applied_at=state.applied_at,
        # Paths relative to the cluster directory, as the operator edits them.
        refused=[line.replace(f"{state.directory}/", "") for line in state.refused],
        progress=progress(state.fleet),
    )


def progress(fleet: Fleet) -> list[Progress]:
    """Fetches (weights, engines) the agents report as queued, running or failed."""
    return [
        Progress(node=node, kind=f"fetch {fetch.kind}", name=fetch.target,
                 done_bytes=fetch.bytes_done, total_bytes=fetch.bytes_total,
                 state=fetch.state + (f": {fetch.error}" if fetch.error else ""))
        for node, report in sorted(fleet.nodes.items())
        for fetch in report.fetches if fetch.state != "done"
    ]
