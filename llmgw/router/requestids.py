"""Request ids for usage rows: unique across routers, without a syscall per request.

A usage row's ``request_id`` is how the store writes it once (:mod:`llmgw.store.outages`
skips an id it holds), so two routers, or two ``--workers`` of one, must never draw the
same one. ``secrets.token_hex(12)`` per request did that with a read of the kernel's
random source each time (about 1 % of the router's CPU in the bench's profile). Here a
process draws a 48-bit random prefix once and counts after it; a process forked from
another draws its own prefix on its first id (the pid is compared), so forks never
share a counter.

    ids = RequestIds()
    ids.next()  # '3f9c0a1b2c4d000000000000': 24 hex digits, as token_hex(12) gave
"""

from __future__ import annotations

import itertools
import os
import secrets


class RequestIds:
    def __init__(self) -> None:
        self._pid = -1
        self._prefix = ""
        self._counter = itertools.count()

    def next(self) -> str:
        """A new id: 12 hex digits of this process's random prefix, 12 of its counter."""
        pid = os.getpid()
        if pid != self._pid:
            self._pid, self._prefix = pid, secrets.token_hex(6)
            self._counter = itertools.count()
        return f"{self._prefix}{next(self._counter) % (1 << 48):012x}"
