"""Give disk back: remove fetched weights that nothing uses.

Only what llmgw fetched is ever a candidate: a fetch record under
``<weights_dir>/.llmgw/fetched/`` names the blobs it brought. Files an
operator put there, other tools' caches, and blobs another record still
names are never touched. A record whose source a unit on the node names is
kept, whatever that unit's state: a stopped unit may start again. The
default is a dry run that says what would go and how much it frees.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from llmgw.hub import fetches


@dataclass(frozen=True)
class Reclaimed:
    source: str
    path: str
    size_bytes: int
    removed: bool
    kept_because: str = ""


def reclaim(weights_dir: str, used: dict[str, list[str]], remove: bool) -> list[Reclaimed]:
    """Per record in ``weights_dir``: removed (or would be), or kept and why.

    ``used`` maps a source to the units that name it in this directory.
    """
    records = fetches.records(weights_dir)
    results = []
    gone: list[fetches.Fetched] = []
    for record in records:
        users = used.get(record.source, [])
        if users:
            results.append(Reclaimed(record.source, record.path, 0, False,
                                     f"used by {', '.join(sorted(users))}"))
        else:
            gone.append(record)
    kept_blobs = {b for r in records if r not in gone for b in r.blobs}
    for record in gone:
        blobs = [Path(b) for b in record.blobs if b not in kept_blobs]
        freed = sum(b.stat().st_size for b in blobs if b.is_file())
        if remove:
            _remove(weights_dir, record, blobs)
        kept_blobs.difference_update(record.blobs)
        results.append(Reclaimed(record.source, record.path, freed, remove))
    return results


def _remove(weights_dir: str, record: fetches.Fetched, blobs: Collection[Path]) -> None:
    doomed = {b.resolve() for b in blobs}
    root = Path(weights_dir).resolve()
    for blob in doomed:
        if root not in blob.parents:
            continue  # a record naming a file outside its directory is not trusted
        snapshots = blob.parent.parent / "snapshots"
        if snapshots.is_dir():
            for current, _, files in os.walk(snapshots):
                for name in files:
                    link = Path(current) / name
                    if link.is_symlink() and (link.parent / os.readlink(link)).resolve() == blob:
                        link.unlink()
        blob.unlink(missing_ok=True)
    for directory in sorted({b.parent for b in doomed} | _snapshot_dirs(record),
                            key=lambda p: -len(p.parts)):
        _prune(directory, root)
    fetches.forget(record.source, weights_dir)


def _snapshot_dirs(record: fetches.Fetched) -> set[Path]:
    if not record.commit:
        return set()
    path = Path(record.path)
    while path.name != record.commit and path != path.parent:
        path = path.parent
    found: set[Path] = set()
    if path.is_dir():
        for current, dirs, _ in os.walk(path):
            found.update(Path(current) / d for d in dirs)
        found.add(path)
    return found


def _prune(directory: Path, root: Path) -> None:
    """Remove ``directory`` and empty parents, never ``root`` or above."""
    while directory != root and root in directory.parents:
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent
