"""Path sources the agent serves stay in the node's weights directories.

The planner places a path source only on a node whose ``weights_dirs`` hold
it, judged by its text. A symlink inside a weights directory can still point
anywhere (``/models/m.gguf -> /etc/shadow``), and an engine would open what
it points at; so before a unit starts, the agent resolves the path as the
engine will and refuses the unit if the real file lies outside every weights
directory (each resolved too: ``/models`` may itself be a link to a disk).

A node that declares no weights directories serves no path source, as the
planner places none there. A path that does not exist is let through: the
engine fails on it with its own error, and nothing is read.

>>> refusal("/models/m.gguf", ("/models",), realpath=lambda p: p) is None
True
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from llmgw.agent import fetchers
from llmgw.proto.conversions import UnitChange
from llmgw.spec import sources


def refusal(path: str, weights_dirs: Sequence[str],
            realpath: Callable[[str], str] = os.path.realpath) -> str | None:
    """Why an engine may not open ``path`` here (it resolves out of ``weights_dirs``, or
    the node declares none)."""
    if not weights_dirs:
        return (f"refused: {path}: this node declares no weights_dirs; an engine serves "
                "only files under them")
    real = realpath(path)
    if sources.within(real, [realpath(d) for d in weights_dirs]):
        return None
    shown = f"{path} (a link to {real})" if real != path else path
    return (f"refused: {shown} is outside this node's weights_dirs "
            f"({', '.join(weights_dirs)}); an engine serves only files under them")


def refusals(changes: Sequence[UnitChange], weights_dirs: Sequence[str]) -> dict[str, str]:
    """Unit name → why it may not start, for each of ``changes`` that may not (it reads
    the file system: resolving links may block, so callers run it in a thread)."""
    return {c.name: why for c in changes if (why := refused(c, weights_dirs)) is not None}


def refused(change: UnitChange, weights_dirs: Sequence[str]) -> str | None:
    """Why ``change`` may not start: its spec's path source, or one of its LoRA adapters
    (``adapters``: paths, which are all an adapter may be), resolves out of
    ``weights_dirs``."""
    if change.action != "start":
        return None
    spec = fetchers.spec_of(change.unit_text, change.name)
    text = spec.get("source")
    adapters = spec.get("adapters")
    paths = [text] if isinstance(text, str) and sources.is_path(text) else []
    for adapter in adapters if isinstance(adapters, list) else ():
        if not isinstance(adapter, str) or not sources.is_path(adapter):
            return f"refused: the LoRA adapter {adapter!r} is not a path on this node"
        paths.append(adapter)
    for path in paths:
        try:
            source = sources.parse(path)
        except sources.SourceError as exc:
            return f"refused: {exc}"
        why = refusal(source.path or path, weights_dirs)
        if why is not None:
            return why
    return None
