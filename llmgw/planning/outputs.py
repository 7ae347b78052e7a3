"""A plan for people and machines: text, Markdown, JSON.

* :func:`text` — terraform-like: ``+`` create, ``-`` destroy, ``-/+``
  replace by destroying first, ``+/-`` replace by creating first, ``~``
  restart; then what cannot be placed (``!``) and what is unknown (``?``);
  the last line is ``Plan: 2 to create, 1 to replace, 0 to destroy.``
* :func:`markdown` — for pull request comments: the summary table first,
  capacity per GPU class before and after, per-model details collapsed in
  ``<details>``; never longer than :data:`MARKDOWN_LIMIT` characters.
* :func:`json_text` — everything, versioned by ``format_version``.

Nothing here reads a secret: plans hold paths of secret files, never values.
What nodes and engines said, and what pull requests wrote, is free text that
may hold one anyway; every format passes each such text (reasons, evidence,
notes, warnings, holds) through :func:`llmgw.spec.secrets.scrub` first
(:func:`public`). The Markdown comment, posted where anyone may read it, also
leaves engine output out unless asked and breaks ``@mentions``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from llmgw.planning import drifts, installs
from llmgw.planning.types import (
    FORMAT_VERSION,
    Attempt,
    Change,
    ObservedShard,
    Plan,
    Shard,
    Unplaceable,
)
from llmgw.spec import secrets
from llmgw.spec.quantities import count

MARKDOWN_LIMIT = 60_000
_NODES_SHOWN = 3  # nodes named per identical reason before "+N more"

SYMBOLS = {
    "create": "+",
    "destroy": "-",
    "restart": "~",
    "hold": "=",
    "create-before-destroy": "+/-",
    "destroy-before-create": "-/+",
}


def symbol(change: Change) -> str:
    if change.action == "replace":
        return SYMBOLS[change.strategy or "destroy-before-create"]
    return SYMBOLS[change.action]


def gpu_list(indices: Sequence[int]) -> str:
    """``(0, 1, 2, 3)`` → ``0-3``; ``(0, 2, 3)`` → ``0,2-3``."""
    if not indices:
        return "-"
    parts: list[str] = []
    ordered = sorted(indices)
    start = prev = ordered[0]
    for index in [*ordered[1:], None]:
        if index is not None and index == prev + 1:
            prev = index
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if index is not None:
            start = prev = index
    return ",".join(parts)


def where(shards: Iterable[Shard | ObservedShard]) -> str:
    """``gpu-a-01 [0-7], gpu-a-02 [0-7]``; CPU shards show the node alone."""
    return ", ".join(f"{s.node} [{gpu_list(s.gpus)}]" if s.gpus else s.node for s in shards)


def headline(change: Change) -> str:
    """``llama-3.1-8b r0 will be replaced by r1 (create before destroy)``."""
    name = f"{change.model} r{change.replica}"
    if change.action == "create":
        return f"{name} will be created"
    if change.action == "destroy":
        return f"{name} will be destroyed"
    if change.action == "restart":
        return f"{name} will be restarted"
    if change.action == "hold":
        return f"{name} will be held (stopped, not restarted)"
    if change.strategy == "create-before-destroy":
        return f"{name} will be replaced by r{change.new_replica} (create before destroy)"
    return f"{name} will be replaced (destroy, then create: no room beside it)"


def group_reasons(reasons: Sequence[tuple[str, str]]) -> list[str]:
    """Per-node reasons with identical text folded into one line.

    ``[("a", "cordoned"), ("b", "cordoned")]`` → ``["a, b: cordoned"]``; more
    than three nodes become ``a, b, c (+5 more): ...``. General lines (no
    node) come first, in order.
    """
    general = [reason for node, reason in reasons if not node]
    by_text: dict[str, list[str]] = {}
    for node, reason in reasons:
        if node:
            by_text.setdefault(reason, []).append(node)
    lines = list(general)
    for reason, nodes in by_text.items():
        shown = ", ".join(nodes[:_NODES_SHOWN])
        more = f" (+{len(nodes) - _NODES_SHOWN} more)" if len(nodes) > _NODES_SHOWN else ""
        lines.append(f"{shown}{more}: {reason}")
    return lines


# -- what a plan may show -----------------------------------------------------------


def public(plan: Plan, engine_output: bool = True) -> Plan:
    """``plan`` with every free text scrubbed of secrets (:mod:`llmgw.spec.secrets`);
    without ``engine_output``, the reasons that quote an engine say only that it failed
    (``Plan.quotes``). The shards' specs and unit files are the cluster's, which
    ``llmgw validate`` keeps free of secret values, and stay as they are: ``apply`` runs them.
    """
    quotes = {} if engine_output else dict(plan.quotes)

    def said(line: str) -> str:
        for quoted, plain in quotes.items():
            if quoted in line:
                line = line.replace(quoted, plain)
        return secrets.scrub(line)

    return _texts(plan, said)


def _texts(plan: Plan, said: Callable[[str], str]) -> Plan:
    def each(lines: Iterable[str]) -> tuple[str, ...]:
        return tuple(said(line) for line in lines)

    return replace(
        plan,
        changes=tuple(replace(c, reasons=each(c.reasons), evidence=each(c.evidence),
                              shards=tuple(replace(s, weights=said(s.weights))
                                           for s in c.shards))
                      for c in plan.changes),
        unplaceable=tuple(replace(u, wanted=said(u.wanted), note=said(u.note), attempts=tuple(
            replace(a, reasons=tuple((node, said(reason)) for node, reason in a.reasons))
            for a in u.attempts)) for u in plan.unplaceable),
        unknown=tuple(replace(u, reasons=each(u.reasons)) for u in plan.unknown),
        held=tuple(replace(h, reasons=each(h.reasons), evidence=each(h.evidence))
                   for h in plan.held),
        holds=tuple(replace(h, reason=said(h.reason)) for h in plan.holds),
        warnings=each(plan.warnings),
        scaling=each(plan.scaling),
        quotes={},
    )


# -- text ---------------------------------------------------------------------


def text(plan: Plan) -> str:
    """The plan as a terminal shows it."""
    plan = public(plan)
    out = [_title(plan), ""]
    if not plan.changes:
        out += [_no_changes(plan), ""]
    for change in plan.changes:
        out += _text_change(change)
        out.append("")
    if plan.unplaceable:
        out += ["Cannot be placed:", ""]
        for entry in plan.unplaceable:
            out += _text_unplaceable(entry)
            out.append("")
    if plan.unknown:
        out += ["Unknown (their nodes did not answer; kept as they are, not placed again):", ""]
        for unknown in plan.unknown:
            out.append(f"  ? {unknown.model} r{unknown.replica} on {', '.join(unknown.nodes)}")
            out += [f"      {reason}" for reason in unknown.reasons]
            out.append("")
    if plan.held:
        out += ["Held (drift shown, not repaired):", ""]
        for held in plan.held:
            out.append(f"  = {held.model} r{held.replica} on {', '.join(held.nodes)} "
                       f"({drifts.title(held.drift)})")
            out += [f"      {reason}" for reason in held.reasons]
            out += [f"      evidence: {line}" for line in held.evidence]
            out.append("")
    if plan.holds:
        out += ["Held (not replaced again until a commit changes the model or "
                "`llmgw apply --retry`):", ""]
        out += [f"  = {hold.model}: {hold.line()}" for hold in plan.holds] + [""]
    if plan.scaling:
        out += ["Autoscaling:", *(f"  ~ {line}" for line in plan.scaling), ""]
    if plan.warnings:
        out += ["Warnings:", *(f"  - {w}" for w in plan.warnings), ""]
    out.append(plan.summary())
    return _lines(out)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _lines(lines: Sequence[str]) -> str:
    """The output, one line per entry: a control character inside an entry (an engine
    argument from a pull request, a node's error text) is shown escaped, so it can
    neither move the terminal's cursor nor start a line of its own (a Markdown fence)."""
    return "".join(_CONTROL.sub(_escape, line) + "\n" for line in lines)


def _escape(match: re.Match[str]) -> str:
    char = match.group(0)
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char)
    code = ord(char)
    return named or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def _no_changes(plan: Plan) -> str:
    if plan.unplaceable:
        return "No changes can be made, and the fleet does not match the cluster: " \
            "replicas cannot be placed (see below)."
    if plan.held:
        return "No changes: what differs is held, not repaired (see below)."
    if plan.holds:
        return "No changes: the fleet does not match the cluster, but what differs is held " \
            "after a failed rollout gate (see below)."
    if installs.holds(plan):
        return "No changes can be made yet: replaces wait for engine installs (see below)."
    if plan.unknown:
        return "No changes: the fleet matches the cluster on every node that answered."
    return "No changes: the fleet matches the cluster."


def _title(plan: Plan) -> str:
    reachable = sum(1 for n in plan.nodes if n.reachable)
    down = len(plan.nodes) - reachable
    nodes = count(len(plan.nodes), "node") + (f" ({down} not reachable)" if down else "")
    revision = f" · revision {plan.revision}" if plan.revision else ""
    return f"llmgw plan · cluster {plan.cluster}{revision} · {nodes} · at {_time(plan.now)}"


def _time(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _text_change(change: Change) -> list[str]:
    out = [f"  {symbol(change)} {headline(change)}"]
    kind = drifts.title(change.drift)
    out += [f"      why ({kind}): {reason}" for reason in change.reasons]
    out += [f"      evidence: {line}" for line in change.evidence]
    if change.drain:
        out.append("      drained first: out of the routes, then stopped once its requests "
                   "in flight finish")
    if change.shards:
        first = change.shards[0]
        out.append(f"      {_describe(first)}")
    if change.action == "replace":
        out += [f"      was {_shard_line(s)}" for s in change.removes]
        for shard in change.shards:
            out.append(f"      now {_shard_line(shard)}")
            out += [f"          weights: {shard.weights}"] if shard.weights else []
    elif change.action == "destroy":
        out += [f"      {_shard_line(s)}" for s in change.removes]
    else:
        for shard in change.shards:
            out.append(f"      {_shard_line(shard)}")
            out += [f"          weights: {shard.weights}"] if shard.weights else []
    return out


def _describe(shard: Shard) -> str:
    fabric = shard.spec.get("fabric")
    per_node = f"{len(shard.gpus)} {shard.gpu_class}" if shard.gpus else "cpu"
    nodes = f"{shard.ranks} nodes × {per_node}" if shard.ranks > 1 else per_node
    return f"{shard.engine} · {nodes}" + (f" · fabric {fabric}" if fabric else "")


def _shard_line(shard: Shard | ObservedShard) -> str:
    gpus = f"  GPUs {gpu_list(shard.gpus)}" if shard.gpus else ""
    port = f"  port {shard.port}" if shard.port is not None else ""
    state = f"  ({shard.state})" if isinstance(shard, ObservedShard) else ""
    return f"s{shard.rank} {shard.node}{gpus}{port}  {shard.unit}  digest {shard.digest}{state}"


def _text_unplaceable(entry: Unplaceable) -> list[str]:
    replicas = ", ".join(f"r{r}" for r in entry.replicas)
    out = [f"  ! {entry.model} {replicas}: {entry.wanted}"]
    if entry.note:
        out.append(f"      {entry.note}")
    for attempt in entry.attempts:
        out += _text_attempt(attempt)
    return out


def _text_attempt(attempt: Attempt) -> list[str]:
    out = [f"      profile {attempt.profile} ({attempt.label}):"]
    out += [f"        {line}" for line in group_reasons(attempt.reasons)]
    return out


# -- markdown -------------------------------------------------------------------


def markdown(plan: Plan, limit: int = MARKDOWN_LIMIT, engine_output: bool = False) -> str:
    """The plan as a pull request comment, at most ``limit`` characters.

    An engine's output is quoted only with ``engine_output``; otherwise a crash's reason
    says which unit failed and how, not what the engine printed. No ``@mention`` in
    it pings anyone (:func:`_unmentioned`).
    """
    plan = public(plan, engine_output)
    head = [f"### llmgw plan for `{plan.cluster}`", ""]
    head += [f"**{plan.summary()}**", ""]
    rows = _markdown_rows(plan)
    footer = [
        "",
        f"<sub>Observed {_time(plan.now)}"
        + (f" · revision `{plan.revision}`" if plan.revision else "")
        + f" · {count(len(plan.nodes), 'node')} · plan format {FORMAT_VERSION}</sub>",
    ]
    budget = limit - len("\n".join(head + footer)) - 400
    table = ["| | model | replica | change | where | why |", "|:-:|---|---|---|---|---|"]
    used = len("\n".join(table))
    for index, row in enumerate(rows):
        if used + len(row) + 1 > budget // 2:
            table.append(f"| | | | | | …and {len(rows) - index} more rows: run `llmgw plan` |")
            break
        table.append(row)
        used += len(row) + 1
    if not rows:
        table = [_no_changes(plan)]
    body = head + table + [""] + _markdown_capacity(plan)
    remaining = limit - len("\n".join(body + footer)) - 200
    details, left_out = _markdown_details(plan, remaining)
    body += details
    if left_out:
        body += ["", f"Details of {left_out} more model{'s' if left_out != 1 else ''} left out "
                     f"to stay under {limit:,} characters; run `llmgw plan` for all of it."]
    if plan.warnings:
        warnings = ["", "**Warnings**", ""] + [f"- {_cell(w)}" for w in plan.warnings]
        if len("\n".join(body + warnings + footer)) < limit:
            body += warnings
    return _lines([_unmentioned(line) for line in body + footer])


_MENTION = re.compile(r"@(?=[A-Za-z0-9_-])")


def _unmentioned(line: str) -> str:
    """``@someone`` with a zero-width space after the ``@``: GitHub links and notifies
    nobody (notes, engine output and error lines are free text; names cannot hold ``@``)."""
    return _MENTION.sub("@\u200b", line)


def _markdown_rows(plan: Plan) -> list[str]:
    rows = []
    for change in plan.changes:
        shards = change.removes if change.action == "destroy" else change.shards
        what: str = change.action
        if change.action == "replace":
            what = ("replace: create before destroy" if change.strategy == "create-before-destroy"
                    else "replace: destroy, then create")
        why = f"{drifts.title(change.drift)}: " + "; ".join(change.reasons)
        rows.append(_row(f"`{symbol(change)}`", change.model, f"r{change.replica}", what,
                         where(shards), _inert(why)))
    for entry in plan.unplaceable:
        replicas = ", ".join(f"r{r}" for r in entry.replicas)
        rows.append(_row("`!`", entry.model, replicas, "cannot be placed", "—",
                         _inert(entry.wanted)))
    for unknown in plan.unknown:
        rows.append(_row("`?`", unknown.model, f"r{unknown.replica}", "unknown",
                         ", ".join(unknown.nodes), _inert("; ".join(unknown.reasons))))
    for held in plan.held:
        rows.append(_row("`=`", held.model, f"r{held.replica}", "held", ", ".join(held.nodes),
                         _inert(f"{drifts.title(held.drift)}: " + "; ".join(held.reasons))))
    for hold in plan.holds:
        rows.append(_row("`=`", hold.model, "—", "held", "—", _inert(hold.line())))
    return rows


_MARKUP = re.compile(r"([\\`\[\]])")  # links, images, code spans; emphasis is harmless


def _inert(text: str) -> str:
    """Reasons quote values from pull requests and nodes: in a comment they must stay
    text — no link, image, emphasis or code span of theirs is rendered."""
    return _MARKUP.sub(r"\\\1", text)


def _row(*cells: str) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")


def _markdown_capacity(plan: Plan) -> list[str]:
    if not plan.capacity:
        return []
    out = ["**GPUs by class** (reachable nodes)", "",
           "| class | total | faulty | in use before | in use after | free after |",
           "|---|--:|--:|--:|--:|--:|"]
    for row in plan.capacity:
        out.append(f"| {row.gpu_class} | {row.total} | {row.faulty} | {row.used_before} | "
                   f"{row.used_after} | {row.free_after} |")
    return [*out, ""]


def _markdown_details(plan: Plan, budget: int) -> tuple[list[str], int]:
    models = sorted({c.model for c in plan.changes} | {u.model for u in plan.unplaceable})
    out: list[str] = []
    used = 0
    for position, model in enumerate(models):
        changes = [c for c in plan.changes if c.model == model]
        lines: list[str] = []
        for change in changes:
            lines += _text_change(change)
        for entry in plan.unplaceable:
            if entry.model == model:
                lines += _text_unplaceable(entry)
        counts = ", ".join(
            f"{sum(1 for c in changes if c.action == a)} to {a}"
            for a in ("create", "replace", "destroy", "restart")
            if any(c.action == a for c in changes)
        ) or "cannot be placed"
        block = [f"<details><summary><b>{model}</b>: {counts}</summary>", "", "```text",
                 *(line.replace("```", "'''") for line in lines), "```", "</details>", ""]
        size = len("\n".join(block)) + 1
        if used + size > budget:
            return out, len(models) - position
        out += block
        used += size
    return out, 0


# -- json ---------------------------------------------------------------------


def json_text(plan: Plan) -> str:
    """The whole plan as JSON (``format_version`` first), unit texts included; free texts
    scrubbed of secrets (:func:`public`)."""
    return json.dumps(to_dict(public(plan)), indent=2, ensure_ascii=False) + "\n"


def to_dict(plan: Plan) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "cluster": plan.cluster,
        "revision": plan.revision,
        "now": plan.now,
        "summary": {
            **{action: plan.count(action)
               for action in ("create", "replace", "destroy", "restart", "hold")},
            "unplaceable": plan.unplaced,
            "held": len(plan.held),
            "unknown": len(plan.unknown),
            "text": plan.summary(),
        },
        "changes": [_change_dict(change) for change in plan.changes],
        "unplaceable": [
            {
                "model": entry.model,
                "replicas": list(entry.replicas),
                "wanted": entry.wanted,
                "note": entry.note,
                "attempts": [
                    {"profile": a.profile, "label": a.label,
                     "reasons": [{"node": node or None, "reason": reason}
                                 for node, reason in a.reasons]}
                    for a in entry.attempts
                ],
            }
            for entry in plan.unplaceable
        ],
        "unknown": [
            {"model": u.model, "replica": u.replica, "nodes": list(u.nodes),
             "drift": "node_lost", "reasons": list(u.reasons)}
            for u in plan.unknown
        ],
        "held": [
            {"model": h.model, "replica": h.replica, "nodes": list(h.nodes), "drift": h.drift,
             "reasons": list(h.reasons), "evidence": list(h.evidence)}
            for h in plan.held
        ],
        "capacity": [
            {"gpu_class": r.gpu_class, "total": r.total, "faulty": r.faulty,
             "used_before": r.used_before, "used_after": r.used_after,
             "free_after": r.free_after}
            for r in plan.capacity
        ],
        "nodes": [{"node": n.node, "reachable": n.reachable, "digest": n.digest}
                  for n in plan.nodes],
        "warnings": list(plan.warnings),
    } | ({"holds": [{"model": h.model, "revision": h.revision, "digest": h.digest,
                     "reason": h.reason, "held_at": h.held_at, "line": h.line()}
                    for h in plan.holds]} if plan.holds else {}) | (
        {"scaling": list(plan.scaling)} if plan.scaling else {})


def _change_dict(change: Change) -> dict[str, Any]:
    return {
        "action": change.action,
        "model": change.model,
        "replica": change.replica,
        "strategy": change.strategy,
        "new_replica": change.new_replica,
        "drift": change.drift,
        "reasons": list(change.reasons),
        "evidence": list(change.evidence),
        "drain": change.drain,
        "shards": [
            {
                "node": s.node, "unit": s.unit, "rank": s.rank, "engine": s.engine,
                "gpu_class": s.gpu_class, "gpus": list(s.gpus), "port": s.port,
                "digest": s.digest, "spec": dict(s.spec), "weights": s.weights or None,
                "unit_text": s.files.unit_text if s.files else None,
                "env_text": s.files.env_text if s.files else None,
                "secret_env": dict(s.files.secret_env) if s.files else {},
            }
            for s in change.shards
        ],
        "removes": [
            {"node": s.node, "unit": s.unit, "rank": s.rank, "digest": s.digest,
             "state": s.state, "gpus": list(s.gpus), "port": s.port}
            for s in change.removes
        ],
    }
