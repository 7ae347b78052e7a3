"""Gated rollouts with the real engine, while a client sends requests the whole time.

``llmgw serve`` runs Gemma 3 270M on llama-server with a rollout gate (probe,
then a bake on half the traffic). An ``openai`` client sends completions from
before the first change to the end, and counts every exception and every
empty answer. Then, each change a git commit:

1. **A good change** (``ctx-size`` 2048 → 1024) rolls out through the gate: the
   new replica is probed, serves its share during the bake, is compared with
   the old one and promoted; the old engine is gone.
2. **A bad change** (``logit-bias: 1+100``, end-of-sequence forced: every
   answer is empty) fails its probe and is rolled back: the new engine is
   removed, the old one never stopped. The revision is held — in the daemon's
   status, ``llmgw status``, ``llmgw plan`` (text and pull-request Markdown),
   the metrics and the journal — and not retried by the daemon's next
   iterations.
3. ``llmgw apply --retry`` releases the hold; the daemon retries the revision,
   which fails its gate again and is held again.
4. A commit that reverts the bad change releases the hold: nothing to do.

Throughout: zero failed client requests, and no client ever got an empty
answer (the bad engine never served one).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support import daemons, nodes

from llmgw.cli.main import main

ROOT = Path(__file__).parents[2]
ENGINE = ROOT / ".cache" / "engine" / "bin" / "llama-server"
MODEL = ROOT / ".cache" / "models" / "gemma3-270m-q4_k_m.gguf"
NAME = "gemma3-270m"

pytestmark = pytest.mark.skipif(
    not (ENGINE.exists() and MODEL.exists()),
    reason="the real engine and model are not built: run `make engine model` (make test does)",
)

CLUSTER = """\
cluster:
  name: local
  sync: auto
  drift_interval: 5s
  auth: none
  listeners: {{router: "127.0.0.1:{router}", admin: "127.0.0.1:{admin}",
               metrics: "127.0.0.1:{metrics}"}}
  store: {{path: {state}/llmgw.db}}
  agent_socket: {state}/agent.sock
  rollout:
    bake: 15s
    share: 0.5
    compare: {{min_requests: 2, max_ttft_ratio: 20}}
nodes:
  local: {{address: local, weights_dirs: [{models}], engine_ports_from: {engines}}}
models:
  gemma3-270m:
    source: {model}
    profiles:
      - engine: llama.cpp
        cpu: true
        min_memory_gb: 1
        args:
          ctx-size: 2048
          threads: 1
          parallel: 1
          no-jinja: true
          chat-template: gemma
"""


def engines() -> dict[int, list[str]]:
    """Every llama-server serving the test model: pid → argv."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if argv[0].endswith("llama-server") and str(MODEL) in argv:
                found[int(entry.name)] = argv
    return found


def commit(directory: Path, text: str, message: str) -> str:
    """Commit ``text`` as cluster.yaml *before* the file changes on disk, so the daemon never
    reads the new file under the old revision; the new revision."""
    git = ["git", "-C", str(directory), "-c", "user.email=ops@example.com",
           "-c", "user.name=ops"]

    def run(*args: str, stdin: str | None = None) -> str:
        return subprocess.run([*git, *args], check=True, capture_output=True, text=True,
                              input=stdin).stdout.strip()

    if not (directory / ".git").exists():
        run("init", "-q")
    blob = run("hash-object", "-w", "--stdin", stdin=text)
    run("update-index", "--add", "--cacheinfo", f"100644,{blob},cluster.yaml")
    run("commit", "-qm", message)
    run("checkout", "--", "cluster.yaml")
    return run("rev-parse", "--short=12", "HEAD")


class Client(threading.Thread):
    """Completions through the router, one after another, until stopped."""

    def __init__(self, router: str) -> None:
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=f"{router}/v1", api_key="unused", max_retries=0,
                                    timeout=120)
        self.stop = threading.Event()
        self.sent = 0
        self.failures: list[str] = []
        self.empty = 0

    def run(self) -> None:
        while not self.stop.is_set():
            self.sent += 1
            try:
                if self.sent % 2:
                    answer = self.client.completions.create(
                        model=NAME, prompt="The capital of France is", max_tokens=4)
                    text = answer.choices[0].text
                else:
                    text = "".join(chunk.choices[0].text for chunk in self.client.completions
                                   .create(model=NAME, prompt="One, two, three,", max_tokens=4,
                                           stream=True) if chunk.choices)
            except openai.OpenAIError as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            if text == "":
                self.empty += 1


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict[str, Any]]:
    directory, state = tmp_path / "cluster", tmp_path / "state"
    directory.mkdir()
    state.mkdir()
    env = {**os.environ, "PATH": f"{ENGINE.parent}{os.pathsep}{os.environ['PATH']}"}
    daemon = daemons.Daemon(directory, tmp_path / "serve.log", env=env)
    text = CLUSTER.format(**daemon.ports, state=state, models=MODEL.parent, model=MODEL,
                          engines=nodes.free_ports(32))
    revision = commit(directory, text, "gemma3-270m behind a rollout gate")
    process = daemon.start()
    info = {"daemon": daemon, "process": process, "dir": directory, "state": state,
            "log": daemon.log, "text": text, "revision": revision, "env": env,
            "router": daemon.router, "admin": daemon.admin, "metrics": daemon.metrics}
    try:
        yield info
    finally:
        daemon.stop(signal.SIGINT)


def status(info: dict[str, Any]) -> dict[str, Any]:
    return info["daemon"].status()  # type: ignore[no-any-return]


def wait_for(info: dict[str, Any], check: Any, what: str, timeout: float = 420) -> dict[str, Any]:
    return info["daemon"].wait(check, what, timeout, poll=0.5)  # type: ignore[no-any-return]


def settled(s: dict[str, Any]) -> bool:
    ready = [r for r in s["replicas"] if r["state"] == "ready"]
    return len(ready) == 1 and len(s["replicas"]) == 1 and not (
        s["plan"] or {}).get("has_changes", True)


def journal(info: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["history", "--cluster", str(info["dir"]), "--json"]) == 0
    entries: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return list(reversed(entries))  # oldest first


def cli(info: dict[str, Any], capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    main([*args, "--cluster", str(info["dir"])])
    return capsys.readouterr().out


def test_a_good_change_rolls_out_and_a_bad_one_rolls_back_with_no_client_error(
    served: dict[str, Any], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", served["env"]["PATH"])
    wait_for(served, settled, "the first replica")
    (first_pid, _), = engines().items()
    client = Client(served["router"])
    client.start()
    try:
        # 1. A good change rolls out through the gate.
        good = served["text"].replace("ctx-size: 2048", "ctx-size: 1024")
        commit(served["dir"], good, "smaller context")
        wait_for(served, lambda s: settled(s) and first_pid not in engines(),
                 "the good change to roll out")
        (good_pid, good_argv), = engines().items()
        assert good_argv[good_argv.index("--ctx-size") + 1] == "1024"
        rolled_out = journal(served, capsys)[-1]
        (change,) = rolled_out["changes"]
        assert change["action"] == "replace" and change["outcome"] == "ok"
        assert change["gate"].startswith("passed: error rate ")  # compared, not probe only
        assert rolled_out["gate"] == "passed" and change["rolled_back"] is None

        # 2. A bad change (every answer empty) fails its probe and is rolled back.
        bad = good.replace("chat-template: gemma", "chat-template: gemma\n          "
                           "logit-bias: \"1+100\"")
        bad_revision = commit(served["dir"], bad, "bias towards end of sequence")
        held = wait_for(served, lambda s: s["held"] and settled_held(s), "the hold")["held"]
        reason = "probe answer holds no completion text"
        line = f"held: revision {bad_revision[:7]} failed its gate: {reason}"
        assert [h["line"] for h in held] == [line]
        assert list(engines()) == [good_pid]  # the old engine was never touched
        entries = journal(served, capsys)
        applied, undone = entries[-2:]
        (change,) = applied["changes"]
        assert (change["action"], change["outcome"], change["rolled_back"]) == (
            "replace", "failed", True)
        assert change["gate"] == f"failed: {reason}"
        assert applied["gate"] == f"failed: {NAME} r{change['replica']}: {reason}"
        assert undone["rollback_of"] == applied["id"]
        (removal,) = undone["changes"]
        assert (removal["action"], removal["replica"], removal["outcome"]) == (
            "destroy", change["new_replica"], "ok")

        # Held: the plan, the status command, the PR comment and the metrics say so, and
        # the daemon's next iterations do not retry it.
        text = cli(served, capsys, "plan")
        assert f"= {NAME}: {line}" in text and "1 model held (failed a rollout gate)." in text
        assert "0 to replace" in text
        assert line in cli(served, capsys, "plan", "--format", "markdown")
        assert f"{NAME}: {line}" in cli(served, capsys, "status")
        metrics = httpx.get(f"{served['metrics']}/metrics", timeout=5).text
        assert f'llmgw_rollout_held{{model="{NAME}"}} 1.0' in metrics
        assert f'llmgw_rollout_gates_total{{model="{NAME}",result="rolled_back"}} 1.0' in metrics
        iterations = status(served)["iterations"]
        wait_for(served, lambda s: s["iterations"] >= iterations + 2, "two more iterations")
        assert len(journal(served, capsys)) == len(entries)
        assert list(engines()) == [good_pid]

        # 3. `llmgw apply --retry` releases the hold: the daemon retries, and holds again.
        out = cli(served, capsys, "apply", "--retry", NAME)
        assert f"released {NAME} ({line})" in out
        wait_for(served, lambda s: len(journal_quiet(served)) >= len(entries) + 2
                 and s["held"] and settled_held(s), "the retry to fail its gate again")
        assert [h["line"] for h in status(served)["held"]] == [line]
        assert list(engines()) == [good_pid]

        # 4. A commit that reverts the bad change releases the hold.
        commit(served["dir"], good, "revert the bias")
        wait_for(served, lambda s: not s["held"] and settled(s), "the hold's release")
        assert list(engines()) == [good_pid]
    finally:
        client.stop.set()
        client.join(timeout=180)
    assert client.sent > 20
    assert client.failures == []
    assert client.empty == 0  # the bad engine never answered a client


def settled_held(s: dict[str, Any]) -> bool:
    """One ready replica and nothing to do but what is held."""
    return (len(s["replicas"]) == 1 and s["replicas"][0]["state"] == "ready"
            and not (s["plan"] or {}).get("has_changes", True))


def journal_quiet(info: dict[str, Any]) -> list[dict[str, Any]]:
    out = subprocess.run([sys.executable, "-m", "llmgw", "history", "--cluster",
                          str(info["dir"]), "--json"], capture_output=True, text=True,
                         check=True, env=info["env"]).stdout
    entries: list[dict[str, Any]] = json.loads(out)
    return entries
