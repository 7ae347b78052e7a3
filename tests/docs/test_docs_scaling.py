"""The plans docs/concepts.md shows under Scaling are what the planner prints for them.

Each ``<!-- plan-case: NAME -->`` block is the text plan (:func:`outputs.text`,
what ``llmgw plan`` prints and the daemon logs) of the planning case
``tests/planning/cases/NAME.yaml``, load history included: change the
planner's wording and this fails until the page is regenerated.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

PLANNING = Path(__file__).parents[1] / "planning"
sys.path.insert(0, str(PLANNING))  # the cases' harness, as tests/planning imports it

import test_plan_cases  # noqa: E402

from llmgw.planning import outputs  # noqa: E402

PAGE = Path(__file__).parents[2] / "docs" / "concepts.md"
BLOCK = re.compile(r"<!-- plan-case: (\S+) -->\n```text\n(.*?)\n```", re.S)


def blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(PAGE.read_text())


def test_the_scaling_section_shows_plans() -> None:
    assert len(blocks()) >= 3


@pytest.mark.parametrize(("name", "shown"), blocks(), ids=[n for n, _ in blocks()])
def test_a_plan_on_the_page_is_the_planners(name: str, shown: str) -> None:
    case = test_plan_cases.load_case(PLANNING / "cases" / f"{name}.yaml")
    plan, *_ = test_plan_cases.run_case(case)
    assert shown == outputs.text(plan).rstrip("\n"), f"regenerate the {name} plan in {PAGE.name}"
