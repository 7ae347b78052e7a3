"""Fetch a hub repo (or an URL) into a node's weights directory.

The contract:

* **Layout.** Hub repos land in ``<weights_dir>/hub`` in the hub cache
  layout (:mod:`llmgw.hub.caches`), so engines and ``huggingface_hub`` with
  ``HF_HUB_OFFLINE=1`` find them. URLs land in ``<weights_dir>/urls/<id>/``.
* **Metadata from the hub client.** :func:`describe` asks the endpoint (the
  cluster's mirror, else ``HF_ENDPOINT``'s default) through
  ``huggingface_hub.HfApi`` for the commit and every file's size and hash.
* **Resumable.** Bytes go to ``blobs/<etag>.incomplete``, a name that
  survives the process: a rerun after a crash or SIGKILL asks only for the
  missing range (``Range: bytes=<have>-``).
* **Verified.** Every file is hashed as it streams (the prefix already on
  disk first, when resuming): sha256 for LFS files, git's blob sha1 for the
  others. A mismatch discards the partial file and fetches it once more
  from scratch; a second mismatch fails the fetch, saying so.
* **Atomic.** A blob is renamed into place only once verified, and a
  snapshot links files only when every selected file is in place; the
  record that says "fetched" (``.llmgw/fetched/<id>.json``) is written last.
  Until then nothing reports the weights or hands them to an engine.
* **Bounded.** Free space is checked against what is still missing, plus a
  margin, before a byte moves.

Synchronous by design (``huggingface_hub`` is): the agent runs it in a
thread and reads :class:`Progress` while it runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import json
import os
import queue
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

from llmgw.hub import caches
from llmgw.hub.reaches import Reach, Refused
from llmgw.spec.sources import Source

CHUNK = 1024 * 1024
MIN_MARGIN = 256 * 1024 * 1024
RECORDS = ".llmgw/fetched"
TIMEOUT = 30.0


class FetchError(Exception):
    """Why a fetch failed, for the operator; ``retry`` says whether trying again may help."""

    def __init__(self, message: str, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass
class Progress:
    """One fetch as it goes; read by reports while another thread writes it."""

    kind: str
    target: str
    state: str = "queued"  # queued | running | done | failed
    bytes_done: int = 0
    bytes_total: int | None = None
    bytes_transferred: int = 0  # over the network in this attempt (a resume moves less)
    rate_bps: float | None = None
    error: str = ""
    started_at: float | None = None
    updated_at: float | None = None
    cancelled: bool = False  # set from another thread: the transfer stops at its next chunk
    # Set while another process holds this fetch's lock: another node on a shared
    # weights directory, or another agent, fetches it; this one waits, then reuses it.
    waiting: str = ""

    def advance(self, count: int, now: float) -> None:
        if self.cancelled:
            # What arrived stays (a partial file), so the next fetch resumes from it.
            raise FetchError("stopped: the agent is shutting down", retry=False)
        self.bytes_done += count
        self.bytes_transferred += count
        if self.started_at is not None and now > self.started_at:
            self.rate_bps = self.bytes_transferred / (now - self.started_at)
        self.updated_at = now


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    etag: str
    url: str
    sha256: str | None = None  # LFS files (and URLs with #sha256=)
    sha1: str | None = None  # git blob id of a non-LFS file


@dataclass(frozen=True)
class Remote:
    commit: str
    files: tuple[RemoteFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class Fetched:
    """A complete fetch: what the engine gets, and what it took."""

    source: str
    path: str
    size_bytes: int
    commit: str | None
    files: tuple[str, ...] = ()
    fetched_by: str = ""
    fetched_at: float = 0.0
    root: str = ""  # the cache directory it lives in (HF_HUB_CACHE) or its urls/ folder
    blobs: tuple[str, ...] = field(default=())


def record_id(source: Source) -> str:
    return hashlib.sha256(source.text.encode()).hexdigest()[:16]


def hub_root(weights_dir: str | Path) -> Path:
    return Path(weights_dir) / "hub"


def _records(weights_dir: str | Path) -> Path:
    return Path(weights_dir) / RECORDS


def describe(source: Source, endpoint: str | None, token: str | None,
             timeout: float = TIMEOUT, reach: Reach | None = None) -> Remote:
    """What fetching ``source`` means: the commit and the selected files with their hashes.

    An URL is asked with HEAD through ``reach`` (default: public addresses and the
    endpoint's host): a host it refuses gets no request at all.
    """
    if source.kind == "url":
        return _describe_url(source, token, timeout, reach or Reach.of((), endpoint))
    from huggingface_hub import HfApi, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError

    assert source.repo is not None
    api = HfApi(endpoint=endpoint, token=token or False)
    try:
        info = api.model_info(source.repo, revision=source.revision, files_metadata=True,
                              timeout=timeout)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        raise FetchError(f"{source.text}: the hub answered {status}: {_first_line(exc)}",
                         retry=status is None or status >= 500 or status == 429) from None
    except Exception as exc:  # connection refused, DNS, TLS: the endpoint is not reachable
        raise FetchError(f"{source.text}: cannot reach {endpoint or 'the hub'}: "
                         f"{_first_line(exc)}") from None
    if not info.sha:
        raise FetchError(f"{source.text}: the hub gave no commit for {source.revision}")
    files = []
    for sibling in info.siblings or []:
        if not source.selects(sibling.rfilename) or sibling.size is None:
            continue
        lfs = sibling.lfs
        etag = lfs.sha256 if lfs is not None else (sibling.blob_id or "")
        if not etag:
            raise FetchError(f"{source.text}: the hub gave no hash for {sibling.rfilename}")
        files.append(RemoteFile(
            path=sibling.rfilename, size=sibling.size, etag=etag,
            url=hf_hub_url(source.repo, sibling.rfilename, revision=info.sha, endpoint=endpoint),
            sha256=lfs.sha256 if lfs is not None else None,
            sha1=None if lfs is not None else sibling.blob_id,
        ))
    if not files:
        raise FetchError(f"{source.text}: no file of {source.repo}@{source.revision} matches "
                         f"{','.join(source.patterns)}", retry=False)
    return Remote(commit=info.sha, files=tuple(files))


def _describe_url(source: Source, token: str | None, timeout: float, reach: Reach) -> Remote:
    assert source.url is not None
    headers = {**_auth(token), "Accept-Encoding": "identity", "User-Agent": "llmgw"}
    try:
        response, connection = _open(source.url, headers, timeout, reach, method="HEAD")
        connection.close()
    except FetchError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        raise FetchError(f"{source.url}: cannot reach it: {_first_line(exc)}") from None
    if response.status != 200:
        raise FetchError(f"{source.url}: HEAD answered {response.status}",
                         retry=response.status >= 500)
    size = response.getheader("Content-Length")
    if size is None or not size.isdigit():
        raise FetchError(f"{source.url}: the server does not say its size", retry=False)
    etag = source.sha256 or hashlib.sha256(source.url.encode()).hexdigest()
    return Remote(commit="", files=(RemoteFile(
        path=source.file_name, size=int(size), etag=etag, url=source.url, sha256=source.sha256,
    ),))


def present(source: Source, weights_dir: str | Path) -> Fetched | None:
    """The completed fetch of ``source`` in ``weights_dir``, if every file is still there."""
    path = _records(weights_dir) / f"{record_id(source)}.json"
    try:
        data = json.loads(path.read_text())
        fetched = _load(data)
    except (OSError, ValueError, TypeError):
        return None
    if fetched.source != source.text or not all(Path(b).is_file() for b in fetched.blobs):
        return None
    return fetched


def records(weights_dir: str | Path) -> list[Fetched]:
    """Every fetch llmgw recorded in ``weights_dir``."""
    found = []
    for path in sorted(_records(weights_dir).glob("*.json")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            data = json.loads(path.read_text())
            found.append(_load(data))
    return found


def _load(data: Any) -> Fetched:
    if not isinstance(data, dict):
        raise ValueError("a fetch record is a JSON object")
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return Fetched(**fields)


def forget(source_text: str, weights_dir: str | Path) -> None:
    digest = hashlib.sha256(source_text.encode()).hexdigest()[:16]
    (_records(weights_dir) / f"{digest}.json").unlink(missing_ok=True)


def needed_bytes(remote: Remote, target: Callable[[RemoteFile], Path]) -> int:
    """Bytes still to transfer: files not in place, less what partial files hold."""
    missing = 0
    for item in remote.files:
        blob = target(item)
        if blob.is_file():
            continue
        partial = blob.with_name(blob.name + ".incomplete")
        have = partial.stat().st_size if partial.is_file() else 0
        missing += max(0, item.size - have)
    return missing


def check_space(directory: Path, missing: int, margin: float) -> None:
    """Raise FetchError when ``directory`` has too little room for ``missing`` bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    reserve = max(int(missing * margin), MIN_MARGIN)
    if missing and free < missing + reserve:
        raise FetchError(
            f"needs {_human(missing + reserve)} ({_human(missing)} + margin), "
            f"{_human(free)} free in {directory}", retry=False,
        )


def fetch(
    source: Source, weights_dir: str | Path, *, endpoint: str | None = None,
    token: str | None = None, progress: Progress | None = None, margin: float = 0.05,
    timeout: float = TIMEOUT, allowed_hosts: tuple[str, ...] = (),
) -> Fetched:
    """Fetch ``source`` unless it is already complete; returns what the engine gets.

    Every connection dials a public address, or a host of ``allowed_hosts`` or
    the endpoint's (:mod:`llmgw.hub.reaches`), redirects included.
    """
    progress = progress or Progress("weights", source.text)
    reach = Reach.of(allowed_hosts, endpoint)
    with _locked(weights_dir, source, progress):
        done = present(source, weights_dir)
        if done is not None:
            progress.state, progress.bytes_done = "done", done.size_bytes
            progress.bytes_total = done.size_bytes
            return done
        progress.state = "running"
        remote = describe(source, endpoint, token, timeout, reach)
        if source.kind == "url":
            base = Path(weights_dir) / "urls" / record_id(source)
            def target(item: RemoteFile) -> Path:
                return base / item.path
        else:
            assert source.repo is not None
            base = caches.repo_dir(hub_root(weights_dir), source.repo)
            def target(item: RemoteFile) -> Path:
                return base / "blobs" / item.etag
        progress.bytes_total = remote.size
        progress.bytes_done = remote.size - needed_bytes(remote, target)
        progress.started_at = progress.updated_at = time.time()
        check_space(base, needed_bytes(remote, target), margin)
        for item in remote.files:
            _one_file(item, target(item), token, progress, timeout, reach)
        fetched = _finish(source, weights_dir, remote, target)
        progress.state = "done"
        return fetched


def _one_file(item: RemoteFile, blob: Path, token: str | None, progress: Progress,
              timeout: float, reach: Reach) -> None:
    if blob.is_file():
        return
    blob.parent.mkdir(parents=True, exist_ok=True)
    partial = blob.with_name(blob.name + ".incomplete")
    for attempt in (1, 2):
        digest = _hasher(item)
        have = _hash_prefix(partial, digest)
        if have > item.size:
            partial.unlink()
            have, digest = 0, _hasher(item)
        if have < item.size:
            _transfer(item, partial, have, digest, token, progress, timeout, reach)
        got = digest.hexdigest() if digest is not None else None
        want = item.sha256 or item.sha1
        if want is None or got == want:
            os.chmod(partial, 0o644)
            os.replace(partial, blob)
            return
        partial.unlink(missing_ok=True)
        progress.bytes_done -= item.size
        if attempt == 2:
            raise FetchError(f"{item.path}: {'sha256' if item.sha256 else 'sha1'} mismatch twice "
                             f"(expected {want}, got {got}); the source serves other bytes than "
                             "it lists", retry=False)


def _hasher(item: RemoteFile) -> Any:
    if item.sha256:
        return hashlib.sha256()
    if item.sha1:
        digest = hashlib.sha1()
        digest.update(b"blob %d\0" % item.size)
        return digest
    return None


def _hash_prefix(partial: Path, digest: Any) -> int:
    """Feed what a previous attempt left into ``digest``; returns its length."""
    if not partial.is_file():
        return 0
    have = 0
    with partial.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            if digest is not None:
                digest.update(chunk)
            have += len(chunk)
    return have


def _transfer(item: RemoteFile, partial: Path, have: int, digest: Any, token: str | None,
              progress: Progress, timeout: float, reach: Reach) -> None:
    """Append the missing bytes of ``item`` to ``partial``, hashing them as they land.

    The bytes are read with the standard library's ``http.client`` into one
    reused buffer: measured beside ``curl`` (tests/bench/fetch.py), the hub
    client's own streaming was at about half curl's rate on this path, and a
    140 GB download is all this loop. Metadata still comes from the hub client.
    """
    headers = {**_auth(token), "Accept-Encoding": "identity", "User-Agent": "llmgw"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        response, connection = _open(item.url, headers, timeout, reach)
        try:
            if response.status == 200 and have:
                raise FetchError(f"{item.path}: the server ignored the range request")
            if response.status not in (200, 206):
                raise FetchError(f"{item.path}: GET answered {response.status}",
                                 retry=response.status >= 500)
            with partial.open("ab") as out, _Hashing(digest) as hashing:
                while True:
                    view = hashing.buffer()
                    count = response.readinto(view)
                    if not count:
                        break
                    out.write(view[:count])
                    hashing.update(view, count)
                    progress.advance(count, time.time())
        finally:
            connection.close()
    except FetchError:
        raise
    except (OSError, http.client.HTTPException) as exc:  # what arrived stays for the next try
        raise FetchError(f"{item.path}: transfer broke off: {_first_line(exc)}") from None
    if partial.stat().st_size != item.size:
        raise FetchError(f"{item.path}: got {partial.stat().st_size} of {item.size} bytes")


def read_prefix(url: str, limit: int, token: str | None = None, timeout: float = TIMEOUT,
                reach: Reach | None = None) -> bytes:
    """At most the first ``limit`` bytes of ``url`` (a ranged GET; a server that ignores the
    range is still read no further): what ``llmgw models`` parses a header from."""
    headers = {**_auth(token), "Accept-Encoding": "identity", "User-Agent": "llmgw",
               "Range": f"bytes=0-{limit - 1}"}
    try:
        response, connection = _open(url, headers, timeout, reach or Reach.of((), url))
        try:
            if response.status not in (200, 206):
                raise FetchError(f"{url}: GET answered {response.status}",
                                 retry=response.status >= 500)
            return response.read(limit)
        finally:
            connection.close()
    except FetchError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        raise FetchError(f"{url}: cannot read it: {_first_line(exc)}") from None


class _Hashing:
    """Hash chunks on a second thread while the next one is read and written.

    hashlib releases the GIL on large updates, so sha256 (about 0.9 GB/s on
    one core) runs beside the socket and the disk instead of after them.
    Buffers circulate between the two threads; none is reused before hashed.
    """

    SLOTS = 8

    def __init__(self, digest: Any) -> None:
        self.digest = digest
        self.free: queue.Queue[memoryview] = queue.Queue()
        self.work: queue.Queue[tuple[memoryview, int] | None] = queue.Queue()
        for _ in range(self.SLOTS):
            self.free.put(memoryview(bytearray(CHUNK)))
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Hashing:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.work.put(None)
        self.thread.join()

    def buffer(self) -> memoryview:
        return self.free.get()

    def update(self, view: memoryview, count: int) -> None:
        self.work.put((view, count))

    def _run(self) -> None:
        while (item := self.work.get()) is not None:
            view, count = item
            if self.digest is not None:
                self.digest.update(view[:count])
            self.free.put(view)


def _open(url: str, headers: dict[str, str], timeout: float, reach: Reach,
          method: str = "GET",
          ) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
    """``method`` ``url``, following up to 5 redirects (the hub sends LFS files to a CDN).

    Each hop dials an address ``reach`` checked; a refused one raises FetchError
    before a byte is sent.
    """
    for _ in range(6):
        parts = urlsplit(url)
        try:
            connection = reach.connection(url, timeout)
        except Refused as exc:
            raise FetchError(f"{url}: refused: {exc}", retry=False) from None
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.request(method, path or "/", headers=headers)
        response = connection.getresponse()
        if response.status not in (301, 302, 303, 307, 308):
            return response, connection
        location = response.getheader("Location") or ""
        connection.close()
        target = urljoin(url, location)
        if urlsplit(target).netloc != parts.netloc:
            headers = {k: v for k, v in headers.items() if k != "Authorization"}
        url = target
    raise FetchError(f"{url}: too many redirects", retry=False)


def _finish(source: Source, weights_dir: str | Path, remote: Remote,
            target: Callable[[RemoteFile], Path]) -> Fetched:
    blobs = tuple(str(target(item)) for item in remote.files)
    if source.kind == "url":
        path, root = blobs[0], str(Path(blobs[0]).parent)
    else:
        assert source.repo is not None
        root = str(hub_root(weights_dir))
        for item in remote.files:
            caches.link(Path(root), source.repo, remote.commit, item.path, item.etag)
        caches.set_ref(Path(root), source.repo, source.revision, remote.commit)
        snapshot = caches.repo_dir(Path(root), source.repo) / "snapshots" / remote.commit
        path = str(snapshot / _entry_file(source, remote)) if _entry_file(source, remote) \
            else str(snapshot)
    fetched = Fetched(
        source=source.text, path=path, size_bytes=remote.size, commit=remote.commit or None,
        files=tuple(f.path for f in remote.files), fetched_by=f"llmgw agent on "
        f"{socket.gethostname()}", fetched_at=time.time(), root=root, blobs=blobs,
    )
    records_dir = _records(weights_dir)
    records_dir.mkdir(parents=True, exist_ok=True)
    temporary = records_dir / f".{record_id(source)}.json.tmp"
    temporary.write_text(json.dumps(asdict(fetched), indent=1))
    os.replace(temporary, records_dir / f"{record_id(source)}.json")
    return fetched


def _entry_file(source: Source, remote: Remote) -> str:
    """The file an engine opens when the selection is GGUF (the first part of a split one)."""
    ggufs = sorted(f.path for f in remote.files if f.path.endswith(".gguf"))
    if not ggufs or len(ggufs) != len([f for f in remote.files if f.path.endswith(".gguf")]):
        return ""
    if all(f.path.endswith(".gguf") for f in remote.files) or source.patterns:
        return ggufs[0]
    return ""


@contextlib.contextmanager
def _locked(weights_dir: str | Path, source: Source,
            progress: Progress | None = None) -> Iterator[None]:
    """One fetch of a source per weights directory, across processes, and across nodes
    where the directory is on a shared filesystem that honours ``flock`` (NFS, CephFS,
    GPFS, BeeGFS; Lustre when mounted with ``-o flock``)."""
    locks = Path(weights_dir) / ".llmgw" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with (locks / f"{record_id(source)}.lock").open("w") as handle:
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if progress is not None:
                    progress.waiting = (f"another fetch of {source.text} into {weights_dir} "
                                        "(another node sharing the directory, or another "
                                        "agent); it is used once complete")
                fcntl.flock(handle, fcntl.LOCK_EX)
                if progress is not None:
                    progress.waiting = ""
        except OSError as exc:
            # Fetching unlocked where other nodes may write the same files would
            # interleave their bytes: refuse, and say what the filesystem lacks.
            raise FetchError(
                f"cannot lock {locks} ({exc.strerror or exc}): the filesystem refuses "
                "flock, which keeps nodes that share the directory to one fetch (Lustre: "
                "mount with -o flock)", retry=False) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit in ("B", "KB") or value >= 100 \
                else f"{value:.1f} {unit}"
        value /= 1000
    return f"{size} B"
