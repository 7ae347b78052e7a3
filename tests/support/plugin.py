"""Pytest fixtures for simulated nodes (registered in ``tests/conftest.py``).

``sim_cluster`` is a factory: ``sim_cluster(3)`` starts three nodes (sshd and,
once the agent exists, an agent each) and returns a
:class:`support.nodes.SimCluster`; everything it started is stopped when
the test ends, pass or fail.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence

import pytest
from support import nodes

SimClusterFactory = Callable[..., nodes.SimCluster]


@pytest.fixture
def sim_cluster() -> Iterator[SimClusterFactory]:
    if not shutil.which(nodes.SSHD) or not shutil.which("ssh-keygen"):
        pytest.skip("OpenSSH server not installed (make sysdeps)")
    made: list[nodes.SimCluster] = []

    def make(
        count: int = 3,
        *,
        hardware: Sequence[str | None] | None = None,
        sshd: bool = True,
        agents: bool = True,
        prefix: str = "node",
    ) -> nodes.SimCluster:
        sim = nodes.SimCluster.create()
        made.append(sim)
        kinds = list(hardware) if hardware is not None else [None] * count
        for index in range(count):
            node = sim.add_node(f"{prefix}-{index + 1:02d}", kinds[index % len(kinds)])
            if sshd:
                node.start_sshd()
            if agents:
                sim.start_agent(node)
        sim.pin_host_keys()
        return sim

    yield make
    for sim in made:
        sim.close()
