"""Requests and tokens per minute, per project and per key, across every router.

A request of a project is admitted against up to four limits: its project's
``rpm`` and ``tpm`` (cluster files) and its key's own (``llmgw keys create
--rpm N --tpm N``). The counts live in the store, one counter per limit and
minute (:mod:`llmgw.store.ratelimits`): a **fixed one-minute window**,
``floor(unix time / 60)`` by the router's clock, so the window a client sees
in ``x-ratelimit-reset-*`` and ``Retry-After`` is the same on every router
(routers whose clocks differ by a second disagree on the minute's turn by as
much; NTP keeps that to milliseconds).

**The bound.** An admission adds to all the request's counters of the minute,
or to none, atomically across routers, ``--workers`` and both databases; so in
any minute a project (or key) is admitted **at most its ``rpm`` requests**:
no overshoot at all, which is within the promise of at most one request per
router beyond the limit. Refusals add nothing, so there is no under-admission
either: while a minute's count is below ``rpm``, a request is admitted. (A
fixed window lets up to twice ``rpm`` through in the 60 s around a minute's
boundary, as any per-minute window does.)

**Tokens.** A request counts its estimate at admission (:func:`accounts.estimate`:
its prompt's bytes as tokens plus its output limit × ``n``, capped by the
model's context), and is refused when that would pass ``tpm``; when it ends,
its minute is corrected to what it really used (the engine's usage; what was
served when it ended early; its estimate when a success's usage cannot be
read). So the tokens admitted in a minute stay within ``tpm`` as long as
answers use no more than their estimate — always, when a client sets an
output limit; in flight, the estimate (larger) holds the room. A request whose
estimate is above the whole ``tpm`` is refused at once: no minute can fit it.

**The local fast path.** A router that saw a counter full for this minute
refuses the next request of that counter itself, without a store round trip,
until the minute ends (requests; a request count never falls within its
minute) or for one second (tokens, which corrections give back), unless the
limit was raised meanwhile (``llmgw keys limits``): then the store is asked.

**Store outages.** While the store cannot be reached, each router counts in
its own window (:meth:`RateLimiter._take_locally`): a counter starts from
what the store last answered for this minute and the same limit applies. The
store is asked again at most every :data:`RETRY` seconds (not once per
request), and the first call that reaches it first adds what was admitted
locally this minute to the store's counters (:meth:`RateLimiter._send`), so
the rest of the minute counts them. So one router passes no limit; with N
routers a project may pass up to N × its limit in a minute of outage. One
line is logged when the store goes, none per request.

**Budgets.** Limits are checked before the budget is reserved
(:meth:`accounts.Accounts.reserve`), so a request refused for its rate
reserves nothing; they never admit what the reservation would refuse.

Usage::

    limiter = RateLimiter(store, clock=time.time, refused=metrics.rate_limited)
    ticket = await limiter.admit(limits_of(project, key, catalog, principal), tokens)
    ... response.headers.update(ticket.headers) ...
    await limiter.settle(ticket, used_tokens)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmgw.router.errors import ApiError
from llmgw.store.ratelimits import Count, Taken
from llmgw.store.stores import Store, StoreError

log = logging.getLogger(__name__)

WINDOW = 60.0  # seconds: a minute
TOKENS_FULL_FOR = 1.0  # seconds a router believes a full token counter without asking
RETRY = 1.0  # seconds between tries of a store that could not be reached
_NO_LIMIT = 2**62  # a counter's limit when what is added was admitted already
Kind = Literal["requests", "tokens"]
_ABBREVIATIONS = {"requests": "RPM", "tokens": "TPM"}


@dataclass(frozen=True)
class Limit:
    """One limit a request is admitted against."""

    owner: str  # for people: "project 'research'", "key 3kq8zt1mw0ab"
    project: str  # the project it is counted for (metrics)
    name: str  # the store's counter: p:<project>:requests, k:<key id>:tokens
    kind: Kind
    limit: int


def limits_of(project: str, key_id: str | None, project_rpm: int | None,
              project_tpm: int | None, key_rpm: int | None = None,
              key_tpm: int | None = None) -> list[Limit]:
    """The limits of a request of ``project`` by key ``key_id`` (None: a page's session,
    which has only its project's). This is a purely computational function."""
    wanted: list[tuple[str, str, Kind, int | None]] = [
        (f"project {project!r}", f"p:{project}", "requests", project_rpm),
        (f"project {project!r}", f"p:{project}", "tokens", project_tpm)]
    if key_id is not None:
        wanted += [(f"key {key_id}", f"k:{key_id}", "requests", key_rpm),
                   (f"key {key_id}", f"k:{key_id}", "tokens", key_tpm)]
    return [Limit(owner, project, f"{counter}:{kind}", kind, limit)
            for owner, counter, kind, limit in wanted if limit is not None]


def slot_of(now: float) -> int:
    """The minute ``now`` (Unix time) falls in. This is a purely computational function."""
    return math.floor(now / WINDOW)


def reset_after(now: float) -> float:
    """Seconds from ``now`` until its minute ends and the counts start again."""
    return (slot_of(now) + 1) * WINDOW - now


def duration(seconds: float) -> str:
    """A reset time as OpenAI writes it: ``12s``, ``1m0s`` (whole seconds, rounded up)."""
    whole = max(math.ceil(seconds), 1)
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


def headers(limits: Sequence[Limit], used: Sequence[int], now: float) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers for the tightest limit of each kind (the least
    remaining): ``limit``, ``remaining`` and ``reset`` for requests and for tokens. This is
    a purely computational function."""
    out: dict[str, str] = {}
    for kind in ("requests", "tokens"):
        pairs = [(lim, u) for lim, u in zip(limits, used, strict=True) if lim.kind == kind]
        if not pairs:
            continue
        lim, u = min(pairs, key=lambda p: (p[0].limit - p[1], p[0].limit))
        out[f"x-ratelimit-limit-{kind}"] = str(lim.limit)
        out[f"x-ratelimit-remaining-{kind}"] = str(max(lim.limit - u, 0))
        out[f"x-ratelimit-reset-{kind}"] = duration(reset_after(now))
    return out


@dataclass
class Ticket:
    """What one admission took: settle it when the request ends."""

    slot: int
    tokens: tuple[str, ...]  # the token counters it added its estimate to
    estimate: int
    headers: dict[str, str] = field(default_factory=dict)


class RateLimiter:
    """Admissions against the store's counters, with a local fast path for full ones.

    ``clock`` is Unix time (injected in tests); ``refused(project, kind)`` is called for
    every refusal (the metrics)."""

    def __init__(self, store: Store | None, clock: Callable[[], float] = time.time,
                 refused: Callable[[str, str], None] | None = None) -> None:
        self.store = store
        self.clock = clock
        self.refused = refused or (lambda project, kind: None)
        # counter name → (its minute, the clock time until which it is known full, the
        # limit it was full at: a key's limits raised meanwhile ask the store again)
        self._full: dict[str, tuple[int, float, int]] = {}
        # counter name → its count as the store last answered, this minute (the headers
        # of a refusal answered locally)
        self._seen: dict[str, int] = {}
        self._slot: int | None = None
        # While the store is away: counter → its count this minute on this router, and
        # what this router admitted that the store has not counted yet (sent on recovery)
        self._local: dict[str, int] = {}
        self._unsent: dict[str, int] = {}
        self._away = False
        self._retry_at = 0.0  # clock time of the next try of a store that is away

    async def admit(self, limits: Sequence[Limit], tokens: int,
                    now: float | None = None) -> Ticket | None:
        """Count one request estimated at ``tokens`` against ``limits`` in the minute of
        ``now`` (its arrival by :attr:`clock`; default: the clock now); None when none
        applies. ApiError 429 ``rate_limit_exceeded`` (with ``Retry-After`` and the
        headers) when one is full, 503 ``store_unavailable`` when the store is not there."""
        if not limits or self.store is None:
            return None
        now = self.clock() if now is None else now
        slot = slot_of(now)
        for lim in limits:
            if lim.kind == "tokens" and tokens > lim.limit:
                self.refused(lim.project, lim.kind)
                raise ApiError(
                    429, f"Request too large for {lim.owner} on tokens per min (TPM): "
                    f"Limit {lim.limit}, Requested {tokens} (its prompt's bytes and "
                    "max_tokens × n). Lower max_tokens or the prompt.",
                    code="rate_limit_exceeded", type="tokens", param="max_tokens")
        self._forget(slot, now)
        for i, lim in enumerate(limits):
            known = self._full.get(lim.name)
            if known and lim.limit <= known[2]:  # the fast path: refused without the store
                used = [self._seen.get(x.name, 0) for x in limits]
                raise self._refusal(limits, used, i, tokens, now)
        counts = [Count(lim.name, lim.limit, 1 if lim.kind == "requests" else tokens)
                  for lim in limits]
        if self._away and now < self._retry_at:
            taken = self._take_locally(counts)
        else:
            try:
                await self._send(slot)
                taken = await self.store.take_rate(slot, counts)
            except StoreError as exc:
                if not self._away:
                    log.error("cannot count requests against their rate limits in the "
                              "store; counting on this router until it returns: %s", exc)
                self._away, self._retry_at = True, now + RETRY
                taken = self._take_locally(counts)
            else:
                self._away = False
        self._seen.update((lim.name, u) for lim, u in zip(limits, taken.used, strict=True))
        if not taken.admitted:
            over = next(i for i, (c, u) in enumerate(zip(counts, taken.used, strict=True))
                        if u + c.amount > c.limit)
            for c, u, lim in zip(counts, taken.used, limits, strict=True):
                if u + c.amount > c.limit and (lim.kind == "requests" or u >= lim.limit):
                    until = (slot + 1) * WINDOW if lim.kind == "requests" else min(
                        now + TOKENS_FULL_FOR, (slot + 1) * WINDOW)
                    self._full[lim.name] = (slot, until, lim.limit)
            raise self._refusal(limits, list(taken.used), over, tokens, now)
        return Ticket(slot, tuple(lim.name for lim in limits if lim.kind == "tokens"), tokens,
                      headers(limits, taken.used, now))

    def _take_locally(self, counts: Sequence[Count]) -> Taken:
        """As the store's take_rate, on this router's own counts of the minute: from what
        the store last answered, plus what this router admitted since."""
        used = tuple(max(self._local.get(c.name, 0), self._seen.get(c.name, 0))
                     for c in counts)
        if any(u + c.amount > c.limit for c, u in zip(counts, used, strict=True)):
            return Taken(False, used)
        after = tuple(u + c.amount for c, u in zip(counts, used, strict=True))
        self._local.update((c.name, a) for c, a in zip(counts, after, strict=True))
        for c in counts:
            self._unsent[c.name] = self._unsent.get(c.name, 0) + c.amount
        return Taken(True, after)

    async def _send(self, slot: int) -> None:
        """Add to the store's counters of minute ``slot`` what this router admitted while
        it was away (StoreError: what is left stays unsent)."""
        assert self.store is not None
        if not self._unsent:
            return
        # take_rate, not adjust_rate: it creates a minute's row the store lacks; what was
        # admitted is counted whatever the limit (it was admitted already).
        added = [Count(name, _NO_LIMIT, amount) for name, amount in self._unsent.items()
                 if amount > 0]
        if added:
            await self.store.take_rate(slot, added)
            for c in added:
                del self._unsent[c.name]
        for name, amount in list(self._unsent.items()):
            if amount:
                await self.store.adjust_rate(slot, name, amount)
            del self._unsent[name]

    async def settle(self, ticket: Ticket | None, tokens: int) -> None:
        """The request of ``ticket`` used ``tokens``: correct its minute's token counters
        from its estimate to that. A store error keeps the estimate (the safe side)."""
        if ticket is None or self.store is None or not ticket.tokens:
            return
        delta = tokens - ticket.estimate
        if delta == 0:
            return
        if self._away:
            if ticket.slot == self._slot:
                for name in ticket.tokens:
                    if name in self._local:
                        self._local[name] = max(self._local[name] + delta, 0)
                        self._unsent[name] = self._unsent.get(name, 0) + delta
            return
        try:
            for name in ticket.tokens:
                await self.store.adjust_rate(ticket.slot, name, delta)
        except StoreError:
            self._away = True  # the estimate holds: the safe side

    def _forget(self, slot: int, now: float) -> None:
        if slot != self._slot:  # a new minute: what was seen is of the last one
            self._slot = slot
            self._seen.clear()
            self._local.clear()
            self._unsent.clear()  # an old minute's counters no longer limit anything
        for name in [n for n, (s, until, _) in self._full.items()
                     if s != slot or until <= now]:
            del self._full[name]

    def _refusal(self, limits: Sequence[Limit], used: Sequence[int], over: int, tokens: int,
                 now: float) -> ApiError:
        lim = limits[over]
        self.refused(lim.project, lim.kind)
        wait = max(math.ceil(reset_after(now)), 1)
        requested = 1 if lim.kind == "requests" else tokens
        return ApiError(
            429, f"Rate limit reached for {lim.owner} on {lim.kind} per min "
            f"({_ABBREVIATIONS[lim.kind]}): Limit {lim.limit}, Used {used[over]}, "
            f"Requested {requested}. Please try again in {wait}s.",
            code="rate_limit_exceeded", type=lim.kind,
            headers={"Retry-After": str(wait), **headers(limits, used, now)})
