"""The fleet as it may leave the daemon: every text scrubbed of secrets.

``GET /api/v1/fleet`` is what CI downloads to plan pull requests
(``llmgw plan --observed``), and a CI job's files are public as often as
not. Engines' log tails, units' details, the program holding a port and a
unit's labels are what nodes report; any of them may carry a token. Every
string in the snapshot goes through :func:`llmgw.spec.secrets.scrub`.

``llmgw validate`` refuses every value of ``args`` and ``env`` that the
scrubber would change, so the spec labels of units started from a valid
cluster come through unchanged (and still match their digests); a label
that did hold a secret no longer matches, and the plan replaces its unit.

A purely computational module with no side effects.
"""

from __future__ import annotations

from typing import Any

from llmgw.fleet.types import Fleet
from llmgw.spec import secrets


def public_json(fleet: Fleet) -> str:
    """The snapshot as JSON (``llmgw plan --observed`` reads it), every string scrubbed;
    laid out as ``model_dump_json(indent=2)`` lays it out (and as fast)."""
    return public(fleet).model_dump_json(indent=2)


def public(fleet: Fleet) -> Fleet:
    """``fleet`` with every string scrubbed (what ``llmgw inventory`` prints and saves,
    and the /admin nodes pages show)."""
    return Fleet.model_validate(scrubbed(fleet.model_dump(mode="json")))


def scrubbed(value: Any) -> Any:
    """A JSON-shaped ``value`` with every string in it scrubbed, keys left as they are."""
    if isinstance(value, str):
        return secrets.scrub(value)
    if isinstance(value, list):
        return [scrubbed(item) for item in value]
    if isinstance(value, dict):
        return {key: scrubbed(item) for key, item in value.items()}
    return value
