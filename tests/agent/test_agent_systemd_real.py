"""The systemd backend against a real systemd: PID 1 of a throwaway container.

Each test boots systemd 252 in ``systemd-nspawn`` (the ``systemd_machine``
fixture), and drives it through the backend exactly as an agent does: unit
files written into the machine's /etc/systemd/system, the real ``systemctl``
and ``journalctl`` run inside it, the test engine as the unit's process.
What systemd really reports is what these tests see, including what no
recording shows: that it forgets a unit the moment it stops.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from agent_support import eventually, unit_name, unit_text
from support.machines import MachineFactory, backend

from llmgw import __version__
from llmgw.agent import monitors, units
from llmgw.agent.settings import ReadinessSettings
from llmgw.agent.systemd import SystemdBackend
from llmgw.agent.unitlogs import Query
from llmgw.agent.units import Observation, UnitChange
from llmgw.fleet.types import HostFacts, NodeReport
from llmgw.onboarding import doctors
from llmgw.onboarding.machines import Machine
from llmgw.planning import drifts
from llmgw.spec.models import Node

CRASHING = "--exit-after 0.1 --exit-code 3"


async def observed(b: SystemdBackend, name: str = unit_name()) -> Observation:
    [found] = [o for o in await b.observe() if o.name == name]
    return found


async def until(b: SystemdBackend, process: str, name: str = unit_name()) -> Observation:
    async def check() -> Observation | None:
        found = await observed(b, name)
        return found if found.process == process else None

    return await eventually(check, timeout=30, what=f"{name} {process}")


def shown(machine: Machine, prop: str, name: str = unit_name()) -> str:
    return machine.run(["systemctl", "show", f"--property={prop}", "--value", "--",
                        name]).stdout.strip()


async def finding(b: SystemdBackend) -> drifts.Finding | None:
    """The drift class the planner gives what the agent reports of the unit."""
    [unit] = await monitors.Monitor(b, ReadinessSettings()).refresh()
    return drifts.unit_finding("node", unit, None, time.time())


async def test_a_unit_runs_as_a_real_service(systemd_machine: MachineFactory) -> None:
    machine = systemd_machine(network=False)
    b = backend(machine)
    [result] = await b.apply([UnitChange(unit_name(), unit_text())])
    assert result.ok, result.error
    running = await until(b, "running")
    assert running.pid is not None and b.owns(running.pid)
    assert shown(machine, "MainPID") == str(running.pid)  # the container's own pid
    assert (running.evidence and running.evidence.written) is True
    async def logged() -> list[str]:  # from the machine's journal
        lines = await b.logs(unit_name(), Query(20))
        return lines if any(f"testengine[{running.pid}]: argv" in ln for ln in lines) else []

    await eventually(logged, what="the engine's own lines in the journal")


async def test_an_operators_stop_stands_across_an_agent_restart(
    systemd_machine: MachineFactory,
) -> None:
    machine = systemd_machine(network=False)
    b = backend(machine)
    await b.apply([UnitChange(unit_name(), unit_text())])
    await until(b, "running")
    machine.run(["systemctl", "stop", "--", unit_name()])
    # systemd has already forgotten the unit: nothing in `show` says it ever ran.
    assert shown(machine, "ExecMainCode") == "0"
    for agent in (b, backend(machine)):  # the second: a restarted agent, same state dir
        stopped = await observed(agent)
        assert stopped.process == "stopped"
        assert stopped.evidence is not None and stopped.evidence.stopped_by == "operator"
        found = await finding(agent)
        assert found is not None and found.kind == "stopped_by_hand", found


async def test_llmgws_own_stop_is_named_as_llmgws(systemd_machine: MachineFactory) -> None:
    machine = systemd_machine(network=False)
    b = backend(machine)
    await b.apply([UnitChange(unit_name(), unit_text())])
    await until(b, "running")
    [result] = await b.apply([UnitChange(unit_name(), "", action="stop")])
    assert result.ok and result.changed, result.error
    for agent in (b, backend(machine)):
        stopped = await observed(agent)
        assert stopped.evidence is not None and stopped.evidence.stopped_by == "llmgw"


async def test_crashes_no_agent_saw_still_count_and_outlive_the_agent(
    systemd_machine: MachineFactory,
) -> None:
    """The agent looks only after systemd restarted the engine three times (it was down);
    then a crash-loop hold stops the unit, and a restarted agent still sees it held."""
    machine = systemd_machine(network=False)
    b = backend(machine)
    service = "RestartSec=0.2"
    await b.apply([UnitChange(unit_name(), unit_text(args=CRASHING, service=service)
                              .replace("StartLimitIntervalSec=10s", "StartLimitIntervalSec=0"))])
    await eventually(lambda: int(shown(machine, "NRestarts") or 0) >= 3, timeout=30,
                     what="three restarts")
    seen = await observed(b)
    assert seen.evidence is not None and len(seen.evidence.crashes) >= 3, seen
    [held] = await b.apply([UnitChange(unit_name(), "", action="stop")])
    assert held.ok, held.error
    for agent in (b, backend(machine)):
        stopped = await observed(agent)
        assert stopped.process == "stopped"
        assert stopped.evidence is not None
        assert (stopped.evidence.stopped_by, len(stopped.evidence.crashes) >= 3) == (
            "llmgw", True), stopped
        found = await finding(agent)
        assert found is not None and found.kind == "engine_crash", found
        assert "held stopped by llmgw" in found.evidence[0]


async def test_the_first_pending_restart_is_restart_1(systemd_machine: MachineFactory) -> None:
    machine = systemd_machine(network=False)
    b = backend(machine)
    await b.apply([UnitChange(unit_name(), unit_text(args=CRASHING, service="RestartSec=60"))])
    waiting = await until(b, "activating")
    assert waiting.detail == "exited with status 3; restart 1 pending"
    assert waiting.evidence is not None and len(waiting.evidence.crashes) == 1


async def test_a_missing_engine_binary_says_so(systemd_machine: MachineFactory) -> None:
    machine = systemd_machine(network=False)
    b = backend(machine)
    text = unit_text(service="RestartSec=60\nExecStart=/opt/nowhere/llama-server --port 1")
    await b.apply([UnitChange(unit_name(), text)])
    waiting = await until(b, "activating")
    assert waiting.detail == ("the engine's binary cannot be executed (status 203/EXEC); "
                              "restart 1 pending")
    assert shown(machine, "ExecMainStatus") == "203"


async def test_a_slow_stop_is_waited_for_as_long_as_the_unit_allows(
    systemd_machine: MachineFactory,
) -> None:
    """The engine drains for 8 s after SIGTERM; the unit allows 30 s. Every other
    systemctl call here gets 4 s (standing in for the usual 30 s): the stop must get
    what the unit allows, and the remove must finish."""
    machine = systemd_machine(network=False)
    b = backend(machine, default_timeout=4.0)
    await b.apply([UnitChange(unit_name(), unit_text(args="--stop-delay 8",
                                                     service="TimeoutStopSec=30"))])
    pid = (await until(b, "running")).pid

    async def draining_set_up() -> bool:  # its SIGTERM handler is in place once it listens
        return any("listening on" in line for line in await b.logs(unit_name(), Query(20)))

    await eventually(draining_set_up, timeout=30, what="the engine to listen")
    [removed] = await b.apply([UnitChange(unit_name(), "", action="remove")])
    assert removed.ok, removed.error
    assert not (machine.units / unit_name()).exists()
    assert pid is not None and not (machine.proc / str(pid)).exists()
    assert [o.name for o in await b.observe()] == []


@pytest.mark.parametrize("verb", ["stop"])
async def test_a_failed_stop_during_remove_says_the_files_are_kept(
    systemd_machine: MachineFactory, verb: str,
) -> None:
    machine = systemd_machine(network=False)
    b = backend(machine)
    await b.apply([UnitChange(unit_name(), unit_text())])
    await until(b, "running")
    real = b.run

    async def refusing(argv: list[str], timeout: float = 30.0) -> units.UnitResult:
        if argv[1] == verb:
            return await real(["systemctl", "stop", "--", "no-such-unit-at-all@"], timeout)
        return await real(argv, timeout)

    b.run = refusing  # type: ignore[assignment]
    [removed] = await b.apply([UnitChange(unit_name(), "", action="remove")])
    assert not removed.ok
    assert "did not stop, so its unit and env files are kept" in removed.error, removed.error
    assert (machine.units / unit_name()).exists()
    assert Path(machine.units / unit_name()).read_text() == unit_text()


async def test_the_limits_an_engine_gets_are_read_not_assumed(
    systemd_machine: MachineFactory,
) -> None:
    """A systemd without CAP_SYS_RESOURCE whose hard memlock limit is 64 KiB lowers the
    unit's LimitMEMLOCK=infinity to 64 KiB and says nothing; the agent reports what the
    engine's process has, and doctor fails the memlock check on it."""
    machine = systemd_machine(network=False, limits=["MEMLOCK=65536"],
                              drop_capabilities=["CAP_SYS_RESOURCE"])
    b = backend(machine)
    probed = await b.engine_limits()  # no engine runs yet: a probe unit with llmgw's limits
    assert probed is not None and "probe" in probed.source, probed
    assert (probed.memlock_bytes, probed.memlock_unlimited) == (65536, False)
    await b.apply([UnitChange(unit_name(), unit_text())])
    running = await until(b, "running")
    assert shown(machine, "LimitMEMLOCK") == "infinity"  # what the unit asks for
    got = await b.engine_limits()
    assert got is not None and got.source == f"{unit_name()} (pid {running.pid})"
    assert (got.memlock_bytes, got.memlock_unlimited) == (65536, False)
    assert got.nofile is not None and got.nofile > 0

    node = Node(address="10.0.0.1", fabrics={"ib-a": ["mlx5_0"]})
    report = NodeReport(node="n", agent_version=__version__, collected_at=time.time(),
                        host=HostFacts(memlock_unlimited=True, engine_limits=got))
    found = {f.check: f for f in doctors.examine(
        "n", node, report, doctors.Context(version=__version__, now=time.time()))}
    assert found["memlock"].status == "fail", found["memlock"]
    assert f"engines get memlock 65536 bytes ({unit_name()}" in found["memlock"].detail


async def test_after_a_reboot_a_stopped_unit_is_not_someone_elses_stop(
    systemd_machine: MachineFactory, tmp_path: Path,
) -> None:
    """The same unit files and evidence under a new PID 1 (the node rebooted; llmgw does
    not enable its units): the unit is not started yet, which is no operator's doing."""
    state = tmp_path / "evidence"
    first = systemd_machine(network=False)
    b = backend(first, state)
    await b.apply([UnitChange(unit_name(), unit_text())])
    await until(b, "running")
    first.stop()
    second = systemd_machine(network=False)
    (second.units / unit_name()).write_text((first.units / unit_name()).read_text())
    second.run(["systemctl", "daemon-reload"])
    after = await observed(backend(second, state))
    assert after.process == "stopped"
    assert after.evidence is not None and after.evidence.stopped_by == "", after


async def test_previous_is_the_invocation_a_sigkill_ended(
    systemd_machine: MachineFactory, tmp_path: Path,
) -> None:
    """The journal's run before the latest (by invocation id), masked, and a follow whose
    journalctl is gone once its reader leaves."""
    machine = systemd_machine(network=False)
    b = backend(machine)
    secret = tmp_path / "token"
    secret.write_text("opensesame-4242\n")
    await b.apply([UnitChange(unit_name(), unit_text(args="--say-env LICENSE_ID"),
                              secret_env={"LICENSE_ID": str(secret)})])
    first = (await until(b, "running")).pid

    async def said(pid: int | None) -> list[str]:
        lines = await b.logs(unit_name(), Query(50))
        return lines if f"testengine[{pid}]: env LICENSE_ID=[redacted]" in lines else []

    await eventually(lambda: said(first), timeout=30, what="the first run's lines")
    assert await b.logs(unit_name(), Query(50, previous=True)) == []
    machine.run(["kill", "-KILL", str(first)])

    async def restarted() -> Observation | None:
        found = await observed(b)
        return found if found.process == "running" and found.pid != first else None

    second = (await eventually(restarted, timeout=30, what="the restart")).pid
    await eventually(lambda: said(second), timeout=30, what="the second run's lines")
    previous = await b.logs(unit_name(), Query(100, previous=True))
    assert f"testengine[{first}]: env LICENSE_ID=[redacted]" in previous
    assert any("code=killed, status=9/KILL" in line for line in previous), previous
    assert not any(f"testengine[{second}]" in line for line in previous)
    assert not any("opensesame-4242" in line for line in previous)

    follow = b.follow(unit_name(), Query(5))
    assert "opensesame" not in await anext(follow)
    await follow.aclose()

    def no_journalctl() -> bool:
        return "journalctl" not in machine.run(["ps", "-eo", "comm"]).stdout

    await eventually(no_journalctl, timeout=15, what="the follow's journalctl gone")
