"""Every profile of a cluster checked as the engine would see it.

The spec layer checks shape and arithmetic; whether each profile's command
lines are ones its engine version accepts is the engines' knowledge. This is
that check, in the form the spec loader takes (``extra_checks``), so that
``llmgw validate``, ``plan`` and the daemon report it at ``file:line:col``.

A purely computational module with no side effects.

Usage::

    loading.load(directory, extra_checks=[profiles.check])
"""

from __future__ import annotations

from collections.abc import Iterator

from llmgw.engines import launches
from llmgw.spec.checks import Problem
from llmgw.spec.models import Cluster


def check(cluster: Cluster) -> Iterator[Problem]:
    """Problems with each profile's command lines, addressed to the field at fault."""
    for name, model in cluster.models.items():
        for index, profile in enumerate(model.profiles):
            source = profile.source or model.source or "org/model"
            for finding in launches.findings(profile, source, tuple(model.adapters)):
                if finding.where == ("nodes",):
                    continue  # llmgw.spec.checks already says so, in its own words
                yield Problem(("models", name, "profiles", index, *finding.where),
                              f"models.{name}.profiles[{index}]: {finding.message}")
