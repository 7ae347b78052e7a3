"""``llmgw node add`` at a terminal, run twice, then upgraded to a newer llmgw.

One bare simulated node with the H100/InfiniBand fixture hardware (an
``agent.yaml`` with its ``hardware:`` section is on the node before, as an
operator leaves one where nvidia-smi is not on PATH; ``node add`` keeps it):

1. The real CLI in a pseudo-terminal: the checklist, drawn and redrawn in
   place; the host key question, answered; the question of which declared
   fabric the InfiniBand adapters are on, answered; the answers in nodes.yaml.
2. Again, without a terminal, the answers as flags: nothing changes on the
   node (its files, the agent process) or in nodes.yaml.
3. An engine started there; then ``node add`` from a scratch copy of llmgw
   whose version is newer: the agent is upgraded and restarted, the engine
   keeps its pid, and the next report carries the new version.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import nodes
from support.engines import MODELS, STUBS, running
from support.plugin import SimClusterFactory
from test_enrolments import WHEELS, site

from llmgw import __version__
from llmgw.onboarding import enrolments, yamledits

REPO = Path(__file__).resolve().parents[2]
NEWER = __version__ + ".post1"  # what the scratch copy calls itself
ANSWER_TIMEOUT = 600.0

pytestmark = pytest.mark.skipif(not shutil.which(nodes.SSHD), reason="sshd not installed")


class Terminal:
    """A command in a pseudo-terminal: read what it draws, type answers."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(argv, cwd=cwd, stdin=slave, stdout=slave, stderr=slave,
                                        env={**os.environ, "TERM": "xterm", "COLUMNS": "80"},
                                        start_new_session=True)
        os.close(slave)
        self.screen = ""  # everything drawn so far, escape sequences included
        self.seen = 0  # where the last match ended

    def expect(self, pattern: str) -> re.Match[str]:
        """Read until ``pattern`` appears in what was drawn after the last match."""
        start = self.seen
        deadline = time.monotonic() + ANSWER_TIMEOUT
        while True:
            found = re.compile(pattern).search(self.screen, start)
            if found:
                self.seen = found.end()
                return found
            if time.monotonic() > deadline or not self._read():
                raise AssertionError(f"never drawn: {pattern!r}; drawn:\n{self.screen[start:]}")

    def type(self, line: str) -> None:
        os.write(self.master, (line + "\r").encode())

    def finish(self) -> int:
        while self._read():
            pass
        return self.process.wait(timeout=60)

    def close(self) -> None:
        """Kill the command if it still runs (a failed expectation), and the terminal."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)
        os.close(self.master)

    def _read(self) -> bool:
        ready, _, _ = select.select([self.master], [], [], 1.0)
        if not ready:
            return self.process.poll() is None
        try:
            data = os.read(self.master, 65536)
        except OSError:  # the command exited and the terminal closed
            return False
        self.screen += data.decode(errors="replace")
        return bool(data)


def fingerprints(prefix: Path) -> dict[str, str]:
    """Every file `node add` writes on the node, with its content's digest and mtime."""
    found = {}
    for path in sorted([*(prefix / "etc").iterdir(), prefix / "run" / "agent.pid"]):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        found[path.name] = f"{digest} {path.stat().st_mtime_ns}"
    return found


def agent_pid(prefix: Path) -> int:
    return int((prefix / "run" / "agent.pid").read_text())


def scratch_newer(tmp_path: Path) -> Path:
    """A copy of this llmgw that calls itself NEWER (what a release would be)."""
    copy = tmp_path / "newer"
    shutil.copytree(REPO / "llmgw", copy / "llmgw",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    shutil.copy(REPO / "README.md", copy / "README.md")
    for name in ("pyproject.toml", "llmgw/__init__.py"):
        path = copy / name
        text = path.read_text()
        assert f'"{__version__}"' in text
        path.write_text(text.replace(f'"{__version__}"', f'"{NEWER}"', 1))
    return copy


@pytest.mark.e2e
@pytest.mark.timeout(900)  # three node adds, one a rebuild and upgrade: 300 s each at most
def test_terminal_add_then_again_then_upgrade_in_place(
    sim_cluster: SimClusterFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    try:
        enrolments.build_wheels(WHEELS)
    except enrolments.EnrolError as exc:
        pytest.skip(f"cannot build the wheels to ship (no package index here?): {exc}")
    sim = sim_cluster(1, agents=False, prefix="bare", hardware=["h100-ib"])
    node = sim.nodes["bare-01"]
    cluster = site(tmp_path, sim)
    prefix = node.root / "opt"
    (prefix / "etc").mkdir(parents=True)
    hardware = nodes.fixture_settings("h100-ib")["hardware"]
    (prefix / "etc" / "agent.yaml").write_text(f"hardware: {json.dumps(hardware)}\n")
    base = ["node", "add", f"root@127.0.0.1:{node.port}", "--cluster", str(cluster),
            "--prefix", str(prefix), "--wheels", str(WHEELS), "--name", "gpu-01"]

    # 1. At a terminal: a checklist, two questions.
    term = Terminal([sys.executable, "-m", "llmgw", *base], tmp_path)
    try:
        term.expect(r"· host key\s*\r\n  · preflight\s*\r\n  · account\s*\r\n  · install\s*\r\n"
                    r"  · agent\s*\r\n"
                    r"  · report\s*\r\n  · compiler\s*\r\n  · fabrics\s*\r\n  · nodes\.yaml")
        term.expect(rf"» host key   \[127\.0\.0\.1\]:{node.port} offers a key not pinned yet")
        question = (f"{node.host_fingerprint()}: is this the key the node's console shows "
                    "(`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`)? [yes/no] ")
        term.expect(re.escape(question))
        assert (cluster / "known_hosts").read_text() == ""  # nothing pinned before the answer
        term.type("yes")
        # Redrawn in place: up over the 9 rows and the question with its answer (as 80
        # columns wrap them), clear, draw again.
        term.expect(rf"\x1b\[{9 + math.ceil(len(question + 'yes') / 80)}F\x1b\[J  » host key")
        term.expect(r"\x1b\[9F\x1b\[J  ✓ host key   SHA256:\S+ pinned in ")
        term.expect(r"» install    .*\(\d+s\)")  # what a running step does, and for how long
        term.expect(r"✓ report     8 GPUs, \d+ GiB, 4 RDMA adapters")
        # This machine's PATH, which the simulated node's sessions have: gcc is there.
        term.expect(r"✓ compiler   (gcc|clang) \S* ?already there")
        term.expect(r"InfiniBand adapters mlx5_0, mlx5_1, mlx5_2, mlx5_3 \(SM LID 0x1, GID "
                    r"prefix fe80:0000:0000:0000\): on which fabric\? "
                    r"\[ib-a/none\] ")
        term.type("ib-b")
        term.expect(r"'ib-b' is not a declared fabric\. InfiniBand adapters")
        term.type("ib-a")
        term.expect(r"✓ fabrics    ib-a: mlx5_0, mlx5_1, mlx5_2, mlx5_3")
        term.expect(r"✓ nodes\.yaml gpu-01 written; commit this:")
        assert term.finish() == 0, term.screen
        assert "+      ib-a: [mlx5_0, mlx5_1, mlx5_2, mlx5_3]" in term.screen
        assert "✗" not in term.screen and "Traceback" not in term.screen
    finally:
        term.close()
    nodes_yaml = (cluster / "nodes.yaml").read_text()
    assert "    fabrics:\n      ib-a: [mlx5_0, mlx5_1, mlx5_2, mlx5_3]\n" in nodes_yaml
    assert "hardware: {" in (prefix / "etc" / "agent.yaml").read_text()  # kept

    # 2. Again, without a terminal, the answers as flags: one line per step, nothing changes.
    before, pid = fingerprints(prefix), agent_pid(prefix)
    again = subprocess.run(
        [sys.executable, "-m", "llmgw", *base, "--fingerprint", node.host_fingerprint(),
         "--fabric", "ib-a=mlx5_0,mlx5_1,mlx5_2,mlx5_3"],
        cwd=tmp_path, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [line[:11] for line in again.stdout.splitlines()] == [
        "host key   ", "preflight  ", "account    ", "install    ", "agent      ", "report     ",
        "compiler   ", "fabrics    ", "nodes.yaml "]
    assert "\x1b" not in again.stdout
    assert f"agent      running (supervise backend, pid {pid})" in again.stdout
    assert "nodes.yaml gpu-01 unchanged" in again.stdout
    assert fingerprints(prefix) == before and nodes._alive(pid)
    assert (cluster / "nodes.yaml").read_text() == nodes_yaml

    # 3. An engine on the node, then a newer llmgw: the agent alone is restarted.
    records = tmp_path / "records"
    records.mkdir()
    tiny = json.loads(json.dumps(MODELS["tiny"]))
    tiny["pricing"] = {"input_per_mtok": 0.1, "output_per_mtok": 0.4}  # init's budget binds
    tiny["profiles"][0]["env"] = {
        "TESTENGINE_RECORD_DIR": str(records),
        "PATH": f"{STUBS}:{Path(sys.executable).parent}:/usr/bin:/bin"}
    (cluster / "models.yaml").write_text(json.dumps({"models": {"tiny": tiny}}))
    # The node shares this machine's ports: its engine on a free block, not 18000.
    placed, _ = yamledits.set_node_key((cluster / "nodes.yaml").read_text(), "gpu-01",
                                       "engine_ports_from", nodes.free_ports(32))
    # tiny's source is a path: the node serves it from its weights_dirs only.
    placed, _ = yamledits.set_node_key(placed, "gpu-01", "weights_dirs", ["/models"])
    (cluster / "nodes.yaml").write_text(placed)
    try:
        applied = subprocess.run(
            # --force: the site's old-01 is unreachable and never reported, so a max-1
            # model is otherwise held back lest it run twice (planning/unseen.py).
            [sys.executable, "-m", "llmgw", "apply", "--cluster", str(cluster),
             "--auto-approve", "--force", "--ready-timeout", "60s"],
            cwd=tmp_path, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        engine = running(records)["tiny"]["pid"]

        newer = scratch_newer(tmp_path)
        upgraded = subprocess.run(
            [sys.executable, "-m", "llmgw", *base, "--fingerprint", node.host_fingerprint(),
             "--fabric", "ib-a=mlx5_0,mlx5_1,mlx5_2,mlx5_3"],
            cwd=tmp_path, capture_output=True, text=True, stdin=subprocess.DEVNULL,
            timeout=300, env={**os.environ, "PYTHONPATH": str(newer)})
        out = upgraded.stdout + upgraded.stderr
        assert upgraded.returncode == 0, out
        assert f"install    llmgw {NEWER} into {prefix}/venv (1 of " in out
        assert f"agent      restarted (supervise backend, pid {agent_pid(prefix)};" in out
        assert agent_pid(prefix) != pid and not nodes._alive(pid)
        assert f"agent {NEWER} (first report" in out  # the report of the new agent
        assert running(records)["tiny"]["pid"] == engine  # the engine was not restarted
        assert "nodes.yaml gpu-01 unchanged" in out
        status = subprocess.run(
            [sys.executable, "-m", "llmgw", "doctor", "gpu-01", "--json", "--cluster",
             str(cluster)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        checks = {f["check"]: f for f in json.loads(status.stdout)["nodes"]["gpu-01"]}
        assert checks["agent-version"]["detail"] == f"agent {NEWER}, this llmgw {__version__}"
    finally:
        for data in running(records).values():
            try:
                os.killpg(data["pgid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
