"""``llmgw init``: the seed server, step by step, each step looking before it acts.

Steps, in order (each skipped by its flag where it has one)::

    [1/7] cluster files   cluster/*.yaml, known_hosts, the CI workflow (sites.files)
    [2/7] .gitignore      every file init and the daemon write beside the cluster files
    [3/7] administrator   a user of the pages, admin, with a generated password shown once
    [4/7] mirror          a hub mirror directory in the state directory, and
                          cluster.weights.endpoint naming this host       (--no-mirror)
    [5/7] node            this machine as a node (`address: local`), or one over SSH
                          through `node add` (--node [USER@]HOST)           (--no-node)
    [6/7] model           a starter that fits what was found               (--no-model)
    [7/7] store           --postgres URL: the store copied there, and back on failure

A step is ``(name, look, act)``: :meth:`Step.look` reads and changes nothing,
returning whether the step is done and what it found or would do; ``act``
does it. :func:`run` looks at every step and acts only where it is not done,
so a rerun after an interruption finishes the job and a rerun after a whole
run changes nothing (the files are byte for byte the same). Files are written
whole (a scratch name, then a rename), so a run killed mid-step leaves either
the old file or the new one.

Secrets never go into the cluster directory: the store and the mirror live in
the state directory (:mod:`llmgw.spec.statedirs`); the administrator's password
is given once to ``secret`` (the terminal) and never to ``say`` (the log).

Usage::

    seed = inits.Seed(inits.Options(Path("acme-gpu")), secret=print)
    inits.run(seed.steps(), say=print)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from llmgw.hub import caches
from llmgw.onboarding import sites, starters, yamledits
from llmgw.spec import checks, loading, statedirs
from llmgw.spec.models import NAME_PATTERN, Cluster, StoreSettings
from llmgw.store import audits, copies, migrations, stores, users

# Set by tests (and by nobody else): stop with SIGINT, as Ctrl-C does, once this
# many steps are done, so a test can show that a rerun finishes the job.
STOP_AFTER_ENV = "LLMGW_INIT_STOP_AFTER"
MIRROR_PORT = 8090
MIRROR_YAML = """\
# The site's hub mirror, written by `llmgw init`: nodes fetch hub repos from it
# instead of the public hub. Serve it on this host with
#   llmgw mirror serve {dir} --listen 0.0.0.0:{port}
# and fill it with `llmgw mirror pull` or `llmgw mirror add` (docs/weights.md).
cluster:
  weights:
    endpoint: {endpoint}
"""
PASSWORD_BYTES = 18  # 24 characters of URL-safe base64: 144 bits


class InitError(Exception):
    """A step that cannot be done as asked; the message says where and why."""


@dataclass(frozen=True)
class Look:
    """What a step found: ``done``, and a sentence of what is there or what it would do."""

    done: bool
    what: str


@dataclass(frozen=True)
class Step:
    name: str
    look: Callable[[], Look]
    act: Callable[[], str]  # returns what it did, one sentence
    after: Callable[[], None] | None = None  # once its line is out (a password, shown once)
    atomic: bool = True  # Ctrl-C waits for act and after to finish (not for a long node add)


@dataclass(frozen=True)
class Options:
    directory: Path
    name: str | None = None
    admin: str = "admin"
    mirror: bool = True
    node: str | None = "local"  # None: --no-node; "local"; else [USER@]HOST[:PORT]
    node_name: str | None = None
    model: bool = True
    model_file: Path | None = None  # the starter GGUF (default: a checkout's .cache/models)
    postgres: str | None = None
    postgres_password_file: Path | None = None



def run(steps: Sequence[Step], say: Callable[[str], None],
        environ: dict[str, str] | None = None) -> list[bool]:
    """Look at each step and act where it is not done; ``[k/n] name: …`` for each.

    Returns, per step, whether it acted. A step that fails raises InitError and
    leaves the steps after it undone: the next run starts from there."""
    environ = dict(os.environ) if environ is None else environ
    stop = environ.get(STOP_AFTER_ENV, "")
    acted = []
    for index, step in enumerate(steps, 1):
        prefix = f"[{index}/{len(steps)}] {step.name}:"
        seen = step.look()
        if seen.done:
            say(f"{prefix} {seen.what}")
            acted.append(False)
        else:
            with interrupts_deferred() if step.atomic else contextlib.nullcontext():
                say(f"{prefix} {step.act()}")
                acted.append(True)
                if step.after is not None:
                    step.after()
        if stop.isdigit() and int(stop) == index:
            raise KeyboardInterrupt  # as Ctrl-C arrives between two steps
    return acted


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold a SIGINT until the block is done, then deliver it.

    So a step is done whole or not at all (an administrator is never created without
    its password shown), and Ctrl-C never lands inside ``asyncio.run``'s teardown,
    which would print a traceback. Nested blocks pass the signal outwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, _frame: caught.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        signal.raise_signal(signal.SIGINT)


def write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` under a scratch name first: an interruption leaves one or
    the other, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.init-part")
    scratch.write_text(text)
    os.replace(scratch, path)


def gitignore_lines(directory: Path, state: Path) -> list[str]:
    """What ``.gitignore`` must cover: SQLite files and their journals, tokens, the
    lab's and the local state, and the state directory when it lies in the repository."""
    lines = list(sites.GITIGNORE)
    if statedirs.inside(state, directory):
        relative = state.resolve().relative_to(directory.resolve()).as_posix()
        lines.append(f"/{relative}/" if relative != "." else "/*")
    return lines


def this_host_name() -> str:
    """This machine's node name: its hostname's first label, as ``node add`` names one."""
    label = socket.gethostname().split(".", 1)[0].lower()
    cleaned = re.sub(r"[^a-z0-9-]", "-", label).strip("-")[:63]
    return cleaned if re.fullmatch(NAME_PATTERN, cleaned) else "seed"


@dataclass
class Seed:
    """The steps of one ``llmgw init``, over one directory and this host's state."""

    options: Options
    secret: Callable[[str], None]  # the terminal, once; never a log
    add_node: Callable[[str, str | None], None] | None = None  # `node add TARGET [--name]`
    detect_gpus: Callable[[], dict[str, int]] = starters.local_gpus
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def __post_init__(self) -> None:
        self.directory = self.options.directory
        self.cluster_dir = self.directory / "cluster"
        self.state = statedirs.default(self.environ)
        self._password: str | None = None
        self._check_options()

    # -- options, checked before any step runs ---------------------------------

    def _check_options(self) -> None:
        o = self.options
        try:
            users.check_name(o.admin)
        except users.UserError as exc:
            raise InitError(f"--admin: {exc}") from None
        if o.name is not None and not re.fullmatch(NAME_PATTERN, o.name):
            raise InitError(f"--name {o.name!r}: lower case letters, digits and -, "
                            "starting with a letter")
        if o.node_name is not None and not re.fullmatch(NAME_PATTERN, o.node_name):
            raise InitError(f"--node-name {o.node_name!r}: lower case letters, digits and -")
        if o.node not in (None, "local") and (
                not re.fullmatch(r"([a-z_][a-z0-9_.-]{0,31}@)?[A-Za-z0-9.:\[\]-]{1,253}", o.node)):
            raise InitError(f"--node {o.node!r}: expected local or [USER@]HOST[:PORT]")
        if o.postgres is not None:
            try:  # target_of's sentences first, then every check of a cluster file
                target = stores.target_of(o.postgres, "", None)
                StoreSettings(url=o.postgres)
            except ValidationError as exc:
                raise InitError(f"--postgres: {exc.errors()[0]['msg']}") from None
            except ValueError as exc:
                raise InitError(f"--postgres: {exc}") from None
            if target.kind != "postgresql":
                raise InitError(f"--postgres {o.postgres!r}: expected "
                                "postgresql://USER@HOST:5432/DATABASE")
        if o.model_file is not None and not o.model_file.is_file():
            raise InitError(f"--model-file {o.model_file}: no such file")
        if o.postgres_password_file is not None and not o.postgres_password_file.is_file():
            raise InitError(f"--postgres-password-file {o.postgres_password_file}: "
                            "no such file")

    def steps(self) -> list[Step]:
        return [
            Step("cluster files", self._look_files, self._write_files),
            Step(".gitignore", self._look_gitignore, self._write_gitignore),
            Step("administrator", self._look_admin, self._create_admin, self._tell_password),
            Step("mirror", self._look_mirror, self._make_mirror),
            Step("node", self._look_node, self._add_node,
                 atomic=self.options.node in (None, "local")),
            Step("model", self._look_model, self._add_model),
            Step("store", self._look_store, self._move_store),
        ]

    # -- 1. cluster files --------------------------------------------------------

    def host(self) -> sites.Host:
        return sites.this_host(self.directory, self.options.name)

    def _files(self) -> dict[str, str]:
        wanted = sites.files(self.host())
        del wanted[".gitignore"]  # step 2's
        pinned = statedirs.pinned(self.environ)
        if pinned is not None:
            text = wanted["cluster/cluster.yaml"]
            wanted["cluster/cluster.yaml"] = text.replace(
                "  auth: keys", f"  state_dir: {json.dumps(str(pinned))}   # this host's secrets: "
                "the admin token, the store's password\n  auth: keys", 1)
        return wanted

    def _missing_files(self) -> list[str]:
        return [p for p in self._files() if not (self.directory / p).exists()]

    def _look_files(self) -> Look:
        missing = self._missing_files()
        if missing:
            return Look(False, f"would write {', '.join(missing)}")
        return Look(True, "already there (" + ", ".join(
            Path(p).name for p in self._files()) + ")")

    def _write_files(self) -> str:
        missing = self._missing_files()
        wanted = self._files()
        for relative in missing:
            write_whole(self.directory / relative, wanted[relative])
        return f"wrote {', '.join(missing)}"

    # -- 2. .gitignore ------------------------------------------------------------

    def _gitignore_missing(self) -> list[str]:
        path = self.directory / ".gitignore"
        have = path.read_text().splitlines() if path.exists() else []
        return [line for line in gitignore_lines(self.directory, self.state) if line not in have]

    def _look_gitignore(self) -> Look:
        missing = self._gitignore_missing()
        if missing:
            return Look(False, f"would add {' '.join(missing)}")
        return Look(True, "already covers the store, tokens and state")

    def _write_gitignore(self) -> str:
        path = self.directory / ".gitignore"
        missing = self._gitignore_missing()
        text = path.read_text() if path.exists() else ""
        if text and not text.endswith("\n"):
            text += "\n"
        write_whole(path, text + "".join(line + "\n" for line in missing))
        return f"added {' '.join(missing)}"

    # -- the cluster and its store -------------------------------------------------

    def cluster(self) -> Cluster:
        try:
            return loading.load(self.cluster_dir)
        except loading.SpecErrors as exc:
            first = exc.errors[0]
            more = f" (and {len(exc.errors) - 1} more: llmgw validate)" if len(exc.errors) > 1 \
                else ""
            raise InitError(f"{first}{more}") from None

    def _on_store(self, action: Callable[[stores.Store], Any],
                  settings: StoreSettings | None = None) -> Any:
        async def go() -> Any:
            store = await stores.open_store(settings or self.cluster().cluster.store)
            try:
                return await action(store)
            finally:
                await store.close()
        try:
            with interrupts_deferred():
                return asyncio.run(go())
        except (stores.StoreError, migrations.SchemaTooNew) as exc:
            raise InitError(str(exc)) from None

    # -- 3. administrator ------------------------------------------------------------

    def _look_admin(self) -> Look:
        name = self.options.admin
        found = self._on_store(lambda store: users.get(store, name))
        if found is None:
            return Look(False, f"would create {name!r} with a generated password")
        if not found.admin:
            raise InitError(f"user {name!r} exists and is no admin: pass --admin ANOTHER, or "
                            f"`llmgw users delete {name}`")
        return Look(True, f"{name!r} already there (a lost password: "
                    f"`llmgw users passwd {name}`)")

    def _create_admin(self) -> str:
        name = self.options.admin
        password = secrets.token_urlsafe(PASSWORD_BYTES)

        async def create(store: stores.Store) -> None:
            await users.create(store, name, password, admin=True)
            await audits.record_cli(store, "user.create", user=name, role="admin",
                                    projects=None, admin_of=None)
        try:
            self._on_store(create)
        except users.UserError as exc:
            raise InitError(str(exc)) from None
        self._password = password
        return f"created {name!r} (password printed once below)"

    def _tell_password(self) -> None:
        password, self._password = self._password, None
        if password:
            name = self.options.admin
            self.secret(f"      password of {name}: {password}\n      shown this once: store "
                        f"it now (`llmgw users passwd {name}` sets another)")

    # -- 4. mirror ---------------------------------------------------------------------

    @property
    def mirror_dir(self) -> Path:
        return self.state / "mirror"

    def mirror_endpoint(self) -> str:
        # The name nodes reach this host by: its FQDN where it has one, else its hostname.
        name = socket.getfqdn()
        if "." not in name or name.startswith("localhost"):
            name = socket.gethostname() or "localhost"
        return f"http://{name}:{MIRROR_PORT}"

    def _look_mirror(self) -> Look:
        if not self.options.mirror:
            return Look(True, "skipped (--no-mirror)")
        endpoint = self.cluster().cluster.weights.endpoint
        hub = self.mirror_dir / "hub"
        gguf = starters.gguf(self.options.model_file)
        starter = gguf is None or caches.repo_dir(hub, starters.STARTER_REPO).exists()
        if endpoint and hub.is_dir() and starter:
            return Look(True, f"already there: {self.mirror_dir}, cluster.weights.endpoint "
                        f"{endpoint}")
        return Look(False, f"would make {self.mirror_dir} and set cluster.weights.endpoint")

    def _make_mirror(self) -> str:
        hub = self.mirror_dir / "hub"
        hub.mkdir(parents=True, exist_ok=True)
        gguf = starters.gguf(self.options.model_file)
        added = ""
        if gguf is not None and not caches.repo_dir(hub, starters.STARTER_REPO).exists():
            caches.add(hub, starters.STARTER_REPO, {starters.STARTER_REPO_FILE: gguf})
            added = f" with {starters.STARTER_REPO}"
        settings = self.cluster().cluster
        endpoint = settings.weights.endpoint
        if not endpoint:
            if "weights" in settings.model_fields_set:
                raise InitError(f"{self.cluster_dir}: cluster.weights is declared without an "
                                f"endpoint: add `endpoint: {self.mirror_endpoint()}` to it, or "
                                "pass --no-mirror")
            endpoint = self.mirror_endpoint()
            write_whole(self.cluster_dir / "mirror.yaml", MIRROR_YAML.format(
                endpoint=json.dumps(endpoint), dir=self.mirror_dir, port=MIRROR_PORT))
        return (f"made {self.mirror_dir}{added}; cluster.weights.endpoint {endpoint} "
                f"(serve it: llmgw mirror serve {self.mirror_dir} --listen "
                f"0.0.0.0:{MIRROR_PORT})")

    # -- 5. node -----------------------------------------------------------------------

    def _node_address(self) -> tuple[str, int | None]:
        node = self.options.node or "local"
        if node == "local":
            return "local", None
        host = node.rpartition("@")[2]
        if re.fullmatch(r"[^:\[\]]+:\d+", host):
            name, _, port = host.partition(":")
            return name, int(port)
        return host.strip("[]"), None

    def _found_node(self) -> str | None:
        address, port = self._node_address()
        cluster = self.cluster()
        for name, node in cluster.nodes.items():
            if node.address == address and (port is None or
                                            (node.ssh_port or cluster.cluster.ssh.port) == port):
                return name
        return None

    def _look_node(self) -> Look:
        if self.options.node is None:
            return Look(True, "skipped (--no-node)")
        found = self._found_node()
        if found:
            return Look(True, f"{found} already in nodes.yaml")
        if self.options.node == "local":
            return Look(False, "would add this machine (address: local)")
        return Look(False, f"would run node add {self.options.node}")

    def _add_node(self) -> str:
        if self.options.node != "local":
            assert self.options.node is not None
            if self.add_node is None:
                raise InitError("--node over SSH needs `llmgw init` itself")
            self.add_node(self.options.node, self.options.node_name)
            found = self._found_node()
            if found is None:
                raise InitError(f"node add {self.options.node} wrote no node into nodes.yaml")
            return f"added {found} over SSH (node add {self.options.node})"
        name = self.options.node_name or this_host_name()
        if name in self.cluster().nodes:
            raise InitError(f"nodes.yaml already has a node {name!r} at another address: "
                            "pass --node-name")
        entry: dict[str, object] = {"address": "local",
                                    "weights_dirs": [str(self.state / "weights")]}
        if os.geteuid() != 0:  # /run/llmgw is root's: the agent's socket goes with the state
            entry["agent_socket"] = str(self.state / "agent.sock")
        counts = self.detect_gpus()
        if counts:
            entry["gpus"] = [{"class": c, "count": n} for c, n in sorted(counts.items())]
        path = self.cluster_dir / "nodes.yaml"
        after, _ = yamledits.add_node(path.read_text() if path.exists() else "", name, entry)
        (self.state / "weights").mkdir(parents=True, exist_ok=True)
        write_whole(path, after)
        gpus = ", ".join(f"{n}× {c}" for c, n in sorted(counts.items())) or "no GPU"
        return f"added {name} (address: local, {gpus})"

    # -- 6. model ----------------------------------------------------------------------

    def _look_model(self) -> Look:
        if not self.options.model:
            return Look(True, "skipped (--no-model)")
        cluster = self.cluster()
        if cluster.models:
            return Look(True, f"already there ({', '.join(sorted(cluster.models))})")
        return Look(False, "would declare a starter that fits the nodes")

    def _starter(self, cluster: Cluster) -> tuple[str, dict[str, Any], str]:
        """The starter's name, its entry in models.yaml and why it was chosen."""
        classes: dict[str, int] = {}
        for node in cluster.nodes.values():
            for gpu in node.gpus:
                classes[gpu.gpu_class] = max(classes.get(gpu.gpu_class, 0), gpu.count)
        chosen = starters.for_gpus(classes, checks.known_classes(cluster)) if classes else None
        if chosen is not None:
            candidate, gpu_class = chosen
            return candidate.name, starters.gpu_entry(candidate, gpu_class), (
                f"fits 1× {gpu_class} at {starters.GPU_CONTEXT // 1024}k context")
        gguf = starters.gguf(self.options.model_file)
        local = next((n for n in cluster.nodes.values() if n.is_local and n.weights_dirs), None)
        if gguf is not None and local is not None:
            placed = Path(local.weights_dirs[0]) / starters.STARTER_FILE
            if not placed.exists():
                placed.parent.mkdir(parents=True, exist_ok=True)
                try:  # a hard link where possible, else a copy: never a link out of the dir
                    os.link(gguf, placed)
                except OSError:
                    shutil.copyfile(gguf, placed)
            source, why = str(placed), "on CPU, from this machine's file"
        else:
            mirror = " mirror" if cluster.cluster.weights.endpoint else ""
            source, why = f"{starters.STARTER_REPO}:Q4_K_M", f"on CPU, from the hub{mirror}"
        return starters.NAME, starters.cpu_entry(source), why

    def _add_model(self) -> str:
        name, entry, why = self._starter(self.cluster())
        path = self.cluster_dir / "models.yaml"
        before = path.read_text() if path.exists() else sites.MODELS_YAML
        write_whole(path, yamledits.add_model(before, name, entry))
        return f"declared {name} ({why})"

    # -- 7. store ----------------------------------------------------------------------

    def _look_store(self) -> Look:
        settings = self.cluster().cluster.store
        wanted = self.options.postgres
        if wanted is None:
            where = settings.url or f"SQLite at {settings.path}"
            return Look(True, f"{where} (--postgres URL moves it)")
        if settings.url == wanted:
            if self._admin_on(settings) is not None:
                return Look(True, f"already on {wanted}")
            return Look(False, f"would finish copying the store to {wanted}")
        return Look(False, f"would copy the store to {wanted} and switch")

    def _admin_on(self, settings: StoreSettings) -> users.User | None:
        return self._on_store(  # type: ignore[no-any-return]
            lambda store: users.get(store, self.options.admin), settings)

    def _move_store(self) -> str:
        """Name PostgreSQL in cluster.yaml, copy the SQLite store into it through what
        the file names, read the administrator back; on any failure, move back.

        The SQLite ``path`` stays in the store section (unused while ``url`` is set), so
        a rerun after an interruption knows what to copy, and moving back is dropping
        ``url``. The copy is one transaction: it is all there or none of it."""
        path = self.cluster_dir / "cluster.yaml"
        current = path.read_text()
        old = self.cluster().cluster.store
        wanted = self.options.postgres
        assert wanted is not None
        if old.url and old.url != wanted:
            raise InitError(f"the store is on {old.url}, not SQLite: `llmgw store migrate "
                            f"--to {wanted}` moves it")
        sqlite = {"path": old.path}
        back = current if not old.url else yamledits.set_cluster_key(current, "store", sqlite)
        settings: dict[str, Any] = {"url": wanted, **sqlite}
        if self.options.postgres_password_file is not None:
            settings["password_file"] = str(self.options.postgres_password_file.absolute())
        write_whole(path, yamledits.set_cluster_key(current, "store", settings))
        source_name = f"sqlite:{Path(old.path).resolve()}"

        async def copy(target: stores.Store) -> copies.CopyReport:
            source = await stores.open_store(StoreSettings(path=old.path))
            try:
                return await copies.copy(source, target, source_name)
            finally:
                await source.close()
        try:
            new = self.cluster().cluster.store  # as `llmgw serve` will read it
            try:
                report: copies.CopyReport = self._on_store(copy, new)
            except stores.StoreError as exc:  # not empty, a mismatch: raised by the copy
                raise InitError(str(exc)) from None
            if self._admin_on(new) is None:
                raise InitError(f"{self.options.admin!r} is not there after the copy")
        except InitError as exc:
            write_whole(path, back)
            raise InitError(f"--postgres {wanted}: {exc}; moved back: the store stays SQLite "
                            f"at {old.path}") from None
        return (f"copied {report.copied('users')} users and {report.copied('keys')} keys to "
                f"{wanted}; cluster.yaml names it (SQLite kept at {old.path})")
