"""/admin/catalog: the models the cluster's mirror holds, what fits, and adding one as a diff.

The mirror is ``cluster.weights.endpoint`` (a site's ``llmgw mirror serve``),
asked as ``llmgw models`` asks a hub (:mod:`llmgw.hub.listings`), in a thread
and within its timeouts, never the public hub unasked. A repo's page shows
its files, its figures and the fit on the cluster's GPU classes
(:mod:`llmgw.planning.fits`); "Add this model" answers with a new cluster
file as a git diff to commit, and the fit check's verdict on it. Nothing is
written: the cluster directory is git's, and a model is a pull request.
What a mirror says is text nobody here wrote: it is escaped by the templates.
"""

from __future__ import annotations

import asyncio
import json
import re
from functools import partial
from typing import TYPE_CHECKING

from aiohttp import web

from llmgw.hub import listings
from llmgw.hub.listings import Listing, ListingError
from llmgw.planning import fits
from llmgw.spec import checks, identifiers
from llmgw.spec.models import Cluster, Model
from llmgw.spec.shapes import Shape

if TYPE_CHECKING:
    from llmgw.web.pages import Pages

CONTEXTS = (8192, 32768)
ENGINES = ("vllm", "sglang", "llama.cpp")
NAME = re.compile(identifiers.PATTERNS["name"][0])
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
SEARCH_LIMIT = 50


def install(pages: Pages, add: web.UrlDispatcher) -> None:
    add.add_get("/admin/catalog", partial(_catalog, pages))
    add.add_get("/admin/catalog/{org}/{name}", partial(_model, pages))
    add.add_post("/admin/catalog/{org}/{name}", partial(_add, pages))


def classes(cluster: Cluster) -> list[str]:
    """The GPU classes the cluster's nodes declare, else a few common ones."""
    table = checks.known_classes(cluster)
    declared = sorted({d.gpu_class for n in cluster.nodes.values() for d in n.gpus
                       if d.gpu_class in table})
    return declared or [c for c in fits.CATALOG_CLASSES if c in table]


def _endpoint(pages: Pages) -> str | None:
    return pages.cluster().cluster.weights.endpoint


async def _catalog(pages: Pages, request: web.Request) -> web.StreamResponse:
    pages.need(request, admin=True)
    text = request.query.get("q", "")
    if len(text) > 200 or not text.isprintable():
        raise web.HTTPBadRequest(text="the search is at most 200 printable characters")
    endpoint, rows, error = _endpoint(pages), [], None
    if endpoint is not None:
        try:
            rows = await asyncio.to_thread(_search, endpoint, text)
        except ListingError as exc:
            error = str(exc)
    return pages.render(request, "admin_catalog.html", endpoint=endpoint, q=text, rows=rows,
                        error=error)


def _search(endpoint: str, text: str) -> list[Listing]:
    found = []
    for repo in listings.hub_search(endpoint, text, SEARCH_LIMIT):
        try:
            found.append(listings.from_hub(endpoint, repo, header=False))
        except ListingError:
            continue  # listed but not describable: left out, as a search would
    return found


def _repo(request: web.Request) -> str:
    org, name = request.match_info["org"], request.match_info["name"]
    if not (_SEGMENT.match(org) and _SEGMENT.match(name)) or "--" in org + name \
            or ".." in org + name:
        raise web.HTTPNotFound(text="not a repository id")
    return f"{org}/{name}"


async def _listing(pages: Pages, repo: str) -> Listing:
    endpoint = _endpoint(pages)
    if endpoint is None:
        raise web.HTTPNotFound(text="no mirror: set cluster.weights.endpoint")
    try:
        return await asyncio.to_thread(listings.from_hub, endpoint, repo)
    except ListingError as exc:
        raise web.HTTPNotFound(text=str(exc)) from None


def fit_rows(listing: Listing, names: list[str], cluster: Cluster) -> list[tuple[str, str]]:
    table = checks.known_classes(cluster)
    found = fits.of_shape(listing.shape(), listing.loaded)
    return [(name, fits.fit_line(found, table[name], CONTEXTS)) for name in names]


async def _model(pages: Pages, request: web.Request) -> web.StreamResponse:
    visitor = pages.need(request, admin=True)
    repo = _repo(request)
    listing = await _listing(pages, repo)
    cluster = pages.cluster()
    names = classes(cluster)
    return pages.render(request, "admin_catalog_model.html", visitor=visitor, listing=listing,
                        fit=fit_rows(listing, names, cluster), classes=names, engines=ENGINES,
                        suggested=_suggested(repo, cluster), proposal=None)


def _suggested(repo: str, cluster: Cluster) -> str:
    base = re.sub(r"[^a-z0-9._-]+", "-", repo.rsplit("/", 1)[-1].lower()).strip("-._")
    base = (base or "model")[:48]
    name, number = base, 2
    while name in cluster.models:
        name, number = f"{base}-{number}", number + 1
    return name


async def _add(pages: Pages, request: web.Request) -> web.StreamResponse:
    visitor = pages.need(request, admin=True)
    data = await pages.form(request, visitor)
    repo = _repo(request)
    cluster = pages.cluster()
    names = classes(cluster)
    name, gpu_class, engine = (data.get("model", ""), data.get("gpu_class", ""),
                               data.get("engine", ""))
    if not NAME.fullmatch(name) or len(name) > 63:
        raise web.HTTPBadRequest(text="a model name is lower-case letters, digits, '.', '_' "
                                 "and '-'")
    if name in cluster.models:
        raise web.HTTPBadRequest(text=f"the cluster has a model {name} already")
    if gpu_class not in names or engine not in ENGINES:
        raise web.HTTPBadRequest(text="choose a GPU class and an engine from the lists")
    listing = await _listing(pages, repo)
    proposal = propose(listing, name, gpu_class, engine, cluster)
    return pages.render(request, "admin_catalog_model.html", visitor=visitor, listing=listing,
                        fit=fit_rows(listing, names, cluster), classes=names, engines=ENGINES,
                        suggested=name, proposal=proposal)


def propose(listing: Listing, name: str, gpu_class: str, engine: str,
            cluster: Cluster) -> dict[str, str]:
    """A new cluster file for the model, as a diff ``git apply`` takes, and the fit check's
    verdict on its one profile."""
    chosen = listing.chosen()
    quants = {f.quantisation for f in chosen}
    source = listing.repo
    if len(listing.quantisations) > 1 and len(quants) == 1 and None not in quants:
        source = f"{listing.repo}:{quants.pop()}"
    weights, shape = listing.loaded, listing.shape()
    lines = ["models:", f"  {name}:", f"    source: {json.dumps(source)}"]
    figures = _shape_text(shape)
    if figures:
        lines.append(f"    shape: {{{figures}}}")
    lines += ["    profiles:", f"      - {{engine: {json.dumps(engine)}, gpu_class: "
              f"{json.dumps(gpu_class)}}}"]
    path = f"models-{name}.yaml"
    diff = "\n".join([f"diff --git a/{path} b/{path}", "new file mode 100644",
                      "--- /dev/null", f"+++ b/{path}", f"@@ -0,0 +1,{len(lines)} @@",
                      *(f"+{line}" for line in lines)]) + "\n"
    model = Model.model_validate({"source": source, "shape": shape.model_dump(),
                                  "profiles": [{"engine": engine, "gpu_class": gpu_class}]})
    why = fits.refusal(model, model.profiles[0], checks.known_classes(cluster), weights)
    verdict = (f"validate would refuse it: {why}" if why else
               fits.fit_line(fits.inputs(model, model.profiles[0], weights),
                             checks.known_classes(cluster)[gpu_class], CONTEXTS))
    return {"path": path, "diff": diff, "verdict": verdict}


def _shape_text(shape: Shape) -> str:
    parts = []
    for key in Shape.model_fields:
        value = getattr(shape, key)
        if value is None:
            continue
        if key == "weights_size":
            value = f"{-(-value // 1024**2)}MiB"  # rounded up: the check never under-counts
        elif isinstance(value, str):
            value = json.dumps(value)
        parts.append(f"{key}: {value}")
    return ", ".join(parts)
