"""The files of a real site's cluster repository, as ``llmgw init`` writes them.

:mod:`.inits` writes each where missing (a second run changes nothing):

* ``cluster/cluster.yaml`` — this control host's settings: its SSH user and
  key, listeners, and the store **outside** the repository (keys and usage
  are not for git);
* ``cluster/nodes.yaml`` and ``cluster/models.yaml`` — empty, with comments
  saying how to fill them (``llmgw node add``);
* ``cluster/known_hosts`` — empty: keys are pinned by ``llmgw node add``;
* ``.github/workflows/llmgw-plan.yml`` — the CI preview (docs/gitops.md);
* ``.gitignore`` — local state (:data:`GITIGNORE`; lines added, never removed).

:func:`daemon_unit` renders the daemon's systemd unit for ``--install``.
"""

from __future__ import annotations

import getpass
import json
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2

from llmgw.rendering import quoting
from llmgw.spec import statedirs

UNIT_PATH = Path("/etc/systemd/system/llmgw.service")
_UNIT_SAFE = re.compile(r"[A-Za-z0-9._/-]+")
WORKING_DIRECTORY = "/"  # the daemon's: never the repository (see daemon_unit)


@dataclass(frozen=True)
class Host:
    """What ``cluster.yaml`` takes from the machine ``llmgw init`` runs on."""

    name: str
    user: str
    identity_file: str | None
    store: str


def this_host(directory: Path, name: str | None = None) -> Host:
    """The control host's settings: root keeps state in /var/lib, anyone else in ~/.local."""
    home = Path.home()
    identity = next((str(p) for p in (home / ".ssh" / "id_ed25519", home / ".ssh" / "id_rsa")
                     if p.exists()), None)
    state = statedirs.default()
    site = name or _name_of(directory)
    return Host(site, "llmgw", identity, str(state / f"{site}.db"))


def _name_of(directory: Path) -> str:
    raw = directory.resolve().name.lower()
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in raw).strip("-._")
    return cleaned[:63] or "site"


def cluster_yaml(host: Host) -> str:
    identity = (f"    identity_file: {json.dumps(host.identity_file)}   # the key the nodes "
                "authorise\n" if host.identity_file else
                "    # identity_file: ~/.ssh/id_ed25519   # default: your SSH agent's keys\n")
    return f"""\
# Cluster-wide settings for {host.name}, written by `llmgw init`. Nodes go in
# nodes.yaml (`llmgw node add`), models in models.yaml; every *.yaml here is read.
cluster:
  name: {json.dumps(host.name)}
  ssh:
    user: {host.user}                # a user in the `llmgw` group on every node
    known_hosts: known_hosts   # pinned host keys: `llmgw node add` fills it
{identity}  sync: manual                 # plans only; switch to auto once plans have earned trust
  drift_interval: 1m
  listeners:
    router: 0.0.0.0:8000       # the OpenAI-compatible endpoint clients use
    admin: 127.0.0.1:8001      # status and fleet snapshot: loopback only
    metrics: 0.0.0.0:9400      # Prometheus scrapes this
  store:
    path: {json.dumps(host.store)}   # keys (hashed) and usage: outside git
  auth: keys                   # every request needs a key from `llmgw keys create`

projects:
  default: {{budget_usd: 100}}
"""


NODES_YAML = """\
# The machines. Add each with `llmgw node add [USER@]HOST`: it pins the host
# key, installs the agent and writes the node here with what it found.
nodes: {}
"""

MODELS_YAML = """\
# Models and how to run them (docs/cluster-reference.md). Give each a price:
# projects' budgets (cluster.yaml) are charged at it, and a budget over models
# without one never binds (`llmgw validate` says so). For example:
#
# models:
#   qwen2.5-7b:
#     source: Qwen/Qwen2.5-7B-Instruct
#     pricing: {input_per_mtok: 0.20, output_per_mtok: 0.60}   # USD per million tokens
#     profiles:
#       - {engine: vllm, gpu_class: l40s-45g}
models: {}
"""

# Local state beside the cluster files, never for git: SQLite stores and their
# journals, tokens and password files, the lab's and the local node's state.
GITIGNORE = ["/cluster/state/", "*.db", "*.db-wal", "*.db-shm", "*.db-journal", "*.token",
             "pgpass", "/.llmgw-lab/"]


def files(host: Host) -> dict[str, str]:
    """Relative path → text of every file ``init`` writes."""
    workflow = resources.files("llmgw").joinpath("templates/llmgw-plan.yml").read_text()
    return {
        "cluster/cluster.yaml": cluster_yaml(host),
        "cluster/nodes.yaml": NODES_YAML,
        "cluster/models.yaml": MODELS_YAML,
        "cluster/known_hosts": "",
        ".github/workflows/llmgw-plan.yml": workflow,
        ".gitignore": "".join(line + "\n" for line in GITIGNORE),
    }


def daemon_unit(cluster_dir: Path, user: str | None = None) -> str:
    """The daemon's systemd unit: ``llmgw serve`` for ``cluster_dir``, as this user.

    It runs in ``/``, not in the repository that holds the cluster directory:
    a ``llmgw.py`` committed there must never be what runs (and ``python -P``
    keeps the working directory off ``sys.path`` when llmgw runs as ``-m``).
    """
    program = Path(sys.argv[0]).resolve() if Path(sys.argv[0]).name == "llmgw" else None
    argv = ([str(program)] if program else [sys.executable, "-P", "-m", "llmgw"])
    argv += ["serve", "--cluster", str(cluster_dir.resolve())]
    user = user or getpass.getuser()
    for what, text in (("user", user), ("directory", str(cluster_dir.resolve()))):
        if not _UNIT_SAFE.fullmatch(text):
            raise ValueError(f"the {what} {text!r} cannot go into a unit file as it is: use a "
                             "name and path of letters, digits and ._/-")
    env = jinja2.Environment(loader=jinja2.PackageLoader("llmgw", "templates"),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)
    return env.get_template("llmgw.service.j2").render(
        user=user, exec_start=quoting.exec_line(argv), working_directory=WORKING_DIRECTORY,
    )


def systemd_is_init() -> bool:
    """Whether PID 1 is systemd (not a container's init, not a VM's agent)."""
    try:
        return Path("/proc/1/comm").read_text().strip() == "systemd"
    except OSError:
        return False


def install_commands() -> list[list[str]]:
    return [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", "llmgw.service"]]
