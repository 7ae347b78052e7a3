"""The ``browser`` fixture: Debian's chromium driven by Playwright (nothing downloaded)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.pages import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("chromium is not installed (make sysdeps installs Debian's)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                              args=CHROMIUM_ARGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()
