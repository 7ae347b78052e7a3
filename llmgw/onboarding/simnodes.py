"""Simulated nodes: a real OpenSSH ``sshd`` per node on loopback, and an agent behind it.

Each :class:`SimNode` has its own directory, host key, port on 127.0.0.1,
sshd config and log, and (when started) an ``llmgw agent serve`` process with
fixture hardware from :data:`HARDWARE` (``llmgw/onboarding/hardware/<kind>/``:
a sysfs tree, /proc files, a recorded nvidia-smi) listening on the node's own
socket. A :class:`SimCluster` holds the nodes, the client key authorised on
all of them, a pinned ``known_hosts`` and a cluster directory written for
them, and kills every process it started on :meth:`SimCluster.close`.

The tests' ``sim_cluster`` fixture and ``llmgw lab`` (:mod:`llmgw.onboarding.labs`)
both build on these. By default all paths live under one short directory in
/tmp: unix socket paths must fit in 108 bytes, which pytest's ``tmp_path``
does not promise.

Usage (through the ``sim_cluster`` fixture of ``tests/support/plugin.py``)::

    sim = sim_cluster(3)                      # three nodes, sshd + agent each
    cluster = loading.load(sim.write_cluster())
    fleet = await pools.collect(cluster, sim.cluster_dir)
"""

from __future__ import annotations

import getpass
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from llmgw.onboarding.processes import (
    MARKER,
    STOP_TIMEOUT,
    alive,
    descendants,
    identity,
    is_same,
    marked,
    terminate,
)

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"  # Debian's openssh-sftp-server
# Fixture hardware, shipped inside the package so `llmgw lab` works from a wheel.
HARDWARE = Path(__file__).resolve().parent / "hardware"
FIXTURES = HARDWARE  # the name the tests know it by
# Where the tests' path sources live on simulated nodes (/models/tiny.gguf, which
# no stand-in engine reads): declared by each, though no node has it.
SIM_MODELS = "/models"
START_TIMEOUT = 60.0  # a bound, not a wait: shared CI cores can take seconds to start a python
# Engine ports each simulated node keeps free for its engines (the doctor checks 16).
ENGINE_PORTS = 32

SSHD_CONFIG = """\
# A simulated llmgw node (llmgw/onboarding/simnodes.py).
ListenAddress 127.0.0.1:{port}
HostKey {host_key}
PidFile none
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile {authorized_keys}
# The files live under /tmp (world-writable), which StrictModes refuses.
StrictModes no
# The daemon's only use of SSH: reaching the agent's unix socket.
AllowStreamLocalForwarding yes
StreamLocalBindUnlink yes
# sshd grants streamlocal opens only while local TCP forwarding is allowed.
AllowTcpForwarding local
X11Forwarding no
# As on a stock Debian sshd: an sftp-server run through the user's shell (so the account
# `node add` makes, shell nologin, gets SFTP from its key's command="internal-sftp" only).
Subsystem sftp {sftp_server}
PrintMotd no
LogLevel INFO
MaxStartups 100:30:200
# The node's own environment, for what its sessions start (an agent `node add` starts):
# the marker that finds every process of this node again, the engines on PATH.
{setenv}
# Any other account (as the one `llmgw node add` makes for cluster.ssh.user) is let in
# only by the keys in its own ~/.ssh/authorized_keys, as on a real node.
Match User *,!root,!{login}
  AuthorizedKeysFile .ssh/authorized_keys
"""


class HarnessError(RuntimeError):
    """A simulated node could not be started; the message carries its log."""


def setenv_line(env: Mapping[str, str]) -> str:
    """``SetEnv "K=V" …`` for sshd_config; a value sshd cannot carry is refused."""
    for key, value in env.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key) or any(c in value for c in '"\n\\'):
            raise HarnessError(f"cannot pass {key}={value!r} to the node's sessions")
    return "SetEnv " + " ".join(f'"{k}={v}"' for k, v in sorted(env.items())) if env else ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# Port blocks that :func:`free_ports` hands out sit below the kernel's ephemeral
# range (``net.ipv4.ip_local_port_range``), so no outgoing connection takes one.
BLOCKS_FROM = 10000
# Nor one that llmgw's own defaults use (engines from 18000, a lab's from 21000), which
# another cluster or lab on this machine may bind at any moment.
AVOIDED = (range(18000, 18100), range(21000, 21000 + 100 * 64))
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def port_free(port: int) -> bool:
    """Whether nothing listens on ``port`` (any address), so a new listener can bind it.

    A bind of the wildcard address fails on a listener at any address; with
    ``SO_REUSEADDR`` a connection lingering in TIME_WAIT does not count.
    """
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
        return True


def free_ports(count: int, *, step: int = 100, taken: Iterable[int] = ()) -> int:
    """The first port of ``count`` consecutive free ports, below the ephemeral range.

    The block starts at a random multiple of ``step``, so two test runs on one
    machine rarely pick the same block before either binds it; blocks starting
    at a port in ``taken`` (handed out already, not yet bound) are skipped.
    Raises :class:`HarnessError` when no block is free.
    """
    try:
        ephemeral = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    skip = set(taken)
    bases = [base for base in range(BLOCKS_FROM, max(BLOCKS_FROM, ephemeral - count), step)
             if base not in skip and not any(
                 base < avoided.stop and avoided.start < base + count for avoided in AVOIDED)]
    random.shuffle(bases)
    for base in bases:
        if all(port_free(port) for port in range(base, base + count)):
            return base
    raise HarnessError(f"no {count} consecutive free ports below {ephemeral}")


def keygen(path: Path, comment: str) -> Path:
    """An unencrypted ed25519 key pair at ``path`` and ``path.pub`` (ssh-keygen, for real)."""
    path.unlink(missing_ok=True)
    path.with_suffix(".pub").unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )
    return path


def fingerprint(public_key: Path) -> str:
    """``SHA256:…`` as ``ssh-keygen -lf`` prints it."""
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(public_key)], check=True, capture_output=True, text=True
    ).stdout
    return out.split()[1]


def _stop(process: subprocess.Popen[bytes], *, with_children: bool) -> None:
    tree = descendants(process.pid) if with_children else []
    terminate([process.pid, *tree])
    process.wait(timeout=STOP_TIMEOUT)


def _wait_for(
    check: Callable[[], bool], what: str, process: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if check():
            return
        if process.poll() is not None:
            raise HarnessError(f"{what} exited with {process.returncode}:\n{_tail(log)}")
        time.sleep(0.02)
    raise HarnessError(f"{what} did not come up within {START_TIMEOUT}s:\n{_tail(log)}")


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class SimNode:
    """One simulated node: sshd (and an agent) on 127.0.0.1, all files under ``root``."""

    name: str
    root: Path
    port: int
    authorized_keys: Path
    hardware: str = "cpu-only"
    sshd: subprocess.Popen[bytes] | None = None
    agent: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    # Every simulated node shares 127.0.0.1: each gets its own engine port range.
    engine_ports_from: int = 18000
    # Set once `llmgw node add` installed llmgw here (simenrolments): its --prefix.
    prefix: Path | None = None
    _listening_before: int = 0

    def processes(self) -> list[int]:
        """Pids of this node's sshd and agent and everything they started."""
        pids = [p.pid for p in (self.sshd, self.agent) if p is not None]
        enrolled = self.enrolled_agent()
        pids += [enrolled] if enrolled is not None else []
        return [*pids, *(d for pid in pids for d in descendants(pid))]

    @property
    def host_key(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    @property
    def sshd_config(self) -> Path:
        return self.root / "sshd_config"

    @property
    def sshd_log(self) -> Path:
        return self.root / "sshd.log"

    @property
    def agent_socket(self) -> Path:
        if self.prefix is not None:  # where `node add` put it
            return self.prefix / "run" / "agent.sock"
        return self.root / "agent.sock"

    def enrolled_agent(self) -> int | None:
        """The pid of the agent ``node add`` started (supervise backend), while it runs."""
        if self.prefix is None:
            return None
        try:
            pid = int((self.prefix / "run" / "agent.pid").read_text())
        except (OSError, ValueError):
            return None
        return pid if alive(pid) else None

    @property
    def agent_log(self) -> Path:
        return self.root / "agent.log"

    @property
    def agent_config(self) -> Path:
        return self.root / "agent.yaml"

    def known_hosts_line(self) -> str:
        algorithm, key = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {algorithm} {key}"

    def host_fingerprint(self) -> str:
        return fingerprint(self.host_key.with_suffix(".pub"))

    # -- sshd -------------------------------------------------------------

    def start_sshd(self, *, wait: bool = True) -> None:
        """Start sshd and (unless ``wait=False``: see :meth:`wait_sshd`) wait until it listens."""
        if self.sshd is not None and self.sshd.poll() is None:
            return
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation dir
        if not self.host_key.exists():
            keygen(self.host_key, f"host key of {self.name}")
        self.sshd_config.write_text(SSHD_CONFIG.format(
            port=self.port, host_key=self.host_key, authorized_keys=self.authorized_keys,
            login=getpass.getuser(), setenv=setenv_line(self.session_environment()),
            sftp_server=SFTP_SERVER if os.access(SFTP_SERVER, os.X_OK) else "internal-sftp",
        ))
        check = subprocess.run(
            [SSHD, "-t", "-f", str(self.sshd_config)], capture_output=True, text=True
        )
        if check.returncode != 0:
            raise HarnessError(f"sshd -t rejected {self.sshd_config}: {check.stderr}")
        self._listening_before = self._listening_lines()
        with self.sshd_log.open("ab") as log:
            self.sshd = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.sshd_config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, env=self._environment(),
            )
        if wait:
            self.wait_sshd()

    def wait_sshd(self) -> None:
        assert self.sshd is not None, "sshd was not started"
        before = self._listening_before
        _wait_for(lambda: self._listening_lines() > before, f"sshd of {self.name}",
                  self.sshd, self.sshd_log)

    def stop_sshd(self) -> None:
        """Stop sshd and every session it forked: the node drops off the network."""
        if self.sshd is not None:
            _stop(self.sshd, with_children=True)
            self.sshd = None

    def restart_sshd(self) -> None:
        self.stop_sshd()
        self.start_sshd()

    def rotate_host_key(self) -> None:
        """A reinstalled node: new host key, sshd restarted; known_hosts is left as it was."""
        keygen(self.host_key, f"new host key of {self.name}")
        if self.sshd is not None:
            self.restart_sshd()

    def accepted_logins(self) -> int:
        """SSH sessions sshd accepted so far, counted from its own log."""
        return self._log_count("Accepted publickey for ")

    def _listening_lines(self) -> int:
        return self._log_count("Server listening on ")

    def _log_count(self, needle: str) -> int:
        try:
            text = self.sshd_log.read_text(errors="replace")
        except FileNotFoundError:
            return 0
        return text.count(needle)

    # -- agent ------------------------------------------------------------

    def start_agent(self, config: Mapping[str, Any], *, wait: bool = True) -> None:
        """Start ``llmgw agent serve`` with ``config`` (written as YAML), wait for its socket."""
        if self.agent is not None and self.agent.poll() is None:
            return
        _write_yaml(self.agent_config, dict(config))
        with self.agent_log.open("ab") as log:
            self.agent = subprocess.Popen(
                [sys.executable, "-P", "-m", "llmgw", "agent", "serve", "--config",
                 str(self.agent_config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, env=self._environment(), cwd=self.root,
            )
        if wait:
            self.wait_agent()

    def wait_agent(self) -> None:
        assert self.agent is not None, "the agent was not started"
        _wait_for(self._socket_accepts, f"agent of {self.name}", self.agent, self.agent_log)

    def stop_agent(self, *, engines: bool = True) -> None:
        """Stop the agent; with ``engines=False`` the engines it started keep running."""
        if self.agent is not None:
            _stop(self.agent, with_children=engines)
            self.agent = None

    def _socket_accepts(self) -> bool:
        with socket.socket(socket.AF_UNIX) as sock:
            try:
                sock.connect(str(self.agent_socket))
            except OSError:
                return False
            return True

    def _environment(self) -> dict[str, str]:
        env = {**os.environ, **self.env, MARKER: str(self.root.parent)}
        env.pop("SSH_AUTH_SOCK", None)
        return env

    def session_environment(self) -> dict[str, str]:
        """What sshd sets in this node's sessions (``SetEnv``): the marker, PATH, the
        stand-in engines' settings (``TESTENGINE_*``) and the node's own ``env``."""
        env = self._environment()
        return {k: v for k, v in env.items()
                if k in (MARKER, "PATH") or k.startswith("TESTENGINE_") or k in self.env}


@dataclass
class SimCluster:
    """Simulated nodes plus everything a cluster directory needs to reach them."""

    root: Path
    nodes: dict[str, SimNode] = field(default_factory=dict)
    extra_nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Declared by every node besides its fixture's own: a path source must lie in a
    # node's weights_dirs, and a test serving a real file adds the file's directory.
    weights_dirs: list[str] = field(default_factory=lambda: [SIM_MODELS])
    # The daemon's account once `llmgw node add` enrolled the nodes (simenrolments).
    account: str | None = None
    _blackholes: list[socket.socket] = field(default_factory=list)

    @classmethod
    def create(cls, root: Path | None = None) -> SimCluster:
        """Keys and directories in ``root`` (default: a new short directory in /tmp)."""
        if root is None:
            root = Path(tempfile.mkdtemp(prefix="llmgw-sim-", dir="/tmp"))
        else:
            root.mkdir(parents=True, exist_ok=True)
        (root / "owner").write_text(identity(os.getpid()))
        sim = cls(root)
        keygen(sim.client_key, "llmgw test client")
        keygen(sim.wrong_key, "a key no node authorises")
        shutil.copy(sim.client_key.with_suffix(".pub"), sim.authorized_keys)
        sim.cluster_dir.mkdir()
        return sim

    @property
    def client_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def wrong_key(self) -> Path:
        return self.root / "id_wrong"

    @property
    def authorized_keys(self) -> Path:
        return self.root / "authorized_keys"

    @property
    def cluster_dir(self) -> Path:
        return self.root / "cluster"

    @property
    def known_hosts(self) -> Path:
        return self.cluster_dir / "known_hosts"

    def add_node(self, name: str, hardware: str = "cpu-only", port: int | None = None) -> SimNode:
        """A node with its own directory, host key and port (default: a free one); not started."""
        node_root = self.root / name
        node_root.mkdir()
        # Engine ports: a free block of its own (the planner allocates upward from
        # engine_ports_from, and nodes on one machine share its ports).
        node = SimNode(name, node_root, port or free_port(), self.authorized_keys, hardware,
                       engine_ports_from=free_ports(
                           ENGINE_PORTS, taken=[n.engine_ports_from for n in self.nodes.values()]))
        keygen(node.host_key, f"host key of {name}")
        self.nodes[name] = node
        return node

    def add_blackhole(self, name: str) -> int:
        """A node whose port accepts TCP connections and never says a word (no SSH banner)."""
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)  # never accept(): the kernel completes handshakes, nobody answers
        self._blackholes.append(sock)
        port: int = sock.getsockname()[1]
        self.extra_nodes[name] = {"address": "127.0.0.1", "ssh_port": port,
                                  "agent_socket": str(self.root / f"{name}.sock")}
        return port

    def start_agent(self, node: SimNode, *, wait: bool = True) -> None:
        """Start the node's agent: supervise backend, its fixture hardware, its own socket."""
        node.start_agent(agent_config(node), wait=wait)

    def start(self, *, sshd: bool = True, agents: bool = True) -> None:
        """Start every node's sshd and agent, all at once, and wait until all are up."""
        for node in self.nodes.values():
            if sshd:
                node.start_sshd(wait=False)
            if agents:
                self.start_agent(node, wait=False)
        for node in self.nodes.values():
            if sshd:
                node.wait_sshd()
            if agents:
                node.wait_agent()

    def pin_host_keys(self, nodes: Iterable[SimNode] | None = None) -> Path:
        """Write known_hosts with the current key of each node (default: all)."""
        chosen = list(self.nodes.values()) if nodes is None else list(nodes)
        self.known_hosts.write_text("".join(n.known_hosts_line() + "\n" for n in chosen))
        return self.known_hosts

    def cluster_data(self, **ssh: Any) -> dict[str, Any]:
        """The cluster spec for these nodes, as plain data; ``ssh`` overrides cluster.ssh.

        Once ``node add`` enrolled them (:attr:`account` set), the daemon logs in as
        that account and the nodes are in ``nodes.yaml``, as ``node add`` wrote them.
        """
        nodes = {} if self.account else {
            name: self._with_weights_dirs(node_spec(node)) for name, node in self.nodes.items()}
        nodes.update(self.extra_nodes)
        settings = {"user": self.account or getpass.getuser(), "known_hosts": "known_hosts",
                    "identity_file": str(self.client_key), "connect_timeout": "5s", **ssh}
        data: dict[str, Any] = {"cluster": {"name": "sim", "ssh": settings}}
        if nodes or not self.account:
            data["nodes"] = nodes
        fabrics = fabric_specs(self.nodes.values())
        if fabrics:
            data["fabrics"] = fabrics
        return data

    def _with_weights_dirs(self, spec: dict[str, Any]) -> dict[str, Any]:
        dirs = list(spec.get("weights_dirs", []))
        dirs += [d for d in self.weights_dirs if d not in dirs]
        return {**spec, "weights_dirs": dirs} if dirs else spec

    def write_cluster(self, extra: Mapping[str, Any] | None = None, **ssh: Any) -> Path:
        """Write ``cluster.yaml`` (plus ``extra`` sections) and pin every node's key if unpinned."""
        data = self.cluster_data(**ssh)
        for section, value in (extra or {}).items():
            data.setdefault(section, {}).update(value)
        _write_yaml(self.cluster_dir / "cluster.yaml", data)
        if not self.known_hosts.exists():
            self.pin_host_keys()
        return self.cluster_dir

    def close(self) -> None:
        """Stop every process started for these nodes, and remove their files."""
        pids = [pid for node in self.nodes.values() for pid in node.processes()]
        terminate([*pids, *self._strays()])
        for node in self.nodes.values():
            for process in (node.sshd, node.agent):
                if process is not None:
                    process.wait(timeout=STOP_TIMEOUT)
            node.sshd = node.agent = None
        for sock in self._blackholes:
            sock.close()
        terminate(self._strays())
        shutil.rmtree(self.root, ignore_errors=True)

    def _strays(self) -> list[int]:
        """Processes of this cluster still running (engines left by an agent, orphans).

        Found by the marker in their environment, or by this cluster's directory
        in their command line: sshd rewrites its process title over the
        environment, so its marker is gone, but its ``-f …/sshd_config`` shows.
        """
        return marked(self.root)


def fixture_settings(hardware: str) -> dict[str, Any]:
    """The fixture node's own ``agent.yaml``, its relative paths made absolute."""
    base = FIXTURES / hardware
    data: dict[str, Any] = YAML(typ="safe").load((base / "agent.yaml").read_text()) or {}
    hw = dict(data.get("hardware") or {})
    for key in ("sysfs_root", "proc_root"):
        if key in hw:
            hw[key] = str(base / hw[key])
    for program in ("nvidia_smi", "sudo"):
        if "/" in str(hw.get(program, "")):
            hw[program] = str(base / hw[program])
    data["hardware"] = hw
    declared = dict(data.get("declared") or {})
    declared["weights_dirs"] = [str(base / d) for d in declared.get("weights_dirs", [])]
    data["declared"] = declared
    return data


def agent_config(node: SimNode) -> dict[str, Any]:
    """The agent settings of a simulated node: its fixture hardware, socket and state dir."""
    data = fixture_settings(node.hardware)
    data.update({
        "node": node.name,
        "socket": {"path": str(node.agent_socket), "mode": "0660", "group": None},
        "backend": "supervise",
        "state_dir": str(node.root / "state"),
        "engines": {"dir": str(node.root / "engines")},
    })
    data.setdefault("readiness", {"poll_interval": "0.2s", "probe_timeout": "1s"})
    data["hardware"] = hardware_settings(node)
    return data


def hardware_settings(node: SimNode) -> dict[str, Any]:
    """The fixture's ``hardware`` settings, its ``proc`` tree the node's own copy."""
    hardware = dict(fixture_settings(node.hardware)["hardware"])
    if "proc_root" in hardware:
        hardware["proc_root"] = str(_proc_tree(node, Path(hardware["proc_root"])))
    return hardware


def _proc_tree(node: SimNode, fixture: Path) -> Path:
    """The node's own copy of its fixture's ``proc`` tree, where the fixture's mount of
    ``/models`` (an NFS filer on the InfiniBand nodes, a local disk elsewhere) is also
    mounted at the lab's models directory (``<runtime>/models``, beside the nodes'
    own): so the lab's nodes report its one copy of a model as the fixture's filesystem
    holds it, shared or local."""
    target = node.root / "proc"
    shutil.copytree(fixture, target, dirs_exist_ok=True)
    info = target / "self" / "mountinfo"
    if info.is_file():
        text = info.read_text()
        lab_models = str(node.root.parent / "models").replace("\\", "\\134").replace(" ", "\\040")
        extra = [" ".join([*fields[:4], lab_models, *fields[5:]]) for line in text.splitlines()
                 if len(fields := line.split(" ")) > 5 and fields[4] == SIM_MODELS]
        info.write_text(text + "".join(f"{line}\n" for line in extra))
    return target


def node_spec(node: SimNode) -> dict[str, Any]:
    """The node's entry in the cluster spec: where SSH reaches it and what it declares."""
    spec: dict[str, Any] = {"address": "127.0.0.1", "ssh_port": node.port,
                            "agent_socket": str(node.agent_socket),
                            "engine_ports_from": node.engine_ports_from}
    declared = fixture_settings(node.hardware)["declared"]
    if declared.get("fabrics"):
        spec["fabrics"] = {name: list(f.get("adapters", []))
                           for name, f in declared["fabrics"].items()}
    if declared.get("weights_dirs"):
        spec["weights_dirs"] = declared["weights_dirs"]
    return spec


def fabric_specs(nodes: Iterable[SimNode]) -> dict[str, Any]:
    """Cluster-level fabric entries for every fabric the nodes' fixtures declare."""
    fabrics: dict[str, Any] = {}
    for node in nodes:
        for name, fabric in fixture_settings(node.hardware)["declared"].get("fabrics", {}).items():
            entry = {"kind": fabric["kind"]}
            if fabric.get("gid_index") is not None:
                entry["gid_index"] = fabric["gid_index"]
            fabrics.setdefault(name, entry)
    return fabrics


def sweep_abandoned() -> list[Path]:
    """Stop what simulated clusters of dead test runs left (a run killed mid-test).

    Each cluster directory records its owner; when that process is gone, every
    process still carrying the directory's marker is stopped and the directory
    removed. Live runs (another pytest, in parallel) are left alone.
    """
    swept = []
    for root in Path("/tmp").glob("llmgw-sim-*"):
        try:
            owner = (root / "owner").read_text()
        except OSError:
            continue
        if is_same(owner):
            continue
        sim = SimCluster(root)
        terminate(sim._strays())
        shutil.rmtree(root, ignore_errors=True)
        swept.append(root)
    return swept


def _write_yaml(path: Path, data: dict[str, Any]) -> None:
    yaml = YAML()
    yaml.default_flow_style = False
    with path.open("w") as out:
        yaml.dump(data, out)


_FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")


def fingerprints_in(text: str) -> list[str]:
    return _FINGERPRINT.findall(text)
