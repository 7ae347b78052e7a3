"""``llmgw init [DIR] [--install]``: a cluster repository for a real site, and the daemon's unit.

See :mod:`llmgw.onboarding.sites` for what is written. ``--install`` writes
the daemon's systemd unit, enables and starts it and waits for its
``/health``; where systemd is not PID 1 (a container, CI) it prints the unit
and the commands instead. Every step is skipped when already done.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import httpx

from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.onboarding import sites

NEXT = """\
Next:{cd}
  llmgw node add [USER@]HOST      # pin its key, install the agent, add it to nodes.yaml
  llmgw doctor                    # check every node
  {git}git add -A && git commit -m "llmgw: {name}\""""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "init", help="start a cluster repository for a real site",
        description="Write cluster/ (this host's settings, the store outside git, empty nodes, "
        "models and known_hosts), the CI plan workflow and a .gitignore, where missing. "
        "A second run changes nothing.",
    )
    parser.add_argument("dir", nargs="?", type=Path, default=Path("."), metavar="DIR",
                        help="the repository (default: the current directory)")
    parser.add_argument("--name", help="the cluster's name (default: the directory's)")
    parser.add_argument("--install", action="store_true",
                        help="also install, enable and start the daemon's systemd unit")
    parser.add_argument("--health-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="with --install: how long to wait for /health (default 60)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    directory: Path = args.dir
    directory.mkdir(parents=True, exist_ok=True)
    host = sites.this_host(directory, args.name)
    for relative, written in sites.write(directory, host):
        print(f"{'wrote' if written else 'kept '} {directory / relative}")
    cluster_dir = directory / "cluster"
    cluster = clusters.load(cluster_dir)
    if args.install:
        _install(cluster_dir, cluster.cluster.listeners.admin, args.health_timeout)
    print(_next_steps(directory, cluster.cluster.name))
    return 0


def _next_steps(directory: Path, name: str) -> str:
    """What to type next, from where the command ran: into DIR first, and a git repository."""
    here = directory.resolve() == Path.cwd().resolve()
    cd = "" if here else f"\n  cd {directory}"
    in_git = any((d / ".git").exists() for d in (directory.resolve(), *directory.resolve().parents))
    return NEXT.format(cd=cd, git="" if in_git else "git init -q && ", name=name)


def _install(cluster_dir: Path, admin: str, timeout: float) -> None:
    try:
        unit = sites.daemon_unit(cluster_dir)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if not sites.systemd_is_init():
        print(f"systemd is not PID 1 here, so nothing was installed. On the control host, "
              f"as root, write this to {sites.UNIT_PATH}:\n")
        print(unit)
        for argv in sites.install_commands():
            print("  " + " ".join(argv))
        return
    path = sites.UNIT_PATH
    current = path.read_text() if path.exists() else None
    if current != unit:
        try:
            path.write_text(unit)
        except OSError as exc:
            raise UserError(f"cannot write {path}: {exc.strerror} (run as root)") from None
        print(f"wrote {path}")
    else:
        print(f"kept  {path}")
    for argv in sites.install_commands():
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise UserError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    url = f"http://{admin.replace('0.0.0.0', '127.0.0.1')}/health"
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                print(f"llmgw.service is running: {url} answers")
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise UserError(f"llmgw.service started but {url} did not answer within "
                            f"{timeout:g}s: see `journalctl -u llmgw.service`")
        time.sleep(0.5)
