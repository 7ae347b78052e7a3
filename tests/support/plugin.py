"""Pytest fixtures for simulated nodes (registered in ``tests/conftest.py``).

``sim_cluster`` is a factory: ``sim_cluster(3)`` starts three nodes (sshd and
an agent each, hardware from :data:`DEFAULT_HARDWARE` in turn) and returns a
:class:`support.nodes.SimCluster`; everything it started is stopped when
the test ends, pass or fail.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence

import pytest
from support import nodes

SimClusterFactory = Callable[..., nodes.SimCluster]
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
