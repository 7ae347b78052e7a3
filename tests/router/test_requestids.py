"""Usage-row request ids: the store writes a row once per id, so ids never repeat."""

from __future__ import annotations

import os

import pytest

from llmgw.router import requestids
from llmgw.router.requestids import RequestIds


def test_ids_of_one_process_never_repeat_and_look_like_token_hex_12() -> None:
    ids = RequestIds()
    drawn = [ids.next() for _ in range(10_000)]
    assert len(set(drawn)) == len(drawn)
    assert all(len(i) == 24 and int(i, 16) >= 0 for i in drawn)


def test_two_routers_draw_different_prefixes() -> None:
    assert RequestIds().next()[:12] != RequestIds().next()[:12]


def test_a_forked_process_draws_its_own_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = RequestIds()
    parent = [ids.next() for _ in range(3)]
    monkeypatch.setattr(requestids, "_generation", requestids._generation)
    requestids._forked()  # what os.register_at_fork runs in a child
    child = [ids.next() for _ in range(3)]
    assert child[0][:12] != parent[0][:12]
    assert not set(parent) & set(child)


def test_a_real_fork_draws_its_own_prefix() -> None:
    ids = RequestIds()
    parent = ids.next()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: send its next id, leave at once
        os.write(write, ids.next().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert len(child) == 24 and child[:12] != parent[:12]
