"""Meaning checks on the parts of a cluster whose shape is valid.

When pydantic rejects part of a cluster directory, the rest still deserves
its meaning checks in the same run — an operator should not fix one error to
be shown the next. This module builds the largest valid cluster it can from
the merged data: without the offending keys first; then without the profiles
still failing (each replaced, so later profiles keep their indices, by a
placeholder whose own problems are never reported); last without whole
entries. Problems about what was left out are not reported again.

A purely computational module: data in, :class:`~llmgw.spec.checks.Problem` out.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pydantic

from llmgw.spec import checks
from llmgw.spec.models import Cluster

DataPath = tuple[str | int, ...]
COLLECTIONS = ("fabrics", "nodes", "models", "projects", "engines", "upstreams")
# Valid anywhere, needs nothing from the fleet: meaning checks find nothing to say about it.
PLACEHOLDER: dict[str, Any] = {"engine": "llama.cpp", "cpu": True,
                               "source": checks.PLACEHOLDER_SOURCE}


def problems(
    merged: dict[str, Any], bad_paths: set[DataPath],
    data_path: Callable[[tuple[int | str, ...], Any], DataPath],
) -> list[checks.Problem]:
    """Meaning problems of the valid parts; ``data_path`` maps pydantic locs to data paths."""
    partial = copy.deepcopy(merged)
    for path in bad_paths:
        _remove_key(partial, path)
    if any(p[:1] == ("cluster",) for p in bad_paths):
        partial["cluster"] = {"name": "partial"}
    dropped: set[tuple[str, str]] = set()
    placeholders: set[tuple[str, int]] = set()
    for _ in range(3):
        try:
            cluster = Cluster.model_validate(partial)
            break
        except pydantic.ValidationError as exc:
            for item in exc.errors(include_url=False):
                path = data_path(item["loc"], partial)
                if _is_profile(path) and (str(path[1]), int(path[3])) not in placeholders:
                    placeholders.add((str(path[1]), int(path[3])))
                    partial["models"][path[1]]["profiles"][path[3]] = dict(PLACEHOLDER)
                elif len(path) >= 2 and path[0] in COLLECTIONS:
                    dropped.add((str(path[0]), str(path[1])))
                    partial[path[0]].pop(path[1], None)
    else:
        return []  # nothing we could isolate; the shape errors already say enough
    return [
        p for p in checks.check(cluster, dropped=dropped)
        if not (_is_profile(p.path) and (str(p.path[1]), int(p.path[3])) in placeholders)
    ]


def _is_profile(path: DataPath) -> bool:
    return (len(path) >= 4 and path[0] == "models" and path[2] == "profiles"
            and isinstance(path[3], int))


def _remove_key(data: Any, path: DataPath) -> None:
    """Drop the key at ``path`` below entry level (a whole entry is dropped later, if need be)."""
    for step in path[:-1]:
        if isinstance(data, dict) and step in data:
            data = data[step]
        elif isinstance(data, list) and isinstance(step, int) and step < len(data):
            data = data[step]
        else:
            return
    if isinstance(data, dict) and len(path) > 2:
        if path[-1] == "source" and path[-1] in data:
            # A malformed source is still a source: "no source" would be a second,
            # wrong error about the same line.
            data["source"] = PLACEHOLDER["source"]
            return
        data.pop(path[-1], None)
