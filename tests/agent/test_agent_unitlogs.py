"""A unit's log as the agent serves it: the run before the latest, bounds, masked secrets.

The pure halves (the journal's invocations, the masker, the bounded tail) on
data; the supervise backend with the real test engine, SIGKILLed; the gRPC
stream over a real unix socket; the streamed command killed when its
reader leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from agent_support import (
    alive,
    eventually,
    free_port,
    node_settings,
    served_agent,
    short_dir,
    unit_name,
    unit_text,
)

from llmgw.agent import commands, servers, unitlogs
from llmgw.agent.settings import SuperviseSettings
from llmgw.agent.supervisors import Supervisor
from llmgw.agent.unitlogs import Query
from llmgw.agent.units import UnitChange
from llmgw.proto import agent_pb2 as pb
from llmgw.transport.agent_client import AgentClient

FAST = SuperviseSettings(restart_backoff=0.05, restart_backoff_max=0.2, restart_limit=5,
                         stop_timeout=2.0)
PLANTED = "opensesame-4242"  # no shape the scrubber knows: only the value mask hides it
# A variable whose name the scrubber does not take for a secret's (HF_TOKEN=… it would hide).


def entry(invocation: str | None, message: object, field: str = "_SYSTEMD_INVOCATION_ID"
          ) -> str:
    data: dict[str, object] = {"MESSAGE": message}
    if invocation is not None:
        data[field] = invocation
    return json.dumps(data)


# journalctl --output json --reverse: newest first.
@pytest.mark.parametrize(("entries", "lines", "expected"), [
    pytest.param([entry("b", "b2"), entry("b", "b1"), entry("a", "a2"), entry("a", "a1")],
                 10, ["a1", "a2"], id="the-run-before-the-latest"),
    pytest.param([entry("b", "b1"), entry("a", "Main process exited, code=killed, "
                                         "status=9/KILL", "INVOCATION_ID"),
                  entry("a", "a1")],
                 10, ["a1", "Main process exited, code=killed, status=9/KILL"],
                 id="systemds-own-lines-count-by-INVOCATION_ID"),
    pytest.param([entry("c", "c1"), entry("b", "b1"), entry("a", "a1")], 10, ["b1"],
                 id="only-the-one-before"),
    pytest.param([entry("b", "b2"), entry("a", "a3"), entry("b", "late b"),
                  entry("a", "a2")], 10, ["a2", "a3"], id="a-late-entry-of-the-latest-run"),
    pytest.param([entry("b", "b1"), entry("a", "a3"), entry("a", "a2"), entry("a", "a1")],
                 2, ["a2", "a3"], id="its-last-lines"),
    pytest.param([entry("b", "b1"), entry(None, "no id"), entry("a", "a1")], 10, ["a1"],
                 id="an-entry-without-id-belongs-to-the-run-around-it"),
    pytest.param([entry("b", "b1"), entry("a", [104, 105, 255])], 10, ["hi\ufffd"],
                 id="binary-message"),
    pytest.param([entry("b", "b2"), entry("b", "b1")], 10, None, id="never-restarted"),
    pytest.param(["not json", entry("b", "b1"), "[1]", entry("a", "a1")], 10, ["a1"],
                 id="garbage-skipped"),
])
def test_previous_run_from_journal_invocations(entries: list[str], lines: int,
                                               expected: list[str] | None) -> None:
    assert unitlogs.previous_run(entries, lines) == expected


@pytest.mark.parametrize(("query", "follow", "expected"), [
    pytest.param(Query(50), False, ["--output", "cat", "--lines", "50"], id="latest"),
    pytest.param(Query(50, since=1000.5), False,
                 ["--since=@1000", "--output", "cat", "--lines", "50"], id="since"),
    pytest.param(Query(5), True, ["--output", "cat", "--lines", "5", "--follow"], id="follow"),
    pytest.param(Query(5, previous=True), False,
                 ["--output", "json", "--reverse", "--lines", str(unitlogs.SCAN_ENTRIES),
                  "--output-fields=MESSAGE,_SYSTEMD_INVOCATION_ID,INVOCATION_ID"],
                 id="previous-scans-a-bounded-number-of-entries"),
])
def test_journal_commands(query: Query, follow: bool, expected: list[str]) -> None:
    argv = unitlogs.journal_command("u.service", query, follow=follow)
    assert argv == ["journalctl", "--unit", "u.service", "--no-pager", "--quiet", *expected]


@pytest.mark.parametrize(("values", "line", "expected"), [
    pytest.param([PLANTED], f"token is {PLANTED}!", "token is [redacted]!", id="a-value"),
    pytest.param(["abcd", "abcdefgh"], "x abcdefgh y abcd", "x [redacted] y [redacted]",
                 id="the-longest-first"),
    pytest.param(["abc"], "abc abc", "abc abc", id="too-short-to-mask-by-value"),
    pytest.param([], "LICENSE_ID=hf_" + "a1B2c3D4e5" * 4, "LICENSE_ID=[redacted]",
                 id="the-scrubber-too"),
    pytest.param([], "x" * (unitlogs.LINE_CHARS_MAX + 10),
                 "x" * unitlogs.LINE_CHARS_MAX + unitlogs.CUT, id="a-long-line-is-cut"),
])
def test_masker(values: list[str], line: str, expected: str) -> None:
    assert unitlogs.Masker(values)(line) == expected


def test_tail_is_bounded_in_bytes_and_drops_a_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"first\n" + b"y" * 5000 + f" {PLANTED}\nsecond\nthird\n".encode())
    assert unitlogs.tail(path, 10) == ["first", "y" * 5000 + f" {PLANTED}", "second", "third"]
    # 20 bytes back: "second\nthird\n" and a piece of the long line, which is dropped.
    assert unitlogs.tail(path, 10, max_bytes=20) == ["second", "third"]
    assert unitlogs.tail(tmp_path / "absent", 10) == []


def test_lines_hold_no_endless_line() -> None:
    split = unitlogs.Lines(limit=8)
    assert list(split.feed(b"ab\ncdefghijkl")) == ["ab", "cdefghij" + unitlogs.CUT]
    assert list(split.feed(b"\nz")) == [""] and list(split.rest()) == ["z"]


async def test_a_streamed_command_is_bounded_and_killed_when_its_reader_leaves() -> None:
    got = b"".join([c async for c in commands.stream(["yes"], max_bytes=100_000)])
    assert len(got) == 100_000
    script = "echo $$; while :; do echo tick; sleep 0.05; done"
    stream = commands.stream(["sh", "-c", script])
    first = await anext(stream)
    pid = int(first.split()[0])
    assert alive(pid)
    await stream.aclose()  # the reader left (a client that went away)
    await eventually(lambda: not alive(pid), what="the command killed")
    with pytest.raises(commands.CommandFailed, match="exited with status 3: nope"):
        [c async for c in commands.stream(["sh", "-c", "echo nope >&2; exit 3"])]
    with pytest.raises(commands.CommandFailed, match="did not finish within 0.2s"):
        [c async for c in commands.stream(["sleep", "5"], timeout=0.2)]


async def test_a_command_cut_at_its_bound_is_reaped_every_time() -> None:
    # ``yes`` fills the pipe faster than it is read, so when the stream is cut its
    # reader has often paused on a full buffer; Python 3.11's wait() then waited for a
    # pipe that nobody read (a CI run hung here for 300 s). Many tries meet that race.
    for _ in range(100):
        got = b"".join([c async for c in commands.stream(["yes"], max_bytes=100_000)])
        assert len(got) == 100_000
    done = await commands.run(["yes"], timeout=0.2)  # the same, for run()'s timeout
    assert done.returncode is None and "did not finish within 0.2s" in done.error


# ---- the supervise backend, real engines ------------------------------------------

@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[Supervisor]:
    sup = Supervisor(tmp_path / "state", FAST)
    yield sup
    await sup.apply([UnitChange(n, "", action="remove") for n in list(sup._slots)])


async def leaky(sup: Supervisor, tmp_path: Path) -> int:
    """A unit whose engine prints its secret env at start; the running pid."""
    secret = tmp_path / "token"
    secret.write_text(PLANTED + "\n")
    text = unit_text(port=free_port(), args="--say-env LICENSE_ID")
    [result] = await sup.apply([UnitChange(unit_name(), text,
                                           secret_env={"LICENSE_ID": str(secret)})])
    assert result.ok, result.error
    return await running(sup)


async def running(sup: Supervisor, other_than: int | None = None) -> int:
    async def pid() -> int | None:
        await sup.tick()
        [obs] = await sup.observe()
        return obs.pid if obs.process == "running" and obs.pid != other_than else None

    found = await eventually(pid, what="the engine running")
    await eventually(lambda: any("]: env LICENSE_ID" in line for line in
                                 unitlogs.tail(sup.units_dir / unit_name() / "log", 50)),
                     what="the engine's first lines")
    return found


async def test_previous_is_the_run_a_sigkill_ended(supervisor: Supervisor,
                                                  tmp_path: Path) -> None:
    first = await leaky(supervisor, tmp_path)
    assert await supervisor.logs(unit_name(), Query(10, previous=True)) == []
    os.kill(first, signal.SIGKILL)
    second = await running(supervisor, other_than=first)
    previous = await supervisor.logs(unit_name(), Query(100, previous=True))
    assert f"testengine[{first}]: env LICENSE_ID=[redacted]" in previous
    assert previous[-1] == "-- llmgw: main process killed by SIGKILL"
    assert not any(f"testengine[{second}]" in line for line in previous)
    latest = await supervisor.logs(unit_name(), Query(100))  # across the last two runs
    assert latest.index(previous[-1]) < latest.index(f"testengine[{second}]: env "
                                                     "LICENSE_ID=[redacted]")
    assert not any(PLANTED in line for line in previous + latest)
    # since: the runs whose log was written since; a future time leaves none.
    assert await supervisor.logs(unit_name(), Query(100, since=2e10)) == []


async def test_previous_stays_bounded(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "state", SuperviseSettings(
        log_max_bytes=4096, restart_backoff=0.05, restart_backoff_max=0.2))
    try:
        pid = await leaky(sup, tmp_path)
        with (sup.units_dir / unit_name() / "log").open("ab") as log:
            log.write(b"z" * 20000 + b"\nthe last line\n")
        os.kill(pid, signal.SIGKILL)
        await running(sup, other_than=pid)
        kept = sup.units_dir / unit_name() / "log.previous"
        assert kept.stat().st_size <= 4096
        assert (await sup.logs(unit_name(), Query(2, previous=True)))[0] == "the last line"
    finally:
        await sup.apply([UnitChange(unit_name(), "", action="remove")])


async def test_follow_reads_on_across_a_restart(supervisor: Supervisor,
                                                tmp_path: Path) -> None:
    first = await leaky(supervisor, tmp_path)
    lines = supervisor.follow(unit_name(), Query(50))
    seen: list[str] = []

    async def until(text: str) -> None:
        async with asyncio.timeout(20):
            while not any(text in line for line in seen):
                seen.append(await anext(lines))

    try:
        await until("]: env LICENSE_ID")
        os.kill(first, signal.SIGKILL)
        second = await running(supervisor, other_than=first)
        await until(f"testengine[{second}]: env LICENSE_ID")  # the new run's file
        assert "-- llmgw: main process killed by SIGKILL" in seen
        assert not any(PLANTED in line for line in seen)
    finally:
        await lines.aclose()


# ---- over gRPC ------------------------------------------------------------------

@pytest.fixture
async def served() -> AsyncIterator[tuple[servers.Agent, AgentClient]]:
    root = short_dir()
    try:
        async with served_agent(node_settings("cpu-only", root), monitor=True) as served:
            yield served
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_logs_over_grpc(served: tuple[servers.Agent, AgentClient],
                              tmp_path: Path) -> None:
    agent, client = served
    backend = agent.backend
    assert isinstance(backend, Supervisor)
    pid = await leaky(backend, tmp_path)
    os.kill(pid, signal.SIGKILL)
    await running(backend, other_than=pid)
    previous = await client.logs(unit_name(), 100, previous=True)
    assert previous.source == "supervise log"
    assert f"testengine[{pid}]: env LICENSE_ID=[redacted]" in previous.lines
    assert (await client.logs(unit_name(), 100, since_seconds=0.0)).lines == ()
    for call, code in ((client.logs("llmgw-nothing-r0-s0.service"), "NOT_FOUND"),
                       (client.logs(unit_name(), since_seconds=-1), "INVALID_ARGUMENT")):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
        assert refused.value.code().name == code
    follow = client._stub.FollowUnitLogs(pb.UnitLogsRequest(name=unit_name(), previous=True))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await anext(aiter(follow))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stream = client.follow_logs(unit_name(), 5)
    got = await anext(stream)
    assert got.lines and not any(PLANTED in line for line in got.lines)
    with contextlib.suppress(StopAsyncIteration):
        await stream.aclose()
