"""Which models a request may name: its project's ``models:`` allow-list.

Every endpoint that names a model (``/v1/chat/completions``,
``/v1/completions``, ``/v1/embeddings``, ``/v1/responses``, LoRA adapters by
their own names) calls :func:`check` before the name is looked up, and the
model list (``GET /v1/models``, /chat, /account) goes through :func:`listed`.

**Nothing about other models leaks.** A name outside the project's allow-list
gets the same 403 ``model_not_allowed``, with the same words, whether or not
the cluster serves it, so a key cannot probe for models its project may not
see; ``GET /v1/models/{name}`` answers 404 for it, as for a name nobody
serves. A name inside the allow-list that nothing serves still gets 404
``model_not_found``: the project's own patterns already tell it that name.

A request without a project (``auth: none``) and a project without
``models:`` may name any model. Matching rules: :mod:`llmgw.spec.allowlists`.
A purely computational module with no side effects.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.router.catalogs import Catalog
from llmgw.router.errors import ApiError
from llmgw.spec import allowlists

NOT_ALLOWED = "model_not_allowed"


def allows(catalog: Catalog, project: str | None, name: str) -> bool:
    """Whether ``project`` (None: no project) may call the served name ``name``."""
    if project is None:
        return True
    return allowlists.allows(catalog.access.get(project), name)


def check(catalog: Catalog, project: str | None, name: str) -> None:
    """Raise the 403 ``model_not_allowed`` when ``project`` may not call ``name``."""
    if not allows(catalog, project, name):
        raise ApiError(403, f"project {project!r} may not call model {name!r} (the model is "
                       "not in the project's `models:` list); GET /v1/models lists the "
                       "models this key may call", code=NOT_ALLOWED, param="model")


def listed(catalog: Catalog, projects: Iterable[str | None], names: Iterable[str]) -> list[str]:
    """The names among ``names`` that at least one of ``projects`` may call, in order."""
    chosen = list(projects)
    return [n for n in names if any(allows(catalog, p, n) for p in chosen)]


def projects_for(catalog: Catalog, projects: Iterable[str], name: str) -> list[str]:
    """Those of ``projects`` that may call ``name`` (where /chat may send it), in order."""
    return [p for p in projects if allows(catalog, p, name)]
