"""The ``supervise`` backend: llmgw runs the units itself, without systemd.

For laptops, containers and CI. It runs the same rendered unit systemd
would: ``ExecStart`` expanded with ``Environment=`` and the env files it was
given, in its own session and process group, output appended to a log in
its state directory. Unlike systemd it passes the agent's own environment
on underneath the unit's (``inherit_environment``), which is what a laptop
or CI job expects of PATH, HF_HOME and the like. It mirrors what llmgw's units ask of systemd:

* ``KillMode=control-group``: stop sends SIGTERM to the whole group, then
  SIGKILL after ``TimeoutStopSec`` — forked workers die with the engine; when
  the main process exits on its own, the rest of its group is killed too;
* ``Restart=on-failure`` with ``RestartSec=``: restarts with doubling backoff,
  and after ``restart_limit`` quick failures in a row the unit is Failed —
  unless the unit sets ``StartLimitIntervalSec=0``, as systemd would;
* engines outlive the agent: each pid file holds the process's fingerprint
  (pid, start time, boot, command line), and a restarted agent adopts only a
  process whose fingerprint still matches — a reused pid is never adopted,
  never signalled.

Drift evidence (:class:`llmgw.agent.units.Evidence`) is kept per unit in
its ``evidence`` file — restarts, how and when the engine last ended, recent
crash times, who stopped it — so a hold or a crash history outlives an agent
restart; the unit files this agent wrote are in its ledger (``ledger/``).

State directory layout, per unit: ``units/<name>/{unit,env,secret.env,
wanted,pid,log,evidence}``. A state file that cannot be read back (not UTF-8, not
the format this module writes: a disk error, a hand edit, a crash mid-write
on a filesystem without atomic rename) is moved aside with a warning rather
than taking the agent down: a bad pid or ``wanted`` file is renamed to
``<file>.corrupt-<time>`` and the unit carries on without it (the daemon
re-applies what it wants); a bad unit file moves the whole unit directory
to ``corrupt/<name>-<time>``, since nothing can run without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.agent import processes, unitfiles, unitlogs, units
from llmgw.agent.settings import SuperviseSettings
from llmgw.agent.unitfiles import Labels, UnitFile, UnitFileError
from llmgw.agent.units import Observation, ProcessState, UnitChange, UnitResult
from llmgw.fleet.types import UNSEEN_EXIT, EngineLimits

log = logging.getLogger(__name__)

# What systemd gives a service, when the agent's environment is not inherited.
BASE_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "HOME", "USER", "LOGNAME", "TMPDIR")
WANTED = ("running", "stopped")  # what a unit's ``wanted`` file may say
# Exits systemd counts as clean for Restart=on-failure.
_CLEAN = ("exited with status 0",) + tuple(
    f"killed by {sig}" for sig in ("SIGHUP", "SIGINT", "SIGTERM", "SIGPIPE")
)



@dataclass
class _Run:
    print: processes.Fingerprint
    popen: subprocess.Popen[bytes] | None  # None: adopted after an agent restart
    started_at: float


@dataclass
class _Slot:
    name: str
    directory: Path
    wanted: bool = False
    run: _Run | None = None
    failures: int = 0
    next_start: float = 0.0  # monotonic
    given_up: bool = False
    last_exit: str = ""
    since: float | None = None
    # Drift evidence (units.Evidence): restarts since llmgw last started the unit,
    # when the main process last ended, recent crash times, who stopped it.
    restarts: int = 0
    last_exit_at: float | None = None
    crashes: list[float] = field(default_factory=list)
    stopped_by: str = ""

    @property
    def pid_file(self) -> Path:
        return self.directory / "pid"

    @property
    def log_file(self) -> Path:
        return self.directory / "log"

    @property
    def previous_log_file(self) -> Path:
        """The run before the latest: ``log`` moved aside when the unit starts again."""
        return self.directory / "log.previous"


@dataclass
class Supervisor:
    """The supervise backend over one state directory.

    ``readonly=True`` observes without side effects (``llmgw agent
    inventory`` next to a running agent): no adoption bookkeeping is
    written, nothing is started or signalled.
    """

    state_dir: Path
    settings: SuperviseSettings = field(default_factory=SuperviseSettings)
    readonly: bool = False
    kind: str = "supervise"
    _slots: dict[str, _Slot] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _hurried: bool = False  # stopping at once: SIGKILL, no SIGTERM grace
    _applying: set[asyncio.Future[list[UnitResult]]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.ledger = units.Ledger(self.state_dir / "ledger")
        if not self.readonly:
            self.units_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._load()
        if not self.readonly:
            self.ledger.adopt({name: text for name, slot in self._slots.items()
                               if (text := self._unit_text(slot)) is not None})

    @property
    def units_dir(self) -> Path:
        return self.state_dir / "units"

    # ---- loading and adoption --------------------------------------------

    def _load(self) -> None:
        if not self.units_dir.is_dir():
            return
        for directory in sorted(self.units_dir.iterdir()):
            if not (directory / "unit").exists():
                continue
            slot = _Slot(directory.name, directory)
            try:
                unitfiles.labels(self._unit(slot))
            except UnitFileError as exc:
                self._set_aside_unit(slot, str(exc))
                continue
            except OSError:
                pass  # unreadable now is not corrupt: observe() reports it
            wanted = self._state_file(slot, "wanted", lambda text: text in WANTED)
            self._load_evidence(slot)
            slot.run = self._adopt(slot)
            slot.wanted = wanted == "running" if wanted is not None else slot.run is not None
            if slot.run is not None:
                slot.since = slot.run.started_at
            self._slots[slot.name] = slot

    def _state_file(self, slot: _Slot, name: str, valid: Callable[[str], bool]) -> str | None:
        """A state file's text; None when absent, or when corrupt (then moved aside)."""
        path = slot.directory / name
        try:
            text = path.read_bytes().decode().strip()
        except FileNotFoundError:
            return None
        except UnicodeDecodeError:
            text = None
        except OSError as exc:
            log.warning("%s: cannot read %s: %s", slot.name, path, exc.strerror or exc)
            return None
        if text is not None and (not text or valid(text)):
            return text or None
        if not self.readonly:
            aside = path.with_name(f"{name}.corrupt-{int(time.time())}")
            path.rename(aside)
            log.warning("%s: %s is not a %s file llmgw wrote; moved aside to %s",
                        slot.name, path, name, aside.name)
        return None

    def _load_evidence(self, slot: _Slot) -> None:
        """The drift evidence an earlier agent kept (``evidence``), so a hold or a crash
        history outlives an agent restart."""
        raw = self._state_file(slot, "evidence", _valid_evidence)
        if raw is None:
            return
        data = json.loads(raw)
        slot.restarts, slot.last_exit = int(data["restarts"]), str(data["last_exit"])
        slot.last_exit_at = data["last_exit_at"]
        slot.crashes = [float(t) for t in data["crashes"]][-units.CRASHES_KEPT:]
        slot.stopped_by = str(data["stopped_by"])

    def _save_evidence(self, slot: _Slot) -> None:
        if self.readonly or not slot.directory.exists():
            return
        data = {"restarts": slot.restarts, "last_exit": slot.last_exit,
                "last_exit_at": slot.last_exit_at, "crashes": slot.crashes,
                "stopped_by": slot.stopped_by}
        units.write(slot.directory / "evidence", json.dumps(data) + "\n", mode=0o600)

    def _set_aside_unit(self, slot: _Slot, why: str) -> None:
        """Move a unit whose unit file is unusable out of the way, with a warning."""
        if self.readonly:
            return
        pid = self._state_file(slot, "pid", _valid_pid_file)
        left = f"; its last engine (pid {json.loads(pid)['pid']}) may still run" if pid else ""
        aside = self.state_dir / "corrupt" / f"{slot.name}-{int(time.time())}"
        aside.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        slot.directory.rename(aside)
        log.warning("%s: %s; moved its state aside to %s%s", slot.name, why, aside, left)

    def _adopt(self, slot: _Slot) -> _Run | None:
        raw = self._state_file(slot, "pid", _valid_pid_file)
        if raw is None:
            return None
        data = json.loads(raw)
        recorded = processes.Fingerprint(
            int(data["pid"]), int(data["start_ticks"]), str(data["boot_id"]),
            str(data["cmdline_sha256"]),
        )
        started_at = float(data.get("started_at", time.time()))
        if processes.matches(recorded):
            log.info("%s: adopted running pid %d", slot.name, recorded.pid)
            return _Run(recorded, None, started_at)
        log.warning(
            "%s: pid %d from the pid file is gone or is another process now; not adopted",
            slot.name, recorded.pid,
        )
        slot.last_exit = UNSEEN_EXIT
        if not self.readonly:
            slot.pid_file.unlink(missing_ok=True)
        return None

    # ---- the Backend interface ---------------------------------------------

    async def apply(self, changes: Sequence[UnitChange]) -> list[UnitResult]:
        """Carry the changes out. Once begun they finish even if the caller leaves (its gRPC
        call cancelled): a removal cut short in its stop would drop a unit whose engine was
        signalled but never reaped."""
        task = asyncio.ensure_future(self._apply(changes))
        self._applying.add(task)
        task.add_done_callback(self._applying.discard)
        return await asyncio.shield(task)

    async def _apply(self, changes: Sequence[UnitChange]) -> list[UnitResult]:
        results = []
        async with self._lock:
            for change in changes:
                try:
                    results.append(await self._apply_one(change))
                except (UnitFileError, units.SecretError, OSError) as exc:
                    results.append(UnitResult(change.name, ok=False, error=str(exc)))
        return results

    async def _apply_one(self, change: UnitChange) -> UnitResult:
        if change.action == "remove":
            slot = self._slots.pop(change.name, None)
            self.ledger.forget(change.name)
            if slot is None:
                return UnitResult(change.name, ok=True)
            await self._stop(slot)
            shutil.rmtree(slot.directory, ignore_errors=True)
            return UnitResult(change.name, ok=True, changed=True)
        if change.action == "stop" and not change.unit_text:
            # A hold: stop the unit as it is; its files stay for a later start.
            held = self._slots.get(change.name)
            if held is None:
                return UnitResult(change.name, ok=True)
            units.write(held.directory / "wanted", "stopped")
            return UnitResult(change.name, ok=True, changed=await self._stop(held))
        unit, _ = units.check(change)
        secret_text = units.render_secrets(change.secret_env)
        slot = self._slots.get(change.name)
        if slot is None:
            slot = _Slot(change.name, self.units_dir / change.name)
            self._slots[change.name] = slot
        slot.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        written = [
            units.write(slot.directory / "unit", change.unit_text),
            units.write(slot.directory / "env", change.env_text),
            units.write(slot.directory / "secret.env", secret_text, mode=0o600),
        ]
        changed = any(written)
        self.ledger.record(change.name, change.unit_text)
        if change.action == "stop":
            units.write(slot.directory / "wanted", "stopped")
            stopped = await self._stop(slot)
            return UnitResult(change.name, ok=True, changed=changed or stopped)
        restarted = False
        if slot.run is not None and changed:
            await self._stop(slot)  # new text or env takes effect by restarting
            restarted = True
        units.write(slot.directory / "wanted", "running")
        if slot.run is None:
            slot.wanted, slot.failures, slot.given_up, slot.next_start = True, 0, False, 0.0
            slot.restarts = 0
            self._start(slot, unit)
            return UnitResult(change.name, ok=True, changed=True)
        slot.wanted = True
        return UnitResult(change.name, ok=True, changed=changed or restarted)

    async def observe(self) -> list[Observation]:
        observations = []
        for slot in sorted(self._slots.values(), key=lambda s: s.name):
            if not self._lock.locked():  # an apply in progress settles its own units
                self._reap(slot)
            try:
                labels: Labels | None = unitfiles.labels(self._unit(slot))
                detail = ""
            except (UnitFileError, OSError) as exc:
                labels, detail = None, str(exc)
            pid = slot.run.print.pid if slot.run else None
            state: ProcessState
            if slot.run is not None:
                state = "running"
            elif slot.given_up:
                state, detail = "failed", slot.last_exit
            elif slot.wanted:
                wait = max(0.0, slot.next_start - time.monotonic())
                state = "activating"
                detail = f"{slot.last_exit}; restarting in {wait:.1f}s" if slot.last_exit else ""
            else:
                state, detail = "stopped", slot.last_exit or detail
            text = self._unit_text(slot)
            evidence = units.Evidence(
                restarts=slot.restarts, last_exit=slot.last_exit, last_exit_at=slot.last_exit_at,
                crashes=tuple(slot.crashes), stopped_by=slot.stopped_by if state == "stopped"
                else "", written=text is not None and self.ledger.vouches(slot.name, text),
            )
            observations.append(Observation(slot.name, labels, state, pid, slot.since, detail,
                                            evidence))
        return observations

    async def logs(self, name: str, query: unitlogs.Query) -> list[str]:
        slot = self._slots.get(name)
        if slot is None:
            raise KeyError(name)
        mask = unitlogs.Masker.of_file(slot.directory / "secret.env")
        return [mask(line) for line in await asyncio.to_thread(_read_log, slot, query)]

    async def follow(self, name: str, query: unitlogs.Query) -> AsyncGenerator[str, None]:
        slot = self._slots.get(name)
        if slot is None:
            raise KeyError(name)
        mask = unitlogs.Masker.of_file(slot.directory / "secret.env")
        handle = unitlogs.open_end(slot.log_file)  # before the latest lines: none missed
        following = unitlogs.follow_file(slot.log_file, handle)
        try:
            for line in await asyncio.to_thread(_read_log, slot, query):
                yield mask(line)
            async for line in following:
                yield mask(line)
        finally:
            await following.aclose()
            if handle is not None:
                handle.close()  # when the follow never began

    def owns(self, pid: int) -> bool:
        return self.unit_of(pid) is not None

    def unit_of(self, pid: int) -> str | None:
        info = processes.stat(pid)
        if info is None or not info.alive:
            return None
        # Each unit runs in a process group of its own, led by its main process.
        return next((s.name for s in self._slots.values()
                     if s.run is not None and s.run.print.pid == info.pgrp), None)

    async def engine_limits(self) -> EngineLimits | None:
        """None: this backend applies no ``Limit*=``, so engines get the agent's own limits,
        which the agent reports (:meth:`llmgw.agent.reports.Collector.own_limits`)."""
        return None

    async def tick(self) -> None:
        if self.readonly or self._lock.locked() or self._hurried:
            return  # an apply in progress (a slow stop, say) must not stall reports
        async with self._lock:
            for slot in list(self._slots.values()):
                self._reap(slot)
                self._trim_log(slot)
                if slot.run is not None and slot.since is not None:
                    if slot.failures and time.time() - slot.since >= self.settings.stable_after:
                        slot.failures = 0  # up long enough: earlier failures are forgiven
                if slot.wanted and slot.run is None and not slot.given_up:
                    if time.monotonic() >= slot.next_start:
                        try:
                            self._start(slot, self._unit(slot))
                        except (UnitFileError, OSError) as exc:
                            slot.given_up, slot.last_exit = True, str(exc)

    async def close(self) -> None:
        if self.settings.stop_on_exit and not self.readonly:
            async with self._lock:
                for slot in self._slots.values():
                    await self._stop(slot, persist=False)

    def running(self) -> list[str]:
        """The units whose engine runs now (started or adopted), by name."""
        return sorted(name for name, slot in self._slots.items() if slot.run is not None)

    def hurry(self) -> None:
        """Stop at once (a second signal): SIGKILL every engine's group now, and any
        stop still to come skips the SIGTERM grace. Safe to call from a signal handler:
        it waits for nothing, not even the lock a slow stop holds."""
        if self.readonly:
            return
        self._hurried = True
        for slot in self._slots.values():
            if slot.run is not None:
                processes.signal_group(slot.run.print.pid, signal.SIGKILL)

    # ---- processes ----------------------------------------------------------

    def _unit_text(self, slot: _Slot) -> str | None:
        try:
            return (slot.directory / "unit").read_text()
        except (OSError, ValueError):
            return None

    def _unit(self, slot: _Slot) -> UnitFile:
        raw = (slot.directory / "unit").read_bytes()
        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            raise UnitFileError(f"{slot.name}: the unit file is not UTF-8 "
                                f"(byte {exc.start})") from None
        return unitfiles.parse(slot.name, text)

    def _environment(self, slot: _Slot, unit: UnitFile) -> dict[str, str]:
        if self.settings.inherit_environment:
            env = dict(os.environ)
        else:
            env = {k: os.environ[k] for k in BASE_ENV if k in os.environ}
        env.update(unitfiles.environment(unit))
        given = {
            f"{slot.name}.env": slot.directory / "env",
            f"{slot.name}.secret.env": slot.directory / "secret.env",
        }
        for path, optional in unitfiles.environment_files(unit):
            # The env files the daemon sent are kept here, whatever directory
            # the unit names; any other file is read where the unit says.
            source = given.get(Path(path).name, Path(path))
            try:
                env.update(unitfiles.parse_env_file(source.read_text()))
            except OSError as exc:
                if not optional:
                    raise OSError(f"{slot.name}: EnvironmentFile={path}: {exc.strerror}") from None
        return env

    def _start(self, slot: _Slot, unit: UnitFile) -> None:
        env = self._environment(slot, unit)
        exec_start = unit.value("Service", "ExecStart") or ""
        argv = unitfiles.expand(exec_start, env, slot.name)
        if not argv:
            raise UnitFileError(f"{slot.name}: ExecStart= is empty")
        workdir = unit.value("Service", "WorkingDirectory")
        # The run before this one stays readable (`llmgw logs --previous`), bounded.
        unitlogs.rotate(slot.log_file, slot.previous_log_file, self.settings.log_max_bytes)
        with slot.log_file.open("ab") as output:
            output.write(f"-- llmgw: starting {' '.join(argv)}\n".encode())
            output.flush()
            try:
                popen = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                    env=env, cwd=workdir.lstrip("-") if workdir else None,
                    start_new_session=True, close_fds=True,
                )
            except OSError as exc:
                slot.given_up = True
                slot.last_exit = f"cannot execute {argv[0]}: {exc.strerror or exc}"
                output.write(f"-- llmgw: {slot.last_exit}\n".encode())
                raise OSError(f"{slot.name}: {slot.last_exit}") from None
        now = time.time()
        print_ = processes.fingerprint(popen.pid) or processes.Fingerprint(popen.pid, 0, "", "")
        slot.run, slot.since, slot.wanted = _Run(print_, popen, now), now, True
        slot.stopped_by = ""
        self._save_evidence(slot)
        self._write_pid(slot)
        log.info("%s: started pid %d", slot.name, popen.pid)

    def _write_pid(self, slot: _Slot) -> None:
        assert slot.run is not None
        data = slot.run.print.to_dict() | {"started_at": slot.run.started_at}
        units.write(slot.pid_file, json.dumps(data) + "\n", mode=0o600)

    def _alive(self, run: _Run) -> tuple[bool, str]:
        """Whether the run's process lives, and how it ended when it does not."""
        if run.popen is not None:
            code = run.popen.poll()
            if code is None:
                return True, ""
            if code < 0:
                return False, f"killed by {signal.Signals(-code).name}"
            return False, f"exited with status {code}"
        current = processes.fingerprint(run.print.pid)
        if current is not None and current.start_ticks == run.print.start_ticks:
            return True, ""
        return False, UNSEEN_EXIT

    def _reap(self, slot: _Slot) -> None:
        """Notice a main process that ended; kill what is left of its group; plan a restart."""
        if slot.run is None:
            return
        alive, how = self._alive(slot.run)
        if alive:
            current = processes.fingerprint(slot.run.print.pid)
            # An engine may retitle itself after start; keep the fingerprint current.
            if current and current != slot.run.print and not self.readonly:
                slot.run.print = current
                self._write_pid(slot)
            return
        if self.readonly:
            slot.run, slot.last_exit = None, how
            return
        pgid = slot.run.print.pid
        if processes.group_members(pgid):
            processes.signal_group(pgid, signal.SIGKILL)
        ran_for = time.time() - slot.run.started_at
        slot.run, slot.since, slot.last_exit = None, time.time(), how
        slot.last_exit_at = slot.since
        if how in _CLEAN:
            # A server does not end cleanly on its own: a signal llmgw did not send (engines
            # catch SIGTERM and exit 0) means someone stopped it.
            slot.stopped_by = "operator"
        elif how not in _CLEAN and how != UNSEEN_EXIT:
            slot.crashes = [*slot.crashes, slot.since][-units.CRASHES_KEPT:]
        slot.pid_file.unlink(missing_ok=True)
        with slot.log_file.open("ab") as output:
            output.write(f"-- llmgw: main process {how}\n".encode())
        self._reap_settled(slot, how, ran_for)
        self._save_evidence(slot)

    def _reap_settled(self, slot: _Slot, how: str, ran_for: float) -> None:
        """Plan a restart, give up, or end the unit, after its main process ended."""
        if not slot.wanted:
            return
        try:
            unit = self._unit(slot)
        except (UnitFileError, OSError) as exc:
            slot.given_up, slot.last_exit = True, f"{how}; not restarted: {exc}"
            return
        policy = unit.value("Service", "Restart") or "no"
        clean = how in _CLEAN
        if policy == "always" or (policy == "on-failure" and not clean):
            if ran_for >= self.settings.stable_after:
                slot.failures = 0
            slot.failures += 1
            # StartLimitIntervalSec=0 turns systemd's start limit off: retry for ever.
            unlimited = unit.value("Unit", "StartLimitIntervalSec") in ("0", "infinity")
            if not unlimited and slot.failures > self.settings.restart_limit:
                slot.given_up = True
                slot.last_exit = f"{how}; gave up after {slot.failures - 1} restarts"
                return
            slot.restarts += 1
            base = unitfiles.parse_timespan(unit.value("Service", "RestartSec") or "0") or 0.0
            delay = max(base, self.settings.restart_backoff) * 2 ** (slot.failures - 1)
            slot.next_start = time.monotonic() + min(delay, self.settings.restart_backoff_max)
        elif clean:
            slot.wanted = False  # a clean exit under on-failure ends the unit, as in systemd
            # and it stays ended across an agent restart, as a `systemctl stop` would.
            units.write(slot.directory / "wanted", "stopped")
        else:
            slot.given_up = True

    async def _stop(self, slot: _Slot, persist: bool = True) -> bool:
        """SIGTERM the group, SIGKILL after the stop timeout; True when something was stopped."""
        slot.wanted = slot.wanted and not persist
        if persist and slot.directory.exists():
            units.write(slot.directory / "wanted", "stopped")
        if persist:
            slot.stopped_by = "llmgw"  # also when it was waiting for a restart (a hold)
            self._save_evidence(slot)
        run = slot.run
        if run is None:
            return False
        pgid = run.print.pid
        timeout = self.settings.stop_timeout
        try:
            span = self._unit(slot).value("Service", "TimeoutStopSec")
            if span:
                timeout = unitfiles.parse_timespan(span) or timeout
        except (UnitFileError, OSError):
            pass
        processes.signal_group(pgid, signal.SIGKILL if self._hurried else signal.SIGTERM)
        if not await self._wait_group(run, pgid, timeout):
            log.warning("%s: alive %.1fs after SIGTERM; sending SIGKILL", slot.name, timeout)
            processes.signal_group(pgid, signal.SIGKILL)
            await self._wait_group(run, pgid, 10.0)
        _, how = self._alive(run)
        slot.run, slot.since, slot.last_exit = None, time.time(), f"stopped ({how})"
        slot.last_exit_at = slot.since
        slot.given_up, slot.failures = False, 0
        slot.pid_file.unlink(missing_ok=True)
        self._save_evidence(slot)
        return True

    async def _wait_group(self, run: _Run, pgid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if run.popen is not None:
                run.popen.poll()  # reap the main process so it stops counting
            # A zombie is no member, but a zombie leader whose other threads still exit
            # cannot be reaped yet (waitpid says "running"): wait for our child too, or
            # its Popen is dropped unreaped and the agent keeps a zombie.
            reaped = run.popen is None or run.popen.poll() is not None
            if not processes.group_members(pgid) and reaped:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)

    def _trim_log(self, slot: _Slot) -> None:
        """Keep the log bounded: cut it to its last half when it outgrows the limit.
        The engine appends (O_APPEND), so its next write lands after what is kept."""
        with contextlib.suppress(FileNotFoundError):
            if slot.log_file.stat().st_size > self.settings.log_max_bytes:
                unitlogs.cut_file(slot.log_file, self.settings.log_max_bytes // 2)


def _read_log(slot: _Slot, query: unitlogs.Query) -> list[str]:
    return unitlogs.read_runs(slot.log_file, slot.previous_log_file, query)


def _valid_pid_file(text: str) -> bool:
    """Whether ``text`` is a pid file as :meth:`Supervisor._write_pid` writes it."""
    try:
        data = json.loads(text)
        int(data["pid"]), int(data["start_ticks"]), float(data.get("started_at", 0))
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(data.get("boot_id"), str) and isinstance(data.get("cmdline_sha256"), str)


def _valid_evidence(text: str) -> bool:
    """Whether ``text`` is an evidence file as :meth:`Supervisor._save_evidence` writes it."""
    try:
        data = json.loads(text)
        int(data["restarts"]), [float(t) for t in data["crashes"]]
        at = data["last_exit_at"]
        float(at) if at is not None else None
    except (ValueError, KeyError, TypeError):
        return False
    return (isinstance(data.get("last_exit"), str)
            and data.get("stopped_by") in ("", "llmgw", "operator"))
