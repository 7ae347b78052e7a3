"""``llmgw lab up|down|status``: simulated nodes on this machine and a cluster directory for them.

The nodes are the ones the tests use (a real sshd on loopback each, an
agent behind it, fixture hardware); see :mod:`llmgw.onboarding.labs`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from pathlib import Path

from llmgw.cli.errors import UserError
from llmgw.onboarding import fleetsims, labfiles, labs

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
    sim = commands.add_parser(
        "simulate", help="thousands of simulated nodes in this process, until Ctrl-C",
        description="Run a fleet simulator in the foreground: N real agents in one process "
        "(fixture hardware: H100 with InfiniBand, L40S, CPU only in turn), each on its own "
        "gRPC socket, with stand-in engines that become ready after --load-delay. No sshd: "
        "`llmgw serve --simulated DIR/sockets` reaches them. Writes DIR/cluster the first time.")
    _dir_flag(sim)
    sim.add_argument("--nodes", metavar="N", type=int, default=1000,
                     help="how many nodes (default 1000)")
    sim.add_argument("--models", metavar="M", type=int, default=None,
                     help="models in the cluster directory it writes (default: N/10)")
    sim.add_argument("--replicas", metavar="R", type=int, default=1,
                     help="replicas of each model (default 1)")
    sim.add_argument("--load-delay", metavar="SECONDS", type=float,
                     default=fleetsims.DEFAULT_LOAD_DELAY,
                     help=f"how long a stand-in engine loads (default "
                     f"{fleetsims.DEFAULT_LOAD_DELAY:g}s)")
    sim.add_argument("--relay", action="store_true",
                     help="also serve a relay for the nodes (DIR/sockets/relay-0.sock): the "
                     "daemon then holds one connection and one push stream for all of them, "
                     "not one per node")
    sim.set_defaults(handler=run_simulate)
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


def run_simulate(args: argparse.Namespace) -> int:
    if not 1 <= args.nodes <= 100_000:
        raise UserError(f"--nodes must be between 1 and 100000; got {args.nodes}")
    if args.load_delay < 0 or args.replicas < 1 or (args.models is not None and args.models < 0):
        raise UserError("--load-delay must be 0 or more, --replicas 1 or more, --models 0 or "
                        "more")
    root = args.dir.resolve()
    longest = root / "sockets" / f"sim-{args.nodes:04d}.sock"
    if len(str(longest)) > 100:  # a unix socket path must fit in 108 bytes
        raise UserError(f"--dir {args.dir}: {longest} is too long for a unix socket; use a "
                        "shorter directory (e.g. under /tmp)")
    try:
        return asyncio.run(_simulate(root, args))
    except KeyboardInterrupt:
        return 0


async def _simulate(root: Path, args: argparse.Namespace) -> int:
    started = time.monotonic()
    sim = fleetsims.SimulatedFleet(root, args.nodes, load_delay=args.load_delay,
                                   relay=args.relay)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await sim.start()
        written = ""
        if not (sim.cluster_dir / "cluster.yaml").exists():
            count = args.models if args.models is not None else max(1, args.nodes // 10)
            sim.write_cluster(fleetsims.models(count, args.replicas),
                              store={"path": str(root / "llmgw.db")})
            written = f" (written: {count} models of {args.replicas} replica(s))"
        print(f"{args.nodes} simulated nodes up in {time.monotonic() - started:.1f}s "
              f"({', '.join(sim.kinds)} in turn; engines ready {args.load_delay:g}s after "
              f"they start)" + (f"; relay on {sim.relay_socket}" if args.relay else ""))
        print(f"cluster directory: {sim.cluster_dir}{written}")
        print("Serve them with:")
        print(f"  llmgw serve --cluster {sim.cluster_dir} --simulated {sim.sockets}")
        print("Ctrl-C stops them.", flush=True)
        await stop.wait()
    finally:
        await sim.aclose()
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
