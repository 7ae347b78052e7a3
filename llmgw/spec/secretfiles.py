"""The secret files a cluster names on its control host, and the places they must not lie.

The cluster directory is a git working tree. A secret file in it, or one git
tracks, or one in a working tree that no ``.gitignore`` covers, is a ``git add
-A`` away from every clone. ``llmgw validate`` warns (it does not refuse: the
cluster is valid, and the file may be moved at leisure) about each such file:

* ``cluster.store.password_file`` — the PostgreSQL password;
* ``cluster.web.oidc.client_secret_file`` — the single sign-on client secret;
* each ``upstreams.NAME.api_key_file`` — an upstream's key;
* the daemon's admin token, in the state directory (:mod:`llmgw.spec.statedirs`).

``cluster.weights.token_file`` is a path on each *node*, never read on the
control host, so it is not checked here.

Only the decision is here; what git says of a file is asked by the caller
(``llmgw validate`` runs ``git ls-files`` and ``git check-ignore``), so that this
module runs no program. No message holds a secret: only paths and setting names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmgw.spec import statedirs
from llmgw.spec.checks import Problem
from llmgw.spec.models import Cluster

DataPath = tuple[str | int, ...]
# What git says of a path: tracked, in a working tree and not ignored ("exposed"), or
# neither (ignored, outside any repository, or no git on this host).
GitState = Literal["tracked", "exposed"] | None
GitProbe = Callable[[Path], GitState]


@dataclass(frozen=True)
class SecretFile:
    setting: DataPath  # where the cluster files name it (or would)
    what: str  # for people: "store.password_file"
    file: Path  # absolute, as the loader resolved it


def named(cluster: Cluster) -> list[SecretFile]:
    """Every secret file the control host reads for ``cluster`` (a loaded cluster: relative
    paths are already resolved)."""
    settings = cluster.cluster
    found = [SecretFile(("cluster", "state_dir"), f"the admin token ({statedirs.ADMIN_TOKEN} "
                        "in the state directory)", statedirs.admin_token(settings))]
    if settings.store.password_file:
        found.append(SecretFile(("cluster", "store", "password_file"), "store.password_file",
                                Path(settings.store.password_file)))
    oidc = settings.web.oidc
    if oidc is not None and oidc.client_secret_file:
        found.append(SecretFile(("cluster", "web", "oidc", "client_secret_file"),
                                "web.oidc.client_secret_file", Path(oidc.client_secret_file)))
    for name, upstream in sorted(cluster.upstreams.items()):
        if upstream.api_key_file:
            found.append(SecretFile(("upstreams", name, "api_key_file"),
                                    f"upstreams.{name}.api_key_file",
                                    Path(upstream.api_key_file)))
    return found


def problems(cluster: Cluster, directory: Path, git: GitProbe) -> list[Problem]:
    """A warning for each secret file that git tracks, that lies in ``directory`` (the
    cluster directory), or that lies in a git working tree no ``.gitignore`` covers."""
    found = []
    for secret in named(cluster):
        state = git(secret.file)
        if state == "tracked":
            why = ("is tracked by git: every clone has it. Move it out of the repository "
                   f"(`git rm --cached {secret.file}`), then change the secret, since "
                   "the history keeps the old one")
        elif statedirs.inside(secret.file, directory):
            why = ("lies inside the cluster directory, a git working tree: `git add -A` "
                   f"would commit it. Move it to {_outside(cluster, directory)}"
                   + (" (a relative name is read from there)"
                      if secret.setting[-1] in ("password_file", "api_key_file") else ""))
        elif state == "exposed":
            why = ("lies in a git working tree that no .gitignore covers: `git add -A` "
                   "would commit it. Move it out, or ignore it")
        else:
            continue
        found.append(Problem(secret.setting, f"{secret.what} {secret.file} {why}",
                             at_key=True))
    return found


def _outside(cluster: Cluster, directory: Path) -> str:
    state = statedirs.of(cluster.cluster)
    if statedirs.inside(state, directory):
        return "a directory outside it (and cluster.state_dir with it)"
    return f"the state directory, {state}"
