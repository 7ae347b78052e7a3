"""Simulated nodes for tests: the harness lives in :mod:`llmgw.onboarding.simnodes`.

``llmgw lab`` starts the same nodes for people; this module keeps the names
the tests have always used (``nodes.SimCluster``, ``nodes.free_port``, …).
"""

from __future__ import annotations

from llmgw.onboarding.processes import MARKER, STOP_TIMEOUT, terminate
from llmgw.onboarding.processes import alive as _alive
from llmgw.onboarding.simnodes import (
    FIXTURES,
    SSHD,
    START_TIMEOUT,
    HarnessError,
    SimCluster,
    SimNode,
    agent_config,
    fabric_specs,
    fingerprint,
    fingerprints_in,
    fixture_settings,
    free_port,
    free_ports,
    keygen,
    node_spec,
    sweep_abandoned,
)

__all__ = [
    "FIXTURES", "MARKER", "SSHD", "START_TIMEOUT", "STOP_TIMEOUT", "HarnessError", "SimCluster",
    "SimNode", "_alive", "agent_config", "fabric_specs", "fingerprint", "fingerprints_in",
    "fixture_settings", "free_port", "free_ports", "keygen", "node_spec", "sweep_abandoned",
    "terminate",
]
