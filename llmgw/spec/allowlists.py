"""Which served names a project may call: its ``models:`` allow-list of names and globs.

A pattern is a served name (a model's ``served_name`` or key, or a LoRA
adapter's ``name``) or a glob of one: ``*`` matches any run of characters,
``?`` one character, case-sensitively (:func:`fnmatch.fnmatchcase`; the
pattern's rule in :mod:`llmgw.spec.identifiers` leaves no ``[`` for classes).
An adapter is matched by its own name only: allowing ``llama-8b`` does not
allow its adapter ``sql-expert`` (an adapter may be priced, or trained on data,
apart from its base), so a project that should have both lists both, or a
glob that covers both.

``None`` (no ``models:``) allows every name; ``[]`` allows none. A pattern
that matches no served name of the cluster is an error (:func:`problems`):
there is no warning channel in ``validate``, and a typo in an allow-list
silently takes a model away from a whole team.

A purely computational module with no side effects.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmgw.spec.models import Cluster

Patterns = Sequence[str] | None  # None: every model


def allows(patterns: Patterns, name: str) -> bool:
    """Whether a project with ``patterns`` may call the served name ``name``."""
    return patterns is None or any(fnmatchcase(name, p) for p in patterns)


def allowed(patterns: Patterns, names: Iterable[str]) -> list[str]:
    """The names among ``names`` that ``patterns`` allows, in their order."""
    return [n for n in names if allows(patterns, n)]


def served_names(cluster: Cluster) -> list[str]:
    """Every name a client may send: each model's served name and each adapter's."""
    names = []
    for key, model in cluster.models.items():
        names.append(model.served_name or key)
        names.extend(adapter.name for adapter in model.adapters)
    declared = set(names)
    # Names no model declares that upstreams serve (llmgw.spec.upstreams).
    names.extend({served for upstream in cluster.upstreams.values()
                  for served in upstream.models if served not in declared})
    return sorted(names)


def problems(cluster: Cluster) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(data path, message) for each pattern of a project that matches no served name."""
    names = served_names(cluster)
    for project, spec in cluster.projects.items():
        for index, pattern in enumerate(spec.models or ()):
            if not allowed([pattern], names):
                known = ", ".join(names[:10]) + (", …" if len(names) > 10 else "") or "none"
                yield (("projects", project, "models", index),
                       f"projects.{project}.models[{index}]: {pattern!r} matches no model or "
                       f"adapter of this cluster (served names: {known}); clients call "
                       "models by their served_name")
