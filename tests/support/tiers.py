"""The test tiers: markers for the slow tests a quick loop leaves out (``make test-fast``).

Registered in pyproject.toml (``--strict-markers`` refuses any other name):

* ``e2e`` — whole processes end to end (``llmgw serve``, ``llmgw node add``, the
  real engine): every test under ``tests/e2e/``, marked here, and the node-add
  tests that say so themselves;
* ``browser`` — drives chromium: every test that uses the ``browser`` fixture,
  marked here;
* ``docs_session`` — runs a page's shell session (``tests/docs/sessions.py``),
  marked where it is defined;
* ``fleetsim`` — the fleet simulator at hundreds of nodes through the real daemon
  loop (``tests/daemon/test_fleetsim.py``), marked on its module.

``make test`` runs every tier; ``make test-fast`` runs
``-m "not e2e and not browser and not docs_session and not fleetsim"``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

E2E = Path(__file__).resolve().parents[1] / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
