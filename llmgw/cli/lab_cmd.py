"""``llmgw lab up|down|status``: simulated nodes on this machine and a cluster directory for them.

The nodes are the ones the tests use (a real sshd on loopback each, an
agent behind it, fixture hardware); see :mod:`llmgw.onboarding.labs`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from llmgw.cli.errors import UserError
from llmgw.onboarding import labfiles, labs

NEXT = """\
Next, in {where}:
  llmgw validate                  # check the files, reach no node
  llmgw inventory                 # ask every node's agent what it has
  {git}git add -A && git commit -qm "a lab"
  llmgw plan                      # what apply would change
  llmgw apply                     # make it so
  llmgw lab down                  # stop every node and engine of this lab"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "lab", help="simulated nodes on this machine, with a cluster directory for them",
        description="Start simulated nodes (a real sshd on 127.0.0.1 each, an llmgw agent "
        "behind it reporting fixture hardware: 8× H100 with InfiniBand, 4× L40S, CPU only) "
        "that keep running after the command, and write a ready cluster directory for them.",
    )
    commands = parser.add_subparsers(dest="lab_command", metavar="COMMAND", required=True)
    start = commands.add_parser("up", help="start the lab's nodes; write cluster/ the first time")
    _dir_flag(start)
    start.add_argument("--nodes", metavar="N", type=int, default=None,
                       help="how many nodes (default 3: gpu-01 H100, gpu-02 L40S, cpu-01)")
    start.add_argument("--ssh-port", metavar="PORT", type=int, default=None,
                       help=f"first node's SSH port on 127.0.0.1 (default {labs.SSH_PORT_FROM}, "
                       "or free ports where another program holds those)")
    start.add_argument("--engine-ports", metavar="PORT", type=int, default=None,
                       help=f"first node's first engine port; each node gets 100 (default "
                       f"{labs.ENGINE_PORTS_FROM}, or free ports where those are taken)")
    start.add_argument("--model", metavar="FILE", type=Path,
                       help="the Gemma 3 270M GGUF the CPU node serves (default: the llmgw "
                       "checkout's .cache/models, from `make model`)")
    start.add_argument("--engine", metavar="FILE", type=Path,
                       help="llama-server to run it with (default: on PATH, or the checkout's "
                       ".cache/engine from `make engine`)")
    start.add_argument("--backend", choices=("supervise", "systemd"), default=None,
                       help="what runs the nodes' agents and engines: `supervise` (default: "
                       "the agent itself) or `systemd` (each node's agent a systemd service "
                       "in a systemd-nspawn machine of its own, its engines systemd units; "
                       "needs root and systemd-container)")
    enrol = start.add_mutually_exclusive_group()
    enrol.add_argument("--account", metavar="USER",
                       help=f"the account node add makes on each node and the daemon logs in "
                       f"as (default {labs.DEFAULT_ACCOUNT}, as `llmgw init` writes it)")
    enrol.add_argument("--no-enrol", action="store_true",
                       help="start each node's agent directly instead of enrolling the bare "
                       "node with `llmgw node add` (seconds instead of minutes; what a lab "
                       "not started as root does)")
    start.set_defaults(handler=run_up)
    stop = commands.add_parser("down", help="stop every process of the lab, engines included")
    _dir_flag(stop)
    stop.add_argument("--purge", action="store_true",
                      help=f"also remove the nodes' files ({labs.RUNTIME}/, host keys included)")
    stop.set_defaults(handler=run_down)
    show = commands.add_parser("status", help="which of the lab's processes run")
    _dir_flag(show)
    show.set_defaults(handler=run_status)


def _dir_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", metavar="DIR", type=Path, default=Path("."),
                        help="the lab directory (default: the current one)")


def run_up(args: argparse.Namespace) -> int:
    account = args.account
    if account is None and not args.no_enrol:
        existing = labs.Lab(args.dir.resolve())
        if existing.nodes():  # a lab keeps how it was started
            account = existing.account()
        elif args.backend == "systemd":
            pass  # each node a systemd machine whose agent the lab starts as a service
        elif os.geteuid() == 0:
            account = labs.DEFAULT_ACCOUNT
        else:
            print(f"Not root: node add cannot make the {labs.DEFAULT_ACCOUNT} account, so each "
                  "node's agent is started directly (as with --no-enrol).")
    try:
        lab = labs.up(args.dir, count=args.nodes, ssh_port_from=args.ssh_port,
                      engine_ports_from=args.engine_ports,
                      model=args.model, engine=args.engine, account=account,
                      say=print, backend=args.backend)
    except labs.LabError as exc:
        raise UserError(str(exc)) from None
    where = "this directory" if lab.directory == Path.cwd().resolve() else str(args.dir)
    in_git = any((d / ".git").exists() for d in (lab.directory, *lab.directory.parents))
    print(NEXT.format(where=where, git="" if in_git else "git init -q && "))
    return 0


def run_down(args: argparse.Namespace) -> int:
    account = labs.Lab(args.dir.resolve()).account()
    try:
        stopped = labs.down(args.dir, purge=args.purge)
    except labs.LabError as exc:
        raise UserError(str(exc)) from None
    names = ", ".join(stopped) if stopped else "no node was running"
    print(f"Stopped the lab ({names}); nothing of it is running."
          + (f" Removed {labs.RUNTIME}/." if args.purge else ""))
    if args.purge and account is not None:
        print(f"The account {account} that node add made stays (other labs may use it): "
              f"`userdel -r {account}` removes it.")
    return 0


def run_status(args: argparse.Namespace) -> int:
    try:
        states = labs.status(args.dir)
    except labs.LabError as exc:
        raise UserError(str(exc)) from None
    for state in states:
        running = "up" if state.sshd and state.agent else (
            "sshd only" if state.sshd else "agent only" if state.agent else "stopped")
        print(f"  {state.name:<7} {labfiles.describe(state.hardware):<32} "
              f"ssh 127.0.0.1:{state.port}  {running}")
    return 0 if all(s.sshd and s.agent for s in states) else 3
