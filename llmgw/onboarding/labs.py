"""``llmgw lab``: simulated nodes on this machine that outlive the command, and a cluster for them.

A lab is a directory (``--dir``, default the current one) holding

* ``cluster/`` — a ready cluster directory for the nodes (``cluster.yaml``,
  ``nodes.yaml``, ``models.yaml``, ``known_hosts`` with every node's host key
  pinned), written once: a second ``lab up`` never overwrites your edits;
* ``.llmgw-lab/`` — the nodes themselves: per node a real ``sshd`` on
  127.0.0.1 and an ``llmgw agent`` (supervise backend) behind it reporting
  fixture hardware (:data:`llmgw.onboarding.simnodes.HARDWARE`), the lab's
  client key, logs, and ``lab.json``, which records each process as
  "pid start-time" (a reused pid is never mistaken for a node);
* ``.gitignore`` — ``.llmgw-lab/`` and the store stay out of git.

With ``--backend systemd`` each node's agent runs under a real systemd instead,
in a ``systemd-nspawn`` machine of its own (:mod:`llmgw.onboarding.labmachines`),
and its engines are systemd units there.

These are the nodes the tests start (``sim_cluster``), kept running. Every
process a lab starts carries the lab's marker in its environment, engines
included, so :func:`down` finds and stops all of them, and checks that nothing
is left. Nodes get fixed SSH ports (from 2201), engine port ranges (from
21000) and listeners (8000, 8001, 9400), so the files and the docs that show
them stay the same from run to run; where another program holds one of those,
a new lab takes free ports instead and says so (:func:`choose_ports`).

Usage::

    lab = labs.up(Path("."), count=3, say=print)     # start, write cluster/
    labs.down(Path("."))                             # stop everything
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from llmgw.onboarding import accounts, labfiles, labmachines, processes, simenrolments
from llmgw.onboarding.simnodes import (
    ENGINE_PORTS,
    HarnessError,
    SimNode,
    agent_config,
    free_port,
    free_ports,
    keygen,
    port_free,
)
from llmgw.spec import quantities

RUNTIME = ".llmgw-lab"
STATE = "lab.json"
CYCLE = ("h100-ib", "l40s-nofabric", "cpu-only")
SSH_PORT_FROM = 2201
ENGINE_PORTS_FROM = 21000
MAX_NODES = 64
MODEL_FILE = "gemma3-270m-q4_k_m.gguf"
ENGINE_BINARY = "llama-server"
_SOCKET_LIMIT = 107  # sun_path holds 108 bytes with the terminating NUL

Say = Callable[[str], None]


class LabError(Exception):
    """A lab that cannot be started or stopped as asked; the message says what to do."""


@dataclass(frozen=True)
class LabNode:
    """One node of a lab as ``lab.json`` records it."""

    name: str
    hardware: str
    port: int
    engine_ports_from: int
    sshd: str = ""   # processes.identity() of its sshd, "" when stopped
    agent: str = ""  # of its agent


@dataclass(frozen=True)
class NodeState:
    name: str
    hardware: str
    port: int
    sshd: bool
    agent: bool


@dataclass(frozen=True)
class Ports:
    """Where a new lab listens: nodes' SSH and engine ports, the cluster's listeners."""

    ssh_from: int = SSH_PORT_FROM
    engines_from: int = ENGINE_PORTS_FROM
    listeners: tuple[tuple[str, int], ...] = labfiles.LISTENERS


def layout(count: int, ssh_port_from: int = SSH_PORT_FROM,
           engine_ports_from: int = ENGINE_PORTS_FROM) -> list[LabNode]:
    """Names, hardware and ports of ``count`` nodes: GPU nodes ``gpu-NN``, CPU nodes ``cpu-NN``.

    A pure function: hardware cycles through :data:`CYCLE`, ports count up
    (SSH by one, engine ranges by 100).
    """
    if not 1 <= count <= MAX_NODES:
        raise LabError(f"--nodes must be between 1 and {MAX_NODES}; got {count}")
    if not 1024 <= ssh_port_from <= 65535 - count:
        raise LabError(f"--ssh-port must leave room for {count} ports below 65536; "
                       f"got {ssh_port_from}")
    seen: dict[str, int] = {}
    nodes = []
    for index in range(count):
        hardware = CYCLE[index % len(CYCLE)]
        prefix = "cpu" if hardware == "cpu-only" else "gpu"
        seen[prefix] = seen.get(prefix, 0) + 1
        nodes.append(LabNode(f"{prefix}-{seen[prefix]:02d}", hardware, ssh_port_from + index,
                             engine_ports_from + 100 * index))
    return nodes


def choose_ports(count: int, ssh_port_from: int | None = None,
                 engine_ports_from: int | None = None, say: Say = print) -> Ports:
    """The defaults where they are free, else free ports; ports given are kept as given.

    A port given explicitly that is in use is refused later, when its node
    starts; a default in use is replaced by a free port, with one line said.
    """
    def free(ports: range) -> bool:
        return all(port_free(p) for p in ports)

    try:
        ssh = ssh_port_from
        if ssh is None:
            ssh = SSH_PORT_FROM
            if not free(range(ssh, ssh + count)):
                ssh = free_ports(count)
                say(f"SSH ports {SSH_PORT_FROM}-{SSH_PORT_FROM + count - 1} are in use: "
                    f"the nodes listen on {ssh}-{ssh + count - 1} (--ssh-port to choose).")
        engines = engine_ports_from
        if engines is None:
            engines = ENGINE_PORTS_FROM
            blocks = [range(engines + 100 * i, engines + 100 * i + ENGINE_PORTS)
                      for i in range(count)]
            if not all(free(block) for block in blocks):
                engines = free_ports(100 * count)
                say(f"engine ports from {ENGINE_PORTS_FROM} are in use: the nodes' engines "
                    f"use {engines} up (--engine-ports to choose).")
    except HarnessError as exc:
        raise LabError(str(exc)) from None
    listeners = []
    for name, port in labfiles.LISTENERS:
        if not port_free(port):
            chosen = free_port()
            say(f"127.0.0.1:{port} (cluster.listeners.{name}) is in use: cluster.yaml "
                f"says 127.0.0.1:{chosen}.")
            port = chosen
        listeners.append((name, port))
    return Ports(ssh, engines, tuple(listeners))


@dataclass
class Lab:
    """A lab directory: where its cluster and its nodes live."""

    directory: Path

    @property
    def runtime(self) -> Path:
        return self.directory / RUNTIME

    @property
    def cluster_dir(self) -> Path:
        return self.directory / "cluster"

    @property
    def client_key(self) -> Path:
        return self.runtime / "id_ed25519"

    @property
    def authorized_keys(self) -> Path:
        return self.runtime / "authorized_keys"

    def nodes(self) -> list[LabNode]:
        """The nodes ``lab.json`` records; empty when there is no lab here."""
        try:
            data = json.loads((self.runtime / STATE).read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise LabError(f"{self.runtime / STATE}: unreadable ({exc}); "
                           f"remove {RUNTIME}/ to start afresh") from None
        return [LabNode(**entry) for entry in data.get("nodes", [])]

    def save(self, nodes: list[LabNode], engine_dir: str | None,
             backend: str | None = None, account: str | None = None) -> None:
        data: dict[str, object] = {
            "format_version": 1, "owner": getpass.getuser(), "engine_dir": engine_dir,
            "backend": backend or self.backend(), "nodes": [asdict(n) for n in nodes]}
        if account is not None:
            data["account"] = account
        path = self.runtime / STATE
        path.with_suffix(".tmp").write_text(json.dumps(data, indent=2) + "\n")
        path.with_suffix(".tmp").replace(path)

    def backend(self) -> str:
        """Which backend the lab's agents run ("supervise", or "systemd" in machines)."""
        try:
            value = json.loads((self.runtime / STATE).read_text()).get("backend")
        except (OSError, ValueError):
            return "supervise"
        return value if value in labmachines.BACKENDS else "supervise"

    def account(self) -> str | None:
        """The daemon's account when ``node add`` enrolled the nodes (``--account``)."""
        try:
            value = json.loads((self.runtime / STATE).read_text()).get("account")
        except (OSError, ValueError):
            return None
        return value if isinstance(value, str) else None

    def engine_dir(self) -> str | None:
        try:
            value = json.loads((self.runtime / STATE).read_text()).get("engine_dir")
        except (OSError, ValueError):
            return None
        return value if isinstance(value, str) else None

    def sim_node(self, node: LabNode) -> SimNode:
        return SimNode(node.name, self.runtime / node.name, node.port, self.authorized_keys,
                       node.hardware, engine_ports_from=node.engine_ports_from)


def up(
    directory: Path,
    *,
    count: int | None = None,
    ssh_port_from: int | None = None,
    engine_ports_from: int | None = None,
    model: Path | None = None,
    engine: Path | None = None,
    account: str | None = None,
    say: Say = print,
    backend: str | None = None,
) -> Lab:
    """Start the lab's nodes (creating the lab if there is none) and write its cluster files.

    Idempotent: nodes already running are left alone, stopped ones restart with
    their own host keys and ports, and files that exist are not rewritten. A
    new lab takes the default ports unless they are in use (:func:`choose_ports`).

    With ``account`` (a new lab; an existing one keeps what it was started with)
    the nodes start bare, sshd only, and each is enrolled by the real ``llmgw
    node add`` as root, the daemon logging in as ``account`` (see
    :func:`_enrol`); a stopped node is started again by ``node add``'s re-run.
    """
    lab = Lab(directory.resolve())
    nodes = lab.nodes()
    recorded = lab.account()
    if nodes and account is not None and account != recorded:
        raise LabError(f"the lab in {directory} was started "
                       + (f"with --account {recorded}" if recorded else "without --account")
                       + ": run `llmgw lab down --purge` first to start a different one")
    account = recorded if nodes else account
    if account is not None:
        _check_account(lab, account)
    if nodes and count is not None and count != len(nodes):
        raise LabError(f"the lab in {directory} has {quantities.count(len(nodes), 'node')}, "
                       f"not {count}: run `llmgw lab down --purge` first to start a different one")
    fresh = not nodes
    ports = Ports()
    if backend is not None and backend not in labmachines.BACKENDS:
        raise LabError(f"--backend must be one of {', '.join(labmachines.BACKENDS)}; "
                       f"got {backend!r}")
    if nodes and backend is not None and backend != lab.backend():
        raise LabError(f"the lab in {directory} runs its agents with --backend "
                       f"{lab.backend()}: run `llmgw lab down --purge` first to change it")
    backend = backend or (lab.backend() if nodes else "supervise")
    if fresh:
        layout(count or 3, ssh_port_from or SSH_PORT_FROM)  # refuse a bad count or port first
        ports = choose_ports(count or 3, ssh_port_from, engine_ports_from, say)
        nodes = layout(count or 3, ports.ssh_from, ports.engines_from)
        _check_socket_paths(lab, nodes, enrolled=account is not None)
        _create_runtime(lab)
    engine_dir = lab.engine_dir() if not fresh else _engine_dir(engine)
    model_path = _link_model(lab, model) if fresh else None
    if fresh and account is not None:  # node add needs the cluster directory first
        _write_cluster(lab, nodes, model_path is not None and engine_dir is not None, say,
                       ports.listeners, account=account)
    started = _start(lab, nodes, engine_dir, say, backend, account=account)
    lab.save(started, engine_dir, backend, account)
    if fresh and account is None:
        _write_cluster(lab, started, model_path is not None and engine_dir is not None, say,
                       ports.listeners)
        if model_path is None or engine_dir is None:
            missing = [what for what, found in (("the Gemma 3 270M GGUF", model_path),
                                                (ENGINE_BINARY, engine_dir)) if found is None]
            say(f"No model to serve: {' and '.join(missing)} not found (`make engine model` in "
                "an llmgw checkout, or --model FILE / --engine FILE); models.yaml is empty.")
    return lab


def down(directory: Path, *, purge: bool = False) -> list[str]:
    """Stop every process of the lab (sshd, agents, engines, sessions); names of nodes stopped.

    With ``purge`` the lab's node files go too (host keys included); the
    cluster directory is always kept. Raises :class:`LabError` if any process
    of the lab is still running afterwards.
    """
    lab = Lab(directory.resolve())
    nodes = lab.nodes()
    if not nodes and not lab.runtime.exists():
        raise LabError(f"no lab in {directory} (no {RUNTIME}/ there)")
    if lab.backend() == "systemd":  # each agent is a machine: power it off first
        for node in nodes:
            labmachines.stop(lab.runtime, node.name, node.agent)
    recorded = [int(ident.split()[0]) for n in nodes for ident in (n.agent, n.sshd)
                if ident and processes.is_same(ident)]
    # Agents first, with their trees, so no supervisor restarts an engine meanwhile.
    tree = [d for pid in recorded for d in processes.descendants(pid)]
    processes.terminate([*recorded, *tree])
    for _ in range(3):
        left = processes.marked(lab.runtime)
        if not left:
            break
        processes.terminate(left)
    left = [pid for pid in processes.marked(lab.runtime) if processes.alive(pid)]
    if left:
        raise LabError(f"processes of the lab still running after SIGKILL: {left}")
    for node in nodes:
        (lab.runtime / node.name / "agent.sock").unlink(missing_ok=True)
    stopped = [n.name for n in nodes if n.sshd or n.agent]
    if purge:
        shutil.rmtree(lab.runtime, ignore_errors=True)
    elif nodes:
        lab.save([LabNode(n.name, n.hardware, n.port, n.engine_ports_from) for n in nodes],
                 lab.engine_dir(), lab.backend(), lab.account())
    return stopped


def status(directory: Path) -> list[NodeState]:
    """Whether each node's sshd and agent run (as recorded, and the same processes)."""
    lab = Lab(directory.resolve())
    nodes = lab.nodes()
    if not nodes:
        raise LabError(f"no lab in {directory}: start one with `llmgw lab up`")
    return [NodeState(n.name, n.hardware, n.port, bool(n.sshd and processes.is_same(n.sshd)),
                      bool(n.agent and processes.is_same(n.agent))) for n in nodes]


# -- starting -------------------------------------------------------------


def _check_socket_paths(lab: Lab, nodes: list[LabNode], *, enrolled: bool = False) -> None:
    socket = f"{simenrolments.PREFIX}/run/agent.sock" if enrolled else "agent.sock"
    longest = max(len(str(lab.runtime / n.name / socket).encode()) for n in nodes)
    if longest > _SOCKET_LIMIT:
        raise LabError(f"{lab.directory} is too deep for the agents' unix sockets "
                       f"({longest} bytes, at most {_SOCKET_LIMIT}): use a shorter --dir")


def _create_runtime(lab: Lab) -> None:
    lab.runtime.mkdir(parents=True, exist_ok=True)
    keygen(lab.client_key, "llmgw lab client")
    shutil.copy(lab.client_key.with_suffix(".pub"), lab.authorized_keys)


DEFAULT_ACCOUNT = "llmgw"  # what `llmgw init` writes as cluster.ssh.user


def _check_account(lab: Lab, account: str) -> None:
    """The account can be made, and can reach its agents' sockets under the lab."""
    if not accounts.USER_NAME.match(account):
        raise LabError(f"--account {account!r} is not a valid user name")
    if os.geteuid() != 0:
        raise LabError("--account: node add makes that account and logs in as root, so "
                       "`llmgw lab up --account` runs as root")
    for parent in [lab.directory, *lab.directory.parents]:
        mode = parent.stat().st_mode if parent.exists() else 0o755
        if not mode & 0o001:
            raise LabError(f"{parent} is closed to other accounts (mode {mode & 0o777:04o}), "
                           f"and {account} reaches its agents' sockets through it: start the "
                           "lab elsewhere (--dir), `chmod o+x` it, or start it with "
                           "--no-enrol")


def _enrol(lab: Lab, sims: list[SimNode], account: str, say: Say) -> None:
    """``llmgw node add`` for each bare node, as an operator runs it (:mod:`.simenrolments`),
    its checklist shown; its agent's pid is the one node add recorded."""
    checkout = _checkout()
    wheels = (checkout / ".cache" / "wheels" if checkout is not None
              else Path.home() / ".cache" / "llmgw" / "wheels")
    try:
        outputs = simenrolments.enrol(lab.cluster_dir, sims, account, wheels,
                                      weights_dirs=[f"../{RUNTIME}/models"])
    except HarnessError as exc:
        raise LabError(str(exc)) from None
    for sim in sims:
        say(f"  {sim.name}: llmgw node add root@127.0.0.1:{sim.port} --name {sim.name} "
            "--no-compiler")
        # Its checklist; the nodes.yaml diff it shows is the lab's own, already written.
        for line in outputs[sim.name].splitlines():
            if line.startswith("nodes.yaml"):
                say(f"    {line.removesuffix('; commit this:')}")
                break
            if line:
                say(f"    {line}")


def _start(lab: Lab, nodes: list[LabNode], engine_dir: str | None, say: Say,
           backend: str = "supervise", *, account: str | None = None) -> list[LabNode]:
    """Start whatever of each node is not running; every node's identities, once all are up.

    With ``account`` the agents are ``node add``'s (:func:`_enrol`), not started here."""
    sims: list[tuple[LabNode, SimNode, bool, bool]] = []
    for node in nodes:
        sshd_up = bool(node.sshd) and processes.is_same(node.sshd)
        agent_up = bool(node.agent) and processes.is_same(node.agent)
        if not sshd_up and not port_free(node.port):
            raise LabError(f"127.0.0.1:{node.port} (ssh of {node.name}) is in use by another "
                           "program: stop it, or start the lab elsewhere with --ssh-port")
        sim = lab.sim_node(node)
        sim.root.mkdir(exist_ok=True)
        if engine_dir is not None:
            sim.env["PATH"] = f"{engine_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        sims.append((node, sim, sshd_up, agent_up))
    begun = time.monotonic()
    in_machines: dict[str, str] = {}  # node → its machine's nspawn identity
    try:
        for _node, sim, sshd_up, agent_up in sims:
            if not sshd_up:
                sim.start_sshd(wait=False)
            if not agent_up and backend == "supervise" and account is None:
                sim.start_agent(agent_config(sim), wait=False)
        for node, sim, _sshd_up, agent_up in sims:
            if not agent_up and backend == "systemd":
                in_machines[node.name], booted = labmachines.start(
                    lab.runtime, sim, engine_dir, [lab.runtime / "models"])
                say(f"  {node.name:<7} systemd booted in {booted:.1f}s")
        for _node, sim, sshd_up, agent_up in sims:
            if not sshd_up:
                sim.wait_sshd()
            if not agent_up and backend == "supervise" and account is None:
                sim.wait_agent()
    except Exception as exc:  # one place: whatever failed, stop what this call started
        for node, sim, _s, _a in sims:
            sim.stop_agent()
            sim.stop_sshd()
            if node.name in in_machines:
                labmachines.stop(lab.runtime, node.name, in_machines[node.name])
        raise LabError(f"a node did not start: {exc}") from None
    if account is not None:
        _enrol(lab, [sim for _n, sim, _s, agent_up in sims if not agent_up], account, say)
    result = []
    for node, sim, sshd_up, agent_up in sims:
        sshd = node.sshd if sshd_up else _identity_of(sim.sshd)
        agent = (node.agent if agent_up else
                 in_machines.get(node.name) or _identity_of(sim.agent))
        enrolled = sim.enrolled_agent() if account is not None and not agent_up else None
        agent = processes.identity(enrolled) if enrolled is not None else agent
        result.append(LabNode(node.name, node.hardware, node.port, node.engine_ports_from,
                              sshd, agent))
        state = "already running" if sshd_up and agent_up else "up"
        what = labfiles.describe(node.hardware)
        say(f"  {node.name:<7} {what:<32} ssh 127.0.0.1:{node.port}  {state}")
    fresh = sum(1 for _n, _s, a, b in sims if not (a and b))
    if fresh:
        say(f"{fresh} of {quantities.count(len(nodes), 'node')} started in "
            f"{time.monotonic() - begun:.1f}s; "
            f"their files and logs are in {RUNTIME}/.")
    return result


def _identity_of(process: object) -> str:
    pid = getattr(process, "pid", None)
    return processes.identity(pid) if isinstance(pid, int) else ""


def _checkout() -> Path | None:
    """The llmgw source checkout this package runs from, if it runs from one."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").exists() else None


def _engine_dir(engine: Path | None) -> str | None:
    """The directory of the ``llama-server`` the CPU node's engines run, put on its PATH."""
    if engine is not None:
        if not os.access(engine, os.X_OK):
            raise LabError(f"--engine {engine}: not an executable file")
        return str(engine.resolve().parent)
    found = shutil.which(ENGINE_BINARY)
    if found:
        return str(Path(found).resolve().parent)
    checkout = _checkout()
    built = checkout / ".cache" / "engine" / "bin" / ENGINE_BINARY if checkout else None
    return str(built.parent.resolve()) if built and os.access(built, os.X_OK) else None


def _link_model(lab: Lab, model: Path | None) -> Path | None:
    """The GGUF the CPU node serves, linked into the lab (the cluster names it relatively)."""
    if model is not None and not model.is_file():
        raise LabError(f"--model {model}: no such file")
    if model is None:
        checkout = _checkout()
        candidates = [Path.cwd() / ".cache" / "models" / MODEL_FILE]
        if checkout is not None:
            candidates.append(checkout / ".cache" / "models" / MODEL_FILE)
        model = next((c for c in candidates if c.is_file()), None)
    if model is None:
        return None
    link = lab.runtime / "models" / MODEL_FILE
    link.parent.mkdir(exist_ok=True)
    link.unlink(missing_ok=True)
    # A hard link where possible: the engine's command line then names the lab's
    # own path, so the lab's engine is easy to find. Else a copy, not a symlink: an
    # agent serves no path source that resolves out of the node's weights_dirs.
    try:
        os.link(model.resolve(), link)
    except OSError:
        shutil.copyfile(model.resolve(), link)
    return link


# -- the cluster directory ---------------------------------------------------


def _write_cluster(lab: Lab, nodes: list[LabNode], with_model: bool, say: Say,
                   listeners: tuple[tuple[str, int], ...] = labfiles.LISTENERS, *,
                   account: str | None = None) -> None:
    lab.cluster_dir.mkdir(exist_ok=True)
    written = []
    texts = {
        "cluster.yaml": labfiles.cluster_yaml(account or getpass.getuser(),
                                              f"../{RUNTIME}/id_ed25519", nodes, listeners),
        "nodes.yaml": (labfiles.enrolled_nodes_yaml() if account is not None
                       else labfiles.nodes_yaml(nodes, f"../{RUNTIME}")),
        "models.yaml": labfiles.models_yaml(
            f"../{RUNTIME}/models/{MODEL_FILE}" if with_model else None),
        # Enrolled, node add pins each key (its fingerprint given, as from a console).
        "known_hosts": "" if account is not None else "".join(
            lab.sim_node(n).known_hosts_line() + "\n" for n in nodes),
    }
    for name, text in texts.items():
        path = lab.cluster_dir / name
        if not path.exists():
            path.write_text(text)
            written.append(f"cluster/{name}")
    ignore = lab.directory / ".gitignore"
    lines = ignore.read_text().splitlines() if ignore.exists() else []
    wanted = [f"/{RUNTIME}/", "/cluster/state/"]
    if any(w not in lines for w in wanted):
        ignore.write_text("\n".join([*lines, *(w for w in wanted if w not in lines)]) + "\n")
        written.append(".gitignore")
    if written:
        say(f"Wrote {', '.join(written)} "
            + (f"(node add pins {quantities.count(len(nodes), 'host key')})."
               if account is not None
               else f"({len(nodes)} host keys pinned)."))
