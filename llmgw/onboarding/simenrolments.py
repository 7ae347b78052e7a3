"""Simulated nodes enrolled the way real ones are: bare, then ``llmgw node add`` as root.

:func:`enrol` takes nodes whose sshd runs and nothing else, and runs the real
``llmgw node add root@127.0.0.1:PORT`` for each, the cluster's
``ssh.user`` being the daemon's account. ``node add`` makes that account (a
system account in group llmgw, shell nologin, the control host's key for
forwarding and SFTP only), installs llmgw from wheels into the node's
prefix (``<node>/opt``), makes ``<prefix>/engines`` the account's, starts the
agent (supervise backend: systemd is not PID 1 here) and waits for its first
report through the account. Each node's entry in ``nodes.yaml`` is the one
``node add`` wrote, plus the engine port range the shared loopback needs.

Before ``node add`` runs, the prefix's ``etc/agent.yaml`` holds only the
fixture's ``hardware:`` (its sysfs, /proc and nvidia-smi), which ``node add``
keeps. The directories above the prefixes are opened for traversal (0711):
the account reaches its agent's socket through them, as through /opt on a
real node.

Usage (the tests' ``enrolled_cluster`` fixture, and ``llmgw lab up``)::

    outputs = simenrolments.enrol(cluster_dir, nodes, "llmgw", wheels)
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ruamel.yaml import YAML

from llmgw.onboarding import enrolments, yamledits
from llmgw.onboarding.simnodes import HarnessError, SimNode, fixture_settings, hardware_settings
from llmgw.spec.models import NAME_PATTERN

ENROL_TIMEOUT = 900.0  # node add builds nothing here, but installs ~50 wheels per node
PREFIX = "opt"


def prefix_of(node: SimNode) -> Path:
    return node.root / PREFIX


def prepare(node: SimNode) -> Path:
    """The node's prefix with the fixture hardware's agent.yaml, reachable by the account."""
    prefix = prefix_of(node)
    (prefix / "etc").mkdir(parents=True, exist_ok=True)
    settings = prefix / "etc" / "agent.yaml"
    if not settings.exists():  # node add's own, once it ran: it keeps the hardware
        yaml = YAML()
        yaml.default_flow_style = False
        with settings.open("w") as out:
            out.write("# The simulated node's hardware, kept by `llmgw node add`.\n")
            yaml.dump({"hardware": hardware_settings(node)}, out)
    for directory in (node.root.parent, node.root, prefix):
        directory.chmod(0o711 if directory != prefix else 0o755)
    return prefix


def node_add_argv(cluster_dir: Path, node: SimNode, wheels: Path,
                  weights_dirs: Sequence[str] = ()) -> list[str]:
    """``llmgw node add`` for one bare node, as an operator runs it (as root, key pinned
    by its fingerprint, its fixture's fabrics and ``weights_dirs`` named), and
    ``--no-compiler``: a simulated GPU node is this machine, which node add leaves alone."""
    fabrics = fixture_settings(node.hardware)["declared"].get("fabrics", {})
    argv = [sys.executable, "-m", "llmgw", "node", "add", f"root@127.0.0.1:{node.port}",
            "--cluster", str(cluster_dir), "--prefix", str(prefix_of(node)),
            "--wheels", str(wheels), "--name", node.name,
            "--fingerprint", node.host_fingerprint(),
            # The lab's nodes are this machine: node add installs no compiler on it.
            "--no-compiler"]
    for name, fabric in sorted(fabrics.items()):
        argv += ["--fabric", f"{name}={','.join(fabric.get('adapters') or [])}"]
    for directory in weights_dirs:
        argv += ["--weights-dir", directory]
    return argv


def enrol(cluster_dir: Path, nodes: Sequence[SimNode], account: str, wheels: Path,
          say: Callable[[str], None] | None = None,
          weights_dirs: Sequence[str] = ()) -> dict[str, str]:
    """Run ``node add`` for every node (sshd running, nothing else), one after the other;
    the output of each. Raises :class:`HarnessError` with the output of the first that failed.

    The cluster directory's ``cluster.yaml`` must name ``account`` as ``ssh.user``.
    """
    for node in nodes:
        if not re.match(NAME_PATTERN, node.name):
            raise HarnessError(f"{node.name!r} is not a node name")
        prepare(node)
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}

    def one(node: SimNode) -> subprocess.CompletedProcess[str]:
        return subprocess.run(node_add_argv(cluster_dir, node, wheels, weights_dirs),
                              capture_output=True,
                              text=True, timeout=ENROL_TIMEOUT, stdin=subprocess.DEVNULL,
                              env=env)

    # Built here once: parallel node adds would each rebuild llmgw's own wheel into the
    # same cache at once.
    try:
        enrolments.build_wheels(wheels)
    except enrolments.EnrolError as exc:
        raise HarnessError(str(exc)) from None
    # One at a time: these nodes share one machine, so one account, which the first
    # node add makes (on real nodes, each its own), and every node add rewrites the
    # same nodes.yaml.
    done = []
    for node in nodes:
        done.append(one(node))
        if done[-1].returncode != 0:
            break
    for node, result in zip(nodes, done, strict=False):
        if result.returncode != 0:
            raise HarnessError(f"`llmgw node add` of {node.name} failed ({result.returncode}):"
                               f"\n{result.stdout}{result.stderr}")
        node.prefix = prefix_of(node)
        if say is not None:
            say(result.stdout)
    path = cluster_dir / "nodes.yaml"
    text = path.read_text()
    for node in nodes:  # every node shares 127.0.0.1: each its own engine ports
        text, _ = yamledits.set_node_key(text, node.name, "engine_ports_from",
                                         node.engine_ports_from)
    path.write_text(text)
    return {node.name: result.stdout for node, result in zip(nodes, done, strict=True)}


def account_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def remove_account(user: str, *, group: bool) -> None:
    """Delete the account ``node add`` made (and its home); with ``group``, group llmgw too
    (when ``node add`` made it for this account)."""
    subprocess.run(["userdel", "-r", user], capture_output=True, check=False)
    if group:
        subprocess.run(["groupdel", "llmgw"], capture_output=True, check=False)
