"""The signals of ``llmgw serve``, in-process: what each one asks for, and the exit status.

The processes themselves (agent, engines, workers) are checked end to end in
tests/e2e/test_serve_signals.py; this is the decision table, in milliseconds.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from llmgw.daemon import lifetimes

INT, TERM = signal.SIGINT, signal.SIGTERM


@pytest.mark.parametrize(("received", "stop", "hurry", "status"), [
    pytest.param([], False, False, 0, id="none"),
    pytest.param([INT], True, False, 0, id="Ctrl-C: an orderly stop, exit 0"),
    pytest.param([TERM], True, False, 0, id="SIGTERM: an orderly stop, exit 0"),
    pytest.param([INT, INT], True, True, 130, id="Ctrl-C twice: at once, 130"),
    pytest.param([TERM, TERM], True, True, 143, id="SIGTERM twice: at once, 143"),
    pytest.param([TERM, INT], True, True, 130, id="the second one names the status"),
    pytest.param([INT, INT, TERM], True, True, 130, id="a third changes nothing"),
])
async def test_signals_decide_the_stop_and_the_exit_status(
    received: list[signal.Signals], stop: bool, hurry: bool, status: int,
) -> None:
    signals = lifetimes.Signals()
    hurried: list[bool] = []
    signals.on_hurry(lambda: hurried.append(True))
    for signum in received:
        signals.received_signal(signum)
    assert (signals.stop.is_set(), signals.hurry.is_set()) == (stop, hurry)
    assert hurried == ([True] if hurry else [])
    if received:
        assert signals.exit_status() == status


async def test_real_signals_reach_the_handlers() -> None:
    loop = asyncio.get_running_loop()
    signals = lifetimes.Signals()
    signals.install(loop)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(signals.stop.wait(), 30)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(signals.hurry.wait(), 30)
    finally:
        signals.remove(loop)
    assert signals.exit_status() == 143


async def test_a_task_that_fails_stops_the_process_with_status_1() -> None:
    signals = lifetimes.Signals()
    process = lifetimes._Process(signals)

    async def broken() -> None:
        raise RuntimeError("a bug")

    async def patient() -> None:
        await signals.stop.wait()

    async with process.stack:
        process.task(patient(), "patient")
        process.task(broken(), "broken")
        await asyncio.wait_for(signals.stop.wait(), 30)
    assert process.failed
