"""The control host's state directory: where its secrets live, never the cluster directory.

The cluster directory is a git working tree: whatever lies in it is one
``git add -A`` away from a remote. The daemon's admin token, and by default
the files holding the store's password, are kept in a directory of this host
instead:

1. ``cluster.state_dir`` when the cluster files set it (relative to the
   cluster directory unless absolute; ``llmgw validate`` warns when it lies
   inside it);
2. else ``$LLMGW_STATE_DIR`` (one host of several that share the files, a
   test);
3. else ``/var/lib/llmgw`` for root, ``~/.local/state/llmgw`` for anyone else
   (where ``llmgw init`` puts the SQLite store).

Usage::

    token = statedirs.admin_token(cluster.cluster)   # Path; the file may not exist yet
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmgw.spec.models import ClusterSettings

ENV = "LLMGW_STATE_DIR"
ADMIN_TOKEN = "admin.token"


def default(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """This host's state directory when the cluster files do not name one."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV):
        return Path(environ[ENV]).expanduser().absolute()
    if (os.geteuid() if euid is None else euid) == 0:
        return Path("/var/lib/llmgw")
    return Path.home() / ".local" / "state" / "llmgw"


def pinned(environ: Mapping[str, str] | None = None) -> Path | None:
    """The state directory a new cluster file must name (``state_dir``), or None.

    None when the default needs no environment: root's and the user's are found by
    ``llmgw serve`` whatever its environment. Where ``$LLMGW_STATE_DIR`` chose it, a
    daemon started without that variable (a systemd unit) would look elsewhere, so
    ``llmgw init`` writes it into ``cluster.yaml``."""
    environ = os.environ if environ is None else environ
    return default(environ) if environ.get(ENV) else None


def of(settings: ClusterSettings, environ: Mapping[str, str] | None = None) -> Path:
    """The state directory of a loaded cluster (whose ``state_dir`` the loader anchored)."""
    if settings.state_dir:
        return Path(settings.state_dir).expanduser()
    return default(environ)


def admin_token(settings: ClusterSettings, environ: Mapping[str, str] | None = None) -> Path:
    """Where ``llmgw serve`` keeps its admin token, whatever the store is."""
    return of(settings, environ) / ADMIN_TOKEN


def inside(path: Path, directory: Path) -> bool:
    """Whether ``path`` (symlinks followed) lies in ``directory`` or below it."""
    try:
        path.expanduser().resolve().relative_to(directory.resolve())
    except ValueError:
        return False
    return True
