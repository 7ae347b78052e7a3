"""Retry schedule and reason strings: pure, no sockets, no sleeping."""

from __future__ import annotations

import random

import pytest

from llmgw.transport.backoffs import Backoff
from llmgw.transport.failures import NodeUnreachable, reason_of


def test_delays_double_within_jitter_up_to_the_cap() -> None:
    now = [0.0]
    backoff = Backoff(base=1.0, cap=8.0, clock=lambda: now[0], rng=random.Random(7))
    assert backoff.wait() == 0
    ceilings = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    delays = [backoff.failed() for _ in ceilings]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert backoff.wait() == pytest.approx(delays[-1])
    now[0] += delays[-1]
    assert backoff.wait() == 0
    backoff.succeeded()
    assert 0.5 <= backoff.failed() <= 1.0  # a success starts the schedule over


def test_jitter_spreads_nodes_that_failed_together() -> None:
    delays = {round(Backoff(rng=random.Random(seed)).failed(), 6) for seed in range(20)}
    assert len(delays) == 20


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        pytest.param("refused: a refused the connection; is sshd up?", "refused", id="refused"),
        pytest.param("host key: n offered ssh-ed25519 SHA256:x", "host key", id="host-key"),
        pytest.param("agent not running: nothing accepts on /s", "agent not running", id="agent"),
        pytest.param("disk full: no", None, id="not-a-reason"),
        pytest.param(None, None, id="reachable"),
    ],
)
def test_reason_is_read_back_from_the_error_string(error: str | None, reason: str | None) -> None:
    assert reason_of(error) == reason


def test_failure_string_starts_with_its_reason() -> None:
    failure = NodeUnreachable("n1", "timeout", "no answer within 1s while connecting")
    assert str(failure) == "timeout: no answer within 1s while connecting"
    assert reason_of(str(failure)) == failure.reason
