"""The session-end leak check (``tests/support/leaks.py``) fails a run that leaves a process.

Each case runs a small pytest of its own with the plugin, in a scratch
directory: what it reports, and that it leaves nothing behind and flags no
process of another run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.onboarding import processes

SUPPORT = Path(__file__).resolve().parents[1]

LEAKY = '''
import subprocess

def test_leaves_a_child():
    subprocess.Popen(["sleep", "300"], start_new_session=True)

def test_leaves_an_orphan():
    subprocess.run(["sh", "-c", "sleep 301 &"], check=True)

def test_cleans_up():
    child = subprocess.Popen(["sleep", "302"])
    child.kill()
    child.wait()
'''

CLEAN = '''
import subprocess

def test_cleans_up():
    child = subprocess.Popen(["sleep", "302"])
    child.kill()
    child.wait()
'''


def inner_pytest(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTHONPATH": str(SUPPORT), "LLMGW_LEAK_GRACE": "0.5"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "support.leaks", "-p", "no:cacheprovider",
         "test_inner.py"], cwd=tmp_path, env=env, text=True, capture_output=True, timeout=120)


@pytest.mark.parametrize("source, leaked", [
    pytest.param(LEAKY, {"test_leaves_a_child": "sleep 300",
                         "test_leaves_an_orphan": "sleep 301"}, id="leaky"),
    pytest.param(CLEAN, {}, id="clean"),
])
def test_the_run_fails_naming_each_process_left_and_stops_it(
    tmp_path: Path, source: str, leaked: dict[str, str]
) -> None:
    # A process of another run on this machine (not the inner pytest's): never flagged.
    other = subprocess.Popen(["sleep", "303"], start_new_session=True,
                             env={**os.environ, "LLMGW_TEST_RUN": "1 2 other-run::test"})
    try:
        result = inner_pytest(tmp_path, source)
    finally:
        other.kill()
        other.wait()
    output = result.stdout + result.stderr
    named = dict(re.findall(r"pid \d+, started by test_inner\.py::(\w+): (sleep \d+)", output))
    assert named == leaked, output
    assert "sleep 303" not in output and "sleep 302" not in output
    assert result.returncode == (1 if leaked else 0), output
    pids = [int(p) for p in re.findall(r"pid (\d+), started by", output)]
    assert not any(processes.alive(pid) for pid in pids), "the leaks were not stopped"
