"""``llmgw init``'s steps, one at a time: each looks without changing anything, acts once,
and then looks done; a hostile option is refused before any step runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmgw.onboarding import inits, sites, starters
from llmgw.planning import fits
from llmgw.spec import checks, loading, statedirs
from llmgw.store import stores, users

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"
NAMES = ["cluster files", ".gitignore", "administrator", "mirror", "node", "model", "store"]


class Seen:
    """What a seed said (the log) and told (the terminal), kept apart."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self.told: list[str] = []


def seed(tmp_path: Path, seen: Seen, gpus: dict[str, int] | None = None,
         **options: object) -> inits.Seed:
    return inits.Seed(inits.Options(tmp_path / "site", **options),  # type: ignore[arg-type]
                      secret=seen.told.append,
                      detect_gpus=lambda: dict(gpus or {}))


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".db" not in p.name}


def step(s: inits.Seed, name: str) -> inits.Step:
    return next(x for x in s.steps() if x.name == name)


def upto(s: inits.Seed, name: str) -> inits.Step:
    """Run every step before ``name``; return ``name``'s, not yet looked at."""
    for x in s.steps():
        if x.name == name:
            return x
        if not x.look().done:
            x.act()
    raise AssertionError(name)


def test_the_steps_are_named_in_order(tmp_path: Path) -> None:
    assert [x.name for x in seed(tmp_path, Seen()).steps()] == NAMES


def test_cluster_files_are_written_once_and_kept(tmp_path: Path, state_dir: Path) -> None:
    s = seed(tmp_path, Seen())
    files = step(s, "cluster files")
    look = files.look()
    assert not look.done and "cluster/cluster.yaml" in look.what
    assert not (tmp_path / "site").exists()  # looking wrote nothing
    files.act()
    assert files.look().done
    cluster = loading.load(tmp_path / "site" / "cluster")
    # LLMGW_STATE_DIR chose the state directory: the daemon finds it without the variable.
    assert cluster.cluster.state_dir == str(state_dir)
    assert statedirs.inside(Path(cluster.cluster.store.path), state_dir)
    (tmp_path / "site" / "cluster" / "nodes.yaml").write_text("nodes: {}  # mine\n")
    (tmp_path / "site" / "cluster" / "known_hosts").unlink()
    assert not files.look().done
    assert files.act() == "wrote cluster/known_hosts"
    assert (tmp_path / "site" / "cluster" / "nodes.yaml").read_text() == "nodes: {}  # mine\n"


def test_no_state_dir_is_written_where_the_default_needs_no_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(statedirs.ENV)
    assert statedirs.pinned() is None
    s = inits.Seed(inits.Options(tmp_path / "site"), secret=print,
                   environ={"HOME": str(tmp_path)})
    assert "state_dir" not in s._files()["cluster/cluster.yaml"]


def test_gitignore_keeps_what_is_there_and_adds_what_is_missing(tmp_path: Path) -> None:
    s = seed(tmp_path, Seen())
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / ".gitignore").write_text("*.pyc\n*.db")  # no final newline
    ignore = step(s, ".gitignore")
    assert not ignore.look().done
    ignore.act()
    lines = (tmp_path / "site" / ".gitignore").read_text().splitlines()
    assert lines[:2] == ["*.pyc", "*.db"] and lines.count("*.db") == 1
    assert {"*.token", "*.db-wal", "/cluster/state/"} <= set(lines)
    assert ignore.look().done


def test_a_state_directory_inside_the_repository_is_ignored(tmp_path: Path) -> None:
    state = tmp_path / "site" / ".state"
    s = inits.Seed(inits.Options(tmp_path / "site"), secret=print,
                   environ={statedirs.ENV: str(state)})
    upto(s, ".gitignore").act()
    assert "/.state/" in (tmp_path / "site" / ".gitignore").read_text().splitlines()


def test_the_administrator_is_created_once_and_the_password_only_told(tmp_path: Path) -> None:
    seen = Seen()
    s = seed(tmp_path, seen)
    admin = upto(s, "administrator")
    assert admin.look().what == "would create 'admin' with a generated password"
    inits.run([admin], say=seen.said.append)
    assert seen.said == ["[1/1] administrator: created 'admin' (password printed once below)"]
    assert len(seen.told) == 1
    password = seen.told[0].split("password of admin: ", 1)[1].split()[0]
    assert len(password) >= 20
    assert not any(password in line for line in seen.said)
    cluster = loading.load(tmp_path / "site" / "cluster")

    async def check() -> users.User | None:
        store = await stores.open_store(cluster.cluster.store)
        try:
            return await users.authenticate(store, "admin", password)
        finally:
            await store.close()
    found = asyncio.run(check())
    assert found is not None and found.admin
    assert admin.look().done
    assert inits.run([admin], say=seen.said.append) == [False]
    assert len(seen.told) == 1  # a rerun tells nothing


def test_a_user_of_that_name_who_is_no_admin_stops_the_step(tmp_path: Path) -> None:
    s = seed(tmp_path, Seen())
    admin = upto(s, "administrator")
    cluster = loading.load(tmp_path / "site" / "cluster")

    async def make() -> None:
        store = await stores.open_store(cluster.cluster.store)
        try:
            await users.create(store, "admin", "an-ordinary-pw", admin=False)
        finally:
            await store.close()
    asyncio.run(make())
    with pytest.raises(inits.InitError, match="exists and is no admin: pass --admin"):
        admin.look()


def test_the_mirror_is_made_declared_and_holds_the_starter(tmp_path: Path,
                                                           state_dir: Path) -> None:
    gguf = tmp_path / "starter.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    s = seed(tmp_path, Seen(), model_file=gguf)
    mirror = upto(s, "mirror")
    assert not mirror.look().done
    said = mirror.act()
    assert f"llmgw mirror serve {state_dir / 'mirror'}" in said
    cluster = loading.load(tmp_path / "site" / "cluster")
    assert cluster.cluster.weights.endpoint == s.mirror_endpoint()
    from llmgw.hub import caches
    assert caches.repo_dir(state_dir / "mirror" / "hub", starters.STARTER_REPO).is_dir()
    assert mirror.look().done


def test_weights_declared_without_an_endpoint_stop_the_mirror(tmp_path: Path) -> None:
    s = seed(tmp_path, Seen())
    mirror = upto(s, "mirror")
    path = tmp_path / "site" / "cluster" / "cluster.yaml"
    path.write_text(path.read_text().replace("  auth: keys", "  weights: {disk_margin: 0.1}\n"
                                             "  auth: keys"))
    with pytest.raises(inits.InitError, match="cluster.weights is declared without an "
                       "endpoint"):
        mirror.act()


@pytest.mark.parametrize(("gpus", "declared"), [
    ({}, None),
    ({"l40s-45g": 4}, [{"class": "l40s-45g", "count": 4}]),
], ids=["cpu", "4x l40s"])
def test_this_machine_becomes_a_local_node(tmp_path: Path, state_dir: Path,
                                           gpus: dict[str, int], declared: object) -> None:
    s = seed(tmp_path, Seen(), gpus, node_name="seed-01")
    node = upto(s, "node")
    assert node.look().what == "would add this machine (address: local)"
    node.act()
    entry = loading.load(tmp_path / "site" / "cluster").nodes["seed-01"]
    assert entry.address == "local" and entry.weights_dirs == [str(state_dir / "weights")]
    assert [{"class": g.gpu_class, "count": g.count} for g in entry.gpus] == (declared or [])
    assert node.look() == inits.Look(True, "seed-01 already in nodes.yaml")


def test_a_node_over_ssh_goes_through_node_add(tmp_path: Path) -> None:
    calls: list[tuple[str, str | None]] = []
    s = seed(tmp_path, Seen(), node="root@10.0.0.7:2222", node_name="gpu-07")

    def add(target: str, name: str | None) -> None:  # what node add writes, at the end
        calls.append((target, name))
        path = tmp_path / "site" / "cluster" / "nodes.yaml"
        path.write_text("nodes:\n  gpu-07: {address: 10.0.0.7, ssh_port: 2222}\n")
    s.add_node = add
    node = upto(s, "node")
    assert node.look().what == "would run node add root@10.0.0.7:2222"
    assert node.act() == "added gpu-07 over SSH (node add root@10.0.0.7:2222)"
    assert calls == [("root@10.0.0.7:2222", "gpu-07")]
    assert node.look().done


def test_local_gpus_are_read_from_nvidia_smi() -> None:
    recorded = (FIXTURES / "l40s-nofabric" / "query-gpu.csv").read_text()
    assert starters.local_gpus(lambda argv: recorded) == {"l40s-45g": 4}
    assert starters.local_gpus(lambda argv: None) == {}


@pytest.mark.parametrize(("gpu_class", "model"), [
    ("h100-80g", "qwen2.5-32b"),
    ("l40s-45g", "qwen2.5-7b"),
    ("l4-22g", "qwen2.5-7b"),
], ids=lambda v: v)
def test_the_gpu_starter_is_the_largest_that_the_fit_check_fits(
        tmp_path: Path, gpu_class: str, model: str) -> None:
    s = seed(tmp_path, Seen(), {gpu_class: 2})
    starter = upto(s, "model")
    assert starter.act().startswith(f"declared {model} (fits 1× {gpu_class} at 8k context")
    cluster = loading.load(tmp_path / "site" / "cluster", extra_checks=[fits.check])
    assert list(cluster.models) == [model]
    # The next larger candidate does not fit: the choice is the fit check's, not a table's.
    index = [c.name for c in starters.GPU_CANDIDATES].index(model)
    known = checks.known_classes(cluster)
    if index:
        bigger = starters.GPU_CANDIDATES[index - 1]
        assert starters.for_gpus({gpu_class: 1}, known) == (starters.GPU_CANDIDATES[index],
                                                            gpu_class)
        assert fits.estimate(fits.of_shape(bigger.shape, None), known[gpu_class]).fits is False
    assert starter.look().done


def test_the_cpu_starter_is_this_machines_file_or_else_the_hub(tmp_path: Path,
                                                               state_dir: Path) -> None:
    gguf = tmp_path / "starter.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    s = seed(tmp_path / "a", Seen(), model_file=gguf, mirror=False)
    upto(s, "model").act()
    source = loading.load(tmp_path / "a" / "site" / "cluster").models["gemma3-270m"].source
    assert source == str(state_dir / "weights" / starters.STARTER_FILE)
    assert Path(source).read_bytes() == gguf.read_bytes()
    s = seed(tmp_path / "b", Seen(), node=None, mirror=False)
    assert upto(s, "model").act() == "declared gemma3-270m (on CPU, from the hub)"
    models = loading.load(tmp_path / "b" / "site" / "cluster").models
    assert models["gemma3-270m"].source == "google/gemma-3-270m-it-GGUF:Q4_K_M"
    # The template's comments stay above the starter.
    text = (tmp_path / "b" / "site" / "cluster" / "models.yaml").read_text()
    assert text.startswith(sites.MODELS_YAML.split("models: {}")[0])


@pytest.mark.parametrize(("options", "message"), [
    ({"admin": "Root!"}, "--admin: invalid user name 'Root!'"),
    ({"name": "../etc"}, "--name '../etc': lower case letters"),
    ({"node_name": "a b"}, "--node-name 'a b'"),
    ({"node": "root@host;reboot"}, "--node 'root@host;reboot': expected local or"),
    ({"postgres": "mysql://db/x"}, "--postgres: store.url scheme 'mysql' is not supported"),
    ({"postgres": "postgresql://u:hunter2@db/x"}, "--postgres: store.url must not hold a "
     "password"),
    ({"postgres": "sqlite:///tmp/x.db"}, "expected postgresql://USER@HOST:5432/DATABASE"),
    ({"model_file": Path("/nonexistent.gguf")}, "--model-file /nonexistent.gguf: no such"),
], ids=lambda v: str(v)[:30])
def test_hostile_options_are_refused_before_any_step(
        tmp_path: Path, options: dict[str, object], message: str) -> None:
    with pytest.raises(inits.InitError) as caught:
        seed(tmp_path, Seen(), **options)
    assert message in str(caught.value)
    assert "hunter2" not in str(caught.value)
    assert not (tmp_path / "site").exists()


def test_a_stop_after_step_k_is_an_interruption(tmp_path: Path) -> None:
    s = seed(tmp_path, Seen())
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        inits.run(s.steps(), said.append, environ={inits.STOP_AFTER_ENV: "2"})
    assert [line.split(":")[0] for line in said] == ["[1/7] cluster files", "[2/7] .gitignore"]
    before = snapshot(tmp_path / "site")
    acted = inits.run(s.steps(), said.append, environ={})
    assert acted == [False, False, True, True, True, True, False]
    again: list[str] = []
    assert inits.run(s.steps(), again.append, environ={}) == [False] * 7
    assert before != snapshot(tmp_path / "site")
