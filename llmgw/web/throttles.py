"""Login limits: backoff per source address, and an account-level alarm that cannot lock out.

The rules, each a pure function of the records below and the clock:

* **Per source.** Every failed login from a source (an IPv4 address, an IPv6
  /64) counts. The first ``free`` failures cost nothing; after that the source
  must wait ``base · 2^(n − free)`` seconds after its last failure, capped at
  ``cap``, before its next attempt is even checked. A source's count is
  forgotten ``forget`` seconds after its last failure.
* **Per account.** Failures against an existing account are counted too.
  An account with ``alarm`` or more failures, none more than ``forget``
  apart, is *under attack*: from then on a source that has failed before
  gets no free attempts for it (it waits ``base`` after its first failure,
  and twice as long after each further one).
  A source without failures is never held back, so the account's owner
  logs in from their own address however hard a stranger hammers the name.
* **Bounded.** Each table keeps at most ``max_keys`` records, one small
  record per key (not one entry per failure): when full, forgotten records go
  first, then the least recently failed. A stranger who rotates names fills
  nothing (only existing accounts are recorded); one who rotates addresses
  evicts old sources, which is all they gain from addresses they own anyway.

A success clears nothing: otherwise an attacker with one valid account of
their own could reset their source's backoff between guesses.

Usage::

    limiter = Limiter(clock=time.time)
    wait = limiter.retry_after(source, account)   # 0: check the password now
    limiter.failed(source, account, known=True)  # a wrong password for an existing account
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Record:
    """Failures of one key: how many, and when the last one was."""

    count: int
    last: float


@dataclass(frozen=True)
class Rules:
    free: int = 5  # failures per source before any backoff
    base: float = 1.0  # seconds of the first backoff
    cap: float = 900.0  # the longest backoff
    forget: float = 3600.0  # a record is dropped this long after its last failure
    alarm: int = 10  # an account with this many failures is under attack
    max_keys: int = 10_000  # records per table

    def backoff(self, count: int, free: int) -> float:
        """Seconds a source with ``count`` failures waits after its last one."""
        free = max(free, 1)  # the first failure itself is always checked
        if count < free:
            return 0.0
        return min(self.cap, self.base * 2.0 ** min(count - free, 32))


class Limiter:
    """Failed logins per source and per account; see the module's rules."""

    def __init__(self, rules: Rules | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.rules = rules or Rules()
        self.clock = clock
        self.sources: OrderedDict[str, Record] = OrderedDict()
        self.accounts: OrderedDict[str, Record] = OrderedDict()

    def retry_after(self, source: str, account: str) -> int:
        """Whole seconds until ``source`` may try ``account``; 0 when it may now."""
        now = self.clock()
        mine = self._live(self.sources, source, now)
        if mine is None:
            return 0  # a source without failures is never held back
        free = 0 if self.under_attack(account) else self.rules.free
        wait = mine.last + self.rules.backoff(mine.count, free) - now
        return math.ceil(wait) if wait > 0 else 0

    def under_attack(self, account: str) -> bool:
        record = self._live(self.accounts, account, self.clock())
        return record is not None and record.count >= self.rules.alarm

    def failures(self, source: str) -> int:
        record = self._live(self.sources, source, self.clock())
        return record.count if record else 0

    def failed(self, source: str, account: str, *, known: bool) -> None:
        """Count a wrong password from ``source``; for ``account`` too when it exists."""
        now = self.clock()
        self._count(self.sources, source, now)
        if known:
            self._count(self.accounts, account, now)

    def _live(self, table: OrderedDict[str, Record], key: str, now: float) -> Record | None:
        record = table.get(key)
        if record is not None and now - record.last > self.rules.forget:
            del table[key]
            return None
        return record

    def _count(self, table: OrderedDict[str, Record], key: str, now: float) -> None:
        # The table is ordered by last failure, so forgotten records are a prefix.
        while table and now - next(iter(table.values())).last > self.rules.forget:
            table.popitem(last=False)
        record = table.get(key)
        if record is None:
            if len(table) >= self.rules.max_keys:
                table.popitem(last=False)  # full: the least recently failed goes
            table[key] = Record(1, now)
        else:
            record.count += 1
            record.last = now
            table.move_to_end(key)


def source_of(address: str) -> str:
    """The limiter's key for a client address: IPv4 as is, IPv6 by its /64.

    One host usually owns a whole IPv6 /64, so counting single IPv6 addresses
    would give it 2^64 fresh sources. An IPv4-mapped IPv6 address is its IPv4.
    Anything that is not an address (a Unix socket peer) is one source, "?".
    """
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return "?"
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((parsed, 64), strict=False))
    return str(parsed)
