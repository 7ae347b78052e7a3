"""The supervise backend with real child processes: the test engine, which forks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from agent_support import alive, eventually, free_port, unit_name, unit_text

from llmgw.agent import processes
from llmgw.agent.settings import SuperviseSettings
from llmgw.agent.supervisors import Supervisor
from llmgw.agent.unitlogs import Query
from llmgw.agent.units import UnitChange

FAST = SuperviseSettings(
    restart_backoff=0.05, restart_backoff_max=0.2, restart_limit=2, stop_timeout=2.0
)


@pytest.fixture
async def supervisor(tmp_path: Path):  # type: ignore[no-untyped-def]
    sup = Supervisor(tmp_path / "state", FAST)
    yield sup
    # Leave nothing running, whatever the test did.
    await sup.apply([UnitChange(n, "", action="remove") for n in list(sup._slots)])


def running_pid(observations: list, name: str) -> int | None:  # type: ignore[type-arg]
    for obs in observations:
        if obs.name == name and obs.process == "running":
            return int(obs.pid)
    return None


async def test_start_runs_execstart_with_unit_and_given_environment(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    secret = tmp_path / "hf_token"
    secret.write_text("hf_s3cr3t value\n")
    record = tmp_path / "record.json"
    text = unit_text(
        port=free_port(),
        args=f"--record {record} --tp ${{TP}} $EXTRA",
        service='Environment="VLLM_LOGGING_LEVEL=DEBUG" TP=2\n',
    )
    change = UnitChange(
        unit_name(), text, env_text="NCCL_IB_HCA=mlx5_0,mlx5_1\nEXTRA=--a --b\n",
        secret_env={"HF_TOKEN": str(secret)},
    )
    [result] = await supervisor.apply([change])
    assert result.ok and result.changed, result.error
    data = await eventually(lambda: record.exists() and json.loads(record.read_text()))
    assert data["argv"][-6:] == ["--record", str(record), "--tp", "2", "--a", "--b"]
    assert data["env"]["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert data["env"]["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert data["env"]["HF_TOKEN"] == "hf_s3cr3t value"
    assert data["pgid"] == data["pid"], "the engine leads its own process group"
    secret_file = supervisor.units_dir / unit_name() / "secret.env"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    assert "hf_s3cr3t" not in result.error


async def test_applying_the_same_start_twice_changes_nothing(supervisor: Supervisor) -> None:
    change = UnitChange(unit_name(), unit_text(port=free_port()))
    [first] = await supervisor.apply([change])
    pid = running_pid(await supervisor.observe(), unit_name())
    [second] = await supervisor.apply([change])
    assert first.changed and not second.changed
    assert running_pid(await supervisor.observe(), unit_name()) == pid


async def test_changed_unit_text_restarts_the_engine(supervisor: Supervisor) -> None:
    port = free_port()
    await supervisor.apply([UnitChange(unit_name(), unit_text(port=port, digest="a"))])
    before = running_pid(await supervisor.observe(), unit_name())
    [result] = await supervisor.apply([UnitChange(unit_name(), unit_text(port=port, digest="b"))])
    after = running_pid(await supervisor.observe(), unit_name())
    assert result.changed and before and after and before != after
    assert before is not None and not alive(before)


async def test_stop_kills_the_whole_group_even_a_worker_ignoring_sigterm(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    worker_file = tmp_path / "worker.pid"
    text = unit_text(
        port=free_port(),
        args=f"--fork-worker --worker-ignores-sigterm --worker-pid-file {worker_file}",
        service="TimeoutStopSec=0.3\n",
    )
    await supervisor.apply([UnitChange(unit_name(), text)])
    worker = int(await eventually(lambda: worker_file.exists() and worker_file.read_text()))
    engine = running_pid(await supervisor.observe(), unit_name())
    assert engine and alive(worker) and supervisor.owns(worker) and supervisor.owns(engine)
    [stopped] = await supervisor.apply([UnitChange(unit_name(), text, action="stop")])
    assert stopped.ok and stopped.changed
    assert not alive(engine) and not alive(worker), "SIGKILL after the stop timeout"
    [again] = await supervisor.apply([UnitChange(unit_name(), text, action="stop")])
    assert again.ok and not again.changed
    [obs] = await supervisor.observe()
    assert obs.process == "stopped"


async def test_main_process_exit_kills_its_workers_too(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    worker_file = tmp_path / "worker.pid"
    text = unit_text(
        port=free_port(),
        args=f"--fork-worker --worker-pid-file {worker_file} --exit-after 0.5 --exit-code 0",
    )
    await supervisor.apply([UnitChange(unit_name(), text)])
    worker = int(await eventually(lambda: worker_file.exists() and worker_file.read_text()))

    async def ended() -> bool:
        await supervisor.tick()
        [obs] = await supervisor.observe()
        return obs.process == "stopped"

    await eventually(ended, what="clean exit ends the unit")
    await eventually(lambda: not alive(worker), what="the worker killed with its group")


async def test_failures_restart_with_backoff_then_fail_with_the_log_tail(
    supervisor: Supervisor,
) -> None:
    text = unit_text(port=free_port(), args="--exit-after 0.1 --exit-code 3")
    await supervisor.apply([UnitChange(unit_name(), text)])

    async def failed() -> object:
        await supervisor.tick()
        [obs] = await supervisor.observe()
        return obs if obs.process == "failed" else None

    obs = await eventually(failed, what="Failed after the restart limit")
    assert "exited with status 3" in obs.detail and "gave up after 2 restarts" in obs.detail
    log = await supervisor.logs(unit_name(), Query(200))
    # The last two runs are kept: the last restart's log, and the one before it.
    assert sum("-- llmgw: starting" in line for line in log) == 2
    assert any("exiting with status 3 as asked" in line for line in log)


# The first Supervisor stands for an agent that died: its handles on running
# children are dropped without waiting, which Python reports as a ResourceWarning.
ABANDONED = pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")


@ABANDONED
async def test_restarted_agent_adopts_the_running_engine(tmp_path: Path) -> None:
    first = Supervisor(tmp_path / "state", FAST)
    text = unit_text(port=free_port())
    await first.apply([UnitChange(unit_name(), text)])
    pid = running_pid(await first.observe(), unit_name())
    assert pid is not None
    # The agent dies without stopping anything; a new one reads the state dir.
    second = Supervisor(tmp_path / "state", FAST)
    await second.tick()
    assert running_pid(await second.observe(), unit_name()) == pid
    assert second.owns(pid)
    [result] = await second.apply([UnitChange(unit_name(), text)])
    assert result.ok and not result.changed, "adopted, not restarted"
    await second.apply([UnitChange(unit_name(), text, action="remove")])
    assert not alive(pid)


async def test_a_reused_pid_is_never_adopted_nor_signalled(tmp_path: Path) -> None:
    first = Supervisor(tmp_path / "state", FAST)
    text = unit_text(port=free_port())
    await first.apply([UnitChange(unit_name(), text)])
    pid_file = first.units_dir / unit_name() / "pid"
    recorded = json.loads(pid_file.read_text())
    await first.apply([UnitChange(unit_name(), text, action="stop")])
    # An unrelated process now holds the pid the file names (the engine's pid was
    # reused): same pid, started later than the engine the file recorded.
    time.sleep(0.05)  # past the clock tick the engine started in
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        print_ = processes.fingerprint(stranger.pid)
        assert print_ is not None and print_.start_ticks != recorded["start_ticks"]
        recorded |= {"pid": stranger.pid}
        pid_file.write_text(json.dumps(recorded))
        (first.units_dir / unit_name() / "wanted").write_text("running")

        second = Supervisor(tmp_path / "state", FAST)
        assert not second.owns(stranger.pid)
        await second.tick()  # wanted but not running: a fresh engine starts
        fresh = running_pid(await second.observe(), unit_name())
        assert fresh is not None and fresh != stranger.pid
        await second.apply([UnitChange(unit_name(), text, action="remove")])
        assert stranger.poll() is None, "the unrelated process was not signalled"
    finally:
        stranger.kill()
        stranger.wait()


@ABANDONED
async def test_an_engine_that_exec_ed_after_its_pid_file_was_written_is_adopted(
    tmp_path: Path,
) -> None:
    """``/usr/bin/env vllm`` or a wrapper script execs the engine after the agent wrote
    the pid file: an agent killed in that moment left the first program's command line
    there. Its successor adopts the engine (same pid and start time) all the same."""
    first = Supervisor(tmp_path / "state", FAST)
    text = unit_text(port=free_port())
    await first.apply([UnitChange(unit_name(), text)])
    pid_file = first.units_dir / unit_name() / "pid"
    recorded = json.loads(pid_file.read_text())
    pid_file.write_text(json.dumps(recorded | {"cmdline_sha256": "0" * 64}))
    second = Supervisor(tmp_path / "state", FAST)
    try:
        assert second.owns(recorded["pid"])
        assert running_pid(await second.observe(), unit_name()) == recorded["pid"]
    finally:
        await second.apply([UnitChange(unit_name(), text, action="remove")])
    assert not alive(recorded["pid"])


async def test_missing_secret_file_fails_that_unit_only(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    good = UnitChange(unit_name("ok"), unit_text("ok", port=free_port()))
    bad = UnitChange(
        unit_name("bad"), unit_text("bad", port=free_port()),
        secret_env={"HF_TOKEN": str(tmp_path / "absent")},
    )
    results = await supervisor.apply([bad, good])
    assert [r.ok for r in results] == [False, True]
    assert "HF_TOKEN" in results[0].error and str(tmp_path / "absent") in results[0].error


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("nginx.service", unit_text(), "not an llmgw unit name"),
        (unit_name("m2"), unit_text(), "its labels name it llmgw-m1-r0-s0.service"),
        (unit_name(), unit_text().replace("X-Llmgw-Digest=d1\n", ""), "no X-Llmgw-Digest"),
        (unit_name(), "[Unit]\nX-Llmgw-Model=m1\nnot an assignment\n", ":3: expected Key=value"),
        # Only the keys the template writes, as often as it writes them.
        (unit_name(), unit_text() + "ExecStartPre=/usr/bin/touch /tmp/p\n",
         "refused: [Service] ExecStartPre= is not a key llmgw writes"),
        (unit_name(), unit_text() + "User=root\n", "[Service] User= is not a key"),
        (unit_name(), unit_text() + "\n[Install]\nWantedBy=multi-user.target\n",
         "[Install] is not a section llmgw writes"),
        (unit_name(), unit_text() + "ExecStart=/bin/sh -c id\n",
         "[Service] ExecStart= is written 2 times; llmgw writes it at most 1"),
        (unit_name(), unit_text().replace("KillMode=control-group\n", ""),
         "[Service] has no KillMode="),
        # systemd ends a line at CR: a CR in a label value starts a new key.
        (unit_name(), unit_text().replace(
            "X-Llmgw-Digest=d1\n", "X-Llmgw-Digest=d1\r[Service]\rExecStartPre=/bin/id\n"),
         "ExecStartPre= is not a key"),
    ],
)
async def test_units_llmgw_cannot_read_are_refused(
    supervisor: Supervisor, name: str, text: str, message: str
) -> None:
    [result] = await supervisor.apply([UnitChange(name, text)])
    assert not result.ok and message in result.error


async def test_remove_stops_and_forgets(supervisor: Supervisor) -> None:
    text = unit_text(port=free_port())
    await supervisor.apply([UnitChange(unit_name(), text)])
    pid = running_pid(await supervisor.observe(), unit_name())
    [removed] = await supervisor.apply([UnitChange(unit_name(), text, action="remove")])
    assert removed.changed and pid is not None and not alive(pid)
    assert await supervisor.observe() == []
    assert not (supervisor.units_dir / unit_name()).exists()
    [again] = await supervisor.apply([UnitChange(unit_name(), text, action="remove")])
    assert again.ok and not again.changed


async def test_log_stays_bounded(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "state", SuperviseSettings(log_max_bytes=4096))
    await sup.apply([UnitChange(unit_name(), unit_text(port=free_port()))])
    log = sup.units_dir / unit_name() / "log"
    with log.open("ab") as handle:
        handle.write(b"x" * 10000 + b"\nlast line\n")
    await sup.tick()
    assert log.stat().st_size <= 4096
    assert (await sup.logs(unit_name(), Query(1))) == ["last line"]
    await sup.apply([UnitChange(unit_name(), "", action="remove")])


async def test_group_signals_reach_forked_children() -> None:
    """The helpers the backend relies on, against a real process group."""
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    try:
        members = await eventually(
            lambda: len(m := processes.group_members(proc.pid)) == 3 and m, what="3 members"
        )
        assert os.getpid() not in members
        assert processes.signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        await eventually(lambda: not processes.group_members(proc.pid), what="group gone")
        assert not any(alive(pid) for pid in members)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_start_limit_off_keeps_restarting_and_shows_why(tmp_path: Path) -> None:
    """StartLimitIntervalSec=0 (as llmgw's template writes it): never Failed, just retried."""
    from llmgw.agent.monitors import Monitor

    sup = Supervisor(tmp_path / "state", FAST)
    text = unit_text(port=free_port(), args="--exit-after 0.05 --exit-code 4").replace(
        "StartLimitIntervalSec=10s\n", "StartLimitIntervalSec=0\n"
    )
    await sup.apply([UnitChange(unit_name(), text)])
    monitor = Monitor(sup)
    try:
        async def restarted_often() -> bool:
            await sup.tick()
            [obs] = await sup.observe()
            return (obs.evidence.restarts or 0) > FAST.restart_limit + 1

        await eventually(restarted_often, what="more restarts than the limit")
        units = await eventually(
            lambda: _restarting(monitor), what="a unit waiting to be restarted"
        )
        [unit] = units
        assert unit.state == "starting" and "exited with status 4" in unit.detail
        assert any("exiting with status 4 as asked" in line for line in unit.log_tail)
    finally:
        await monitor.close()
        await sup.apply([UnitChange(unit_name(), "", action="remove")])


async def _restarting(monitor):  # type: ignore[no-untyped-def]
    units = await monitor.refresh()
    return units if units and units[0].state == "starting" and units[0].log_tail else None


@pytest.mark.parametrize("inherit", [True, False])
async def test_engines_inherit_the_agents_environment_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inherit: bool
) -> None:
    monkeypatch.setenv("LLMGW_FROM_AGENT", "yes")
    monkeypatch.setenv("HF_HOME", "/agent/hf")
    settings = FAST.model_copy(update={"inherit_environment": inherit})
    sup = Supervisor(tmp_path / "state", settings)
    record = tmp_path / "record.json"
    text = unit_text(port=free_port(), args=f"--record {record}")
    await sup.apply([UnitChange(unit_name(), text, env_text="HF_HOME=/unit/hf\n")])
    try:
        data = await eventually(lambda: record.exists() and json.loads(record.read_text()))
        assert data["env"]["HF_HOME"] == "/unit/hf", "the unit's environment wins"
        assert ("LLMGW_FROM_AGENT" in data["env"]) is inherit
    finally:
        await sup.apply([UnitChange(unit_name(), "", action="remove")])


GARBAGE = b"\xff\xfe\x00pid \xc3\x28 not json"


@ABANDONED
async def test_garbage_pid_and_wanted_files_are_moved_aside_and_the_unit_carries_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = Supervisor(tmp_path / "state", FAST)
    text = unit_text(port=free_port())
    await first.apply([UnitChange(unit_name(), text)])
    pid = running_pid(await first.observe(), unit_name())
    assert pid is not None
    directory = first.units_dir / unit_name()
    (directory / "pid").write_bytes(GARBAGE)
    (directory / "wanted").write_bytes(b"runn\xffing")
    try:
        second = Supervisor(tmp_path / "state", FAST)  # the agent restarts over bad state
        [obs] = await second.observe()
        assert obs.name == unit_name() and obs.labels is not None
        assert obs.process == "stopped"  # nothing adopted from a pid file it cannot read
        assert [p.name.split("-")[0] for p in sorted(directory.glob("*.corrupt-*"))] == [
            "pid.corrupt", "wanted.corrupt"]
        assert "pid is not a pid file llmgw wrote; moved aside" in caplog.text
        # The daemon re-applies what it wants, and the unit runs again.
        [result] = await second.apply([UnitChange(unit_name(), text)])
        assert result.ok, result.error
        assert running_pid(await second.observe(), unit_name()) is not None
        await second.apply([UnitChange(unit_name(), text, action="remove")])
    finally:
        os.kill(pid, signal.SIGKILL)


@ABANDONED
async def test_a_unit_file_that_is_not_utf8_moves_the_unit_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = Supervisor(tmp_path / "state", FAST)
    await first.apply([UnitChange(unit_name(), unit_text(port=free_port()))])
    pid = running_pid(await first.observe(), unit_name())
    assert pid is not None
    (first.units_dir / unit_name() / "unit").write_bytes(b"[Unit]\nDescription=\xff\xfe\n")
    try:
        second = Supervisor(tmp_path / "state", FAST)
        assert await second.observe() == []
        [aside] = (tmp_path / "state" / "corrupt").iterdir()
        assert aside.name.startswith(unit_name() + "-") and (aside / "unit").exists()
        assert "the unit file is not UTF-8" in caplog.text
        assert f"its last engine (pid {pid}) may still run" in caplog.text
    finally:
        os.kill(pid, signal.SIGKILL)


async def test_a_unit_file_garbled_while_running_is_reported_not_fatal(
    supervisor: Supervisor,
) -> None:
    await supervisor.apply([UnitChange(unit_name(), unit_text(port=free_port()))])
    (supervisor.units_dir / unit_name() / "unit").write_bytes(GARBAGE)
    await supervisor.tick()
    [obs] = await supervisor.observe()
    assert obs.labels is None and "not UTF-8" in obs.detail
