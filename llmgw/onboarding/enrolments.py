"""``llmgw node add``: from "I can SSH to it" to a node in ``nodes.yaml`` whose agent reports.

Steps, each shown through :class:`Progress` as it starts and as it finishes:

1. **host key** — the node's key is fetched and its fingerprint shown; it must
   match ``--fingerprint`` (or be confirmed at a terminal), then it is pinned
   in the cluster's ``known_hosts``. Nothing else is sent before that.
2. **preflight** — root or password-less sudo, Python ≥ 3.11 with ``venv``,
   free disk under the prefix, whether systemd is PID 1. Anything missing
   stops here, before any change, with every problem listed.
3. **account** — when ``cluster.ssh.user`` is not the user ``node add`` logs in
   as (and not root), that account is made and given the key ``node add``
   logged in with (:mod:`.accounts`), so the daemon can log in.
4. **install** — this llmgw version and its dependencies as wheels (built
   here once with ``pip wheel``, cached), copied over SFTP and installed into
   ``<prefix>/venv`` with ``--no-index``: the node never reaches the
   internet. Skipped when that version is already there.
5. **agent** — ``<prefix>/engines/`` made the daemon's account's (it ships
   engine binaries into ``.incoming/`` there; a re-run keeps what is installed),
   ``agent.yaml`` and ``llmgw-agent.service`` written under the prefix; with
   systemd the unit is installed, enabled and (re)started;
   without it the agent runs with the supervise backend, detached, its pid
   recorded. An upgrade restarts the agent only: engines keep running.
6. **report** — waits for the agent's first report through the tunnel the
   daemon will use, as ``cluster.ssh.user``.
7. **compiler** — on a node whose report lists GPUs, gcc (or clang) on PATH,
   which Triton needs when vLLM or SGLang first loads a model: when preflight
   saw neither, the package manager installs gcc (:mod:`.compilers`;
   ``--no-compiler`` skips it). A failure is a doubt, as the others.

The caller then writes the node into ``nodes.yaml`` (:mod:`.yamledits`).
Every step is idempotent: a second run changes nothing.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import asyncssh
from asyncssh.public_key import load_default_keypairs
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from llmgw import __version__
from llmgw.fleet.types import NodeReport
from llmgw.onboarding import accounts, compilers
from llmgw.onboarding.preflights import (
    PREFLIGHT,
    Facts,
    PreflightError,
    node_name,
    one_line,
    parse_preflight,
    report_doubts,
)
from llmgw.spec.models import Cluster, Node
from llmgw.transport import hostkeys, pools

TARGET = re.compile(r"^(?:(?P<user>[A-Za-z_][A-Za-z0-9_.-]{0,31})@)?"
                    r"(?P<host>[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9a-fA-F:]+\])"
                    r"(?::(?P<port>\d{1,5}))?$")
# A first report waits on the agent importing grpc and reading its hardware: seconds on an
# idle node, more than a minute on a loaded 2-core one (seen: 62 s in a lab of three).
REPORT_TIMEOUT = 180.0


class EnrolError(Exception):
    """A step that cannot go on; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class Target:
    user: str
    host: str
    port: int

    @property
    def known_hosts_name(self) -> str:
        return hostkeys.entry(self.host, self.port)


def parse_target(text: str, default_user: str, default_port: int) -> Target:
    """``[USER@]HOST[:PORT]``, validated."""
    match = TARGET.match(text)
    if not match:
        raise EnrolError(f"{text!r} is not [USER@]HOST[:PORT]")
    port = int(match.group("port") or default_port)
    if not 1 <= port <= 65535:
        raise EnrolError(f"port {port} is out of range")
    return Target(match.group("user") or default_user, match.group("host").strip("[]"), port)


@dataclass
class Plan:
    """Where things go on the node."""

    prefix: str
    systemd: bool
    name: str
    # Kept from an agent.yaml already on the node: where its nvidia-smi and sysfs are.
    hardware: dict[str, object] | None = None
    # The socket's group without systemd: llmgw once the daemon's account is in it.
    group: str | None = None

    @property
    def engines(self) -> str:
        """Where the agent installs engine versions: the account ships binaries into its
        ``.incoming/`` over SFTP, so ``node add`` makes it the account's (see :meth:`agent`)."""
        return f"{self.prefix}/engines"

    @property
    def socket(self) -> str:
        return "/run/llmgw/agent.sock" if self.systemd else f"{self.prefix}/run/agent.sock"

    def agent_yaml(self) -> str:
        group = "llmgw" if self.systemd else (self.group or "null")
        return (f"# Written by `llmgw node add`: the agent of node {self.name}.\n"
                f"node: {json.dumps(self.name)}\n"
                f"socket: {{path: {self.socket}, mode: \"0660\", group: {group}}}\n"
                f"backend: {'systemd' if self.systemd else 'supervise'}\n"
                f"state_dir: {self.prefix}/state\n"
                f"engines: {{dir: {self.engines}}}\n"
                + (f"hardware: {json.dumps(self.hardware)}  # kept from the node's agent.yaml\n"
                   if self.hardware else ""))

    def unit(self) -> str:
        return ("[Unit]\nDescription=llmgw agent: reports this node, runs its engines\n"
                "After=network-online.target\n\n[Service]\nType=exec\n"
                f"ExecStart={self.prefix}/venv/bin/llmgw agent serve --config "
                f"{self.prefix}/etc/agent.yaml\n"
                "RuntimeDirectory=llmgw\nRuntimeDirectoryPreserve=yes\n"
                "LimitMEMLOCK=infinity\nKillMode=process\nRestart=on-failure\n\n"
                "[Install]\nWantedBy=multi-user.target\n")


class Progress(Protocol):
    """Where the steps show: ``begin`` as a step starts (and as it moves on), ``done`` once
    it has finished, with what it found (``llmgw.cli.checklists.Checklist``)."""

    def begin(self, step: str, doing: str) -> None: ...

    def done(self, step: str, detail: str) -> None: ...


@dataclass
class Enrolment:
    """One ``node add`` run."""

    cluster: Cluster
    cluster_dir: Path
    target: Target
    name: str  # "": the machine's own hostname, read at preflight (:func:`node_name`)
    prefix: str
    identity: Path | None
    progress: Progress
    wheel_cache: Path
    plan: Plan | None = None  # where things went on the node, once the agent step ran
    login_key: asyncssh.SSHKeyPair | None = None  # the key connect() logged in with
    account: accounts.Outcome | None = None  # the daemon's account, once that step ran
    # Asked, with a step and its doubts, whether to go on past them (--continue-past, or a
    # question at a terminal); the doubts gone past, for nodes.yaml's comment.
    go_on: Callable[[str, list[str]], bool] = lambda step, doubts: False
    passed: list[str] = field(default_factory=list)

    async def pin(self, expected: str | None, confirm: Callable[[str], bool]) -> None:
        known_hosts = Path(self.cluster.cluster.ssh.known_hosts)
        pinned = hostkeys.load(known_hosts)
        self.progress.begin("host key", f"asking {self.target.known_hosts_name} for its key")
        try:
            key = await asyncio.wait_for(
                asyncssh.get_server_host_key(self.target.host, self.target.port), 15)
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            raise EnrolError(f"cannot reach {self.target.host}:{self.target.port}: {exc}") \
                from None
        if key is None:
            raise EnrolError("the node offered no host key")
        offered = key.get_fingerprint("sha256")
        already = [k.get_fingerprint("sha256") for k in
                   pinned.keys_for(self.target.host, self.target.host, self.target.port)]
        if already and offered not in already:
            raise EnrolError(f"{self.target.known_hosts_name} offers {offered}, but "
                             f"{known_hosts} pins {', '.join(already)}: check the node before "
                             "changing the pin")
        if offered not in already:
            self.progress.begin("host key", f"{self.target.known_hosts_name} offers a key "
                                "not pinned yet")
            if expected is not None and expected != offered:
                raise EnrolError(f"the node offers {offered}, not {expected}: nothing was "
                                 "pinned or sent")
            if expected is None and not confirm(offered):
                raise EnrolError(f"{offered} not confirmed: nothing was pinned or sent")
            line = f"{self.target.known_hosts_name} {key.export_public_key('openssh').decode()}"
            with known_hosts.open("a") as out:
                out.write(line if line.endswith("\n") else line + "\n")
            self.progress.done("host key", f"{offered} pinned in {_shown(known_hosts)}")
        else:
            self.progress.done("host key", f"{offered} already pinned")

    async def connect(self) -> asyncssh.SSHClientConnection:
        """Log in as the target user with ``identity_file``, else the ssh-agent's keys and
        the default ones, one key at a time, so that :attr:`login_key` is the key that
        worked: the one the daemon's account is given."""
        try:
            if self.identity:
                candidates = asyncssh.load_keypairs(str(self.identity))[:1]
            else:
                candidates = [*await _agent_keys(), *load_default_keypairs()]
        except (OSError, ValueError, asyncssh.KeyImportError) as exc:
            raise EnrolError(f"cannot read the SSH key {self.identity}: {exc}") from None
        if not candidates:
            raise EnrolError("no SSH key to log in with: set ssh.identity_file in "
                             "cluster.yaml, or load a key into your ssh-agent")
        failure: Exception | None = None
        for key in candidates:
            try:
                conn = await asyncssh.connect(
                    self.target.host, port=self.target.port, username=self.target.user,
                    known_hosts=self.cluster.cluster.ssh.known_hosts, agent_path=None,
                    client_keys=[key], connect_timeout=15, config=None)
            except asyncssh.PermissionDenied as exc:
                failure = exc
                continue
            except (OSError, asyncssh.Error) as exc:
                raise EnrolError(f"cannot log in as {self.target.user}: {exc}") from None
            self.login_key = key
            return conn
        raise EnrolError(f"cannot log in as {self.target.user}: {failure}")

    async def ensure_account(self, conn: asyncssh.SSHClientConnection, facts: Facts) -> None:
        """The daemon's account (``cluster.ssh.user``) on the node: see :mod:`.accounts`."""
        user = self.cluster.cluster.ssh.user
        if user == self.target.user or user == "root":
            self.progress.begin("account", "the daemon's account")
            self.progress.done("account", f"the daemon logs in as {user}, as node add does: "
                               "no account to make")
            return
        self.progress.begin("account", f"{user}, the daemon's account, and our key")
        assert self.login_key is not None
        try:
            self.account = await accounts.ensure(conn, user, facts.uid != 0, self.login_key)
        except accounts.AccountError as exc:
            raise EnrolError(str(exc)) from None
        self.progress.done("account", self.account.detail())

    async def preflight(self, conn: asyncssh.SSHClientConnection) -> Facts:
        self.progress.begin("preflight", "root or sudo, Python, disk, systemd")
        result = await conn.run(PREFLIGHT.format(prefix=shlex.quote(self.prefix)), check=False)
        facts = parse_preflight(str(result.stdout))
        problems = facts.problems()
        if problems:
            raise EnrolError("the node is not ready; nothing was changed:\n  - "
                             + "\n  - ".join(problems))
        named = ""
        if not self.name:
            try:
                self.name = node_name(facts.hostname)
            except PreflightError as exc:
                raise EnrolError(str(exc)) from None
            known = self.cluster.nodes.get(self.name)
            if known is not None and known.address != self.target.host:
                raise EnrolError(
                    f"the machine calls itself {self.name}, but nodes.yaml's {self.name} is "
                    f"at {known.address}; nothing was changed: pass --name to name this one")
            named = f", named {self.name} after its hostname"
        self._doubt("preflight", facts.doubts(), "nothing was changed")
        self.progress.done("preflight", f"{'root' if facts.uid == 0 else 'sudo'}, Python "
                           f"{facts.python}, "
                 f"{facts.disk_free >> 30} GiB free, "
                 + ("systemd" if facts.systemd else "no systemd: supervise backend") + named)
        return facts

    def _doubt(self, step: str, doubts: list[str], state: str) -> None:
        """Stop on ``doubts`` unless :attr:`go_on` says to pass them, then noted."""
        if not doubts:
            return
        if not self.go_on(step, doubts):
            raise EnrolError(f"{step}: {'; '.join(doubts)}; {state}. Fix it, or pass "
                             "--continue-past to go on (nodes.yaml will say so)")
        self.passed.extend(f"{step}: {one_line(doubt)}" for doubt in doubts)

    async def install(self, conn: asyncssh.SSHClientConnection, facts: Facts) -> bool:
        """Ship and install this llmgw; True when something changed."""
        sudo = "" if facts.uid == 0 else "sudo -n "
        prefix = shlex.quote(self.prefix)
        self.progress.begin("install", "the version on the node")
        have = await conn.run(f"{prefix}/venv/bin/llmgw --version", check=False)
        if str(have.stdout).strip() == f"llmgw {__version__}":
            self.progress.done("install", f"llmgw {__version__} already in {self.prefix}/venv")
            return False
        begun = time.monotonic()
        self.progress.begin("install", f"building the wheels of llmgw {__version__} here")
        wheels = await asyncio.to_thread(build_wheels, self.wheel_cache)
        # Ours, but not engines/: that is the daemon's account's, and keeps its installs.
        await _run(conn, f"{sudo}mkdir -p {prefix}/wheels {prefix}/etc {prefix}/state "
                   f"{prefix}/run && {sudo}chown $(id -u) {prefix} && {sudo}chown -R $(id -u) "
                   f"{prefix}/wheels {prefix}/etc {prefix}/state {prefix}/run")
        listing = await conn.run(f"ls {prefix}/wheels", check=False)
        present = set(str(listing.stdout).split())
        # llmgw's own wheel always (same name, newer code); dependencies when missing.
        missing = [w for w in wheels if w.name not in present or w.name.startswith("llmgw-")]
        if missing:
            self.progress.begin("install", f"sending {len(missing)} wheels over SFTP")
            try:
                async with conn.start_sftp_client() as sftp:
                    await sftp.put([str(w) for w in missing], f"{self.prefix}/wheels/")
            except (OSError, asyncssh.Error) as exc:
                raise EnrolError(f"copying the wheels over SFTP failed ({exc}): the node's "
                                 "sshd needs its sftp subsystem (`Subsystem sftp …`)") from None
        self.progress.begin("install", f"pip install llmgw=={__version__} --no-index")
        await _run(conn, f"test -x {prefix}/venv/bin/python || python3 -m venv {prefix}/venv")
        await _run(conn, f"{prefix}/venv/bin/pip install -q --no-index --find-links "
                   f"{prefix}/wheels 'llmgw=={__version__}'")
        self.progress.done("install", f"llmgw {__version__} into {self.prefix}/venv "
                           f"({len(missing)} of {len(wheels)} wheels sent, "
                           f"{time.monotonic() - begun:.1f}s)")
        return True

    async def agent(self, conn: asyncssh.SSHClientConnection, facts: Facts,
                    upgraded: bool) -> Plan:
        plan = self.plan = Plan(self.prefix, facts.systemd, self.name,
                                group=accounts.GROUP if self.account else None)
        self.progress.begin("agent", "agent.yaml and llmgw-agent.service")
        prefix = shlex.quote(self.prefix)
        sudo = "" if facts.uid == 0 else "sudo -n "
        changed = upgraded
        current = await conn.run(f"cat {prefix}/etc/agent.yaml", check=False)
        plan.hardware = kept_hardware(str(current.stdout))
        await _run(conn, engines_command(plan, self.account.user if self.account else None,
                                         sudo))
        for path, text in ((f"{self.prefix}/etc/agent.yaml", plan.agent_yaml()),
                           (f"{self.prefix}/etc/llmgw-agent.service", plan.unit())):
            current = await conn.run(f"cat {shlex.quote(path)}", check=False)
            if current.stdout != text:
                await conn.run(f"cat > {shlex.quote(path)}", input=text, check=True)
                changed = True
        if facts.systemd:
            await _run(conn, f"{sudo}getent group llmgw >/dev/null || {sudo}groupadd --system "
                       f"llmgw; {sudo}cp {prefix}/etc/llmgw-agent.service "
                       f"/etc/systemd/system/llmgw-agent.service && {sudo}systemctl "
                       "daemon-reload && " + (f"{sudo}systemctl enable llmgw-agent && "
                                              f"{sudo}systemctl restart llmgw-agent" if changed
                                              else f"{sudo}systemctl enable --now llmgw-agent"))
            self.progress.done("agent", "llmgw-agent.service enabled and "
                               + ("restarted" if changed else "running"))
            return plan
        running = await conn.run(
            f"pid=$(cat {prefix}/run/agent.pid 2>/dev/null) && "
            f"tr '\\0' ' ' < /proc/$pid/cmdline 2>/dev/null | grep -q {prefix}/venv/bin/llmgw "
            "&& echo $pid", check=False)
        pid = str(running.stdout).strip()
        if pid and not changed:
            self.progress.done("agent", f"running (supervise backend, pid {pid})")
            return plan
        if pid:  # the agent only: its engines run in their own groups and are adopted again
            await conn.run(f"kill {pid}; while kill -0 {pid} 2>/dev/null; do sleep 0.1; done",
                           check=False)
        # In its own session, so it outlives this SSH session. `cd` stays out of the
        # background job: a backgrounded list would keep a shell, and with it this
        # session's stdout, open for as long as the agent runs.
        started = await conn.run(
            f"cd {prefix} || exit 1; setsid {prefix}/venv/bin/llmgw agent serve --config "
            f"{prefix}/etc/agent.yaml >>{prefix}/agent.log 2>&1 </dev/null & "
            f"echo $! > {prefix}/run/agent.pid; cat {prefix}/run/agent.pid", check=True)
        self.progress.done("agent", f"{'restarted' if pid else 'started'} (supervise backend, "
                           f"pid {str(started.stdout).strip()}; no systemd on the node)")
        return plan

    async def first_report(self, plan: Plan) -> NodeReport:
        node = Node(address=self.target.host,
                    ssh_port=None if self.target.port == 22 else self.target.port,
                    agent_socket=plan.socket)
        # As the daemon will: as cluster.ssh.user, with its keys.
        alone = self.cluster.model_copy(update={"nodes": {self.name: node},
                                                "models": {}})
        deadline = time.monotonic() + REPORT_TIMEOUT
        self.progress.begin("report", "waiting for the agent's first report as "
                            f"{self.cluster.cluster.ssh.user}")
        begun = time.monotonic()
        async with pools.Pool(alone, self.cluster_dir) as pool:
            while True:
                report = await pool.report(self.name)
                if report.reachable:
                    self.progress.done(
                        "report", f"{len(report.gpus)} GPUs, "
                        f"{(report.memory_total_bytes or 0) / (1 << 30):.0f} GiB, "
                        f"{len(report.adapters)} RDMA adapters, agent "
                        f"{report.agent_version} (first report after "
                        f"{time.monotonic() - begun:.1f}s)")
                    self._doubt("report", report_doubts(report),
                                "the agent runs, nodes.yaml is unchanged")
                    return report
                if time.monotonic() > deadline:
                    raise EnrolError(f"the agent did not report within {REPORT_TIMEOUT:g}s "
                                     f"(its log: {self.prefix}/agent.log): {report.error}")
                await asyncio.sleep(0.2)

    async def compiler(self, conn: asyncssh.SSHClientConnection, facts: Facts,
                       report: NodeReport, wanted: bool = True) -> None:
        """gcc on a GPU node that has no C compiler (:mod:`.compilers`), after the report:
        its GPUs say whether vLLM and SGLang will be installed here."""
        self.progress.begin("compiler", "gcc or clang, for Triton on a GPU node")
        action = compilers.decide(facts.compiler, gpus=len(report.gpus),
                                  root=facts.uid == 0, wanted=wanted)
        doubt = action.detail if action.kind == "cannot" else ""
        if action.kind == "install":
            self.progress.begin("compiler", action.detail)
            try:
                result = await conn.run(action.command, check=False,
                                        timeout=compilers.INSTALL_TIMEOUT)
                status, stderr = result.exit_status, str(result.stderr)
            except asyncssh.TimeoutError as exc:  # what it printed until then
                status = None
                stderr = str(exc.stderr) + f"\nno end after {compilers.INSTALL_TIMEOUT:g}s"
            after = compilers.parse(str((await conn.run(compilers.PROBE, check=False)).stdout))
            manager = facts.compiler.package_manager
            line = compilers.installed(action, facts.compiler, after)
            if status != 0:
                doubt = compilers.failure(action, manager, status, stderr)
            elif not line:
                doubt = (f"installed {action.what} with {manager}, yet found no gcc or clang on "
                         "PATH, or no Python.h: install them yourself, or pass --no-compiler")
            else:
                action = compilers.Action("install", line)
        if doubt:
            self._doubt("compiler", [doubt], "the agent runs, nodes.yaml is unchanged")
            self.progress.done("compiler", f"none, gone past: {doubt}")
            return
        self.progress.done("compiler", action.detail)


def engines_command(plan: Plan, account: str | None, sudo: str) -> str:
    """Make the engines directory and its ``.incoming/``, or take them over, keeping what
    is installed there: the daemon's ``account`` (when ``node add`` made one) owns both,
    because ``llmgw engine install`` ships binaries into ``.incoming/`` over SFTP as that
    account; the agent, in group llmgw, installs beside them. Without an account they are
    the SSH user's, as the rest of the prefix."""
    engines = shlex.quote(plan.engines)
    incoming = shlex.quote(f"{plan.engines}/.incoming")
    if account is None:
        return f"{sudo}mkdir -p {incoming}"
    owner = f"-o {shlex.quote(account)} -g {accounts.GROUP}"
    return (f"{sudo}install -d -m 2775 {owner} {engines} && "
            f"{sudo}install -d -m 2770 {owner} {incoming}")


async def _run(conn: asyncssh.SSHClientConnection, command: str) -> None:
    result = await conn.run(command, check=False)
    if result.exit_status != 0:
        raise EnrolError(f"on the node, `{command}` failed ({result.exit_status}): "
                         f"{str(result.stderr).strip()[-500:]}")


def build_wheels(cache: Path) -> list[Path]:
    """This llmgw and every dependency as wheels, cached here.

    The dependencies are built once per ``pyproject.toml`` (that needs the
    package index, from this machine, once); llmgw's own wheel is rebuilt
    whenever its source changes, offline.
    """
    source = Path(__file__).resolve().parents[2]
    if not (source / "pyproject.toml").exists():
        raise EnrolError("llmgw does not run from a source checkout: put its wheels in "
                         f"{cache} (pip wheel llmgw=={__version__} -w {cache})")
    cache.mkdir(parents=True, exist_ok=True)
    # One build at a time: pip builds llmgw's wheel in the checkout itself, and two node
    # adds (two labs started at once) failed each other's build.
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_wheels(source, cache)


def _build_wheels(source: Path, cache: Path) -> list[Path]:
    project = (source / "pyproject.toml").read_bytes()
    wanted = "\n".join(sorted(tomllib.loads(project.decode())["project"]["dependencies"]))
    deps = cache / f"deps-{hashlib.sha256(wanted.encode()).hexdigest()[:12]}"
    if not (deps / ".complete").exists():
        _pip_wheel(source, deps, "--no-build-isolation")
        for own in deps.glob("llmgw-*.whl"):
            own.unlink()
        (deps / ".complete").write_text("")
    digest = hashlib.sha256(project)
    for path in sorted(source.glob("llmgw/**/*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.read_bytes())
    own_dir = cache / f"llmgw-{__version__}-{digest.hexdigest()[:12]}"
    if not (own_dir / ".complete").exists():
        _pip_wheel(source, own_dir, "--no-deps", "--no-build-isolation")
        (own_dir / ".complete").write_text("")
    return sorted([*deps.glob("*.whl"), *own_dir.glob("*.whl")])


def _pip_wheel(source: Path, into: Path, *flags: str) -> None:
    into.mkdir(parents=True, exist_ok=True)
    # -P: a pip.py in the working directory is not what builds the wheels.
    done = subprocess.run([sys.executable, "-P", "-m", "pip", "wheel", "-q", *flags, str(source),
                           "-w", str(into)], capture_output=True, text=True)
    if done.returncode != 0:
        raise EnrolError(f"pip wheel failed: {pip_error(done.stderr)}")


def pip_error(stderr: str, limit: int = 800) -> str:
    """pip's error output, shortened for a message: from its first ``ERROR:`` line, else
    its last whole lines within ``limit`` characters; never cut inside a line."""
    lines = stderr.strip().splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("ERROR:")), None)
    if first is not None:
        lines = lines[first:]
    kept: list[str] = []
    for line in reversed(lines):
        if kept and sum(len(k) + 1 for k in kept) + len(line) > limit:
            break
        kept.insert(0, line)
    return "\n".join(kept)


async def _agent_keys() -> list[asyncssh.SSHKeyPair]:
    """The keys of the operator's ssh-agent, if one runs (``SSH_AUTH_SOCK``)."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        return []
    try:
        agent = await asyncssh.connect_agent()
    except (OSError, asyncssh.Error):
        return []
    if agent is None:
        return []
    try:
        return list(await agent.get_keys())
    except (OSError, asyncssh.Error, ValueError):
        return []


def kept_hardware(agent_yaml: str) -> dict[str, object] | None:
    """The ``hardware:`` section of an agent.yaml (nvidia-smi's path, the sysfs root), which
    ``node add`` keeps when it rewrites the file; None when there is none."""
    try:
        data = YAML(typ="safe").load(agent_yaml)
    except YAMLError:
        return None
    hardware = data.get("hardware") if isinstance(data, dict) else None
    if not isinstance(hardware, dict) or not hardware:
        return None
    return {str(k): v for k, v in hardware.items() if isinstance(v, str | int | float | bool)}


def node_entry(target: Target, plan: Plan, report: NodeReport, fabrics: dict[str, list[str]],
               labels: dict[str, str], weights_dirs: Sequence[str] = ()) -> dict[str, object]:
    """The node's entry for ``nodes.yaml``: how it is reached and what it was found to have."""
    entry: dict[str, object] = {"address": target.host}
    if target.port != 22:
        entry["ssh_port"] = target.port
    if plan.socket != "/run/llmgw/agent.sock":
        entry["agent_socket"] = plan.socket
    counts: dict[str, int] = {}
    for gpu in report.gpus:
        counts[gpu.gpu_class] = counts.get(gpu.gpu_class, 0) + 1
    if counts:
        entry["gpus"] = [{"class": c, "count": n} for c, n in sorted(counts.items())]
    if report.memory_total_bytes:
        entry["memory"] = f"{report.memory_total_bytes >> 30}GiB"
    if fabrics:
        entry["fabrics"] = fabrics
    if labels:
        entry["labels"] = labels
    if weights_dirs:
        entry["weights_dirs"] = list(weights_dirs)
    return entry


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
