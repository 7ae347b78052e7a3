"""Pytest fixtures for simulated nodes (registered in ``tests/conftest.py``).

``sim_cluster`` is a factory: ``sim_cluster(3)`` starts three nodes (sshd and
an agent each, hardware from :data:`DEFAULT_HARDWARE` in turn) and returns a
:class:`support.nodes.SimCluster`; everything it started is stopped when
the test ends, pass or fail.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from support import nodes, postgres

from llmgw.onboarding import enrolments, simenrolments
from llmgw.spec import statedirs

SimClusterFactory = Callable[..., nodes.SimCluster]


@pytest.fixture(autouse=True)
def state_dir(tmp_path_factory: pytest.TempPathFactory,
              monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's own control-host state directory (``$LLMGW_STATE_DIR``, inherited by
    the processes it starts): ``llmgw serve`` writes its admin token there, never into
    the tester's ``~/.local/state/llmgw`` or ``/var/lib/llmgw``. Outside ``tmp_path``, so
    a test that makes ``tmp_path`` a git repository does not hold it."""
    path = tmp_path_factory.mktemp("llmgw-state")
    monkeypatch.setenv(statedirs.ENV, str(path))
    return path
# The wheels `node add` ships, built once (the dependencies need the package index once).
WHEELS = Path(__file__).resolve().parents[2] / ".cache" / "wheels"
# Fixture hardware (tests/fixtures/nodes/) the nodes get in turn, unless a test says.
DEFAULT_HARDWARE = ("h100-ib", "l40s-nofabric", "cpu-only")


@pytest.fixture
def sim_cluster() -> Iterator[SimClusterFactory]:
    if not shutil.which(nodes.SSHD) or not shutil.which("ssh-keygen"):
        pytest.skip("OpenSSH server not installed (make sysdeps)")
    nodes.sweep_abandoned()
    made: list[nodes.SimCluster] = []

    def make(
        count: int = 3,
        *,
        hardware: Sequence[str] = DEFAULT_HARDWARE,
        sshd: bool = True,
        agents: bool = True,
        prefix: str = "node",
    ) -> nodes.SimCluster:
        sim = nodes.SimCluster.create()
        made.append(sim)
        kinds = list(hardware)
        for index in range(count):
            sim.add_node(f"{prefix}-{index + 1:02d}", kinds[index % len(kinds)])
        sim.start(sshd=sshd, agents=agents)
        sim.pin_host_keys()
        return sim

    yield make
    for sim in made:
        sim.close()


@pytest.fixture
def enrolled_cluster() -> Iterator[SimClusterFactory]:
    """``enrolled_cluster(2)``: bare nodes (sshd only) enrolled by the real ``llmgw node add``
    as root, the daemon logging in as an account of this test only (``llmgw-t…``: a system
    account in group llmgw, shell nologin, made by node add), its agents started by node
    add from the venv it installed; ``nodes.yaml`` as node add wrote it. Everything is
    stopped, and the account deleted, when the test ends."""
    if not shutil.which(nodes.SSHD) or not shutil.which("ssh-keygen"):
        pytest.skip("OpenSSH server not installed (make sysdeps)")
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("node add makes a system account: needs root and useradd (CI runs as root)")
    try:
        enrolments.build_wheels(WHEELS)
    except enrolments.EnrolError as exc:
        pytest.skip(f"cannot build the wheels node add ships (no package index?): {exc}")
    nodes.sweep_abandoned()
    account = f"llmgw-t{secrets.token_hex(4)}"
    had_group = subprocess.run(["getent", "group", "llmgw"], capture_output=True).returncode == 0
    made: list[nodes.SimCluster] = []

    def make(count: int = 1, *, hardware: Sequence[str] = ("cpu-only",),
             prefix: str = "node") -> nodes.SimCluster:
        sim = nodes.SimCluster.create()
        made.append(sim)
        kinds = list(hardware)
        for index in range(count):
            sim.add_node(f"{prefix}-{index + 1:02d}", kinds[index % len(kinds)])
        sim.start(agents=False)
        sim.account = account
        sim.write_cluster()
        sim.known_hosts.write_text("")  # node add pins each key, by its fingerprint
        simenrolments.enrol(sim.cluster_dir, list(sim.nodes.values()), account, WHEELS,
                            weights_dirs=sim.weights_dirs)
        return sim

    yield make
    for sim in made:
        sim.close()
    simenrolments.remove_account(account, group=not had_group)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[postgres.PgServer]:
    """One real PostgreSQL per test session (the Debian package, no system service)."""
    if postgres.bindir() is None:
        pytest.skip("PostgreSQL not installed (make sysdeps)")
    server = postgres.PgServer()
    yield server
    server.stop()


@pytest.fixture
def postgres_db(postgres_server: postgres.PgServer) -> postgres.Database:
    """A fresh, empty database on the session's PostgreSQL."""
    return postgres_server.database()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_settings(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The ``cluster.store`` section of each kind: run a test once per implementation."""
    if request.param == "sqlite":
        return {"path": str(tmp_path / "llmgw.db")}
    database: postgres.Database = request.getfixturevalue("postgres_db")
    return database.settings
