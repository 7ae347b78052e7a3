"""Where weights are kept across the fleet: shared stores per fabric, local copies per node.

A weights directory on a network or cluster filesystem (NFS, Lustre, GPFS,
BeeGFS, CephFS, ...) is a **shared store**: one copy there is seen by every
node that mounts it. Two nodes share a store when they are on one declared
fabric and their agents report the same filesystem (type, source and the
directory inside it) under a weights directory. A store is counted per
fabric: a mount named ``filer:/export`` at two sites is not taken for one. A
node on no fabric, a local filesystem, or a mount the agent did not report
(an older agent) keeps its copies for itself.

:func:`survey` is what the planner (a copy in a store counts for every node
that mounts it), ``llmgw status`` and /admin read. A purely computational
module with no side effects.

    found = survey(fleet, {"gpu-a-01": ["ib-a"], "gpu-a-02": ["ib-a"]})
    [(s.fabric, s.source, [c.name for c in s.copies]) for s in found.stores]
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from llmgw.fleet.types import Disk, Fleet, Mount, NodeReport

# Network and cluster filesystems: what one node writes there, the others read.
SHARED_TYPES = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "ceph", "fuse.ceph-fuse", "cifs", "smb3",
    "glusterfs", "fuse.glusterfs", "wekafs", "fuse.juicefs", "fuse.sshfs", "ocfs2", "gfs2",
    "9p", "virtiofs", "fuse.s3fs", "fuse.gcsfuse", "fuse.mountpoint-s3",
})


def is_shared(fs_type: str, overrides: Mapping[str, bool] | None = None) -> bool:
    """Whether a filesystem of ``fs_type`` is seen alike by many nodes; ``overrides``
    (the cluster's ``weights.filesystems``) win over :data:`SHARED_TYPES`."""
    if overrides and fs_type in overrides:
        return overrides[fs_type]
    return fs_type in SHARED_TYPES


@dataclass(frozen=True)
class Copy:
    """One set of weights in one weights directory."""

    name: str  # the fetched source, else the path below the weights directory
    size_bytes: int
    source: str | None  # the source llmgw fetched it as; None: weights found on disk
    relative: str  # the path below the weights directory
    nodes: tuple[str, ...]  # the nodes whose agents reported it
    directory: str = ""  # the weights directory it is in, as the first of them sees it


@dataclass(frozen=True)
class Store:
    """A shared filesystem as the nodes of one fabric mount it."""

    fabric: str
    fs_type: str
    source: str  # `filer-a:/export/models`, and the directory inside it when not its root
    dirs: tuple[tuple[str, str], ...]  # (node, its weights directory there), by node
    copies: tuple[Copy, ...]  # by name

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(node for node, _ in self.dirs)


@dataclass(frozen=True)
class Survey:
    stores: tuple[Store, ...] = ()  # by fabric, then source
    local: Mapping[str, tuple[Copy, ...]] = field(default_factory=dict)  # node → its own
    # node → why a shared mount of its is not shared with other nodes ("on no fabric")
    alone: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def of(self, node: str, directory: str) -> Store | None:
        """The store ``node``'s weights ``directory`` is part of; None: local."""
        for store in self.stores:
            if (node, directory) in store.dirs:
                return store
        return None

    def fabrics(self) -> list[str]:
        return sorted({s.fabric for s in self.stores})


def shared_mount(disk: Disk, overrides: Mapping[str, bool] | None) -> Mount | None:
    """The disk's mount when it is on a shared filesystem; else None."""
    mount = disk.mount
    if mount is None or not is_shared(mount.fs_type, overrides):
        return None
    return mount


def _disk_of(path: str, disks: Iterable[Disk]) -> Disk | None:
    best = None
    for disk in disks:
        base = disk.path.rstrip("/")
        if (path == base or path.startswith(base + "/")) and (
                best is None or len(base) > len(best.path.rstrip("/"))):
            best = disk
    return best


def _below(path: str, disk: Disk | None) -> str:
    """``path`` below the disk's directory (both absolute, normalised by the agent)."""
    if disk is None:
        return path
    base = disk.path.rstrip("/")
    return path[len(base) + 1:] if path.startswith(base + "/") else posixpath.relpath(path, base)


def copies(report: NodeReport) -> list[tuple[Disk | None, str, int, str | None, str]]:
    """Each copy a node reports: (its disk, its name, size, fetched source, relative path)."""
    found: list[tuple[Disk | None, str, int, str | None, str]] = []
    for cached in report.cached_weights:
        disk = _disk_of(cached.path, report.disks)
        relative = _below(cached.path, disk)
        found.append((disk, cached.source, cached.size_bytes, cached.source, relative))
    fetched = [c.path.rstrip("/") for c in report.cached_weights]
    for weights in report.weights:
        if any(weights.path == f or weights.path.startswith(f + "/") for f in fetched):
            continue  # what llmgw fetched: reported above, as its source
        disk = _disk_of(weights.path, report.disks)
        relative = _below(weights.path, disk)
        found.append((disk, relative, weights.size_bytes, None, relative))
    return found


def survey(fleet: Fleet, fabrics: Mapping[str, Iterable[str]],
           overrides: Mapping[str, bool] | None = None, *, local: bool = True) -> Survey:
    """The fleet's stores and local copies; ``fabrics``: each node's declared fabrics.
    ``local=False`` leaves out the local copies (the planner reads each node's own)."""
    groups: dict[tuple[str, tuple[str, str, str]], dict[str, str]] = {}
    kinds: dict[tuple[str, tuple[str, str, str]], tuple[str, str]] = {}
    alone: dict[str, list[str]] = {}
    # (node, store) → the groups it is in: each copy looks its own up, not every group.
    member: dict[tuple[str, tuple[str, str, str]], list[tuple[str, tuple[str, str, str]]]] = {}
    reports = {n: r for n, r in sorted(fleet.nodes.items()) if r.reachable}
    for name, report in reports.items():
        on = sorted(fabrics.get(name, ()))
        for disk in report.disks:
            mount = shared_mount(disk, overrides)
            if mount is None:
                continue
            if not on:
                alone.setdefault(name, []).append(
                    f"{disk.path}: {mount.fs_type} {mount.label} is shared, but the node is "
                    "on no fabric: its copies count for this node only")
            for fabric in on:
                key = (fabric, mount.store)
                groups.setdefault(key, {}).setdefault(name, disk.path)
                kinds.setdefault(key, (mount.fs_type, mount.label))
                member.setdefault((name, mount.store), []).append(key)
    # group → (relative, source) → the first report's copy and every reporting node
    held: dict[tuple[str, tuple[str, str, str]],
               dict[tuple[str, str | None], tuple[Copy, list[str]]]] = {}
    own: dict[str, list[Copy]] = {}
    for name, report in reports.items():
        stored = {d.path: m.store for d in report.disks if (m := shared_mount(d, overrides))}
        if not stored and not local:
            continue
        for on_disk, label, size, source, relative in copies(report):
            store = stored.get(on_disk.path) if on_disk is not None else None
            keys = member.get((name, store), []) if store is not None else []
            if not keys:
                own.setdefault(name, []).append(
                    Copy(label, size, source, relative, (name,), on_disk.path if on_disk else ""))
                continue
            for key in keys:
                entry = held.setdefault(key, {})
                seen = entry.get((relative, source))
                if seen is not None:
                    seen[1].append(name)
                else:
                    first = Copy(label, size, source, relative, (), on_disk.path if on_disk else "")
                    entry[(relative, source)] = (first, [name])
    stores = tuple(
        Store(fabric=key[0], fs_type=kinds[key][0], source=kinds[key][1],
              dirs=tuple(sorted(members.items())),
              copies=tuple(sorted((replace(c, nodes=tuple(n)) for c, n in
                                   held.get(key, {}).values()),
                                  key=lambda c: (c.name, c.relative))))
        for key, members in sorted(groups.items(), key=lambda item: (item[0][0],
                                                                     kinds[item[0]][1]))
    )
    return Survey(stores=stores,
                  local={n: tuple(sorted(c, key=lambda c: c.name)) for n, c in own.items()
                         if local},
                  alone={n: tuple(w) for n, w in alone.items()})
