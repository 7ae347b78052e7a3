"""Fixtures: a router in front of real upstreams (see support.stacks)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.stacks import Stack, StackFactory, cluster

from llmgw.router import Settings
from llmgw.spec.models import Cluster


@pytest.fixture
def make_stack(tmp_path: Path, store_settings: dict[str, str]) -> Iterator[StackFactory]:
    """Stacks on each store implementation in turn (SQLite, then a real PostgreSQL)."""
    stacks: list[Stack] = []

    def make(spec: Cluster | None = None, replicas: int = 2, **settings: Any) -> Stack:
        stack = Stack(tmp_path, spec or cluster(), Settings(**settings), replicas,
                      store_settings)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.close()


@pytest.fixture
def stack(make_stack: StackFactory) -> Stack:
    """Model `chat` on two replicas, key auth, project `research` without a budget."""
    s = make_stack()
    s.route({"chat": s.upstreams})
    return s
