"""``llmgw mirror serve DIR``: a hub-compatible endpoint over a hub cache directory.

Serves the subset of the hub's HTTP API that ``huggingface_hub`` (and so
every node's fetch) uses, read from a cache laid out as in
:mod:`llmgw.hub.caches`:

* ``GET /api/models/{org}/{name}[/revision/{rev}]``: repo metadata; with
  ``?blobs=true`` each sibling has its size, blob id and, for LFS files,
  ``lfs: {sha256, size, pointerSize}``. ``sha`` is the resolved commit.
* ``GET /api/models/{org}/{name}/tree/{rev}``: the file listing
  (``snapshot_download`` reads it).
* ``GET /api/models?search=TEXT&limit=N``: the repos whose id holds ``TEXT``
  (case-insensitive), as ``HfApi.list_models`` reads them (``llmgw models
  search``).
* ``HEAD|GET /{org}/{name}/resolve/{rev}/{path}``: the file, with ``ETag``,
  ``X-Repo-Commit``, ``Accept-Ranges``, and ``X-Linked-Etag`` /
  ``X-Linked-Size`` for LFS files (the client takes the etag of an LFS file
  from them); ``Range: bytes=a-b`` gets 206 with ``Content-Range``.

Errors carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``, ``GatedRepo``) so the client raises its own typed errors.
With a token, every request needs ``Authorization: Bearer <token>`` (a gated
site mirror; compared in constant time).

Nothing outside the served tree is read or hinted at: a revision must be a
commit hash or a ref name (:func:`llmgw.hub.caches.is_revision`; anything else
is 400 ``BadRequest``, whatever it names), a file path must be a plain relative
path, and links are followed only when they stay in the tree, so a revision
or file that points outside answers exactly as one that is not there.

``max_rate`` bounds bytes per second per response, so a mirror does not
saturate a site's link; a client that takes no bytes of a file for
``send_stall`` seconds is dropped. The server counts the body bytes
it sent (``app[SENT]``): benchmarks and tests measure transfers with it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from llmgw.hub import caches

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


@dataclass
class Counter:
    bytes_sent: int = 0
    requests: int = 0


SENT = web.AppKey("sent", Counter)
ROOT = web.AppKey("root", Path)
TOKEN = web.AppKey("token", str)
RATE = web.AppKey("rate", float)
STALL = web.AppKey("stall", float)
# Seconds a client may take to accept one chunk (1 MiB) of a file before it is dropped:
# one that stops reading would otherwise hold its connection, file and buffers for good.
SEND_STALL = 60.0


class _Stalled(Exception):
    """The client took nothing for the stall bound."""


def _error(status: int, code: str, message: str, commit: str | None = None) -> web.Response:
    headers = {"X-Error-Code": code, "X-Error-Message": message}
    if commit:
        headers["X-Repo-Commit"] = commit
    return web.json_response({"error": message}, status=status, headers=headers)


def _repo(request: web.Request) -> str | None:
    org, name = request.match_info["org"], request.match_info["name"]
    if not (_SEGMENT.match(org) and _SEGMENT.match(name)) or "--" in org + name:
        return None
    return f"{org}/{name}"


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def authorized(header: str, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token``, compared in constant time.

    Both sides are hashed first, so the comparison takes as long for a wrong length as
    for a wrong byte.

    >>> authorized("Bearer s3cret", "s3cret"), authorized("Bearer s3cre", "s3cret")
    (True, False)
    """
    return hmac.compare_digest(_digest(header), _digest(f"Bearer {token}"))


@web.middleware
async def _guard(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> web.StreamResponse:
    request.app[SENT].requests += 1
    token = request.app[TOKEN]
    if token and not authorized(request.headers.get("Authorization", ""), token):
        return _error(401, "GatedRepo", "this mirror needs a token (Authorization: Bearer)")
    return await handler(request)


_NOT_FOUND: dict[type[caches.CacheError], tuple[int, str]] = {
    caches.NoRepo: (404, "RepoNotFound"),
    caches.NoRevision: (404, "RevisionNotFound"),
    caches.BadRevision: (400, "BadRequest"),
}


def _locate(request: web.Request) -> tuple[str, str] | web.Response:
    repo = _repo(request)
    if repo is None:
        return _error(404, "RepoNotFound", "not a repository id")
    revision = request.match_info.get("rev", "main")
    try:
        return repo, caches.resolve(request.app[ROOT], repo, revision)
    except caches.CacheError as exc:
        status, code = _NOT_FOUND.get(type(exc), (404, "RevisionNotFound"))
        return _error(status, code, str(exc))


def is_file_path(path: str) -> bool:
    """Whether ``path`` is a plain relative path of a file in a repository.

    >>> [is_file_path(p) for p in ("a/b.json", "../x", "/etc/passwd", "a\\b", "a//b")]
    [True, False, False, False, False]
    """
    parts = path.split("/")
    return (0 < len(path) <= 1024 and all(part not in ("", ".", "..") for part in parts)
            and "\\" not in path and path.isprintable())


async def _info(request: web.Request) -> web.Response:
    located = _locate(request)
    if isinstance(located, web.Response):
        return located
    repo, commit = located
    files = caches.snapshot(request.app[ROOT], repo, commit)
    with_blobs = request.query.get("blobs", "").lower() in ("1", "true")
    siblings = []
    for item in files:
        sibling: dict[str, object] = {"rfilename": item.path}
        if with_blobs:
            sibling.update(_blob_fields(item))
        siblings.append(sibling)
    return web.json_response({
        "id": repo, "modelId": repo, "sha": commit, "private": False, "gated": False,
        "disabled": False, "siblings": siblings, "tags": [], "downloads": 0, "likes": 0,
    })


SEARCH_LENGTH = 200
SEARCH_LIMIT = 1000


async def _search(request: web.Request) -> web.Response:
    text = request.query.get("search", "")
    limit = request.query.get("limit", "")
    if len(text) > SEARCH_LENGTH or not text.isprintable():
        return _error(400, "BadRequest", f"search is at most {SEARCH_LENGTH} printable "
                      "characters")
    if limit and not (limit.isdigit() and 0 < int(limit) <= SEARCH_LIMIT):
        return _error(400, "BadRequest", f"limit is a number from 1 to {SEARCH_LIMIT}")
    root, wanted = request.app[ROOT], text.lower()
    found: list[dict[str, object]] = []
    for repo in sorted(caches.repos(root)):
        if wanted not in repo.lower():
            continue
        try:
            commit: str | None = caches.resolve(root, repo, "main")
        except caches.CacheError:
            commit = None
        found.append({"id": repo, "modelId": repo, "sha": commit, "private": False,
                      "tags": [], "downloads": 0, "likes": 0})
        if len(found) >= int(limit or SEARCH_LIMIT):
            break
    return web.json_response(found)


def _blob_fields(item: caches.CachedFile) -> dict[str, object]:
    if item.lfs:
        pointer = caches.lfs_pointer(item.etag, item.size)
        return {"size": item.size, "blobId": caches.git_blob_sha1(pointer),
                "lfs": {"sha256": item.etag, "size": item.size, "pointerSize": len(pointer)}}
    return {"size": item.size, "blobId": item.etag}


async def _tree(request: web.Request) -> web.Response:
    located = _locate(request)
    if isinstance(located, web.Response):
        return located
    repo, commit = located
    entries = []
    for item in caches.snapshot(request.app[ROOT], repo, commit):
        fields = _blob_fields(item)
        entry: dict[str, object] = {"type": "file", "path": item.path, "size": item.size,
                                    "oid": fields["blobId"]}
        if item.lfs:
            lfs = fields["lfs"]
            assert isinstance(lfs, dict)
            entry["lfs"] = {"oid": item.etag, "size": item.size,
                            "pointerSize": lfs["pointerSize"]}
        entries.append(entry)
    return web.json_response(entries)


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """(start, end exclusive), None for the whole file, or "bad"."""
    if not header:
        return None
    match = _RANGE.match(header.strip())
    if not match or (not match.group(1) and not match.group(2)):
        return "bad"
    if match.group(1):
        start = int(match.group(1))
        end = int(match.group(2)) + 1 if match.group(2) else size
    else:  # a suffix: the last N bytes
        start, end = max(0, size - int(match.group(2))), size
    end = min(end, size)
    if start >= size or start >= end:
        return "bad"
    return start, end


async def _resolve_file(request: web.Request) -> web.StreamResponse:
    located = _locate(request)
    if isinstance(located, web.Response):
        return located
    repo, commit = located
    path = request.match_info["path"]
    if not is_file_path(path):
        return _error(400, "BadRequest", "not a file path inside a repository", commit)
    found = next((f for f in caches.snapshot(request.app[ROOT], repo, commit)
                  if f.path == path), None)
    if found is None:
        return _error(404, "EntryNotFound", f"{path} is not in {repo}@{commit}", commit)
    headers = {
        "ETag": f'"{found.etag}"', "X-Repo-Commit": commit, "Accept-Ranges": "bytes",
        "Content-Type": "application/octet-stream",
    }
    if found.lfs:
        headers["X-Linked-Etag"] = f'"{found.etag}"'
        headers["X-Linked-Size"] = str(found.size)
    span = _byte_range(request.headers.get("Range"), found.size)
    if span == "bad":
        headers["Content-Range"] = f"bytes */{found.size}"
        return web.Response(status=416, headers=headers)
    start, end = span if isinstance(span, tuple) else (0, found.size)
    status = 206 if isinstance(span, tuple) else 200
    if status == 206:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{found.size}"
    headers["Content-Length"] = str(end - start)
    response = web.StreamResponse(status=status, headers=headers)
    if request.method == "HEAD":
        await response.prepare(request)
        return response
    await response.prepare(request)
    try:
        await _send(request, response, found.blob, start, end)
        await response.write_eof()
    except ConnectionResetError:  # it resumes with Range
        log.info("%s@%s %s: the client went away mid-file", repo, commit, found.path)
    except _Stalled:
        log.info("%s@%s %s: the client took no bytes for %g s; closing its connection",
                 repo, commit, found.path, request.app[STALL])
        if request.transport is not None:
            request.transport.abort()
    return response


async def _send(request: web.Request, response: web.StreamResponse, blob: Path,
                start: int, end: int) -> None:
    counter, rate = request.app[SENT], request.app[RATE]
    began, sent = time.monotonic(), 0
    with blob.open("rb") as handle:
        handle.seek(start)
        while start + sent < end:
            chunk = handle.read(min(CHUNK, end - start - sent))
            if not chunk:
                break
            try:
                async with asyncio.timeout(request.app[STALL]):
                    await response.write(chunk)
            except TimeoutError:
                raise _Stalled from None
            sent += len(chunk)
            counter.bytes_sent += len(chunk)
            if rate:
                ahead = sent / rate - (time.monotonic() - began)
                if ahead > 0:
                    await asyncio.sleep(ahead)


def app(root: Path, token: str = "", max_rate: float = 0.0,
        send_stall: float = SEND_STALL) -> web.Application:
    """The mirror's aiohttp application over the hub cache at ``root``.

    ``send_stall``: seconds a client may take to accept each chunk of a file.
    """
    application = web.Application(middlewares=[_guard])
    application[ROOT] = root
    application[SENT] = Counter()
    application[TOKEN] = token
    application[RATE] = max_rate
    application[STALL] = send_stall
    application.router.add_get("/api/models", _search)
    api = "/api/models/{org}/{name}"
    application.router.add_get(api, _info)
    application.router.add_get(api + "/revision/{rev}", _info)
    application.router.add_get(api + "/tree/{rev}", _tree)
    application.router.add_route("GET", "/{org}/{name}/resolve/{rev}/{path:.+}", _resolve_file)
    application.router.add_route("HEAD", "/{org}/{name}/resolve/{rev}/{path:.+}", _resolve_file)
    return application
