"""``llmgw logs`` over real sshd nodes with the real engine: the run a SIGKILL ended.

Gemma served by llama-server on a simulated node (its agent reached over
SSH, the supervise backend running the unit), a completion asked of it,
then the engine SIGKILLed: the agent restarts it, and ``llmgw logs gemma
--previous`` shows the killed run's last lines (the request it served, how
it ended), while ``llmgw logs gemma`` shows the new run. A follow through
the pool sees the new run's request as it happens and ends when its reader
leaves. Unknown models and replicas are refused in one line, no traceback.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest
from support.plugin import SimClusterFactory
from test_real_engine import ENGINE, MODEL

from llmgw.cli.main import main
from llmgw.fleet.types import Unit
from llmgw.spec import loading
from llmgw.transport import logreads, pools

pytestmark = pytest.mark.skipif(
    not (ENGINE.exists() and MODEL.exists()),
    reason="the real engine and model are not built: run `make engine model` (make test does)",
)
KILLED = "-- llmgw: main process killed by SIGKILL"


def logs(capsys: pytest.CaptureFixture[str], directory: Path, *argv: str
         ) -> tuple[int, str, str]:
    code = main(["logs", *argv, "--cluster", str(directory)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def ready_unit(directory: Path, other_than: int | None = None, timeout: float = 180) -> Unit:
    cluster = loading.load(directory)

    async def poll() -> Unit:
        async with pools.Pool(cluster, directory) as pool:
            deadline = time.monotonic() + timeout
            while True:
                units = [u for u in (await pool.report("node-01")).units
                         if u.model == "gemma" and u.state == "ready" and u.pid != other_than]
                if units:
                    return units[0]
                assert time.monotonic() < deadline, "gemma never ready"
                await asyncio.sleep(0.5)

    return asyncio.run(poll())


def complete(port: int) -> None:
    with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                       max_retries=0, timeout=120) as client:
        assert client.completions.create(model="gemma", prompt="Hello", max_tokens=2)


async def follow_sees_a_request(directory: Path, port: int) -> list[str]:
    """Follow the log through the pool (SSH), ask for a completion, stop reading."""
    cluster = loading.load(directory)
    async with pools.Pool(cluster, directory) as pool:
        fleet = await pool.fleet()
        target = logreads.locate(fleet, "gemma")
        stream = logreads.follow(pool, target, 5)
        seen: list[str] = []
        try:
            async with asyncio.timeout(120):
                seen += (await anext(stream)).lines  # the latest lines come first
                asked = asyncio.create_task(asyncio.to_thread(complete, port))
                while not any("prompt eval time" in line for line in seen):
                    seen += (await anext(stream)).lines
                await asked
        finally:
            await stream.aclose()
        return seen


def follow_until_ctrl_c(directory: Path, port: int) -> None:
    """``llmgw logs gemma -f`` as a person runs it: a request's lines arrive, Ctrl-C ends
    it with 130 and no traceback."""
    follower = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "logs", "gemma", "-f", "-n", "1", "--cluster",
         str(directory)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in follower.stdout or ()],
                              daemon=True)
    reader.start()
    try:
        lines.get(timeout=120)  # the latest line: following now
        complete(port)
        deadline = time.monotonic() + 120
        while "prompt eval time" not in lines.get(timeout=max(0.1, deadline - time.monotonic())):
            pass
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=60) == 130
        err = (follower.stderr.read() if follower.stderr else "")
        assert err.startswith("==> gemma r0 s0 on node-01 (supervise log, following)"), err
        assert "Traceback" not in err
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        reader.join(timeout=10)
        for pipe in (follower.stdout, follower.stderr):
            if pipe is not None:
                pipe.close()


@pytest.mark.timeout(420)
def test_logs_previous_shows_the_run_a_sigkill_ended(
    sim_cluster: SimClusterFactory, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", f"{ENGINE.parent}{os.pathsep}{os.environ['PATH']}")
    sim = sim_cluster(1, hardware=["cpu-only"])
    sim.weights_dirs.append(str(MODEL.parent))  # a path source lies in weights_dirs
    directory = sim.write_cluster({"models": {"gemma": {
        "source": str(MODEL), "scaling": {"min": 1, "max": 1},
        "profiles": [{"engine": "llama.cpp", "cpu": True, "args": {"ctx-size": 2048}}],
    }}})
    assert main(["apply", "--cluster", str(directory), "--auto-approve"]) == 0
    capsys.readouterr()
    first = ready_unit(directory)
    assert first.pid is not None and first.port is not None

    code, out, err = logs(capsys, directory, "gemma", "--previous")
    assert code == 0 and out == "", out
    assert "(no earlier run is kept" in err

    complete(first.port)  # the killed run's last lines hold this request
    # llama-server prints the request's timings after it has answered, and the supervisor
    # writes them a moment later: kill only once the log holds them, or the killed run's
    # last lines may honestly end before the request's (CI saw that once)
    deadline = time.monotonic() + 60
    while True:
        code, out, err = logs(capsys, directory, "gemma", "-n", "40")
        if "prompt eval time" in out or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert "prompt eval time" in out, out
    os.kill(first.pid, signal.SIGKILL)
    second = ready_unit(directory, other_than=first.pid)
    assert second.pid is not None and second.port is not None

    code, out, err = logs(capsys, directory, "gemma", "--previous", "--lines", "40")
    assert code == 0, err
    killed = out.splitlines()
    with capsys.disabled():
        print(err + out)  # docs/operations.md, "Logs", shows this output (pytest -s)
    assert err.startswith("==> gemma r0 s0 on node-01 (supervise log, the run before the "
                          "latest)")
    assert killed[-1] == KILLED
    assert any("prompt eval time" in line for line in killed), out
    assert len(killed) <= 40

    code, out, err = logs(capsys, directory, "gemma", "--replica", "0", "-n", "3")
    assert code == 0 and len(out.splitlines()) == 3 and KILLED not in out, out

    seen = asyncio.run(follow_sees_a_request(directory, second.port))
    assert any("prompt eval time" in line for line in seen)
    follow_until_ctrl_c(directory, second.port)

    for argv, said in (
        (["nope"], "error: nope: no replica of it runs on any node (models running: gemma)"),
        (["gemma", "--replica", "7"], "error: gemma r7: no such replica (running: r0)"),
        (["gemma", "--shard", "2"], "error: gemma r0 s2: no such shard (its shards: s0)"),
        (["Bad/Name"], "error: 'Bad/Name' is not a model name"),
        (["gemma", "--since", "soon"], "error: --since 'soon': invalid duration"),
        (["gemma", "--previous", "-f"], "error: --previous and --follow do not go together"),
    ):
        code, out, err = logs(capsys, directory, *argv)
        assert code == 1 and out == "" and err.startswith(said), err
        assert "Traceback" not in err
