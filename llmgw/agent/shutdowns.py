"""The agent stopping for good (``Shutdown``): ``llmgw node remove --stop-agent/--uninstall``.

The daemon's account has no shell (``node add`` gives it ``nologin``: it only
forwards the agent's socket), so the agent stops itself, asked over gRPC:

* **stop** — under systemd it disables its own ``llmgw-agent.service`` (so
  no boot starts it again) and exits 0, which ``Restart=on-failure`` leaves
  stopped; under the supervise backend it exits and drops its pid file.
* **uninstall** — also deletes, once it has stopped serving, the prefix
  ``node add`` installed into (``venv/``, ``etc/``, ``state/``, ``run/``,
  ``wheels/``, ``engines/`` and what is installed there) and, under systemd,
  the unit file. The agent runs as root (``node add`` starts it so: it runs
  engine units), so that is everything ``node add`` made except the daemon's
  account and the group ``llmgw``: the daemon is logged in as that account
  while it asks, and the group may have other members. Those are *left*,
  as the commands for an operator with root on the node (``userdel -r``,
  ``groupdel``); a path the agent cannot delete is left in the same way.

The prefix is the parent of ``state_dir`` (``node add`` writes
``state_dir: <prefix>/state``), accepted only if it holds what ``node add``
puts there (``venv/bin/llmgw``, ``etc/agent.yaml``,
``etc/llmgw-agent.service``): an agent set up by hand is never asked to
delete a directory it did not make. Uninstall is refused while llmgw units
remain (``node remove`` removes them first). A dry run checks the same and
answers the same, with units not counted (they are removed later).

:func:`decide` is pure; :func:`disable` and :func:`finish` act.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.agent import commands
from llmgw.agent.settings import Settings

log = logging.getLogger(__name__)

UNIT = "llmgw-agent.service"
MARKERS = ("venv/bin/llmgw", "etc/agent.yaml", f"etc/{UNIT}")


class ShutdownRefused(Exception):
    """The agent will not stop as asked; nothing was done. The message says why."""


@dataclass(frozen=True)
class Install:
    """What ``node add`` installed, as found on this node."""

    prefix: Path | None  # None: no prefix of node add's (the agent was set up otherwise)
    unit_file: Path | None  # llmgw-agent.service in systemd's directory, naming the prefix


@dataclass
class Decision:
    """What a Shutdown does: the answer's lines, and what is deleted as the agent exits."""

    detail: str
    removed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    disable: bool = False  # systemctl disable llmgw-agent before answering
    pid_file: Path | None = None


def find(settings: Settings) -> Install:
    """The prefix and unit file of ``node add``'s install, as far as this node proves them."""
    prefix = Path(settings.state_dir).parent
    ours = all((prefix / marker).exists() for marker in MARKERS)
    unit = Path(settings.systemd.unit_dir) / UNIT
    try:
        names = f"{prefix}/venv/bin/llmgw agent serve" in unit.read_text()
    except OSError:
        names = False
    return Install(prefix if ours else None, unit if ours and names else None)


def decide(install: Install, *, uninstall: bool, systemd: bool, units: Sequence[str],
           dry_run: bool, can_delete: bool) -> Decision:
    """What to do, or :class:`ShutdownRefused`. A purely computational function.

    ``units``: the llmgw units still on the node; ``can_delete``: whether the agent
    may delete the prefix (its parent is writable to it).
    """
    if units and not dry_run:
        raise ShutdownRefused(f"{len(units)} llmgw units remain on this node "
                              f"({', '.join(sorted(units)[:3])}): remove them first")
    if uninstall and install.prefix is None:
        raise ShutdownRefused("no install of `llmgw node add` found here (its prefix, the "
                              "parent of state_dir, lacks " + ", ".join(MARKERS) + "): "
                              "nothing is deleted; stop the agent without uninstall")
    decision = Decision(detail="")
    decision.disable = systemd and install.unit_file is not None
    if install.prefix is not None and not systemd:
        decision.pid_file = install.prefix / "run" / "agent.pid"
    if uninstall and install.prefix is not None:
        if install.unit_file is not None:
            decision.removed.append(str(install.unit_file))
        if can_delete:
            decision.removed.append(str(install.prefix))
        else:
            decision.left.append(f"rm -rf {install.prefix}")
    doing = (f"{UNIT} disabled" if decision.disable
             else f"no {UNIT} of node add's to disable" if systemd
             else "supervise backend: nothing starts it again")
    decision.detail = ("dry run: " if dry_run else "") + doing
    return decision


async def disable(settings: Settings, decision: Decision) -> None:
    """``systemctl disable llmgw-agent`` (and, when it is to go, the unit file and a
    daemon-reload), before the agent answers; :class:`ShutdownRefused` if it fails."""
    if not decision.disable:
        return
    systemctl = settings.systemd.systemctl
    done = await commands.run([systemctl, "disable", UNIT])
    if not done.ok:
        raise ShutdownRefused(f"systemctl disable {UNIT} failed: {done.why()}")
    unit = Path(settings.systemd.unit_dir) / UNIT
    if str(unit) in decision.removed:
        unit.unlink(missing_ok=True)
        reload = await commands.run([systemctl, "daemon-reload"])
        if not reload.ok:
            log.warning("systemctl daemon-reload after removing %s: %s", unit, reload.why())


def finish(decision: Decision, *, replace_process: bool = False) -> None:
    """Once the agent has stopped: its pid file and, with uninstall, the prefix go.

    ``replace_process``: the process becomes ``rm -rf`` of them (``exec``), as ``llmgw
    agent serve``'s last act, so that nothing of the interpreter runs from the venv
    being deleted; the agent's pid ends when its files are gone.
    """
    if decision.pid_file is not None:
        with contextlib.suppress(OSError):
            decision.pid_file.unlink()
    if not decision.removed:
        return
    log.info("removing %s (node remove --uninstall)", ", ".join(decision.removed))
    rm = shutil.which("rm")
    if replace_process and rm is not None:
        logging.shutdown()
        os.execv(rm, [rm, "-rf", "--", *decision.removed])
    for path in decision.removed:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
