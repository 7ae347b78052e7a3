"""Gated rollouts in a cluster file: ``rollout:`` per model, defaults in ``cluster.rollout``.

A gate is optional. Without ``rollout`` in either place a replacement is done
when its new replica is Ready, as before. With one, a create-before-destroy
replacement is done only once the new replica answered a probe and, during a
bake, served a share of live traffic no worse than the replica it replaces
(:mod:`llmgw.applying.gates` decides).

Defaults merge field by field: a model's ``rollout: {bake: 5m}`` keeps every
other setting of ``cluster.rollout``; ``rollout: {enabled: false}`` turns the gate
off for one model. :func:`effective` is that merge. Purely computational.

Usage::

    gate = rollouts.effective(cluster.cluster.rollout, cluster.models["llama"].rollout)
    if gate is not None: ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmgw.spec import identifiers
from llmgw.spec.quantities import Duration


class _Strict(BaseModel):
    # Same rules as models.Strict (which imports this module, so cannot be imported here).
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("*", mode="after")
    @classmethod
    def _text(cls, value: object) -> object:
        return identifiers.check_text(value)


class Probe(_Strict):
    prompt: str = Field(
        "Reply with one word: ready.", min_length=1, max_length=2000,
        description="The probe's one user message, sent straight to the new replica (not "
        "through the router) before it gets any client traffic.",
    )
    max_tokens: int = Field(8, ge=1, le=1024, description="The probe's `max_tokens`.")
    expect_status: int = Field(200, ge=100, le=599, description="The HTTP status it must get.")
    expect: Literal["text", "any"] = Field(
        "text",
        description="`text`: the answer must hold non-empty completion text (an engine that "
        "answers every request with nothing fails); `any`: any answer with the status passes.",
    )
    timeout: Duration = Field(
        60.0, gt=0, le=3600.0,
        description="Latency bound: the whole answer must arrive within this long.",
    )


class Compare(_Strict):
    max_error_rate_increase: float = Field(
        0.01, ge=0.0, le=1.0,
        description="The new replica's error rate (5xx answers and failed connections per "
        "request) may exceed the old replicas' by at most this much (0.01: one point).",
    )
    max_ttft_ratio: float = Field(
        2.0, ge=1.0, le=1000.0,
        description="The new replica's median time to first token may be at most this many "
        "times the old replicas'.",
    )
    min_requests: int = Field(
        20, ge=1, le=1_000_000,
        description="Requests the new replica must have served before the comparison counts. "
        "Fewer by the end of the bake: promoted on the probe alone, and the verdict says so.",
    )


class Rollout(_Strict):
    enabled: bool = Field(
        True, description="`false`: no gate for this model, whatever `cluster.rollout` says.",
    )
    probe: Probe | None = Field(
        default_factory=Probe,
        description="A short request the new replica must answer before it gets traffic; "
        "`null`: no probe.",
    )
    bake: Duration = Field(
        60.0, ge=0.0, le=86400.0,
        description="How long the new replica serves `share` of live traffic beside the old "
        "one before it is compared and promoted; `0`: no bake (the probe alone decides).",
    )
    share: float = Field(
        0.1, gt=0.0, le=1.0,
        description="Share of the model's requests sent to the new replica during the bake. "
        "A request that fails there before its first byte is retried on an old replica.",
    )
    compare: Compare = Field(
        default_factory=Compare,
        description="When the new replica is worse than the old one.",
    )
    max_surge: int = Field(
        1, ge=1, le=1000,
        description="Replicas of this model replaced side by side at once (each needs room "
        "for one more replica while its replacement bakes).",
    )
    max_unavailable: int = Field(
        0, ge=0, le=1000,
        description="Replicas of this model that may be down at once when a replacement "
        "cannot start beside the old one (destroy before create); `0` still replaces them, "
        "one at a time.",
    )


@dataclass(frozen=True)
class Hold:
    """A model whose replacement failed its gate: not replaced again while its spec is
    the one that failed (:mod:`llmgw.planning.holds`)."""

    model: str
    digest: str  # of the model's spec that failed (:func:`llmgw.planning.holds.digest`)
    revision: str | None  # the cluster directory's git revision, when known
    reason: str  # the gate's: "p50 TTFT 4.1 s vs 0.3 s"
    held_at: float  # Unix time

    def line(self) -> str:
        """``held: revision 1a2b3c failed its gate: p50 TTFT 4.1 s vs 0.3 s``"""
        what = f"revision {self.revision[:7]}" if self.revision else f"spec {self.digest[:7]}"
        return f"held: {what} failed its gate: {self.reason}"


def effective(default: Rollout | None, own: Rollout | None) -> Rollout | None:
    """The gate of a model: its own ``rollout`` over the cluster's, field by field.

    None when neither sets one or the result is not ``enabled``. Purely computational.
    """
    gate = own if default is None else default if own is None else _over(default, own)
    return gate if gate is not None and gate.enabled else None


def _over(base: Rollout, top: Rollout) -> Rollout:
    update: dict[str, object] = {}
    for name in top.model_fields_set:
        mine, theirs = getattr(top, name), getattr(base, name)
        if isinstance(mine, (Probe, Compare)) and isinstance(theirs, type(mine)):
            # A nested section merges too: `compare: {min_requests: 5}` keeps the ratios.
            mine = theirs.model_copy(update={f: getattr(mine, f) for f in mine.model_fields_set})
        update[name] = mine
    return base.model_copy(update=update)
