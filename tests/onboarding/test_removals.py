"""The pure halves of ``llmgw node remove``: what an uninstall leaves for root."""

from __future__ import annotations

import pytest

from llmgw.onboarding import removals


@pytest.mark.parametrize(("account", "agent_left", "expected"), [
    pytest.param("llmgw", (), ["userdel -r llmgw",
                               "groupdel llmgw  # once no other account is in it"],
                 id="node-adds-account"),
    pytest.param("root", (), [], id="root-nothing-made"),
    pytest.param("root", ("rm -rf /opt/llmgw",), ["rm -rf /opt/llmgw"],
                 id="what-the-agent-could-not-delete"),
    pytest.param("llmgw", ("rm -rf /opt/llmgw",),
                 ["rm -rf /opt/llmgw", "userdel -r llmgw",
                  "groupdel llmgw  # once no other account is in it"], id="both"),
])
def test_what_an_uninstall_leaves_for_root(account: str, agent_left: tuple[str, ...],
                                           expected: list[str]) -> None:
    assert removals.left_for_root(account, agent_left) == expected
