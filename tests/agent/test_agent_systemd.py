"""The systemd backend: command construction, and parsing recorded systemctl output.

systemd is not PID 1 here, so a recording runner stands in for systemctl:
it answers ``show`` with recorded output and records every argv.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from agent_support import unit_name, unit_text

from llmgw.agent import evidence, systemd, unitlogs
from llmgw.agent.commands import Completed
from llmgw.agent.settings import SystemdSettings
from llmgw.agent.unitlogs import Query
from llmgw.agent.units import UnitChange

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "systemctl"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


class Systemctl:
    """Answers like systemctl would, from recorded output; records what was run."""

    def __init__(self, show: str = "", fail: Sequence[str] = ()) -> None:
        self.show = show
        self.fail = set(fail)
        self.calls: list[list[str]] = []

    async def __call__(self, argv: Sequence[str], timeout: float = 30.0) -> Completed:
        self.calls.append(list(argv))
        verb = argv[1] if argv[0].endswith("systemctl") else "journal"
        if verb in self.fail:
            return Completed(tuple(argv), 1, "", f"Failed to {verb} unit: Access denied")
        if verb == "show":
            return Completed(tuple(argv), 0, self.show)
        if verb == "journal":
            return Completed(tuple(argv), 0, recorded("journalctl-cat.txt"))
        return Completed(tuple(argv), 0)

    def verbs(self) -> list[str]:
        return [" ".join(c[1:2] + c[-1:]) for c in self.calls if c[1] != "show"]


@pytest.fixture
def settings(tmp_path: Path) -> SystemdSettings:
    return SystemdSettings(unit_dir=str(tmp_path / "system"), env_dir=str(tmp_path / "env"))


def test_commands() -> None:
    assert systemd.daemon_reload_command() == ["systemctl", "daemon-reload"]
    assert systemd.unit_command("start", "u.service", "/bin/systemctl") == [
        "/bin/systemctl", "start", "--", "u.service"
    ]
    assert systemd.show_command(["a.service", "b.service"]) == [
        "systemctl", "show",
        "--property=Id,LoadState,ActiveState,SubState,Result,MainPID,ExecMainCode,"
        "ExecMainStatus,NRestarts,StateChangeTimestampMonotonic,ExecMainExitTimestampMonotonic,"
        "LimitMEMLOCK,LimitNOFILE",
        "--", "a.service", "b.service",
    ]
    with pytest.raises(ValueError):
        systemd.unit_command("enable", "u.service")


@pytest.mark.parametrize(
    ("unit", "state", "pid", "detail"),
    [
        ("llmgw-llama-3.1-8b-r0-s0.service", "running", 48213, ""),
        ("llmgw-qwen-coder-r0-s0.service", "activating", None,
         "exited with status 1; restart 3 pending"),  # NRestarts=2 were done
        ("llmgw-mixtral-r1-s0.service", "failed", None,
         "killed by signal 9 (result: signal)"),
        ("llmgw-gemma-r0-s0.service", "stopped", None, ""),
        ("llmgw-gone-r0-s0.service", "stopped", None, "systemd does not know this unit"),
    ],
)
def test_parse_show_on_recorded_output(
    unit: str, state: str, pid: int | None, detail: str
) -> None:
    shown = systemd.parse_show(recorded("show-mixed.txt"))[unit]
    assert shown.state() == (state, detail)
    assert shown.pid == pid


def test_since_comes_from_the_monotonic_timestamp() -> None:
    shown = systemd.parse_show(recorded("show-mixed.txt"))["llmgw-llama-3.1-8b-r0-s0.service"]
    # The state changed at monotonic 8126.547213 s; now is monotonic 8200 s.
    assert shown.since(now=1_700_000_000.0, monotonic_now=8200.0) == pytest.approx(
        1_700_000_000.0 - (8200.0 - 8126.547213)
    )
    gone = systemd.parse_show(recorded("show-mixed.txt"))["llmgw-gone-r0-s0.service"]
    assert gone.since(1.0, 1.0) is None


@pytest.mark.parametrize(
    ("fixture", "unit"),
    [
        ("cgroup-v2.txt", "llmgw-llama-3.1-8b-r0-s0.service"),
        ("cgroup-v1.txt", "llmgw-llama-3.1-8b-r0-s0.service"),
        ("cgroup-user-session.txt", None),
    ],
)
def test_cgroup_names_the_unit(fixture: str, unit: str | None) -> None:
    assert systemd.cgroup_unit(recorded(fixture)) == unit


async def test_first_start_writes_files_reloads_and_starts(
    settings: SystemdSettings, tmp_path: Path
) -> None:
    secret = tmp_path / "token"
    secret.write_text("hf_abc\n")
    ctl = Systemctl(show=recorded("show-one-inactive.txt"))
    backend = systemd.SystemdBackend(settings, ctl)
    change = UnitChange(unit_name(), unit_text(port=18000), "A=1\n", {"HF_TOKEN": str(secret)})
    [result] = await backend.apply([change])
    assert result.ok and result.changed, result.error
    assert ctl.verbs() == ["daemon-reload daemon-reload", f"start {unit_name()}"]
    assert (Path(settings.unit_dir) / unit_name()).read_text() == change.unit_text
    assert (Path(settings.env_dir) / f"{unit_name()}.env").read_text() == "A=1\n"
    secret_file = Path(settings.env_dir) / f"{unit_name()}.secret.env"
    assert secret_file.read_text() == "HF_TOKEN='hf_abc'\n"
    assert secret_file.stat().st_mode & 0o777 == 0o600


async def test_same_start_on_a_running_unit_runs_nothing(settings: SystemdSettings) -> None:
    change = UnitChange(unit_name(), unit_text(port=18000))
    await systemd.SystemdBackend(settings, Systemctl(recorded("show-one-inactive.txt"))).apply(
        [change]
    )
    ctl = Systemctl(show=recorded("show-one-running.txt"))
    [result] = await systemd.SystemdBackend(settings, ctl).apply([change])
    assert result.ok and not result.changed
    assert ctl.verbs() == []


async def test_changed_text_on_a_running_unit_restarts_it(settings: SystemdSettings) -> None:
    backend = systemd.SystemdBackend(settings, Systemctl(recorded("show-one-inactive.txt")))
    await backend.apply([UnitChange(unit_name(), unit_text(port=18000, digest="a"))])
    ctl = Systemctl(show=recorded("show-one-running.txt"))
    backend.run = ctl
    [result] = await backend.apply([UnitChange(unit_name(), unit_text(port=18000, digest="b"))])
    assert result.ok and result.changed
    assert ctl.verbs() == ["daemon-reload daemon-reload", f"restart {unit_name()}"]


async def test_remove_stops_first_then_deletes_and_reloads(settings: SystemdSettings) -> None:
    backend = systemd.SystemdBackend(settings, Systemctl(recorded("show-one-inactive.txt")))
    await backend.apply([UnitChange(unit_name(), unit_text(port=18000))])
    ctl = Systemctl(show=recorded("show-one-running.txt"))
    backend.run = ctl
    [result] = await backend.apply([UnitChange(unit_name(), "", action="remove")])
    assert result.ok and result.changed
    assert ctl.verbs() == [
        f"stop {unit_name()}", "daemon-reload daemon-reload", f"reset-failed {unit_name()}"
    ]
    assert list(Path(settings.unit_dir).iterdir()) == []
    assert [p for p in Path(settings.env_dir).iterdir() if p.is_file()] == []


async def test_a_failing_systemctl_fails_that_unit_with_its_message(
    settings: SystemdSettings,
) -> None:
    ctl = Systemctl(show=recorded("show-one-inactive.txt"), fail=["start"])
    [result] = await systemd.SystemdBackend(settings, ctl).apply(
        [UnitChange(unit_name(), unit_text(port=18000))]
    )
    assert not result.ok and "Access denied" in result.error


async def test_observe_lists_unit_files_with_systemd_states(settings: SystemdSettings) -> None:
    unit_dir = Path(settings.unit_dir)
    unit_dir.mkdir(parents=True)
    for model in ("llama-3.1-8b", "mixtral"):
        replica = 1 if model == "mixtral" else 0
        (unit_dir / unit_name(model, replica)).write_text(unit_text(model, replica, port=18000))
    (unit_dir / "sshd.service").write_text("[Service]\nExecStart=/usr/sbin/sshd\n")
    ctl = Systemctl(show=recorded("show-mixed.txt"))
    observations = await systemd.SystemdBackend(settings, ctl).observe()
    assert [(o.name, o.process, o.pid) for o in observations] == [
        ("llmgw-llama-3.1-8b-r0-s0.service", "running", 48213),
        ("llmgw-mixtral-r1-s0.service", "failed", None),
    ]
    assert observations[0].labels is not None and observations[0].labels.port == 18000
    assert ctl.calls[0][-2:] == ["llmgw-llama-3.1-8b-r0-s0.service", "llmgw-mixtral-r1-s0.service"]


async def test_logs_come_from_the_journal(settings: SystemdSettings) -> None:
    Path(settings.unit_dir).mkdir(parents=True)
    (Path(settings.unit_dir) / unit_name()).write_text(unit_text())
    Path(settings.env_dir).mkdir(parents=True)
    (Path(settings.env_dir) / f"{unit_name()}.secret.env").write_text("HF_TOKEN=opensesame-4242\n")
    calls: list[tuple[list[str], int | None]] = []

    async def journal(argv: Sequence[str], *, max_bytes: int | None = None,
                      timeout: float | None = None) -> AsyncIterator[bytes]:
        calls.append((list(argv), max_bytes))
        yield (recorded("journalctl-cat.txt") + "said opensesame-4242\n").encode()

    backend = systemd.SystemdBackend(settings, Systemctl(), stream=journal)
    lines = await backend.logs(unit_name(), Query(3))
    assert lines[-2].startswith("ERROR") and len(lines) == 3
    assert lines[-1] == "said [redacted]"  # the unit's secret value, masked
    assert calls == [(unitlogs.journal_command(unit_name(), Query(3)), unitlogs.READ_BYTES_MAX)]
    with pytest.raises(KeyError):
        await backend.logs("llmgw-x-r0-s0.service", Query(2))


def test_owns_processes_in_its_units_cgroups(settings: SystemdSettings, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "100").mkdir(parents=True)
    (proc / "100" / "cgroup").write_text(recorded("cgroup-v2.txt"))
    (proc / "200").mkdir()
    (proc / "200" / "cgroup").write_text(recorded("cgroup-user-session.txt"))
    Path(settings.unit_dir).mkdir(parents=True)
    (Path(settings.unit_dir) / "llmgw-llama-3.1-8b-r0-s0.service").write_text(unit_text())
    backend = systemd.SystemdBackend(settings, Systemctl(), proc=proc)
    assert backend.owns(100) and not backend.owns(200) and not backend.owns(300)
    # What readiness asks of a port's holder: which unit's cgroup it is in.
    assert backend.unit_of(100) == "llmgw-llama-3.1-8b-r0-s0.service"
    assert backend.unit_of(200) is None and backend.unit_of(300) is None


async def test_observe_reports_drift_evidence(settings: SystemdSettings) -> None:
    """A crash (SIGKILL), a `systemctl stop` by someone else, a unit that has not run since
    boot; and after llmgw's own stop, llmgw is named. The ledger vouches only for units
    llmgw wrote (the first agent adopts those already there)."""
    unit_dir = Path(settings.unit_dir)
    unit_dir.mkdir(parents=True)
    for model in ("crashy", "halted", "rebooted"):
        (unit_dir / unit_name(model)).write_text(unit_text(model))
    backend = systemd.SystemdBackend(settings, Systemctl(show=recorded("show-drift.txt")))
    found = {o.name: o.evidence for o in await backend.observe()}
    crashy, halted, rebooted = (found[unit_name(m)] for m in ("crashy", "halted", "rebooted"))
    assert crashy is not None and halted is not None and rebooted is not None
    # NRestarts=3: three restarts, each after a crash no agent saw, and the crash now seen.
    assert (crashy.restarts, crashy.last_exit, len(crashy.crashes)) == (
        3, "killed by signal 9", 4)
    assert crashy.last_exit_at in crashy.crashes
    assert (halted.stopped_by, halted.last_exit, halted.crashes) == (
        "operator", "killed by signal 15", ())
    assert (rebooted.stopped_by, rebooted.last_exit, rebooted.last_exit_at) == ("", "", None)
    assert all(e.written for e in (crashy, halted, rebooted))

    await backend.apply([UnitChange(unit_name("halted"), "", action="stop")])
    (unit_dir / unit_name("rebooted")).write_text(unit_text("rebooted") + "# edited\n")
    found = {o.name: o.evidence for o in await backend.observe()}
    assert found[unit_name("halted")].stopped_by == "llmgw"  # type: ignore[union-attr]
    assert found[unit_name("rebooted")].written is False  # type: ignore[union-attr]
    assert len(found[unit_name("crashy")].crashes) == 4  # type: ignore[union-attr]


def test_the_limits_probe_asks_for_what_the_unit_template_sets() -> None:
    template = Path(systemd.__file__).parents[1] / "templates" / "unit.service.j2"
    lines = template.read_text().splitlines()
    assert [limit for limit in systemd.UNIT_LIMITS if limit not in lines] == []
    assert systemd.probe_command("/usr/bin/systemctl")[:2] == ["/usr/bin/systemd-run", "--wait"]


@pytest.mark.parametrize("garbage", [b"\xff\xfe", b"not json", b'{"wanted": "maybe"}', b"[]"])
def test_an_evidence_file_llmgw_did_not_write_is_moved_aside(
    tmp_path: Path, garbage: bytes
) -> None:
    store = evidence.Store(tmp_path)
    (tmp_path / "u.service.json").write_bytes(garbage)
    assert store.load("u.service") == evidence.fresh()
    assert [p.name.split("-")[0] for p in tmp_path.iterdir()] == ["u.service.json.corrupt"]
    record = evidence.fresh() | {"wanted": "stopped", "crashes": [1.0, 2.0]}
    store.save("u.service", record)  # type: ignore[arg-type]
    assert store.load("u.service") == record


@pytest.mark.parametrize(("status", "said"), [
    ("203", "the engine's binary cannot be executed (status 203/EXEC)"),
    ("217", "the unit's user does not exist or cannot be set (status 217/USER)"),
    ("3", "exited with status 3"),
    ("223", "exited with status 223"),  # not one systemd uses
])
def test_systemds_own_exit_statuses_are_sentences(status: str, said: str) -> None:
    shown = systemd.Shown({"ExecMainCode": "1", "ExecMainStatus": status})
    assert shown.exit() == said
