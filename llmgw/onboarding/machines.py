"""Throwaway machines with systemd as PID 1: ``systemd-nspawn`` containers on this host.

A node in production runs llmgw's units under systemd. On a machine whose
own PID 1 is not systemd (a CI runner, a container) the tests and
``llmgw lab up --backend systemd`` boot one here: systemd 252 as PID 1 of a
container whose root is a tmpfs and whose ``/usr`` is this host's, read-only
(``--volatile=yes``). It boots in about a second and holds a few tens of MB.

* ``/etc`` starts empty; a machine-id is bound in (without one, first-boot
  presets would start every service the host's packages ship), and the
  console getty and the machine-id commit are masked.
* ``/etc/systemd/system`` is a directory of this host (:attr:`Machine.units`),
  so unit files written there (by an agent inside, or a test outside) are the
  container's; ``/etc/llmgw/env`` likewise (:attr:`Machine.env`).
* Host directories the caller names are bound at the same path inside, so a
  path means the same thing on both sides (sockets, state, the checkout).
* Each machine's nspawn runs in a cgroup of its own (created here, on every
  mounted hierarchy, before nspawn is executed), so containers never share
  nspawn's ``payload/`` cgroup; :meth:`Machine.stop` powers it off by the
  nspawn pid, kills what is left through the cgroup, and removes the cgroups.
* The network is the caller's (``network=False``: a private one with only
  ``lo``), so what listens inside on 127.0.0.1 is reachable from outside.

Usage::

    machine = machines.boot(Path("/tmp/m1"), "m1", binds=[Path("/tmp/m1/shared")])
    machine.run(["systemctl", "is-system-running"])
    machine.stop()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.rendering import quoting

NSPAWN = "systemd-nspawn"
NSENTER = "nsenter"
CGROUP_ROOT = Path("/sys/fs/cgroup")
BOOT_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
# Units of the host's /usr that must not run in a throwaway machine.
MASKED = ("console-getty.service", "systemd-machine-id-commit.service",
          "getty@.service", "systemd-networkd-wait-online.service")
_NAME_OK = set("abcdefghijklmnopqrstuvwxyz0123456789-")
AGENT_UNIT = "llmgw-agent.service"
# The PATH systemd gives services; engines found elsewhere are put in front of it.
SERVICE_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
KEPT = "kept"  # the owner of a machine that outlives its creator (a lab's)


class MachineError(RuntimeError):
    """A machine that cannot be booted here; the message says what failed and what to do."""


def unavailable() -> str | None:
    """Why no machine can be booted on this host; None when one can."""
    if shutil.which(NSPAWN) is None:
        return ("systemd-nspawn is not installed (`apt-get install --no-install-recommends "
                "systemd-container`, or `make sysdeps`)")
    if shutil.which(NSENTER) is None:
        return "nsenter is not installed (util-linux)"
    if os.geteuid() != 0:
        return "booting a systemd container needs root"
    if not cgroup_hierarchies():
        return f"no cgroup file system is mounted under {CGROUP_ROOT}"
    if not Path("/usr/lib/systemd/systemd").exists():
        return "this host's /usr has no systemd to boot (/usr/lib/systemd/systemd)"
    return None


def cgroup_hierarchies() -> list[Path]:
    """The cgroup hierarchies nspawn uses: the unified one, or name=systemd (+ unified)."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT]  # cgroup v2 only
    return [p for p in (CGROUP_ROOT / "systemd", CGROUP_ROOT / "unified")
            if (p / "cgroup.procs").exists()]


def python_paths() -> list[Path]:
    """What a machine must see of this host to run this llmgw: its Python (a venv and the
    interpreter it was made from, when those are not under /usr) and its source checkout."""
    paths = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").exists():
        paths.add(checkout)
    return sorted(p for p in paths if p.exists() and not _under(p, Path("/usr")))


def _under(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


@dataclass
class Machine:
    """One booted container: its nspawn process, its PID 1, and its files on this host."""

    name: str
    root: Path
    process: subprocess.Popen[bytes]
    leader: int  # the container's PID 1 (systemd), as this host numbers it
    cgroups: list[Path]
    booted_in: float = 0.0  # seconds from spawning nspawn to `systemctl is-system-running`
    log: Path = field(default=Path("/dev/null"))

    @property
    def units(self) -> Path:
        """This host's directory that is the container's /etc/systemd/system."""
        return self.root / "units"

    @property
    def env(self) -> Path:
        """This host's directory that is the container's /etc/llmgw/env."""
        return self.root / "env"

    @property
    def proc(self) -> Path:
        """The container's /proc (its pid namespace), seen from this host."""
        return Path(f"/proc/{self.leader}/root/proc")

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the container (its mounts, pids, hostname and IPC)."""
        return [NSENTER, f"--target={self.leader}", "--mount", "--pid", "--uts", "--ipc",
                "--", *argv]

    def run(self, argv: Sequence[str], timeout: float = 30.0,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self.command(argv), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise MachineError(f"{' '.join(argv)} in {self.name} exited with "
                               f"{done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
        return done

    def pids(self) -> list[int]:
        """Every process of the machine (nspawn's cgroups), as this host numbers them."""
        found: set[int] = set()
        for top in self.cgroups:
            for procs in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    found.update(int(line) for line in procs.read_text().split())
        return sorted(found)

    def memory_bytes(self) -> int:
        """Proportional set size of every process in the machine (its share of RAM)."""
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
        return total

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Power the machine off (SIGTERM to nspawn), kill what is left, remove its cgroups."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # nspawn asks systemd to power off
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
        _kill_cgroups(self.cgroups)
        _remove_cgroups(self.cgroups)


def boot(
    root: Path,
    name: str,
    *,
    binds: Sequence[Path] = (),
    read_only: Sequence[Path] = (),
    network: bool = True,
    limits: Sequence[str] = (),
    drop_capabilities: Sequence[str] = (),
    timeout: float = BOOT_TIMEOUT,
    kept: bool = False,
) -> Machine:
    """Boot a machine whose files live in ``root`` (created); wait until systemd is up.

    ``binds`` and ``read_only`` are host paths bound at the same path inside;
    ``limits`` are nspawn ``--rlimit=`` values (``MEMLOCK=65536``) and
    ``drop_capabilities`` names capabilities its systemd must not have, to make
    a node whose limits cannot be raised. A machine is swept away
    (:func:`sweep_abandoned`) once the process that booted it is gone, unless
    ``kept`` (a lab's, stopped by ``llmgw lab down``). Raises :class:`MachineError`.
    """
    why = unavailable()
    if why is not None:
        raise MachineError(why)
    if not name or not set(name) <= _NAME_OK or len(name) > 48:
        raise MachineError(f"machine name {name!r}: lower-case letters, digits and '-' only")
    root.mkdir(parents=True, exist_ok=True)
    units, env = root / "units", root / "env"
    units.mkdir(exist_ok=True)
    env.mkdir(exist_ok=True)
    for masked in MASKED:
        link = units / masked
        if not link.is_symlink():
            link.symlink_to("/dev/null")
    machine_id = root / "machine-id"
    machine_id.write_text(uuid.uuid4().hex + "\n")
    argv = [NSPAWN, "--quiet", "--boot", "--register=no", "--keep-unit", "--volatile=yes",
            "--directory=/", f"--machine={name}", "--console=pipe",
            f"--bind-ro={machine_id}:/etc/machine-id", f"--bind={units}:/etc/systemd/system",
            f"--bind={env}:/etc/llmgw/env"]
    if not network:
        argv.append("--private-network")
    argv += [f"--bind={path}" for path in binds]
    argv += [f"--bind-ro={path}" for path in read_only]
    argv += [f"--rlimit={limit}" for limit in limits]
    if drop_capabilities:
        argv.append(f"--drop-capability={','.join(drop_capabilities)}")
    owner = KEPT if kept else str(os.getpid())
    cgroups = [top / f"llmgw-machine-{name}-{owner}" for top in cgroup_hierarchies()]
    for cgroup in cgroups:
        if cgroup.exists():  # a machine of this name that was not stopped: stop it now
            _kill_cgroups([cgroup])
            _remove_cgroups([cgroup])
        cgroup.mkdir()
    # nspawn moves itself into nothing here (no systemd on the host to ask): the shell
    # puts itself into the machine's own cgroups, then becomes nspawn.
    enter = "".join(f'echo $$ > "{c}/cgroup.procs" && ' for c in cgroups)
    log = root / "console.log"
    begun = time.monotonic()
    with log.open("ab") as out:
        process = subprocess.Popen(
            ["/bin/sh", "-c", enter + 'exec "$@"', "sh", *argv],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                 "SYSTEMD_LOG_COLOR": "0"},
        )
    machine = Machine(name, root, process, 0, cgroups, log=log)
    try:
        machine.leader = _wait_leader(machine, begun + timeout)
        _wait_running(machine, begun + timeout)
    except BaseException:
        machine.stop()
        raise
    machine.booted_in = time.monotonic() - begun
    return machine


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no console log)"


def _wait_leader(machine: Machine, deadline: float) -> int:
    """The container's PID 1: nspawn's child once it has become systemd."""
    while time.monotonic() < deadline:
        if machine.process.poll() is not None:
            raise MachineError(f"systemd-nspawn exited with {machine.process.returncode}:\n"
                               + _tail(machine.log))
        for child in _children(machine.process.pid):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                    return child
        time.sleep(0.02)
    raise MachineError(f"{machine.name}: systemd did not start:\n" + _tail(machine.log))


def _children(pid: int) -> list[int]:
    found = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _wait_running(machine: Machine, deadline: float) -> None:
    """Until ``systemctl is-system-running`` says the boot is over (running, or degraded)."""
    state = ""
    while time.monotonic() < deadline:
        if machine.process.poll() is not None:
            raise MachineError(f"systemd-nspawn exited with {machine.process.returncode}:\n"
                               + _tail(machine.log))
        done = machine.run(["systemctl", "is-system-running"], check=False,
                           timeout=max(1.0, deadline - time.monotonic()))
        state = done.stdout.strip()
        if state in ("running", "degraded"):
            return
        time.sleep(0.05)
    raise MachineError(f"{machine.name}: systemd did not finish booting (state {state!r}):\n"
                       + _tail(machine.log))


def _kill_cgroups(cgroups: Sequence[Path]) -> None:
    for cgroup in cgroups:
        kill = cgroup / "cgroup.kill"
        if kill.exists():
            with contextlib.suppress(OSError):
                kill.write_text("1")
    for cgroup in cgroups:  # cgroup v1 has no cgroup.kill: signal each process
        for procs in cgroup.rglob("cgroup.procs") if cgroup.exists() else ():
            with contextlib.suppress(OSError, ValueError):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)


def _remove_cgroups(cgroups: Sequence[Path], timeout: float = 5.0) -> None:
    """Remove each cgroup tree, deepest first, once the killed processes are gone."""
    deadline = time.monotonic() + timeout
    for cgroup in cgroups:
        while cgroup.exists():
            for directory in sorted((p for p in cgroup.rglob("*") if p.is_dir()),
                                    key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                cgroup.rmdir()
            if cgroup.exists():
                if time.monotonic() > deadline:
                    raise MachineError(f"{cgroup} is still in use after the machine stopped")
                time.sleep(0.05)


def start_agent(machine: Machine, config: Path, engine_path: Sequence[str] = (),
                timeout: float = BOOT_TIMEOUT) -> None:
    """Run ``llmgw agent serve --config CONFIG`` in the machine as a systemd service, as a
    node's package would, with ``engine_path`` in front of the PATH every unit gets."""
    argv = [sys.executable, "-m", "llmgw", "agent", "serve", "--config", str(config)]
    (machine.units / AGENT_UNIT).write_text(
        "# The llmgw agent of a machine booted by llmgw/onboarding/machines.py.\n"
        "[Unit]\nDescription=llmgw agent\n\n[Service]\n"
        f"ExecStart={quoting.exec_line(argv)}\nWorkingDirectory={config.parent}\n"
        "Restart=on-failure\nRestartSec=1\n")
    if engine_path:
        machine.run(["systemctl", "set-environment",
                     "PATH=" + ":".join([*engine_path, *SERVICE_PATH])], timeout=timeout)
    machine.run(["systemctl", "daemon-reload"], timeout=timeout)
    machine.run(["systemctl", "start", "--", AGENT_UNIT], timeout=timeout)


def remove(name: str) -> None:
    """Kill and remove what is left of a kept machine called ``name`` (``llmgw lab down``)."""
    cgroups = [top / f"llmgw-machine-{name}-{KEPT}" for top in cgroup_hierarchies()]
    found = [c for c in cgroups if c.exists()]
    _kill_cgroups(found)
    _remove_cgroups(found)


def sweep_abandoned() -> list[Path]:
    """Cgroups of machines whose creator is gone (a killed test run): kill and remove them."""
    swept = []
    for top in cgroup_hierarchies():
        for cgroup in top.glob("llmgw-machine-*"):
            owner = cgroup.name.rsplit("-", 1)[-1]
            if owner.isdigit() and Path(f"/proc/{owner}").exists():
                continue
            _kill_cgroups([cgroup])
            with contextlib.suppress(MachineError):
                _remove_cgroups([cgroup])
            swept.append(cgroup)
    return swept
