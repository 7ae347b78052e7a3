"""``llmgw node add`` against a bare simulated node: sshd only, no agent, no llmgw installed.

The simulated node's sshd runs as the current user, so "installing" goes into
a per-node prefix under the node's directory (a real node gets /opt/llmgw and
a systemd unit; here systemd is not PID 1, so the agent runs with the
supervise backend, as on any machine without systemd).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import nodes
from support.plugin import SimClusterFactory

from llmgw.cli import node_cmd
from llmgw.cli.main import main
from llmgw.onboarding import enrolments, preflights, yamledits
from llmgw.spec import loading

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / ".cache" / "wheels"  # built once, kept between runs like the engine

pytestmark = pytest.mark.skipif(not shutil.which(nodes.SSHD), reason="sshd not installed")


def llmgw(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=300, stdin=subprocess.DEVNULL)


def site(tmp_path: Path, sim: nodes.SimCluster) -> Path:
    # The files alone: these tests add the nodes themselves (test_init_cli: init's node step).
    assert llmgw("init", "site", "--no-mirror", "--no-node", "--no-model",
                 cwd=tmp_path).returncode == 0
    cluster = tmp_path / "site" / "cluster"
    text = (cluster / "cluster.yaml").read_text()
    text = text.replace("user: llmgw ", "user: root  ").replace(
        "    # identity_file: ~/.ssh/id_ed25519   # default: your SSH agent's keys\n",
        f"    identity_file: {sim.client_key}\n")
    text = text.replace("projects:", "fabrics:\n  ib-a: {kind: infiniband}\n\nprojects:")
    (cluster / "cluster.yaml").write_text(text)
    (cluster / "nodes.yaml").write_text(
        "# Our machines, one entry each (`llmgw node add`).\nnodes:\n"
        "  old-01:  # the first box\n    address: 10.9.9.9\n    labels: {rack: \"1\"}\n")
    return cluster


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_node_add_takes_a_bare_node_to_a_reporting_agent(
    sim_cluster: SimClusterFactory, tmp_path: Path,
) -> None:
    try:  # the dependencies' wheels need the package index once; llmgw's own, never
        enrolments.build_wheels(WHEELS)
    except enrolments.EnrolError as exc:
        pytest.skip(f"cannot build the wheels to ship (no package index here?): {exc}")
    sim = sim_cluster(1, agents=False, prefix="bare")
    node = sim.nodes["bare-01"]
    cluster = site(tmp_path, sim)
    prefix = str(node.root / "opt")
    base = ["node", "add", f"root@127.0.0.1:{node.port}", "--cluster", str(cluster),
            "--prefix", prefix, "--wheels", str(WHEELS), "--label", "rack=7", "--name", "bare-01",
            "--weights-dir", "/srv/models", "--weights-dir", "/srv/models"]

    # Without a terminal and without --fingerprint: refused, nothing pinned or sent.
    refused = llmgw(*base, cwd=tmp_path)
    assert refused.returncode == 1
    assert f"offers {node.host_fingerprint()}" in refused.stderr
    assert (cluster / "known_hosts").read_text() == ""
    wrong = llmgw(*base, "--fingerprint", "SHA256:" + "A" * 43, cwd=tmp_path)
    assert wrong.returncode == 1 and "nothing was pinned or sent" in wrong.stderr
    assert not Path(prefix).exists()

    added = llmgw(*base, "--fingerprint", node.host_fingerprint(), cwd=tmp_path)
    assert added.returncode == 0, added.stdout + added.stderr
    lines = added.stdout.splitlines()
    steps = [line.split()[0] for line in lines[:6]]
    assert steps == ["host", "preflight", "account", "install", "agent", "report"], added.stdout
    assert "no systemd: supervise backend" in added.stdout
    assert "compiler   skipped: no GPU, vLLM and SGLang are not installed here" in added.stdout
    assert node.known_hosts_line().split()[2] in (cluster / "known_hosts").read_text()
    # The agent runs from the node's own venv, installed from shipped wheels.
    assert (Path(prefix) / "venv" / "bin" / "llmgw").exists()
    nodes_yaml = (cluster / "nodes.yaml").read_text()
    assert nodes_yaml.startswith("# Our machines, one entry each (`llmgw node add`).\nnodes:\n"
                                 "  old-01:  # the first box\n")
    assert "+  bare-01:\n" in added.stdout and "+      rack: '7'" not in added.stdout
    loaded = loading.load(cluster)
    assert loaded.nodes["bare-01"].labels == {"rack": "7"}
    assert loaded.nodes["bare-01"].weights_dirs == ["/srv/models"]
    assert loaded.nodes["bare-01"].agent_socket == f"{prefix}/run/agent.sock"

    # The daemon's view: the node reports through its pinned key and the forwarded socket.
    inventory = llmgw("inventory", "--cluster", str(cluster), cwd=tmp_path)
    assert "bare-01" in inventory.stdout and "1 reachable" in inventory.stdout, inventory.stdout

    # A second run changes nothing: no install, the same agent, no diff.
    again = llmgw(*base, "--fingerprint", node.host_fingerprint(), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "already pinned" in again.stdout and "already in" in again.stdout
    assert "running (supervise backend" in again.stdout
    assert "nodes.yaml bare-01 unchanged" in again.stdout
    assert (cluster / "nodes.yaml").read_text() == nodes_yaml

    # Removed with --uninstall: its entry and key go, its agent stops, its prefix is deleted.
    agent = int((Path(prefix) / "run" / "agent.pid").read_text())
    removed = llmgw("node", "remove", "bare-01", "--uninstall", "--cluster", str(cluster),
                    cwd=tmp_path)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert "units      none left on bare-01" in removed.stdout
    assert ("agent      stopped (supervise backend: nothing starts it again); it deletes "
            f"{prefix} as it exits") in removed.stdout, removed.stdout
    assert "left       for root" not in removed.stdout  # logs in as root: no account made
    deadline = time.monotonic() + 120  # it stops serving, then deletes (a venv) and exits
    while nodes._alive(agent) or Path(prefix).exists():
        assert time.monotonic() < deadline, "the agent did not delete its prefix and exit"
        time.sleep(0.05)
    assert (cluster / "nodes.yaml").read_text() == (
        "# Our machines, one entry each (`llmgw node add`).\nnodes:\n"
        "  old-01:  # the first box\n    address: 10.9.9.9\n    labels: {rack: \"1\"}\n")
    assert (cluster / "known_hosts").read_text() == ""


@pytest.mark.parametrize(("target", "value", "refused"), [
    ("root@10.0.0.9", "models", True),
    ("root@10.0.0.9", "../models", True),  # relative to the cluster directory: not there
    ("root@10.0.0.9", "/srv/my models", True),
    ("root@10.0.0.9", "/srv/$(id)", True),
    ("root@127.0.0.1:2222", "../.llmgw-lab/models", False),  # the lab's nodes: this machine
    ("root@10.0.0.9", "/srv/models", False),
])
def test_weights_dirs_are_checked_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, value: str, refused: bool,
) -> None:
    (tmp_path / "cluster.yaml").write_text("cluster: {name: c}\n")
    if not refused:
        assert node_cmd._weights_dirs([value], target.split("@")[1].split(":")[0]) == [value]
        return
    code = main(["node", "add", target, "--name", "n1", "--weights-dir", value,
                 "--cluster", str(tmp_path)])
    err = capsys.readouterr().err
    assert code != 0 and f"--weights-dir {value!r}" in err and "Traceback" not in err
    assert not (tmp_path / "known_hosts").exists() and not (tmp_path / "nodes.yaml").exists()


def test_preflight_stops_before_any_change() -> None:
    facts = preflights.parse_preflight(
        "uid=1000\nsudo=no\npython=3.9.2\nvenv=yes\ninit=systemd\ndisk_kib=1048576\n")
    assert facts.problems() == [
        "neither root nor password-less sudo: make the SSH user root, or allow it `sudo` "
        "without a password",
        "python3 is 3.9.2; llmgw needs 3.11 or newer",
    ]
    # Low disk need not stop the install: a doubt, gone past only when told to.
    assert facts.doubts() == [
        "1024 MiB free under the prefix; the agent and its engines want 2 GiB"]
    ready = preflights.parse_preflight("uid=0\nsudo=no\npython=3.11.2\nvenv=yes\ninit=sh\n"
                                       "disk_kib=99999999\nhostname=gpu-07.rack2\n")
    assert ready.problems() == [] and ready.doubts() == [] and ready.hostname == "gpu-07.rack2"


@pytest.mark.parametrize(("hostname", "name"), [
    ("GPU-07.rack2.example.com", "gpu-07"),
    ("node3", "node3"),
    ("", None),
    ("trailing-", None),
    ("-lead", None),
    ("a\x1b[31mred", None),  # the machine's own words: never echoed raw
])
def test_a_node_is_named_after_the_machines_hostname(hostname: str, name: str | None) -> None:
    if name is not None:
        assert preflights.node_name(hostname) == name
        return
    with pytest.raises(preflights.PreflightError, match="pass --name") as caught:
        preflights.node_name(hostname)
    assert "\x1b" not in str(caught.value)


def test_a_note_above_a_node_is_written_once() -> None:
    text = "# fleet\nnodes:\n  a:\n    address: x\n"
    note = ["node add went on past preflight: 5 MiB free"]
    new, diff = yamledits.add_node(text, "b", {"address": "y"}, note)
    assert new == text + "  # node add went on past preflight: 5 MiB free\n  b:\n    address: y\n"
    assert yamledits.add_node(new, "b", {"address": "y"}, note) == (new, "")
    assert preflights.one_line("GPU 0 held by pid 7 (evil\nnodes: {})") == (
        "GPU 0 held by pid 7 (evil nodes: {})")


def test_targets_are_validated() -> None:
    assert enrolments.parse_target("gpu-01.lab:2222", "llmgw", 22) == enrolments.Target(
        "llmgw", "gpu-01.lab", 2222)
    for bad in ("-oProxyCommand=x", "a b", "root@", "h:99999"):
        with pytest.raises(enrolments.EnrolError):
            enrolments.parse_target(bad, "llmgw", 22)


def test_nodes_yaml_keeps_comments_and_order() -> None:
    text = "# fleet\nnodes:\n  b:  # second\n    address: 10.0.0.2\n  a:\n    address: x\n"
    new, diff = yamledits.add_node(text, "c", {"address": "10.0.0.3",
                                               "fabrics": {"ib-a": ["mlx5_0", "mlx5_1"]}})
    assert new == text + "  c:\n    address: 10.0.0.3\n    fabrics:\n      ib-a: [mlx5_0, mlx5_1]\n"
    assert diff.splitlines()[-1] == "+      ib-a: [mlx5_0, mlx5_1]"
    assert yamledits.add_node(new, "c", {"address": "10.0.0.3"})[1] == ""


@pytest.fixture
def daemon_account() -> Iterator[str]:
    """A cluster ssh.user of this test only, deleted afterwards with its home."""
    if os.geteuid() != 0:
        pytest.skip("making a system account on this machine needs root (CI runs as root)")
    if not shutil.which("useradd"):
        pytest.skip("useradd not installed")
    user = f"llmgw-t{secrets.token_hex(4)}"
    had_group = subprocess.run(["getent", "group", "llmgw"], capture_output=True).returncode == 0
    yield user
    subprocess.run(["userdel", "-r", user], capture_output=True)
    if not had_group:  # made by node add for this test's account
        subprocess.run(["groupdel", "llmgw"], capture_output=True)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_node_add_makes_the_daemons_account_and_reports_through_it(
    sim_cluster: SimClusterFactory, tmp_path: Path, daemon_account: str,
) -> None:
    try:
        enrolments.build_wheels(WHEELS)
    except enrolments.EnrolError as exc:
        pytest.skip(f"cannot build the wheels to ship (no package index here?): {exc}")
    sim = sim_cluster(1, agents=False, prefix="acct")
    node = sim.nodes["acct-01"]
    cluster = site(tmp_path, sim)
    text = (cluster / "cluster.yaml").read_text()
    (cluster / "cluster.yaml").write_text(text.replace("user: root  ", f"user: {daemon_account}"))
    # The account reaches the agent's socket through the prefix: not under pytest's 0700
    # tmp_path, as /opt/llmgw is not on a real node.
    prefix = Path(tempfile.mkdtemp(prefix="llmgw-acct-"))
    prefix.chmod(0o755)
    try:
        base = ["node", "add", f"root@127.0.0.1:{node.port}", "--cluster", str(cluster),
                "--prefix", str(prefix / "opt"), "--wheels", str(WHEELS), "--name", "acct-01",
                "--fingerprint", node.host_fingerprint()]
        added = llmgw(*base, cwd=tmp_path)
        assert added.returncode == 0, added.stdout + added.stderr
        lines = added.stdout.splitlines()
        assert [line.split()[0] for line in lines[:6]] == [
            "host", "preflight", "account", "install", "agent", "report"], added.stdout
        assert f"account    {daemon_account}: " in added.stdout  # (group llmgw created, )
        assert ("system account created, our key authorized "
                f"(/home/{daemon_account}/.ssh/authorized_keys)") in added.stdout, added.stdout
        assert "report     0 GPUs" in added.stdout  # reached as the account, not as root
        account = pwd.getpwnam(daemon_account)
        assert account.pw_shell == "/usr/sbin/nologin" and account.pw_uid < 1000
        assert grp.getgrgid(account.pw_gid).gr_name == "llmgw"
        keys = Path(account.pw_dir) / ".ssh" / "authorized_keys"
        stat = keys.stat()
        assert (stat.st_mode & 0o777, stat.st_uid) == (0o600, account.pw_uid)
        public = " ".join(sim.client_key.with_suffix(".pub").read_text().split()[:2])
        assert keys.read_text() == (f'restrict,port-forwarding,command="internal-sftp" '
                                    f"{public} llmgw-daemon\n")

        # The daemon's view, as the cluster's user: inventory and doctor reach the node.
        inventory = llmgw("inventory", "--cluster", str(cluster), cwd=tmp_path)
        assert "acct-01" in inventory.stdout and "1 reachable" in inventory.stdout, \
            inventory.stdout + inventory.stderr
        doctor = llmgw("doctor", "acct-01", "--cluster", str(cluster), cwd=tmp_path)
        assert "auth:" not in doctor.stdout + doctor.stderr, doctor.stdout
        assert "1 node checked: 0 failed" in doctor.stdout, doctor.stdout + doctor.stderr

        # A second run changes nothing: the account, its key file, the agent.
        before = keys.read_text()
        again = llmgw(*base, cwd=tmp_path)
        assert again.returncode == 0, again.stdout + again.stderr
        assert (f"account    {daemon_account} exists, in group llmgw, our key authorized: "
                "unchanged") in again.stdout, again.stdout
        assert "running (supervise backend" in again.stdout
        assert keys.read_text() == before

        # The key as an older node add wrote it (no SFTP for a shell-less account): replaced.
        keys.write_text(f"restrict,port-forwarding {public} llmgw-daemon\n")
        upgraded = llmgw(*base, cwd=tmp_path)
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        assert f"account    {daemon_account}: our key's options updated" in upgraded.stdout
        assert keys.read_text() == before
    finally:
        pidfile = prefix / "opt" / "run" / "agent.pid"
        if pidfile.exists():  # the agent node add started, by its pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGTERM)
        shutil.rmtree(prefix, ignore_errors=True)


def test_pip_errors_are_cut_at_a_line() -> None:
    noise = "".join(f"  Looking in indexes: https://mirror.example/simple {i}\n"
                    for i in range(40))
    error = ("ERROR: Could not find a version that satisfies the requirement asyncssh>=2.14\n"
             "ERROR: No matching distribution found for asyncssh>=2.14\n")
    assert enrolments.pip_error(noise + error) == error.strip()
    long = "".join(f"line {i} of a build log without pip's ERROR: prefix\n" for i in range(100))
    cut = enrolments.pip_error(long)
    assert len(cut) <= 800 and cut.endswith("line 99 of a build log without pip's ERROR: prefix")
    assert all(line.startswith("line ") for line in cut.splitlines())


class _Steps:
    def begin(self, step: str, doing: str) -> None:
        pass

    def done(self, step: str, detail: str) -> None:
        self.last = f"{step} {detail}"


def _enrolment(cluster: Path, node: nodes.SimNode, **kw: object) -> enrolments.Enrolment:
    spec = loading.load(cluster)
    target = enrolments.Target("root", "127.0.0.1", node.port)
    identity = Path(str(spec.cluster.ssh.identity_file))
    return enrolments.Enrolment(spec, cluster, target, "", str(node.root / "opt"), identity,
                                _Steps(), WHEELS, **kw)  # type: ignore[arg-type]


@pytest.mark.timeout(120)
def test_preflight_names_the_node_and_stops_on_a_doubt_unless_told(
    sim_cluster: SimClusterFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over a real sshd: without --name the node is named after the machine's hostname (the
    simulated node is this machine); low disk stops node add before any change unless it is
    told to go on, and then the doubt is kept for nodes.yaml; a hostname that an existing
    node of another address holds is refused."""
    import asyncio
    import socket

    sim = sim_cluster(1, agents=False, prefix="bare")
    node = sim.nodes["bare-01"]
    cluster = site(tmp_path, sim)
    monkeypatch.setattr(preflights, "MIN_DISK", 1 << 60)  # more than any disk: a doubt

    async def preflight(enrolment: enrolments.Enrolment) -> None:
        await enrolment.pin(node.host_fingerprint(), lambda _: False)
        async with await enrolment.connect() as conn:
            await enrolment.preflight(conn)

    refused = _enrolment(cluster, node)
    with pytest.raises(enrolments.EnrolError, match=r"free under the prefix.*--continue-past"):
        asyncio.run(preflight(refused))
    assert not (node.root / "opt").exists()

    asked: list[tuple[str, list[str]]] = []
    going = _enrolment(cluster, node, go_on=lambda step, doubts: asked.append(
        (step, doubts)) is None)
    asyncio.run(preflight(going))
    assert going.name == preflights.node_name(socket.gethostname())
    assert [step for step, _ in asked] == ["preflight"]
    (passed,) = going.passed
    assert passed.startswith("preflight: ") and "free under the prefix" in passed

    nodes_yaml = cluster / "nodes.yaml"
    nodes_yaml.write_text(nodes_yaml.read_text() + f"  {going.name}:\n    address: 10.1.2.3\n")
    taken = _enrolment(cluster, node, go_on=lambda step, doubts: True)
    with pytest.raises(enrolments.EnrolError, match=r"at 10\.1\.2\.3.*pass --name"):
        asyncio.run(preflight(taken))
