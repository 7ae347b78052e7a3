"""Request ids for usage rows: unique across routers, without a syscall per request.

A usage row's ``request_id`` is how the store writes it once (:mod:`llmgw.store.outages`
skips an id it holds), so two routers, or two ``--workers`` of one, must never draw the
same one. ``secrets.token_hex(12)`` per request did that with a read of the kernel's
random source each time (a system call per request). Here a process draws a 48-bit
random prefix once and counts after it; a process forked from another draws its own
prefix on its first id (``os.register_at_fork`` bumps a generation the ids compare
with, no system call per id), so forks never share a counter.

    ids = RequestIds()
    ids.next()  # '3f9c0a1b2c4d000000000000': 24 hex digits, as token_hex(12) gave
"""

from __future__ import annotations

import itertools
import os
import secrets

_generation = 0  # bumped in a forked child: its ids draw a new prefix


def _forked() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forked)


class RequestIds:
    def __init__(self) -> None:
        self._generation = -1
        self._prefix = ""
        self._counter = itertools.count()

    def next(self) -> str:
        """A new id: 12 hex digits of this process's random prefix, 12 of its counter."""
        if self._generation != _generation:
            self._generation, self._prefix = _generation, secrets.token_hex(6)
            self._counter = itertools.count()
        return f"{self._prefix}{next(self._counter) % (1 << 48):012x}"
