"""What a mirror directory or a hub holds, for ``llmgw models search`` and ``show``.

A listing is a repo's files with their sizes and quantisations, and the
model's figures from its ``config.json`` or, without one, the header of its
first GGUF file (:mod:`llmgw.discovery.architectures`). Only a bounded
prefix of any file is read: :data:`CONFIG_BYTES` of a ``config.json``,
:data:`HEADER_BYTES` of a GGUF, from the mirror's blobs on this machine or
with a ranged GET from the hub. The hub is the endpoint given (``HF_ENDPOINT``:
the public hub, or a site's ``llmgw mirror serve``), asked through
``huggingface_hub`` as every fetch is (:func:`llmgw.hub.fetches.describe`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from llmgw.discovery import architectures
from llmgw.discovery.architectures import Architecture
from llmgw.hub import caches, fetches
from llmgw.spec import sources
from llmgw.spec.shapes import Shape
from llmgw.spec.sources import Source

CONFIG_BYTES = 1024 * 1024
HEADER_BYTES = 16 * 1024 * 1024  # a 256k-token vocabulary's arrays fit in well under this
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth")
FIRST_BYTES = 2 * 1024 * 1024  # most GGUF headers end within this; a longer one is read again
TIMEOUT = 10.0
HEADER_UNREAD = "the GGUF header is read by `llmgw models show`"
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}


class ListingError(Exception):
    """Why a repo could not be listed, for the operator."""


@dataclass(frozen=True)
class File:
    path: str
    size: int

    @property
    def weights(self) -> bool:
        return self.path.lower().endswith(WEIGHT_SUFFIXES)

    @property
    def quantisation(self) -> str | None:
        return (architectures.quantisation(self.path)
                if self.path.lower().endswith(".gguf") else None)


@dataclass(frozen=True)
class Listing:
    repo: str
    where: str  # "mirror" or "hub"
    commit: str | None
    files: tuple[File, ...]
    architecture: Architecture | None = None
    note: str = ""  # why the architecture is unknown
    selected: tuple[str, ...] = ()  # the files a source's selector picked

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files if f.weights)

    @property
    def quantisations(self) -> tuple[str, ...]:
        return tuple(sorted({q for f in self.files if (q := f.quantisation)}))

    @property
    def loaded(self) -> int | None:
        """Bytes of the files one replica loads (:meth:`chosen`); None when there are none."""
        return sum(f.size for f in self.chosen()) or None

    def shape(self) -> Shape:
        """The ``shape`` block a cluster file declares for this repo's model."""
        if self.architecture is None:
            return Shape(weights_size=self.loaded)
        return self.architecture.shape(self.loaded)

    def chosen(self) -> tuple[File, ...]:
        """The weights one replica loads: the selected ones, else every safetensors file,
        else the smallest GGUF quantisation (a GGUF repo holds several)."""
        weights = [f for f in self.files if f.weights]
        if self.selected:
            return tuple(f for f in weights if f.path in self.selected)
        ggufs = [f for f in weights if f.path.lower().endswith(".gguf")]
        if not ggufs or len(ggufs) != len(weights):
            return tuple(f for f in weights if not f.path.lower().endswith(".gguf"))
        by_quant: dict[str | None, list[File]] = {}
        for item in ggufs:
            by_quant.setdefault(item.quantisation, []).append(item)
        return tuple(min(by_quant.values(), key=lambda group: sum(f.size for f in group)))


def _parse(raw: bytes, name: str) -> Architecture:
    if name.endswith("config.json"):
        return architectures.from_config(raw)
    return architectures.from_gguf(raw)


def _source(text: str) -> Source:
    try:
        source = sources.parse(text)
    except sources.SourceError as exc:
        raise ListingError(str(exc)) from None
    if source.kind != "hub":
        raise ListingError(f"{text!r} is not a hub repo id (org/name[@revision][:files])")
    return source


def _header_file(files: tuple[File, ...], chosen: tuple[File, ...]) -> File | None:
    config = next((f for f in files if f.path == "config.json"), None)
    if config is not None:
        return config
    return next((f for f in chosen if f.path.lower().endswith(".gguf")), None)


def _with_figures(listing: Listing, raw: bytes | None, name: str) -> Listing:
    if raw is None:
        return replace(listing, note="no config.json and no GGUF file")
    try:
        found = _parse(raw, name)
    except architectures.Truncated as exc:
        return replace(listing, note=f"{name}: {exc}")
    except architectures.Malformed as exc:
        return replace(listing, note=f"{name}: {exc}")
    if found.params is None and found.dtype in _DTYPE_BYTES:
        chosen = listing.chosen()
        if chosen and all(f.path.endswith(".safetensors") for f in chosen):
            total = sum(f.size for f in chosen)
            found = replace(found, params=total // _DTYPE_BYTES[found.dtype],
                            params_from=f"the files at {found.dtype}")
    if found.quantisation is None and name.lower().endswith(".gguf"):
        found = replace(found, quantisation=architectures.quantisation(name))
    return replace(listing, architecture=found)


# -- a mirror directory on this machine --------------------------------------------


def mirror_repos(root: Path, text: str = "") -> list[str]:
    """Repo ids of the mirror's hub cache ``root`` whose id holds ``text``."""
    return [r for r in caches.repos(root) if text.lower() in r.lower()]


def from_mirror(root: Path, text: str) -> Listing:
    source = _source(text)
    assert source.repo is not None
    try:
        commit = caches.resolve(root, source.repo, source.revision)
    except caches.CacheError as exc:
        raise ListingError(str(exc)) from None
    cached = caches.snapshot(root, source.repo, commit)
    listing = Listing(source.repo, "mirror", commit,
                      tuple(File(f.path, f.size) for f in cached),
                      selected=_selected(source, [f.path for f in cached]))
    header = _header_file(listing.files, listing.chosen())
    raw = None
    if header is not None:
        blob = next(f.blob for f in cached if f.path == header.path)
        limit = CONFIG_BYTES if header.path == "config.json" else HEADER_BYTES
        with blob.open("rb") as handle:
            raw = handle.read(limit)
    return _with_figures(listing, raw, header.path if header else "")


def _selected(source: Source, paths: list[str]) -> tuple[str, ...]:
    return tuple(p for p in paths if source.selects(p)) if source.patterns else ()


# -- a hub: HF_ENDPOINT -------------------------------------------------------------


def hub_search(endpoint: str, text: str, limit: int = 20,
               token: str | None = None) -> list[str]:
    """Repo ids the hub finds for ``text`` (``GET /api/models?search=``, as
    ``HfApi.list_models`` asks, on the hub client's session but asked once: its pager retries
    a refused connection for half a minute); raises ListingError when it cannot be asked."""
    from huggingface_hub import get_session, hf_raise_for_status

    try:
        response = get_session().get(
            f"{endpoint.rstrip('/')}/api/models", params={"search": text, "limit": limit},
            headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=TIMEOUT)
        hf_raise_for_status(response)
        found = response.json()
    except Exception as exc:  # connection refused, DNS, TLS, an HTTP error: one sentence
        lines = str(exc).strip().splitlines()
        status = getattr(getattr(exc, "response", None), "status_code", None)
        said = f"it answered {status}: " if isinstance(status, int) else ""
        raise ListingError(f"cannot search {endpoint}: {said}"
                           f"{lines[0][:200] if lines else type(exc).__name__}") from None
    if not isinstance(found, list):
        raise ListingError(f"{endpoint} answered the search with no list")
    ids = [m.get("id") for m in found[:limit] if isinstance(m, dict)]
    return [i for i in ids if isinstance(i, str) and len(i) <= 200]


def from_hub(endpoint: str | None, text: str, token: str | None = None,
             header: bool = True) -> Listing:
    """The repo as the hub lists it; with ``header``, its config.json or GGUF header too."""
    source = _source(text)
    assert source.repo is not None
    whole = replace(source, patterns=())
    try:
        remote = fetches.describe(whole, endpoint, token, TIMEOUT)
    except fetches.FetchError as exc:
        raise ListingError(str(exc)) from None
    listing = Listing(source.repo, "hub", remote.commit,
                      tuple(File(f.path, f.size) for f in remote.files),
                      selected=_selected(source, [f.path for f in remote.files]))
    chosen = _header_file(listing.files, listing.chosen())
    if chosen is None:
        return _with_figures(listing, None, "")
    if not header and chosen.path != "config.json":
        return replace(listing, note=HEADER_UNREAD)
    url = next(f.url for f in remote.files if f.path == chosen.path)
    limits = (CONFIG_BYTES,) if chosen.path == "config.json" else (FIRST_BYTES, HEADER_BYTES)
    for limit in limits:
        try:
            raw = fetches.read_prefix(url, limit, token, TIMEOUT)
        except fetches.FetchError as exc:
            return replace(listing, note=str(exc))
        if len(raw) < limit or not _cut_short(raw, chosen.path):
            break  # the whole file, or a header that ended within what was read
    return _with_figures(listing, raw, chosen.path)


def _cut_short(raw: bytes, name: str) -> bool:
    """Whether more of the file would tell more: the key/values, or the tensor infos that
    give the parameter count, go on past ``raw``."""
    try:
        return _parse(raw, name).params is None and name.lower().endswith(".gguf")
    except architectures.Truncated:
        return True
    except architectures.Malformed:
        return False
