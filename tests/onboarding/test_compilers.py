"""``node add``'s compiler step: facts in, one action out; then over a real sshd, with a
stand-in package manager on the node's PATH that really runs.

The simulated node is this machine, which has gcc: its sessions get a PATH of
their own (``compilerless_path``), this machine's programs without any C
compiler or package manager, behind a directory holding the stand-in
``apt-get`` (a real executable: it records its argv and writes a ``gcc``
script beside itself).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import sys
from pathlib import Path

import pytest
from support import nodes
from support.plugin import SimClusterFactory

from llmgw.fleet.types import Gpu, NodeReport
from llmgw.onboarding import compilers, enrolments, preflights
from llmgw.spec import loading

pytestmark = pytest.mark.skipif(not shutil.which(nodes.SSHD), reason="sshd not installed")

APT_BARE = ("env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y "
            "--no-install-recommends")
APT = f"{APT_BARE} gcc libc6-dev"
INSTALL = "-o DPkg::Lock::Timeout=120 install -y --no-install-recommends gcc libc6-dev"
APT_UPDATE = "env DEBIAN_FRONTEND=noninteractive apt-get update -q"
GCC = compilers.Found(compiler="gcc", version="12.2.0", cc=True, package_manager="apt-get")
NONE_APT = compilers.Found(package_manager="apt-get")
HEADERLESS = compilers.Found("gcc", "12.2.0", True, "apt-get", python_headers=False)
NONE_DNF = compilers.Found(package_manager="dnf")


@pytest.mark.parametrize(("found", "gpus", "root", "wanted", "kind", "detail", "command"), [
    pytest.param(NONE_APT, 8, True, True, "install", "installing gcc with apt-get",
                 f"{APT} || {{ {APT_UPDATE} && {APT}; }}", id="apt, as root"),
    pytest.param(NONE_APT, 8, False, True, "install", "installing gcc with apt-get",
                 f"sudo -n {APT} || {{ sudo -n {APT_UPDATE} && sudo -n {APT}; }}",
                 id="apt, not root: sudo -n"),
    pytest.param(NONE_DNF, 4, True, True, "install", "installing gcc with dnf",
                 "dnf -y install gcc", id="dnf"),
    pytest.param(NONE_DNF, 4, False, True, "install", "installing gcc with dnf",
                 "sudo -n dnf -y install gcc", id="dnf, not root: sudo -n"),
    pytest.param(compilers.Found(package_manager="zypper"), 1, True, True, "install",
                 "installing gcc with zypper", "zypper --non-interactive install gcc",
                 id="zypper"),
    pytest.param(compilers.Found(), 8, False, True, "cannot",
                 "no gcc or clang here, and no apt-get, dnf, yum or zypper to install them: "
                 "install gcc (and python3's headers), or pass --no-compiler", "",
                 id="no package manager"),
    pytest.param(HEADERLESS, 8, True, True, "install",
                 "installing python3-dev with apt-get (gcc 12.2.0 is there)",
                 f"{APT_BARE} python3-dev || {{ {APT_UPDATE} && {APT_BARE} python3-dev; }}",
                 id="gcc there, python3's Python.h not"),
    pytest.param(compilers.Found(package_manager="dnf", python_headers=False), 8, False, True,
                 "install", "installing gcc and python3-devel with dnf",
                 "sudo -n dnf -y install gcc python3-devel", id="neither, dnf"),
    pytest.param(HEADERLESS, 8, True, False, "skip",
                 "skipped (--no-compiler): no python3's Python.h here (gcc 12.2.0 is there); "
                 "Triton needs them when vLLM or SGLang first loads a model", "",
                 id="--no-compiler, no headers"),
    pytest.param(GCC, 8, False, True, "present", "gcc 12.2.0 already there", "",
                 id="gcc already there"),
    pytest.param(compilers.Found(compiler="clang", version="16.0.6"), 8, True, True, "present",
                 "clang 16.0.6 already there", "", id="clang already there"),
    pytest.param(compilers.Found(cc=True, package_manager="apt-get"), 8, True, True, "install",
                 "installing gcc with apt-get (a cc is there, but Triton looks for gcc or "
                 "clang)", f"{APT} || {{ {APT_UPDATE} && {APT}; }}", id="cc alone is not enough"),
    pytest.param(NONE_APT, 0, True, True, "skip",
                 "skipped: no GPU, vLLM and SGLang are not installed here", "", id="no GPU"),
    pytest.param(GCC, 0, True, True, "skip",
                 "skipped: no GPU, vLLM and SGLang are not installed here", "",
                 id="no GPU, gcc or not"),
    pytest.param(NONE_APT, 8, True, False, "skip",
                 "skipped (--no-compiler): no gcc or clang here; Triton needs them when vLLM "
                 "or SGLang first loads a model", "", id="--no-compiler"),
    pytest.param(GCC, 8, True, False, "present", "gcc 12.2.0 already there", "",
                 id="--no-compiler, gcc there: said so"),
])
def test_the_step_decides_from_the_facts(
    found: compilers.Found, gpus: int, root: bool, wanted: bool, kind: str, detail: str,
    command: str,
) -> None:
    action = compilers.decide(found, gpus=gpus, root=root, wanted=wanted)
    assert (action.kind, action.detail, action.command) == (kind, detail, command)


def test_preflight_reads_the_probe() -> None:
    # Recorded: the preflight's output on a Debian 12 node with gcc 12, and on a bare one.
    found = preflights.parse_preflight(
        "uid=0\nsudo=no\npython=3.11.2\nvenv=yes\ninit=systemd\nhostname=gpu-07\n"
        "disk_kib=99999999\ncompiler=gcc\ncompiler_version=12.2.0\ncc=yes\npython_h=yes\n"
        "package_manager=apt-get\n").compiler
    assert found == compilers.Found("gcc", "12.2.0", True, "apt-get", python_headers=True)
    bare = preflights.parse_preflight("uid=1000\nsudo=yes\npackage_manager=dnf\n").compiler
    assert bare == NONE_DNF
    # What the node says is untrusted: a version that is no version is dropped, a
    # compiler or package manager not ours is none.
    odd = compilers.parse("compiler=tcc\ncompiler_version=1.2\x1b[31m\npackage_manager=pip\n"
                          "python_h=maybe\n")
    assert odd == compilers.Found()
    assert "command -v $c" in preflights.PREFLIGHT.format(prefix="/opt/llmgw")


def test_a_failed_install_says_what_the_package_manager_said() -> None:
    both = compilers.decide(compilers.Found(package_manager="dnf", python_headers=False),
                            gpus=1, root=True, wanted=True)
    assert compilers.failure(both, "dnf", 1, "Last metadata check: 0:01:02 ago\nError: "
                             "Unable to find a match: gcc\n") == (
        "installing gcc and python3-devel with dnf failed (exit 1): Error: Unable to find a "
        "match: gcc; install it yourself, or pass --no-compiler")
    gcc = compilers.decide(NONE_APT, gpus=1, root=True, wanted=True)
    assert compilers.failure(gcc, "apt-get", None, "") == (
        "installing gcc with apt-get failed (no exit); install it yourself, or pass "
        "--no-compiler")


@pytest.mark.parametrize(("before", "after", "line"), [
    (NONE_APT, GCC, "gcc 12.2.0 installed with apt-get"),
    (compilers.Found(package_manager="apt-get", python_headers=False), GCC,
     "gcc 12.2.0 installed with apt-get, and python3-dev"),
    (HEADERLESS, GCC, "python3-dev installed with apt-get (gcc 12.2.0 was there)"),
    (NONE_APT, NONE_APT, ""),  # it said it worked; the probe says otherwise
    (HEADERLESS, HEADERLESS, ""),
])
def test_the_line_after_an_install_is_what_the_probe_saw(
    before: compilers.Found, after: compilers.Found, line: str,
) -> None:
    action = compilers.decide(before, gpus=1, root=True, wanted=True)
    assert compilers.installed(action, before, after) == line


STANDIN_APT = """#!/bin/sh
# A stand-in apt-get (tests/onboarding/test_compilers.py): records its argv, then
# "installs" gcc beside itself; with apt-get.fail there, an install fails as apt's does.
here=$(dirname "$0")
printf '%s\\n' "DEBIAN_FRONTEND=$DEBIAN_FRONTEND uid=$(id -u) $*" >> "$here/apt-get.calls"
case " $* " in *" install "*) ;; *) exit 0;; esac
if [ -e "$here/apt-get.fail" ]; then echo "E: Unable to locate package gcc" >&2; exit 100; fi
printf '#!/bin/sh\\necho 12.2.0\\n' > "$here/gcc"
chmod +x "$here/gcc"
"""
# What a node without a compiler lacks; the package managers are the stand-in's.
NOT_ON_THE_NODE = re.compile(r"^(c\+\+|cc|c89.*|c99.*|g\+\+.*|gcc.*|clang.*|tcc|cpp.*|"
                             r".*-linux-gnu-.*|apt|apt-get|dnf|yum|zypper)$")


def compilerless_path(where: Path) -> tuple[Path, str]:
    """A directory for the stand-in package manager, and a PATH of it and a copy (in
    symlinks) of this machine's PATH without compilers or package managers."""
    standin, farm = where / "standin", where / "system"
    standin.mkdir()
    farm.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in sorted(os.listdir(directory)):
            source = Path(directory) / entry
            if NOT_ON_THE_NODE.match(entry) or (farm / entry).exists() or \
                    not os.access(source, os.X_OK) or source.is_dir():
                continue
            (farm / entry).symlink_to(source)
    return standin, f"{standin}:{farm}"


def standin_apt(standin: Path) -> None:
    apt = standin / "apt-get"
    apt.write_text(STANDIN_APT)
    apt.chmod(apt.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class _Steps:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def begin(self, step: str, doing: str) -> None:
        pass

    def done(self, step: str, detail: str) -> None:
        self.lines.append(f"{step} {detail}")


H100S = NodeReport(node="gpu-01", gpus=[
    Gpu(index=i, uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3", gpu_class="h100-80g")
    for i in range(8)])


@pytest.mark.timeout(180)
def test_the_step_installs_gcc_over_ssh_once_and_stops_on_a_failure(
    sim_cluster: SimClusterFactory, tmp_path: Path,
) -> None:
    """Over a real sshd: preflight sees no compiler on the node's PATH and the stand-in
    apt-get; the step runs it (as root: no sudo), the probe after it finds the gcc it
    wrote; a rerun says "already there" and runs nothing; a failing apt-get is a doubt
    that stops node add with the fix, or is gone past and kept for nodes.yaml."""
    sim = sim_cluster(1, agents=False, prefix="bare")
    node = sim.nodes["bare-01"]
    standin, path = compilerless_path(tmp_path)
    standin_apt(standin)
    node.env["PATH"] = path
    node.restart_sshd()
    cluster = sim.write_cluster()
    spec = loading.load(cluster)

    async def step(report: NodeReport, **kw: object) -> tuple[_Steps, preflights.Facts]:
        steps = _Steps()
        enrolment = enrolments.Enrolment(
            spec, cluster, enrolments.Target("root", "127.0.0.1", node.port), "bare-01",
            str(node.root / "opt"), Path(str(spec.cluster.ssh.identity_file)), steps,
            tmp_path / "wheels", **kw)  # type: ignore[arg-type]
        await enrolment.pin(node.host_fingerprint(), lambda _: False)
        async with await enrolment.connect() as conn:
            facts = await enrolment.preflight(conn)
            try:
                await enrolment.compiler(conn, facts, report)
            finally:
                steps.lines.extend(f"passed {p}" for p in enrolment.passed)
        return steps, facts

    calls = standin / "apt-get.calls"
    # No GPU: nothing looked for, nothing run.
    steps, facts = asyncio.run(step(NodeReport(node="bare-01")))
    assert facts.compiler == compilers.Found(package_manager="apt-get", python_headers=True), \
        "gcc seen: " + path
    assert steps.lines[-1] == "compiler skipped: no GPU, vLLM and SGLang are not installed here"
    assert not calls.exists()

    # A failing apt-get: a doubt; without --continue-past node add stops with the fix.
    (standin / "apt-get.fail").write_text("")
    with pytest.raises(enrolments.EnrolError) as stopped:
        asyncio.run(step(H100S))
    assert str(stopped.value).startswith(
        "compiler: installing gcc with apt-get failed (exit 100): E: Unable to locate package "
        "gcc; install it yourself, or pass --no-compiler; the agent runs, nodes.yaml is "
        "unchanged. Fix it, or pass --continue-past"), str(stopped.value)
    # It read the package lists once and tried again before giving up.
    assert calls.read_text().splitlines() == [
        f"DEBIAN_FRONTEND=noninteractive uid=0 {a}" for a in (INSTALL, "update -q", INSTALL)]
    steps, _ = asyncio.run(step(H100S, go_on=lambda step, doubts: True))
    assert steps.lines[-2:] == [
        "compiler none, gone past: installing gcc with apt-get failed (exit 100): E: Unable to "
        "locate package gcc; install it yourself, or pass --no-compiler",
        "passed compiler: installing gcc with apt-get failed (exit 100): E: Unable to locate "
        "package gcc; install it yourself, or pass --no-compiler"]
    assert not (standin / "gcc").exists()

    # apt-get works: gcc installed, found by the probe after it.
    (standin / "apt-get.fail").unlink()
    calls.unlink()
    steps, _ = asyncio.run(step(H100S))
    assert steps.lines[-1] == "compiler gcc 12.2.0 installed with apt-get", steps.lines
    assert calls.read_text() == (
        "DEBIAN_FRONTEND=noninteractive uid=0 -o DPkg::Lock::Timeout=120 install -y "
        "--no-install-recommends gcc libc6-dev\n")
    assert (standin / "gcc").exists()

    # Again: already there, nothing run.
    steps, facts = asyncio.run(step(H100S))
    assert facts.compiler == compilers.Found("gcc", "12.2.0", False, "apt-get", True)
    assert steps.lines[-1] == "compiler gcc 12.2.0 already there"
    assert len(calls.read_text().splitlines()) == 1


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_node_add_installs_gcc_on_a_gpu_node_without_one(
    sim_cluster: SimClusterFactory, tmp_path: Path,
) -> None:
    """The real ``llmgw node add`` of a bare node with the H100 fixture's hardware (its
    report lists 8 GPUs) whose PATH has no compiler and the stand-in apt-get: the compiler
    step installs gcc, after the report; a rerun finds it there."""
    import subprocess

    from test_enrolments import WHEELS, site

    try:
        enrolments.build_wheels(WHEELS)
    except enrolments.EnrolError as exc:
        pytest.skip(f"cannot build the wheels to ship (no package index here?): {exc}")
    sim = sim_cluster(1, agents=False, prefix="gpu", hardware=["h100-ib"])
    node = sim.nodes["gpu-01"]
    standin, path = compilerless_path(tmp_path)
    standin_apt(standin)
    node.env["PATH"] = path
    node.restart_sshd()
    cluster = site(tmp_path, sim)
    prefix = node.root / "opt"
    (prefix / "etc").mkdir(parents=True)
    hardware = nodes.fixture_settings("h100-ib")["hardware"]
    (prefix / "etc" / "agent.yaml").write_text(f"hardware: {json.dumps(hardware)}\n")
    argv = [sys.executable, "-m", "llmgw", "node", "add", f"root@127.0.0.1:{node.port}",
            "--cluster", str(cluster), "--prefix", str(prefix), "--wheels", str(WHEELS),
            "--name", "gpu-01", "--fingerprint", node.host_fingerprint(),
            "--fabric", "ib-a=mlx5_0,mlx5_1,mlx5_2,mlx5_3"]

    def node_add() -> str:
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)
        print(done.stdout)  # shown with -s: the docs' transcripts of node add come from it
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    added = node_add()
    lines = added.splitlines()
    assert [line[:11] for line in lines[:9]] == [
        "host key   ", "preflight  ", "account    ", "install    ", "agent      ", "report     ",
        "compiler   ", "fabrics    ", "nodes.yaml "], added
    assert lines[5].startswith("report     8 GPUs, ")
    assert lines[6] == "compiler   gcc 12.2.0 installed with apt-get", added
    assert (standin / "apt-get.calls").read_text() == (
        "DEBIAN_FRONTEND=noninteractive uid=0 -o DPkg::Lock::Timeout=120 install -y "
        "--no-install-recommends gcc libc6-dev\n")
    again = node_add()
    assert "compiler   gcc 12.2.0 already there\n" in again, again
    assert len((standin / "apt-get.calls").read_text().splitlines()) == 1
    assert "nodes.yaml gpu-01 unchanged" in again
