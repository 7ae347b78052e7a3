"""What the agent reports so the daemon can tell one kind of drift from another.

A real agent on a unix socket, the supervise backend and the test engine: an
engine killed by SIGKILL is reported with its restart count, how it ended and
when (an engine crash); one stopped with SIGTERM by someone else says who
stopped it (stopped by hand); a unit file edited by hand is no longer vouched
for by the agent's ledger (a stranger); a hold stops a unit and keeps it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from agent_support import eventually, free_port, node_settings, unit_name, unit_text
from test_agent_grpc import Served, root, serving  # noqa: F401 (root is a fixture)

from llmgw.agent.settings import SuperviseSettings
from llmgw.agent.supervisors import Supervisor
from llmgw.agent.units import Evidence
from llmgw.fleet.types import Unit
from llmgw.proto.conversions import UnitChange


async def _unit(served: Served) -> Unit | None:
    units = (await served.client.report()).units
    return units[0] if units else None


async def _ready(served: Served) -> Unit:
    async def ready() -> Unit | None:
        unit = await _unit(served)
        return unit if unit is not None and unit.state == "ready" else None

    return await eventually(ready, timeout=30, what="the engine ready")


async def test_a_killed_engine_is_reported_with_its_restart_and_exit(root: Path) -> None:  # noqa: F811
    async with serving(node_settings("cpu-only", root), root) as served:
        before = time.time()
        text = unit_text(port=free_port())
        [result] = await served.client.apply_units([UnitChange(unit_name(), text)])
        assert result.ok, result.error
        first = await _ready(served)
        assert first.restarts == 0 and first.last_exit == "" and first.crashes == []
        assert first.written_by_llmgw is True
        assert first.pid is not None
        os.kill(first.pid, signal.SIGKILL)

        async def restarted() -> Unit | None:
            unit = await _unit(served)
            ok = unit is not None and unit.state == "ready" and unit.pid != first.pid
            return unit if ok else None

        unit = await eventually(restarted, timeout=30, what="the engine restarted")
        assert unit.restarts == 1
        assert unit.last_exit == "killed by SIGKILL"
        assert unit.last_exit_at is not None and before <= unit.last_exit_at <= time.time()
        assert unit.crashes == [unit.last_exit_at]
        assert unit.stopped_by == ""
        report = await served.client.report()
        assert report.agent_started_at is not None and report.agent_started_at <= before


async def test_a_stop_by_hand_says_who_stopped_it(root: Path) -> None:  # noqa: F811
    async with serving(node_settings("cpu-only", root), root) as served:
        text = unit_text(port=free_port())
        await served.client.apply_units([UnitChange(unit_name(), text)])
        first = await _ready(served)
        assert first.pid is not None
        os.killpg(first.pid, signal.SIGTERM)  # what `kill` or `systemctl stop` sends

        async def stopped() -> Unit | None:
            unit = await _unit(served)
            return unit if unit is not None and unit.state == "stopped" else None

        unit = await eventually(stopped, what="the unit stopped")
        assert unit.stopped_by == "operator"
        assert unit.last_exit in ("killed by SIGTERM", "exited with status 0")
        assert unit.crashes == []
        assert unit.restarts == 0


async def test_a_hold_stops_the_unit_and_says_llmgw_did(root: Path) -> None:  # noqa: F811
    async with serving(node_settings("cpu-only", root), root) as served:
        await served.client.apply_units([UnitChange(unit_name(), unit_text(port=free_port()))])
        await _ready(served)
        [result] = await served.client.apply_units([UnitChange(unit_name(), "", action="stop")])
        assert result.ok and result.changed, result.error
        unit = await _unit(served)
        assert unit is not None and unit.state == "stopped" and unit.stopped_by == "llmgw"


async def test_a_unit_file_edited_by_hand_is_not_vouched_for(root: Path) -> None:  # noqa: F811
    async with serving(node_settings("cpu-only", root), root) as served:
        text = unit_text(port=free_port(), args="--start-delay 30")
        await served.client.apply_units([UnitChange(unit_name(), text)])
        unit = await eventually(lambda: _unit(served), what="the unit reported")
        assert unit.written_by_llmgw is True
        path = root / "state" / "units" / unit_name() / "unit"
        path.write_text(path.read_text().replace("Description=", "Description=edited "))

        async def stranger() -> Unit | None:
            found = await _unit(served)
            return found if found is not None and found.written_by_llmgw is False else None

        await eventually(stranger, what="the edited unit reported as not llmgw's")


async def test_a_hold_while_the_agent_waits_to_restart_says_llmgw_stopped_it(
    root: Path,  # noqa: F811
) -> None:
    settings = node_settings("cpu-only", root, supervise={"restart_backoff": 30.0,
                                                          "restart_backoff_max": 30.0})
    async with serving(settings, root) as served:
        await served.client.apply_units([UnitChange(unit_name(), unit_text(port=free_port()))])
        first = await _ready(served)
        assert first.pid is not None
        os.kill(first.pid, signal.SIGKILL)

        async def waiting() -> Unit | None:
            unit = await _unit(served)
            return unit if unit is not None and unit.crashes else None

        await eventually(waiting, what="the crash seen, a restart pending")
        await served.client.apply_units([UnitChange(unit_name(), "", action="stop")])
        unit = await _unit(served)
        assert unit is not None and unit.state == "stopped" and unit.stopped_by == "llmgw"
        assert unit.last_exit == "killed by SIGKILL" and len(unit.crashes) == 1


# The first Supervisor stands for an agent that died: its handles on running
# children are dropped without waiting, which Python reports as a ResourceWarning.
@pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")
async def test_a_hold_and_its_crashes_outlive_an_agent_restart(tmp_path: Path) -> None:
    fast = SuperviseSettings(restart_backoff=0.05, restart_backoff_max=0.2, stop_timeout=2.0)
    first = Supervisor(tmp_path / "state", fast)
    await first.apply([UnitChange(unit_name(), unit_text(args="--exit-after 0.1 --exit-code 3"))])

    async def crashed() -> Evidence | None:
        await first.tick()
        [obs] = await first.observe()
        return obs.evidence if obs.evidence and len(obs.evidence.crashes) >= 2 else None

    await eventually(crashed, what="two crashes")
    await first.apply([UnitChange(unit_name(), "", action="stop")])  # the daemon's hold
    [held] = await first.observe()
    assert held.evidence is not None

    again = Supervisor(tmp_path / "state", fast)  # the agent restarted
    [obs] = await again.observe()
    assert obs.process == "stopped" and obs.evidence is not None
    assert obs.evidence.stopped_by == "llmgw"
    assert obs.evidence.crashes == held.evidence.crashes
    assert obs.evidence.last_exit == held.evidence.last_exit
    await again.tick()
    [still] = await again.observe()
    assert still.process == "stopped"  # the restarted agent does not start a held unit
