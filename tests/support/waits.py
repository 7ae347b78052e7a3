"""Waiting in async tests for what another task or process does next."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll ``condition`` every 10 ms until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def wait_until(condition: Callable[[], object], timeout: float = 10.0) -> float:
    """As :func:`until`, blocking (a sync test); the seconds it took."""
    began = time.monotonic()
    while not condition():
        assert time.monotonic() - began < timeout, f"condition not met within {timeout:g} s"
        time.sleep(0.01)
    return time.monotonic() - began
