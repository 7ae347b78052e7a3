"""What a plan says about upstreams: declared in the files against what routers use now.

The leader publishes each upstream's summary with the routes
(:func:`llmgw.spec.upstreams.summary`: the URL, whether a key is sent, the
models and how each is used, the cap; never the key); ``llmgw plan`` reads it
from the store and compares. Upstreams change nothing on the nodes, so they
are listed apart from the plan's changes and never count in its summary.

A purely computational module.

Usage::

    found = upstreams.changes(spec_upstreams.summary(cluster), published)
    print("\n".join(upstreams.lines(found)))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Summary = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class UpstreamChange:
    action: str  # "add", "remove", "change", "keep"
    name: str
    details: tuple[str, ...] = ()


def changes(declared: Summary, running: Summary | None) -> list[UpstreamChange]:
    """Each upstream declared or running, by name. ``running`` None: nothing published
    (no store, or no leader yet): every declared upstream is an addition."""
    running = running or {}
    found = []
    for name in sorted(set(declared) | set(running)):
        new, old = declared.get(name), running.get(name)
        if new is None:
            found.append(UpstreamChange("remove", name, (describe(old or {}),)))
        elif old is None:
            found.append(UpstreamChange("add", name, (describe(new),)))
        elif _plain(old) != _plain(new):
            found.append(UpstreamChange("change", name, tuple(_differences(old, new))))
        else:
            found.append(UpstreamChange("keep", name, (describe(new),)))
    return found


SYMBOLS = {"add": "+", "remove": "-", "change": "~", "keep": " "}


def lines(found: list[UpstreamChange]) -> list[str]:
    """The plan's upstreams section as text; empty when there are none."""
    if not found:
        return []
    out = ["", "Upstreams (the routers' now → the cluster files):"]
    for change in found:
        first, *rest = change.details or ("",)
        out.append(f"  {SYMBOLS[change.action]} {change.name}: {first}".rstrip())
        out.extend(f"      {detail}" for detail in rest)
    counts = {action: sum(c.action == action for c in found) for action in SYMBOLS}
    out.append(f"Upstreams: {counts['add']} to add, {counts['change']} to change, "
               f"{counts['remove']} to remove.")
    return out


def describe(entry: Mapping[str, Any]) -> str:
    """One upstream's summary in a line: its URL, key, cap and models."""
    models = ", ".join(f"{served} → {model} ({use})" for served, (model, use)
                       in sorted(dict(entry.get("models") or {}).items()))
    key = "with a key" if entry.get("key") else "no key"
    cap = entry.get("max_in_flight")
    return f"{entry.get('url')} ({key}{f', at most {cap} in flight' if cap else ''}): {models}"


def _differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    found = []
    if old.get("url") != new.get("url"):
        found.append(f"url {old.get('url')} → {new.get('url')}")
    if bool(old.get("key")) != bool(new.get("key")):
        found.append("a key is sent" if new.get("key") else "no key is sent any more")
    if old.get("max_in_flight") != new.get("max_in_flight"):
        found.append(f"max_in_flight {old.get('max_in_flight') or 'no cap'} → "
                     f"{new.get('max_in_flight') or 'no cap'}")
    was, now = dict(old.get("models") or {}), dict(new.get("models") or {})
    for served in sorted(set(was) | set(now)):
        if served not in was:
            found.append(f"+ {served} → {now[served][0]} ({now[served][1]})")
        elif served not in now:
            found.append(f"- {served}")
        elif list(was[served]) != list(now[served]):
            found.append(f"{served}: {was[served][0]} ({was[served][1]}) → "
                         f"{now[served][0]} ({now[served][1]})")
    return found


def _plain(entry: Mapping[str, Any]) -> Any:
    return {"url": entry.get("url"), "key": bool(entry.get("key")),
            "max_in_flight": entry.get("max_in_flight"),
            "models": {k: list(v) for k, v in dict(entry.get("models") or {}).items()}}
