"""Onboarding: simulated labs, and bringing nodes into a cluster.

Above transport, agent and spec; below daemon and cli (see pyproject's
import-linter contracts). :mod:`llmgw.onboarding.labs` starts simulated nodes
(:mod:`llmgw.onboarding.simnodes`) that outlive the command and writes a
cluster directory for them.
"""
