"""Budget reservations: what a request may cost before it is sent, and who may send one.

Charging only after an answer lets every request in flight pass a budget check that
all of them together break (300 concurrent requests against a nearly spent budget
once reached 140 times it). So a request reserves an estimate of its cost *before*
it is sent and settles to its real cost after:

* **Estimate** (:func:`estimate`): the request body's length in bytes as its prompt
  tokens — a token of any byte-level or byte-fallback tokenizer covers at least one
  byte of UTF-8, and the body holds the prompt plus JSON around it, so this is an
  upper bound — plus its output limit (``max_completion_tokens``, ``max_tokens`` or
  ``max_output_tokens``, times ``n`` choices) or ``default_output_tokens`` when it
  sets none, at the model's prices.
* **Admission** (:meth:`Ledger.reserve`): a project may reserve while what it has
  spent plus what is reserved is below its budget (so ``budget_usd: 0`` admits
  nothing). The last admitted request can carry the total past the budget by its own
  reservation; nothing can be admitted after it.
* **Bound**: spend ≤ budget + one reservation, whatever the concurrency, as long as
  each answer costs no more than it reserved — always, when the client sets an
  output limit. An answer without a limit that runs past ``default_output_tokens``
  adds its excess.
* **Answers without usage** (:func:`unreported`): a client that hung up before the
  engine's usage chunk is charged an estimate of what was served (prompt bytes / 4,
  and one token per event relayed); a successful answer with no readable usage is
  charged its whole reservation.

A purely computational module: the router's :class:`~llmgw.router.accounts.Accounts`
holds the one :class:`Ledger` and calls it on its event loop; nothing locks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmgw.router.usages import Usage

_OUTPUT_LIMITS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
_BYTES_PER_TOKEN = 4  # a typical English token, for charging what was served: not a bound


@dataclass(frozen=True)
class Reservation:
    project: str | None  # None: nothing was reserved (no budget, or auth: none)
    amount: float = 0.0


NOTHING = Reservation(None)


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def estimate(body_bytes: int, payload: Mapping[str, Any], default_output_tokens: int,
             embeddings: bool = False) -> Usage:
    """Tokens to reserve for a request: (prompt upper bound, output limit)."""
    if embeddings:
        return body_bytes, 0
    limit = next((n for n in (_count(payload.get(k)) for k in _OUTPUT_LIMITS) if n is not None),
                 default_output_tokens)
    choices = _count(payload.get("n")) or 1
    return body_bytes, limit * choices


def unreported(body_bytes: int, relayed_events: int) -> Usage:
    """Tokens to charge a stream that ended without the engine's usage: what was served."""
    return -(-body_bytes // _BYTES_PER_TOKEN), relayed_events


@dataclass
class Ledger:
    """Spend and outstanding reservations per project, in USD."""

    spent: dict[str, float] = field(default_factory=dict)
    reserved: dict[str, float] = field(default_factory=dict)

    def committed(self, project: str) -> float:
        return self.spent.get(project, 0.0) + self.reserved.get(project, 0.0)

    def reserve(self, project: str, budget: float | None, amount: float) -> Reservation | None:
        """Hold ``amount`` for ``project``; None when its budget is committed already."""
        if budget is not None and self.committed(project) >= budget:
            return None
        self.reserved[project] = self.reserved.get(project, 0.0) + amount
        return Reservation(project, amount)

    def settle(self, reservation: Reservation, cost: float) -> None:
        """Release ``reservation`` and charge ``cost``, what the request really cost."""
        project = reservation.project
        if project is None:
            return
        left = self.reserved.get(project, 0.0) - reservation.amount
        if left > 1e-12:
            self.reserved[project] = left
        else:
            self.reserved.pop(project, None)
        self.charge(project, cost)

    def charge(self, project: str, cost: float) -> None:
        if cost:
            self.spent[project] = self.spent.get(project, 0.0) + cost
