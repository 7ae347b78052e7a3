"""``llmgw init [DIR] [--install]``: a site's seed server, and the daemon's unit.

The steps are :mod:`llmgw.onboarding.inits`', the files
:mod:`llmgw.onboarding.sites`'. ``--install`` writes the daemon's systemd unit,
enables and starts it and waits for its ``/health``; where systemd is not PID 1
(a container, CI) it prints the unit and the commands instead. Every step is
skipped when already done.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import httpx

from llmgw.cli import clusters, node_cmd
from llmgw.cli.errors import UserError
from llmgw.onboarding import inits, sites

NEXT = """\
Next:{cd}
  llmgw validate                  # what the cluster declares
  llmgw node add [USER@]HOST      # more nodes: pin the key, install the agent
  {again}  # the daemon, which starts a local node's agent
  {git}git add -A && git commit -m "llmgw: {name}\""""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "init", help="make this machine a site's seed server, step by step",
        description="The seed server, each step looking before it acts: the cluster files "
        "and .gitignore, an administrator with a generated password (printed once), a hub "
        "mirror, this machine as a node (or one over SSH), a starter model that fits, and "
        "with --postgres the store moved there. A rerun finishes an interrupted run and "
        "otherwise changes nothing.",
    )
    parser.add_argument("dir", nargs="?", type=Path, default=Path("."), metavar="DIR",
                        help="the repository (default: the current directory)")
    parser.add_argument("--name", help="the cluster's name (default: the directory's)")
    parser.add_argument("--admin", default="admin", metavar="NAME",
                        help="the administrator's user name (default admin)")
    parser.add_argument("--no-mirror", action="store_true", help="no hub mirror")
    parser.add_argument("--no-node", action="store_true", help="add no node")
    parser.add_argument("--no-model", action="store_true", help="declare no starter model")
    parser.add_argument("--node", default="local", metavar="local|[USER@]HOST[:PORT]",
                        help="the node to add: this machine (default) or one over SSH, "
                        "through `llmgw node add`")
    parser.add_argument("--node-name", metavar="NAME",
                        help="the node's name (default: the machine's hostname)")
    parser.add_argument("--fingerprint", metavar="SHA256:…",
                        help="with --node HOST: its host key fingerprint (as node add)")
    parser.add_argument("--prefix", default=node_cmd.DEFAULT_PREFIX,
                        help=f"with --node HOST: where llmgw lives on it (default "
                        f"{node_cmd.DEFAULT_PREFIX})")
    parser.add_argument("--wheels", type=Path, default=Path.home() / ".cache" / "llmgw" /
                        "wheels", help="with --node HOST: local cache of the wheels shipped")
    parser.add_argument("--model-file", type=Path, metavar="GGUF",
                        help="the starter's GGUF (default: `make model`'s, when found)")
    parser.add_argument("--postgres", metavar="URL",
                        help="move the store to this PostgreSQL database "
                        "(postgresql://USER@HOST:5432/DB; moved back if that fails)")
    parser.add_argument("--postgres-password-file", type=Path, metavar="FILE",
                        help="with --postgres: the file holding its password")
    parser.add_argument("--install", action="store_true",
                        help="also install, enable and start the daemon's systemd unit")
    parser.add_argument("--health-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="with --install: how long to wait for /health (default 60)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    directory: Path = args.dir
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{directory}: not a directory")
    options = inits.Options(
        directory=directory, name=args.name, admin=args.admin, mirror=not args.no_mirror,
        node=None if args.no_node else args.node, node_name=args.node_name,
        model=not args.no_model, model_file=args.model_file, postgres=args.postgres,
        postgres_password_file=args.postgres_password_file)

    def add_node(target: str, name: str | None) -> None:
        node_cmd.run_add(argparse.Namespace(
            target=target, name=name, continue_past=False, no_compiler=False,
            fingerprint=args.fingerprint,
            label=[], fabric=[], weights_dirs=[], prefix=args.prefix, wheels=args.wheels,
            cluster=directory / "cluster"))

    def secret(text: str) -> None:  # the terminal only: never a log line
        print(text, flush=True)

    try:
        seed = inits.Seed(options, secret=secret,
                          add_node=add_node)
        directory.mkdir(parents=True, exist_ok=True)
        inits.run(seed.steps(), say=lambda line: print(line, flush=True))
    except inits.InitError as exc:
        raise UserError(str(exc)) from None
    cluster_dir = directory / "cluster"
    cluster = clusters.load(cluster_dir)
    if args.install:
        _install(cluster_dir, cluster.cluster.listeners.admin, args.health_timeout)
    skipped = [f"--no-{what}" for what in ("mirror", "node", "model")
               if getattr(args, f"no_{what}")]
    print(_next_steps(directory, cluster.cluster.name,
                      " ".join(["llmgw init", *skipped, "--install"])))
    return 0


def _next_steps(directory: Path, name: str, again: str = "llmgw init --install") -> str:
    """What to type next, from where the command ran: into DIR first, and a git repository;
    ``again``: init with the same steps skipped, and the daemon."""
    here = directory.resolve() == Path.cwd().resolve()
    cd = "" if here else f"\n  cd {directory}"
    in_git = any((d / ".git").exists() for d in (directory.resolve(), *directory.resolve().parents))
    return NEXT.format(cd=cd, git="" if in_git else "git init -q && ", name=name,
                       again=again.ljust(30))


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
