"""The ``systemd`` backend: unit files, env files, ``systemctl``, ``journalctl``.

Commands are built by pure functions (``*_command``) and run through an
injected runner; ``systemctl show`` output is parsed by :func:`parse_show`.
The parser is tested against recorded output, the backend against a real
systemd (PID 1 of a ``systemd-nspawn`` container, ``tests/agent/``).

One ApplyUnits call becomes, in order: one ``show`` of every unit named;
``stop`` of units being removed; file writes and deletions; one
``daemon-reload`` if any unit file changed; ``start``/``restart``/``stop``
per unit; ``reset-failed`` of removed units. A stop (a restart too) may take
as long as the unit's ``TimeoutStopSec=`` allows, and is waited for that
long. Units are not enabled: after a reboot the daemon converges the node
again, from its own plan. Because nothing references a stopped unit, systemd
forgets it at once (``ExecMainCode=0`` on the next ``show``), so what tells
drift apart is kept on disk as it is seen (:mod:`llmgw.agent.evidence`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.agent import commands, evidence, exitcodes, unitfiles, unitlogs, units
from llmgw.agent.settings import SystemdSettings
from llmgw.agent.unitfiles import Labels, UnitFileError
from llmgw.agent.units import Observation, ProcessState, UnitChange, UnitResult
from llmgw.fleet.types import EngineLimits

SHOW_PROPERTIES = (
    "Id", "LoadState", "ActiveState", "SubState", "Result", "MainPID", "ExecMainCode",
    "ExecMainStatus", "NRestarts", "StateChangeTimestampMonotonic",
    "ExecMainExitTimestampMonotonic", "LimitMEMLOCK", "LimitNOFILE",
)
# Signals a person (systemctl stop, kill) sends; a main process ending by one is no crash.
_STOP_SIGNALS = ("1", "2", "15")
_CLD = {"1": "exited with status", "2": "killed by signal", "3": "dumped core on signal"}
# What a stop may take beyond TimeoutStopSec=: SIGKILL, reaping, systemctl's own work.
STOP_MARGIN = 30.0
_FOREVER = 86400.0  # TimeoutStopSec=infinity: wait a day, not for ever
STOP_TIMEOUT_SECONDS = 90.0  # systemd's DefaultTimeoutStopSec=, for a unit that sets none
# The limits llmgw's unit template asks for (templates/unit.service.j2; a test keeps them
# equal): a probe unit with them shows what an engine gets when none runs to look at.
UNIT_LIMITS = ("LimitMEMLOCK=infinity", "LimitNOFILE=1048576")
PROBE_TTL = 300.0


# ---- commands (pure) ---------------------------------------------------------

def daemon_reload_command(systemctl: str = "systemctl") -> list[str]:
    return [systemctl, "daemon-reload"]


def unit_command(verb: str, name: str, systemctl: str = "systemctl") -> list[str]:
    """``systemctl start|stop|restart|reset-failed -- NAME``."""
    if verb not in ("start", "stop", "restart", "reset-failed"):
        raise ValueError(f"not a unit verb llmgw uses: {verb}")
    return [systemctl, verb, "--", name]


def show_command(names: Sequence[str], systemctl: str = "systemctl") -> list[str]:
    return [systemctl, "show", "--property=" + ",".join(SHOW_PROPERTIES), "--", *names]


def probe_command(systemctl: str = "systemctl") -> list[str]:
    """A transient unit with llmgw's limits that prints the limits it got."""
    run = str(Path(systemctl).with_name("systemd-run")) if "/" in systemctl else "systemd-run"
    limits = [arg for limit in UNIT_LIMITS for arg in ("--property", limit)]
    return [run, "--wait", "--pipe", "--quiet", "--collect", *limits, "--",
            "cat", "/proc/self/limits"]


# ---- parsing (pure) ------------------------------------------------------------

@dataclass(frozen=True)
class Shown:
    """One unit as ``systemctl show`` described it."""

    properties: Mapping[str, str] = field(default_factory=dict)

    def get(self, key: str) -> str:
        return self.properties.get(key, "")

    @property
    def active(self) -> bool:
        return self.get("ActiveState") in ("active", "activating", "reloading")

    def exit(self) -> str:
        """How the main process last ended, in words; systemd's own statuses (203: the
        binary cannot be executed) as what failed (:mod:`llmgw.agent.exitcodes`)."""
        code, status = self.get("ExecMainCode"), self.get("ExecMainStatus")
        if code == "1" and status.isdigit() and (said := exitcodes.describe(int(status))):
            return said
        return f"{_CLD[code]} {status}" if code in _CLD else ""

    def state(self) -> tuple[ProcessState, str]:
        """The process state llmgw uses, and a detail for the operator."""
        active, sub = self.get("ActiveState"), self.get("SubState")
        if self.get("LoadState") == "not-found":
            return "stopped", "systemd does not know this unit"
        if active in ("active", "reloading"):
            return "running", ""
        if active == "activating":
            if sub == "auto-restart":
                # NRestarts counts restarts done; the one pending is the next.
                done = self.get("NRestarts")
                pending = int(done) + 1 if done.isdigit() else 1
                return "activating", f"{self.exit() or 'failed'}; restart {pending} pending"
            return "activating", ""
        if active == "failed":
            return "failed", f"{self.exit() or 'failed'} (result: {self.get('Result')})"
        if active == "deactivating":
            return "stopped", "stopping"
        ended = self.exit()
        return "stopped", "" if ended in ("", "exited with status 0") else ended

    def since(self, now: float, monotonic_now: float) -> float | None:
        """Unix time of the last state change (systemd records it on CLOCK_MONOTONIC, µs)."""
        raw = self.get("StateChangeTimestampMonotonic")
        if not raw.isdigit() or raw == "0":
            return None
        return now - (monotonic_now - int(raw) / 1e6)

    def ended_at(self, now: float, monotonic_now: float) -> float | None:
        """Unix time the main process last ended; None when it has not (this boot)."""
        raw = self.get("ExecMainExitTimestampMonotonic")
        if not raw.isdigit() or raw == "0":
            return None
        return now - (monotonic_now - int(raw) / 1e6)

    def crashed(self) -> bool:
        """Whether the last end was abnormal: a non-zero status, or a signal nobody stops by."""
        code, status = self.get("ExecMainCode"), self.get("ExecMainStatus")
        if code == "1":
            return status not in ("", "0")
        return code in ("2", "3") and status not in _STOP_SIGNALS

    @property
    def pid(self) -> int | None:
        raw = self.get("MainPID")
        return int(raw) if raw.isdigit() and raw != "0" else None


def parse_show(stdout: str) -> dict[str, Shown]:
    """``systemctl show`` of several units: blocks separated by blank lines, keyed by Id."""
    shown: dict[str, Shown] = {}
    for block in stdout.strip().split("\n\n"):
        props = {}
        for line in block.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                props[key] = value
        if props.get("Id"):
            shown[props["Id"]] = Shown(props)
    return shown


def cgroup_unit(cgroup_text: str) -> str | None:
    """The llmgw unit a process belongs to, from its ``/proc/<pid>/cgroup``.

    Works for the unified hierarchy (``0::/system.slice/NAME``) and v1 lines
    (``4:pids:/system.slice/NAME``); processes in sub-cgroups of the unit count.
    """
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        for part in path.split("/"):
            if unitfiles.NAME.match(part):
                return part
    return None


# ---- the backend -----------------------------------------------------------------

@dataclass
class SystemdBackend:
    settings: SystemdSettings = field(default_factory=SystemdSettings)
    run: commands.TimedRunner = field(default=commands.run)
    stream: commands.Streamer = field(default=commands.stream)  # journalctl, bounded
    proc: Path = Path("/proc")
    # Where drift evidence is kept (the agent's state_dir/systemd); default: beside the env files.
    state_dir: Path | None = None
    readonly: bool = False  # observe without writing evidence (`llmgw agent inventory`)
    kind: str = "systemd"
    _pids: dict[str, int] = field(default_factory=dict)  # running units, as last observed
    _probed: tuple[float, EngineLimits | None] | None = None

    @property
    def ledger(self) -> units.Ledger:
        return units.Ledger(self.env_dir)

    @property
    def records(self) -> evidence.Store:
        directory = self.state_dir if self.state_dir is not None else self.env_dir / ".evidence"
        return evidence.Store(directory, readonly=self.readonly)

    @property
    def unit_dir(self) -> Path:
        return Path(self.settings.unit_dir)

    @property
    def env_dir(self) -> Path:
        return Path(self.settings.env_dir)

    def _files(self, name: str) -> tuple[Path, Path, Path]:
        return (self.unit_dir / name, self.env_dir / f"{name}.env",
                self.env_dir / f"{name}.secret.env")

    def _names(self) -> list[str]:
        if not self.unit_dir.is_dir():
            return []
        return sorted(p.name for p in self.unit_dir.iterdir() if unitfiles.NAME.match(p.name))

    async def _show(self, names: Sequence[str]) -> tuple[dict[str, Shown], str]:
        if not names:
            return {}, ""
        done = await self.run(show_command(names, self.settings.systemctl))
        if not done.ok:
            return {}, done.why()
        return parse_show(done.stdout), ""

    async def _do(self, verb: str, name: str, timeout: float = commands.DEFAULT_TIMEOUT) -> str:
        done = await self.run(unit_command(verb, name, self.settings.systemctl), timeout=timeout)
        return "" if done.ok else done.why()

    def _stop_wait(self, change: UnitChange) -> float:
        """How long a stop of this unit may take: its longest ``TimeoutStopSec=``, old or new
        text, plus a margin for the SIGKILL after it."""
        texts = [change.unit_text]
        try:
            texts.append((self.unit_dir / change.name).read_text())
        except (OSError, ValueError):
            pass
        longest = 0.0
        for text in texts:
            if not text:
                continue
            try:
                span = unitfiles.parse(change.name, text).value("Service", "TimeoutStopSec")
                seconds = unitfiles.parse_timespan(span) if span else STOP_TIMEOUT_SECONDS
            except UnitFileError:
                seconds = STOP_TIMEOUT_SECONDS
            longest = max(longest, _FOREVER if seconds is None else seconds)
        return (longest or STOP_TIMEOUT_SECONDS) + STOP_MARGIN

    async def apply(self, changes: Sequence[UnitChange]) -> list[UnitResult]:
        errors: dict[int, str] = {}
        changed: dict[int, bool] = {}
        shown, _ = await self._show([c.name for c in changes])
        waits = [self._stop_wait(c) for c in changes]
        # Removed units stop before their files go, so systemd still knows how.
        for i, change in enumerate(changes):
            if change.action == "remove" and shown.get(change.name, Shown()).active:
                why = await self._do("stop", change.name, waits[i])
                if why:
                    errors[i] = (f"{change.name} did not stop, so its unit and env files are "
                                 f"kept for systemd to finish with (removing it again retries): "
                                 f"{why}")
                changed[i] = True
        reload_needed = False
        rewritten: set[int] = set()
        for i, change in enumerate(changes):
            if i in errors and errors[i]:
                continue
            if change.action == "stop" and not change.unit_text:
                continue  # a hold: stop the unit as it is, files untouched
            try:
                if change.action == "remove":
                    self.ledger.forget(change.name)
                    self.records.forget(change.name)
                    gone = [units.remove(path) for path in self._files(change.name)]
                    reload_needed |= gone[0]
                    changed[i] = changed.get(i, False) or any(gone)
                    continue
                units.check(change)
                secret = units.render_secrets(change.secret_env)
                unit_path, env_path, secret_path = self._files(change.name)
                wrote_unit = units.write(unit_path, change.unit_text)
                wrote_env = units.write(env_path, change.env_text, mode=0o640)
                wrote_secret = units.write(secret_path, secret, mode=0o600)
                self.ledger.record(change.name, change.unit_text)
                reload_needed |= wrote_unit
                if wrote_unit or wrote_env or wrote_secret:
                    rewritten.add(i)
                    changed[i] = True
            except (UnitFileError, units.SecretError, OSError) as exc:
                errors[i] = str(exc)
        if reload_needed:
            done = await self.run(daemon_reload_command(self.settings.systemctl))
            if not done.ok:
                for i in range(len(changes)):
                    errors.setdefault(i, f"daemon-reload failed: {done.why()}")
        boot = evidence.boot_identity(self.proc)
        for i, change in enumerate(changes):
            if errors.get(i):
                continue
            active = shown.get(change.name, Shown()).active
            verb = None
            if change.action == "start":
                verb = "restart" if (active and i in rewritten) else (None if active else "start")
            elif change.action == "stop" and active:
                verb = "stop"
            elif change.action == "remove":
                await self.run(unit_command("reset-failed", change.name, self.settings.systemctl))
            if verb:
                wait = waits[i] if verb in ("stop", "restart") else commands.DEFAULT_TIMEOUT
                errors[i] = await self._do(verb, change.name, wait)
                changed[i] = True
            if change.action != "remove" and not errors.get(i):
                self._wanted(change.name, "running" if change.action == "start" else "stopped",
                             boot)
        return [
            UnitResult(c.name, ok=not errors.get(i), changed=changed.get(i, False),
                       error=errors.get(i, ""))
            for i, c in enumerate(changes)
        ]

    def _wanted(self, name: str, wanted: str, boot: str) -> None:
        """Write down what llmgw asked of a unit, and under which PID 1."""
        record = self.records.load(name)
        record["wanted"] = wanted
        if wanted == "running":
            record["boot"] = boot
        self.records.save(name, record)

    async def observe(self) -> list[Observation]:
        names = self._names()
        shown, why = await self._show(names)
        now, mono = time.time(), time.monotonic()
        boot = evidence.boot_identity(self.proc)
        observations = []
        texts = {}
        for name in names:
            try:
                texts[name] = (self.unit_dir / name).read_text()
            except (OSError, ValueError):
                pass
        if not self.readonly:
            self.ledger.adopt(texts)
        self._pids = {}
        for name in names:
            labels: Labels | None
            try:
                text = (self.unit_dir / name).read_text()
                labels = unitfiles.labels(unitfiles.parse(name, text))
                detail = ""
            except UnicodeDecodeError:
                labels, detail = None, f"{self.unit_dir / name} is not UTF-8"
            except (UnitFileError, OSError) as exc:
                labels, detail = None, str(exc)
            info = shown.get(name)
            if info is None:
                observations.append(Observation(
                    name, labels, "stopped", detail=why or detail or "not shown by systemctl"
                ))
                continue
            state, state_detail = info.state()
            if state == "running" and info.pid is not None:
                self._pids[name] = info.pid
            found = self._evidence(name, info, state, texts.get(name), boot, now, mono)
            if state == "stopped" and found.stopped_by == "operator" and not state_detail:
                state_detail = "stopped outside llmgw"
            observations.append(Observation(
                name, labels, state, info.pid, info.since(now, mono), detail or state_detail,
                found,
            ))
        return observations

    def _evidence(
        self, name: str, info: Shown, state: ProcessState, text: str | None, boot: str,
        now: float, mono: float,
    ) -> units.Evidence:
        record = self.records.load(name)
        before = repr(record)
        ended = info.ended_at(now, mono)
        raw_restarts = info.get("NRestarts")
        restarts = int(raw_restarts) if raw_restarts.isdigit() else None
        if restarts is not None:
            if restarts < record["restarts_seen"]:
                record["restarts_seen"] = restarts  # systemd forgot the unit and counts afresh
            if restarts > record["restarts_seen"]:
                # Restarts whose crash nobody saw (no agent looked in the restart window):
                # each followed a crash; when exactly is lost, so they count as of now.
                record["crashes"] += [now] * (restarts - record["restarts_seen"])
                record["restarts_seen"] = restarts
        raw = info.get("ExecMainExitTimestampMonotonic")
        if ended is not None and raw.isdigit() and int(raw) != record["last_exit_mono"]:
            record["last_exit_mono"] = int(raw)
            record["last_exit"], record["last_exit_at"] = info.exit(), ended
            if info.crashed():
                record["crashes"].append(ended)
                if info.get("SubState") == "auto-restart" and restarts is not None:
                    record["restarts_seen"] = restarts + 1  # the restart it is waiting for
        record["crashes"] = sorted(record["crashes"])[-units.CRASHES_KEPT:]
        if repr(record) != before:
            self.records.save(name, record)
        stopped_by = ""
        if state == "stopped" and info.get("LoadState") != "not-found":
            if record["wanted"] == "stopped":
                stopped_by = "llmgw"
            elif record["wanted"] == "running":
                # Started by llmgw under this PID 1 and stopped since, not by llmgw. Under
                # another PID 1 (a reboot) it has simply not been started again yet.
                stopped_by = "operator" if record["boot"] == boot else ""
            elif ended is not None and info.get("Result") == "success":
                stopped_by = "operator"  # a unit no agent here has started yet
        return units.Evidence(
            restarts=restarts,
            last_exit=info.exit() if ended is not None else "", last_exit_at=ended,
            crashes=tuple(record["crashes"]), stopped_by=stopped_by,
            written=text is not None and self.ledger.vouches(name, text),
        )

    async def logs(self, name: str, query: unitlogs.Query) -> list[str]:
        """From the journal: the unit's latest lines, or the invocation before the latest
        (:func:`llmgw.agent.unitlogs.previous_run`), read bounded, masked."""
        if not (self.unit_dir / name).exists():
            raise KeyError(name)
        argv = unitlogs.journal_command(name, query, self.settings.journalctl)
        split = unitlogs.Lines(unitlogs.JSON_LINE_BYTES_MAX if query.previous
                               else unitlogs.LINE_CHARS_MAX)
        found: list[str] = []
        try:
            async for chunk in self.stream(argv, max_bytes=unitlogs.READ_BYTES_MAX,
                                           timeout=commands.DEFAULT_TIMEOUT):
                found += split.feed(chunk)
        except commands.CommandFailed as exc:
            raise unitlogs.LogError(str(exc)) from None
        found += split.rest()
        if query.previous:
            found = unitlogs.previous_run(found, query.lines) or []
        mask = unitlogs.Masker.of_file(self._files(name)[2])
        return [mask(line) for line in found[-query.lines:]]

    async def follow(self, name: str, query: unitlogs.Query) -> AsyncGenerator[str, None]:
        """``journalctl --follow`` of the unit, masked, until the caller stops."""
        if not (self.unit_dir / name).exists():
            raise KeyError(name)
        mask = unitlogs.Masker.of_file(self._files(name)[2])
        split = unitlogs.Lines()
        argv = unitlogs.journal_command(name, query, self.settings.journalctl, follow=True)
        try:
            async for chunk in self.stream(argv):
                for line in split.feed(chunk):
                    yield mask(line)
        except commands.CommandFailed as exc:
            raise unitlogs.LogError(str(exc)) from None

    def owns(self, pid: int) -> bool:
        name = self.unit_of(pid)
        return name is not None and (self.unit_dir / name).exists()

    def unit_of(self, pid: int) -> str | None:
        """The unit whose cgroup holds ``pid`` (sub-cgroups count), from /proc/<pid>/cgroup."""
        try:
            return cgroup_unit((self.proc / str(pid) / "cgroup").read_text())
        except OSError:
            return None

    async def engine_limits(self) -> EngineLimits | None:
        """The limits running engines have (/proc/<MainPID>/limits), the tightest if several;
        when none runs, those a probe unit with llmgw's Limit*= lines got from systemd.

        A unit's own ``systemctl show`` is no proof: systemd lowers a limit it lacks the
        privilege (CAP_SYS_RESOURCE) to raise to its own hard limit, and says nothing.
        """
        found = [limits for name, pid in sorted(self._pids.items())
                 if (limits := units.process_limits(self.proc, pid, f"{name} (pid {pid})"))]
        if found:
            return units.tightest(found)
        if self.readonly:
            return None
        now = time.monotonic()
        if self._probed is None or now - self._probed[0] > PROBE_TTL:
            done = await self.run(probe_command(self.settings.systemctl))
            probed = None
            if done.ok:
                probed = units.parse_process_limits(
                    done.stdout, "a probe unit with llmgw's Limit*= lines (systemd-run)")
            self._probed = (now, probed)
        return self._probed[1]

    async def tick(self) -> None:
        return None  # systemd restarts units itself

    async def close(self) -> None:
        return None
