"""The hub cache layout, read and written: what engines and the hub client expect.

Under a cache root (``<weights_dir>/hub`` on a node, the directory ``llmgw
mirror serve`` serves)::

    models--org--name/
      blobs/<etag>                    the bytes; etag = sha256 (LFS) or git sha1
      snapshots/<commit>/<path>       relative symlinks to ../../blobs/<etag>
      refs/<revision>                 the commit a branch or tag pointed at

A file appears in a snapshot only once its blob is complete and verified,
so a snapshot never names partial bytes. llmgw's own records (who fetched
what, when) live beside the cache under ``.llmgw/``, which the hub client
and weights discovery both skip.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from llmgw.spec import sources

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
# Files at least this large are stored as LFS objects (etag = sha256), as the hub does.
LFS_THRESHOLD = 1024 * 1024
LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".onnx", ".msgpack", ".h5")


# A branch or tag name as git allows it (git check-ref-format), narrowed to the characters
# hub revisions use: "/"-separated components of letters, digits and ._+-, none starting
# with "." or ending with ".lock" or ".", no "..". So no name can leave refs/.
_REF_COMPONENT = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,99}$")
MAX_REVISION = 255


class CacheError(Exception):
    """A cache directory that does not hold what was asked for."""


class NoRepo(CacheError):
    """The repository is not in the cache."""


class NoRevision(CacheError):
    """The revision names no complete snapshot of the repository."""


class BadRevision(CacheError):
    """Not a revision name at all (a path, an encoded escape, a control character)."""


def is_revision(text: str) -> bool:
    """Whether ``text`` is a commit hash or a ref name a cache may hold under ``refs/``.

    >>> [is_revision(t) for t in ("main", "refs/pr/1", "v1.0", "../x", "/etc/hostname")]
    [True, True, True, False, False]
    """
    if not text or len(text) > MAX_REVISION or ".." in text:
        return False
    return all(_REF_COMPONENT.match(part) and not part.endswith((".lock", "."))
               for part in text.split("/"))


def _inside(root: Path, path: Path) -> bool:
    """Whether ``path``, links followed, lies under ``root`` (links followed too)."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


@dataclass(frozen=True)
class CachedFile:
    """One file of one snapshot."""

    path: str  # inside the repo
    size: int
    etag: str  # sha256 for LFS files, git blob sha1 otherwise
    blob: Path

    @property
    def lfs(self) -> bool:
        return bool(_SHA256.match(self.etag))


def repo_dir(root: Path, repo: str) -> Path:
    return root / sources.cache_folder(repo)


def git_blob_sha1(data: bytes) -> str:
    """The id git gives a blob: sha1 over ``blob <size>\\0`` and the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The pointer file git stores for an LFS object (its blob id is the hub's blobId)."""
    text = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n"
    return text.encode()


def resolve(root: Path, repo: str, revision: str) -> str:
    """The commit ``revision`` names in the cache; raises NoRepo, NoRevision, BadRevision.

    Everything read lies under ``root`` once links are followed: a ref, snapshot or
    repository directory that links outside counts as absent, so the answer says
    nothing about what exists elsewhere.
    """
    if not is_revision(revision):
        raise BadRevision("not a revision name (a commit hash, or a branch or tag name of "
                          "letters, digits and ._+- in /-separated parts)")
    base = repo_dir(root, repo)
    if not (base.is_dir() and _inside(root, base)):
        raise NoRepo(f"repository {repo} is not here")
    if _SHA1.match(revision) and _snapshot_dir(root, repo, revision) is not None:
        return revision
    ref = base / "refs" / revision
    if not (ref.is_file() and _inside(base, ref)):
        raise NoRevision(f"{repo} has no revision {revision!r}")
    commit = ref.read_text(errors="replace").strip()
    if not _SHA1.match(commit) or _snapshot_dir(root, repo, commit) is None:
        raise NoRevision(f"{repo}: refs/{revision} names a snapshot that is not here")
    return commit


def _snapshot_dir(root: Path, repo: str, commit: str) -> Path | None:
    base = repo_dir(root, repo)
    path = base / "snapshots" / commit
    return path if path.is_dir() and _inside(base, path) else None


def snapshot(root: Path, repo: str, commit: str) -> list[CachedFile]:
    """Every complete file of a snapshot, by path.

    A file is listed only if it resolves to a file under ``root``: a link that
    points outside the cache (planted, or left by a copy) is not part of it.
    """
    base = _snapshot_dir(root, repo, commit)
    if base is None or not _inside(root, base):
        return []
    found = []
    for current, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            link = Path(current) / name
            try:
                target = link.resolve(strict=True)
            except OSError:
                continue  # a dangling link: its blob was removed
            if not (_inside(root, target) and target.is_file()):
                continue
            found.append(CachedFile(
                path=str(link.relative_to(base)), size=target.stat().st_size,
                etag=target.name, blob=target,
            ))
    return found


def refs(root: Path, repo: str) -> dict[str, str]:
    base = repo_dir(root, repo) / "refs"
    if not base.is_dir():
        return {}
    return {
        str(p.relative_to(base)): p.read_text().strip()
        for p in sorted(base.rglob("*")) if p.is_file()
    }


def repos(root: Path) -> Iterator[str]:
    """Repo ids of the model repositories in a cache root."""
    if not root.is_dir():
        return
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("models--") and entry.is_dir():
            parts = entry.name[len("models--"):].split("--")
            if len(parts) == 2:
                yield "/".join(parts)


def link(root: Path, repo: str, commit: str, path: str, etag: str) -> Path:
    """Make ``snapshots/<commit>/<path>`` point at ``blobs/<etag>``, atomically."""
    base = repo_dir(root, repo)
    target = base / "snapshots" / commit / path
    if ".." in Path(path).parts or Path(path).is_absolute():
        raise CacheError(f"{path!r} is not a path inside a repository")
    target.parent.mkdir(parents=True, exist_ok=True)
    relative = os.path.relpath(base / "blobs" / etag, target.parent)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.link")
    temporary.unlink(missing_ok=True)
    os.symlink(relative, temporary)
    os.replace(temporary, target)
    return target


def set_ref(root: Path, repo: str, revision: str, commit: str) -> None:
    if revision == commit:
        return
    path = repo_dir(root, repo) / "refs" / revision
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".ref.")
    with os.fdopen(fd, "w") as handle:
        handle.write(commit)
    os.replace(temporary, path)


def add(root: Path, repo: str, files: Mapping[str, Path], revision: str = "main") -> str:
    """Put local files into the cache as one new commit of ``repo``; returns the commit.

    For sites that got their files some other way (a disk carried in): the
    commit id is derived from the content, so adding the same files twice
    gives the same commit.
    """
    sources.parse(repo)
    entries = []
    blobs = repo_dir(root, repo) / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    for path, source in sorted(files.items()):
        size = source.stat().st_size
        lfs = size >= LFS_THRESHOLD or path.endswith(LFS_SUFFIXES)
        digest = hashlib.sha256() if lfs else None
        data = b""
        with source.open("rb") as handle:
            if digest is not None:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
            else:
                data = handle.read()
        etag = digest.hexdigest() if digest is not None else git_blob_sha1(data)
        blob = blobs / etag
        if not blob.exists():
            fd, temporary = tempfile.mkstemp(dir=blobs, prefix=f".{etag}.")
            with os.fdopen(fd, "wb") as out, source.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    out.write(chunk)
            os.chmod(temporary, 0o644)
            os.replace(temporary, blob)
        entries.append((path, etag))
    commit = hashlib.sha1(json.dumps([repo, entries]).encode()).hexdigest()
    for path, etag in entries:
        link(root, repo, commit, path, etag)
    set_ref(root, repo, revision, commit)
    return commit
