"""The real ``llmgw init`` on a fresh machine: a home without keys, an empty state directory.

Runs the CLI as a process: a whole run, a rerun that changes nothing, runs interrupted
after step k and rerun (the end state is an uninterrupted run's), the ``--no-*`` flags,
``--postgres`` against the real PostgreSQL fixture (and the move back when it fails), and
the node step over SSH against a lab node (a real sshd on loopback).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import nodes, postgres
from support.plugin import SimClusterFactory

from llmgw.onboarding import enrolments, inits
from llmgw.spec import statedirs

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / ".cache" / "wheels"  # as test_enrolments: built once, kept between runs


def fresh_env(tmp_path: Path, state: Path) -> dict[str, str]:
    """A fresh machine's user: a home without ~/.ssh, nothing in the state directory."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return {**env, "HOME": str(home), statedirs.ENV: str(state)}


def llmgw(*args: str, cwd: Path, env: dict[str, str],
          timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", *args], cwd=cwd, text=True, env=env,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def snapshot(*roots: Path) -> dict[str, bytes]:
    """Every file under the roots but SQLite's (whose pages change when opened)."""
    return {f"{root.name}/{p.relative_to(root)}": p.read_bytes() for root in roots
            for p in sorted(root.rglob("*")) if p.is_file() and ".db" not in p.name}


def normalised(files: dict[str, bytes], *paths: Path) -> dict[str, bytes]:
    out = {}
    for name, data in files.items():
        for i, path in enumerate(paths):
            data = data.replace(str(path).encode(), f"<{i}>".encode())
        out[name] = data
    return out


def user_names(site: Path, env: dict[str, str]) -> list[tuple[str, bool]]:
    listed = llmgw("users", "list", "--json", "--cluster", str(site / "cluster"), cwd=site,
                   env=env)
    assert listed.returncode == 0, listed.stderr
    return sorted((u["name"], u["admin"]) for u in json.loads(listed.stdout))


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    """The starter's file as `make model` leaves it (a stand-in: init only places it)."""
    path = tmp_path / "gemma3-270m-q4_k_m.gguf"
    path.write_bytes(b"GGUF" + bytes(4096))
    return path


def test_init_on_a_fresh_machine_then_a_rerun_changes_nothing(tmp_path: Path,
                                                              gguf: Path) -> None:
    state = tmp_path / "state"
    env = fresh_env(tmp_path, state)
    first = llmgw("init", "acme", "--model-file", str(gguf), "--node-name", "seed",
                  cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    lines = first.stdout.splitlines()
    progress = [line for line in lines if line.startswith("[")]
    assert [line.split(":")[0] for line in progress] == [
        f"[{i}/7] {name}" for i, name in enumerate(
            ["cluster files", ".gitignore", "administrator", "mirror", "node", "model",
             "store"], 1)]
    assert "[3/7] administrator: created 'admin' (password printed once below)" in lines
    told = [line for line in lines if "password of admin:" in line]
    assert len(told) == 1
    password = told[0].split(": ", 1)[1]
    assert "[5/7] node: added seed (address: local, no GPU)" in lines
    assert "[6/7] model: declared gemma3-270m (on CPU, from this machine's file)" in lines
    assert first.stderr == ""
    site = tmp_path / "acme"
    validate = llmgw("validate", cwd=site, env=env)
    assert validate.returncode == 0, validate.stdout + validate.stderr
    assert "Cluster acme is valid: 1 node, 0 GPUs declared, 0 fabrics, 1 model" in (
        validate.stdout)
    assert user_names(site, env) == [("admin", True)]
    # No secret in the cluster directory: the store, the mirror and the weights are state.
    assert not any(password.encode() in data for data in snapshot(site).values())
    assert not list(site.rglob("*.db")) and (state / "acme.db").is_file()
    assert (state / "mirror" / "hub").is_dir() and (state / "weights" / gguf.name).is_file()
    ignored = (site / ".gitignore").read_text().splitlines()
    assert {"*.db", "*.token", "/cluster/state/"} <= set(ignored)

    before = snapshot(site, state)
    again = llmgw("init", "acme", "--model-file", str(gguf), "--node-name", "seed",
                  cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert password not in again.stdout and "password of" not in again.stdout
    progress = [line for line in again.stdout.splitlines() if line.startswith("[")]
    assert all(("already" in line or "(--postgres URL moves it)" in line) for line in progress
               ), again.stdout
    assert snapshot(site, state) == before  # byte for byte


@pytest.mark.parametrize("k", [1, 3, 5], ids=lambda k: f"after step {k}")
def test_a_rerun_after_an_interruption_finishes_the_job(tmp_path: Path, gguf: Path,
                                                        k: int) -> None:
    whole_state, cut_state = tmp_path / "a" / "state", tmp_path / "b" / "state"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    argv = ("init", "acme", "--model-file", str(gguf), "--node-name", "seed")
    whole_env = fresh_env(tmp_path / "a", whole_state)
    whole = llmgw(*argv, cwd=tmp_path / "a", env=whole_env)
    assert whole.returncode == 0, whole.stderr

    cut_env = fresh_env(tmp_path / "b", cut_state)
    stopped = llmgw(*argv, cwd=tmp_path / "b", env={**cut_env, inits.STOP_AFTER_ENV: str(k)})
    assert stopped.returncode == 130, stopped.stdout + stopped.stderr
    assert [line for line in stopped.stdout.splitlines() if line.startswith("[")][-1].startswith(
        f"[{k}/7]")
    assert "Traceback" not in stopped.stderr
    rerun = llmgw(*argv, cwd=tmp_path / "b", env=cut_env)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"[{k}/7]" in rerun.stdout and "already" in rerun.stdout

    ends = [normalised(snapshot(tmp_path / d / "acme", state), state, tmp_path / d)
            for d, state in (("a", whole_state), ("b", cut_state))]
    assert ends[0] == ends[1]
    assert user_names(tmp_path / "b" / "acme", cut_env) == user_names(
        tmp_path / "a" / "acme", whole_env) == [("admin", True)]


def test_the_no_flags_skip_their_steps_and_a_later_run_does_them(tmp_path: Path) -> None:
    env = fresh_env(tmp_path, tmp_path / "state")
    skipped = llmgw("init", "acme", "--no-mirror", "--no-node", "--no-model", cwd=tmp_path,
                    env=env)
    assert skipped.returncode == 0, skipped.stderr
    for line in ("[4/7] mirror: skipped (--no-mirror)", "[5/7] node: skipped (--no-node)",
                 "[6/7] model: skipped (--no-model)"):
        assert line in skipped.stdout.splitlines()
    cluster = tmp_path / "acme" / "cluster"
    assert not (cluster / "mirror.yaml").exists()
    assert "nodes: {}" in (cluster / "nodes.yaml").read_text()
    assert "\nmodels: {}\n" in (cluster / "models.yaml").read_text()
    assert not (tmp_path / "state" / "mirror").exists()

    later = llmgw("init", "acme", "--node-name", "seed", cwd=tmp_path, env=env)
    assert later.returncode == 0, later.stderr
    assert "[4/7] mirror: made" in later.stdout and "[5/7] node: added seed" in later.stdout
    # From this machine's file where `make model` left one, else the mirror just made.
    assert "[6/7] model: declared gemma3-270m (on CPU, from " in later.stdout
    assert (cluster / "mirror.yaml").exists()


def test_postgres_takes_the_store_and_a_rerun_keeps_it(
        tmp_path: Path, postgres_db: postgres.Database) -> None:
    env = fresh_env(tmp_path, tmp_path / "state")
    moved = llmgw("init", "acme", "--no-mirror", "--no-model", "--postgres", postgres_db.url,
                  "--postgres-password-file", str(postgres_db.password_file), cwd=tmp_path,
                  env=env)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert f"[7/7] store: copied 1 users and 0 keys to {postgres_db.url}; cluster.yaml names " \
           "it (SQLite kept at" in moved.stdout
    site = tmp_path / "acme"
    text = (site / "cluster" / "cluster.yaml").read_text()
    assert f"url: {postgres_db.url}" in text and postgres.PASSWORD not in text
    assert user_names(site, env) == [("admin", True)]  # read through PostgreSQL now
    (tmp_path / "state" / "acme.db").unlink()  # what names the store is the url, not the path
    assert user_names(site, env) == [("admin", True)]

    again = llmgw("init", "acme", "--no-mirror", "--no-model", "--postgres", postgres_db.url,
                  "--postgres-password-file", str(postgres_db.password_file), cwd=tmp_path,
                  env=env)
    assert again.returncode == 0, again.stderr
    assert f"[7/7] store: already on {postgres_db.url}" in again.stdout
    assert (site / "cluster" / "cluster.yaml").read_text() == text


def test_a_failed_move_to_postgres_moves_back(
        tmp_path: Path, postgres_db: postgres.Database) -> None:
    env = fresh_env(tmp_path, tmp_path / "state")
    argv = ["init", "acme", "--no-mirror", "--no-model", "--postgres", postgres_db.url]
    first = llmgw(*argv[:-2], cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    site = tmp_path / "acme"
    before = (site / "cluster" / "cluster.yaml").read_text()
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password-xyzzy\n")
    wrong.chmod(0o600)
    failed = llmgw(*argv, "--postgres-password-file", str(wrong), cwd=tmp_path, env=env)
    assert failed.returncode == 1, failed.stdout
    assert "moved back: the store stays SQLite at" in failed.stderr, failed.stderr
    assert failed.stderr.startswith(f"error: --postgres {postgres_db.url}: ")
    assert "Traceback" not in failed.stderr and "xyzzy" not in failed.stdout + failed.stderr
    assert (site / "cluster" / "cluster.yaml").read_text() == before
    assert user_names(site, env) == [("admin", True)]  # on SQLite, as before

    fixed = llmgw(*argv, "--postgres-password-file", str(postgres_db.password_file),
                  cwd=tmp_path, env=env)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "[7/7] store: copied 1 users" in fixed.stdout


def test_a_postgres_database_of_another_cluster_is_refused_and_moved_back(
        tmp_path: Path, postgres_db: postgres.Database) -> None:
    """A database another init filled: not empty, not this store's copy: refused."""
    flags = ["--no-mirror", "--no-model", "--postgres", postgres_db.url,
             "--postgres-password-file", str(postgres_db.password_file)]
    other = llmgw("init", "other", *flags, cwd=tmp_path, env=fresh_env(tmp_path, tmp_path / "o"))
    assert other.returncode == 0, other.stderr
    env = fresh_env(tmp_path, tmp_path / "state")
    refused = llmgw("init", "acme", *flags, cwd=tmp_path, env=env)
    assert refused.returncode == 1
    assert "moved back: the store stays SQLite at" in refused.stderr
    assert "url:" not in (tmp_path / "acme" / "cluster" / "cluster.yaml").read_text()


@pytest.mark.parametrize(("argv", "message"), [
    (["--node", "root@gpu;reboot"], "error: --node 'root@gpu;reboot': expected local or"),
    (["--admin", "../x"], "error: --admin: invalid user name '../x'"),
    (["--postgres", "postgresql://llmgw:hunter2@db/llmgw"],
     "error: --postgres: store.url must not hold a password"),
], ids=["node", "admin", "postgres"])
def test_hostile_flags_are_refused_located_without_a_traceback(
        tmp_path: Path, argv: list[str], message: str) -> None:
    refused = llmgw("init", "acme", *argv, cwd=tmp_path, env=fresh_env(tmp_path, tmp_path / "s"))
    assert refused.returncode == 1
    assert refused.stderr.startswith(message), refused.stderr
    assert "Traceback" not in refused.stderr and "hunter2" not in refused.stderr
    assert not (tmp_path / "acme").exists() and not (tmp_path / "s").exists()


def test_ctrl_c_in_the_middle_of_a_run_is_finished_by_a_rerun(tmp_path: Path,
                                                             gguf: Path) -> None:
    """SIGINT from outside, whenever it lands (here: once step 2's line is out)."""
    env = fresh_env(tmp_path, tmp_path / "state")
    argv = [sys.executable, "-m", "llmgw", "init", "acme", "--model-file", str(gguf)]
    with subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as running:
        assert running.stdout is not None
        for line in running.stdout:
            if line.startswith("[2/7]"):
                running.send_signal(signal.SIGINT)
                break
        out, err = running.communicate(timeout=120)
    assert running.returncode in (0, 130), err  # 0: it had finished before the signal
    assert "Traceback" not in err
    if "created 'admin'" in out:  # a step is whole: no administrator without its password
        assert "password of admin: " in out
    rerun = llmgw("init", "acme", "--model-file", str(gguf), cwd=tmp_path, env=env)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    site = tmp_path / "acme"
    assert llmgw("validate", cwd=site, env=env).returncode == 0
    assert user_names(site, env) == [("admin", True)]
    assert not list(site.rglob(".*.init-part"))  # no half-written file left


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.skipif(not shutil.which(nodes.SSHD), reason="sshd not installed")
def test_the_node_step_adds_a_lab_node_over_ssh(sim_cluster: SimClusterFactory,
                                                tmp_path: Path) -> None:
    """The seed's node is a machine over SSH (a lab node: a real sshd, nothing installed):
    init stops after the files, the operator names the key, a rerun adds the node."""
    try:  # the dependencies' wheels need the package index once; llmgw's own, never
        enrolments.build_wheels(WHEELS)
    except enrolments.EnrolError as exc:
        pytest.skip(f"cannot build the wheels to ship (no package index here?): {exc}")
    sim = sim_cluster(1, agents=False, prefix="bare")
    node = sim.nodes["bare-01"]
    env = {**os.environ}
    target = f"root@127.0.0.1:{node.port}"
    prefix = str(node.root / "opt")
    argv = ["init", "site", "--no-mirror", "--node", target, "--node-name", "bare-01",
            "--fingerprint", node.host_fingerprint(), "--prefix", prefix, "--wheels",
            str(WHEELS)]
    cut = llmgw(*argv, cwd=tmp_path, env={**env, inits.STOP_AFTER_ENV: "1"})
    assert cut.returncode == 130, cut.stderr
    cluster = tmp_path / "site" / "cluster"
    path = cluster / "cluster.yaml"
    path.write_text(path.read_text().replace("user: llmgw ", "user: root  ").replace(
        "    # identity_file: ~/.ssh/id_ed25519   # default: your SSH agent's keys\n",
        f"    identity_file: {sim.client_key}\n"))
    added = llmgw(*argv, cwd=tmp_path, env=env)
    assert added.returncode == 0, added.stdout + added.stderr
    assert f"[5/7] node: added bare-01 over SSH (node add {target})" in added.stdout
    assert "no systemd: supervise backend" in added.stdout
    assert (Path(prefix) / "venv" / "bin" / "llmgw").exists()
    inventory = llmgw("inventory", "--cluster", str(cluster), cwd=tmp_path, env=env)
    assert "bare-01" in inventory.stdout and "1 reachable" in inventory.stdout
    again = llmgw(*argv, cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert "[5/7] node: bare-01 already in nodes.yaml" in again.stdout
    removed = llmgw("node", "remove", "bare-01", "--uninstall", "--cluster", str(cluster),
                    cwd=tmp_path, env=env)
    assert removed.returncode == 0, removed.stdout + removed.stderr
