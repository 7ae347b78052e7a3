"""How a model is served once placed: its replica count, its prices, its routing.

Parts of :class:`llmgw.spec.models.Model`, kept apart so that each can grow
(scaling targets, the router's admission queue) without one module holding the
whole cluster file.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmgw.spec.bases import Strict
from llmgw.spec.quantities import Duration


class Target(Strict):
    """The load each ready replica should carry; exactly one field is set."""

    waiting_per_replica: float | None = Field(
        None, gt=0, le=1_000_000,
        description="Requests waiting per ready replica: queued in the engines (as they "
        "report it), in the routers' admission queues, and waiting for a replica.",
    )
    in_flight_per_replica: float | None = Field(
        None, gt=0, le=1_000_000,
        description="Requests in flight per ready replica (sent by the routers, not finished).",
    )
    first_token_seconds: Duration | None = Field(
        None, gt=0,
        description="Median time to first token of the model's recent requests.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Target:
        given = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("a scaling target sets exactly one of waiting_per_replica, "
                             "in_flight_per_replica, first_token_seconds"
                             + (f" (it sets {', '.join(given)})" if given else ""))
        return self

    @property
    def name(self) -> str:
        """The field that is set."""
        return next(n for n in type(self).model_fields if getattr(self, n) is not None)

    @property
    def value(self) -> float:
        return float(getattr(self, self.name))


class Scaling(Strict):
    min: int = Field(1, ge=0, le=1000, description="Replicas always running (0: on demand).")
    max: int = Field(1, ge=1, le=1000, description="Most replicas when demand asks.")
    idle_timeout: Duration | None = Field(
        None, description="Stop replicas above `min` after this long without requests."
    )
    replace_unreachable: bool = Field(
        False, description="Place this model's replicas elsewhere even when a node that may "
        "still run one does not answer, and so may exceed `max` until it comes back. Off: "
        "a replica that would bring the model to `max` counting one per such node is not "
        "placed (`llmgw apply --force` places it once).",
    )
    target: Target | None = Field(
        None, description="Autoscale between `min` and `max` to hold this load per ready "
        "replica, e.g. `{waiting_per_replica: 2}`. None: `max` is reached only by what the "
        "router asks (one replica on demand).",
    )
    up_window: Duration = Field(
        30.0, gt=0, description="The load must stay above the target this long before a "
        "scale-up.",
    )
    down_window: Duration = Field(
        300.0, gt=0, description="The load must stay below the target this long before a "
        "scale-down.",
    )
    cooldown: Duration = Field(
        300.0, ge=0, description="After any change of the replica count, no scale-down for "
        "this long.",
    )


class Pricing(Strict):
    input_per_mtok: float = Field(0.0, ge=0, description="USD per million prompt tokens.")
    output_per_mtok: float = Field(0.0, ge=0, description="USD per million completion tokens.")


class Routing(Strict):
    policy: Literal["least-outstanding", "prefix"] = Field(
        "least-outstanding",
        description="`least-outstanding`: the replica with the fewest requests in flight. "
        "`prefix`: requests sharing a prompt prefix (a system prompt, a conversation) go to "
        "the same replica, whose engine has it cached, unless that replica carries more than "
        "`load_factor` × the average load (consistent hashing with bounded loads).",
    )
    prefix_chars: int = Field(
        1024, ge=64, le=1_000_000,
        description="How many characters of a request's context (every message but the last, "
        "roles and text in order; a completion's prompt) make the prefix it is routed by.",
    )
    min_prefix_chars: int = Field(
        256, ge=0, le=1_000_000,
        description="A context shorter than this is routed by least outstanding: it shares "
        "too little to be worth a preference.",
    )
    load_factor: float = Field(
        1.25, ge=1.0, le=10.0,
        description="Most load a replica takes for its prefixes, as a multiple of the average "
        "(requests in flight); beyond it a prefix spills to the next replica.",
    )
    first_byte_timeout: Duration = Field(
        600.0, gt=0,
        description="How long the router waits for a replica's first byte (a stream's first "
        "event, or a whole non-streamed answer) before answering 504. Generous: a long answer "
        "that is not streamed arrives all at once.",
    )
    max_in_flight: int | None = Field(
        None, ge=1, le=100_000,
        description="Most requests the router sends to one replica at once; more wait in the "
        "model's admission queue. Unset: the engine's own slots where a profile's args set "
        "them (llama.cpp `parallel`/`np`, vLLM `max-num-seqs`, SGLang "
        "`max-running-requests`; the smallest of the profiles), else no cap.",
    )
    queue_limit: int = Field(
        1000, ge=0, le=1_000_000,
        description="Most requests queued for this model (every replica at its cap); one more "
        "is answered 503 `queue_full` with `Retry-After: 1`. 0: no queue.",
    )
    queue_timeout: Duration = Field(
        30.0, gt=0,
        description="How long a request may wait in the queue before it is answered 503 "
        "`queue_timeout` with `Retry-After: 1`.",
    )
