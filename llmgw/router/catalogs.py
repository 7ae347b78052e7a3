"""What the router needs from the spec: served names, on-demand models, prices, budgets.

A :class:`Catalog` is plain data built once per spec load
(``catalogs.from_cluster(cluster)``); the router swaps it whole when the
daemon reloads the cluster directory.

Clients name models by their served name (``served_name``, default the model
key); the route table is keyed by model key, as unit labels are. A LoRA
adapter is an entry of its own under its name, with its base model's key (its
requests go to the base's replicas) and an ``adapter`` route saying how the
engine selects it (:mod:`llmgw.router.loras`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from llmgw.router.loras import AdapterRoute
from llmgw.spec import upstreams
from llmgw.spec.budgets import LIFETIME, Period
from llmgw.spec.models import Cluster, Model
from llmgw.spec.servings import Pricing


@dataclass(frozen=True)
class ModelEntry:
    key: str  # the name in models: (route table key)
    served_name: str
    on_demand: bool  # scaling.min == 0: requests wait for it to load
    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0
    # Prefix affinity (llmgw.router.affinities); prefix_chars 0: least outstanding.
    prefix_chars: int = 0
    min_prefix_chars: int = 0
    load_factor: float = 1.25
    first_byte_timeout: float = 600.0  # seconds to the engine\'s first byte
    context_tokens: int | None = None  # what it can read and produce; None: not stated
    adapter: AdapterRoute | None = None  # a LoRA adapter of the model ``key``
    # Adapters the engine applies unless a request lists them (llama.cpp's; 0 elsewhere).
    listed_adapters: int = 0
    # The admission queue (llmgw.router.admissions): requests per replica, None: no cap.
    max_in_flight: int | None = None
    queue_limit: int = 1000
    queue_timeout: float = 30.0

    def cost(self, prompt_tokens: int | None, completion_tokens: int | None) -> float:
        """USD for one request at this model's prices."""
        return (
            (prompt_tokens or 0) * self.input_per_mtok
            + (completion_tokens or 0) * self.output_per_mtok
        ) / 1_000_000


@dataclass(frozen=True)
class UpstreamEntry:
    """An upstream (``upstreams:``) as the router needs it: plain data, no key (the key
    file is read by :mod:`llmgw.router.externals`)."""

    name: str
    url: str  # the base the /v1/... paths are appended to, no trailing slash
    key_file: str | None
    # model key → (the upstream's name for it, "always" | "fallback")
    models: dict[str, tuple[str, str]] = field(default_factory=dict)
    max_in_flight: int | None = None
    health_path: str = "/v1/models"
    interval: float = 10.0
    timeout: float = 5.0
    max_backoff: float = 60.0


@dataclass(frozen=True)
class Catalog:
    models: dict[str, ModelEntry] = field(default_factory=dict)  # by served name
    budgets: dict[str, float | None] = field(default_factory=dict)  # project → USD or None
    # project → the calendar period its budget resets on (absent: lifetime)
    periods: dict[str, Period] = field(default_factory=dict)
    request_caps: dict[str, float | None] = field(default_factory=dict)  # max_request_usd
    # project → (rpm, tpm), each None for no limit (llmgw.router.ratelimits)
    rates: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    auth: str = "keys"  # "keys" | "none"
    # project → its `models:` allow-list (None: every model); see llmgw.router.permissions.
    access: dict[str, tuple[str, ...] | None] = field(default_factory=dict)
    upstreams: dict[str, UpstreamEntry] = field(default_factory=dict)  # by name

    _by_key: dict[str, ModelEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Requests resolve served names; accounting resolves keys: both are a dict lookup.
        # An adapter shares its base model's key; the key means the base.
        object.__setattr__(self, "_by_key", {e.key: e for e in self.models.values()
                                             if e.adapter is None})

    def period(self, project: str) -> Period:
        """The period ``project``'s budget resets on (:data:`LIFETIME` when it never does)."""
        return self.periods.get(project, LIFETIME)

    def by_key(self, key: str) -> ModelEntry | None:
        return self._by_key.get(key)

    def adapters(self, key: str) -> list[str]:
        """The served names of model ``key``'s adapters."""
        return sorted(name for name, e in self.models.items()
                      if e.adapter is not None and e.key == key)

    def priced(self, key: str, served: str | None) -> ModelEntry | None:
        """The entry whose prices a request for ``served`` on model ``key`` pays: the
        adapter's, when ``served`` names one of that model, else the model's."""
        entry = self.models.get(served) if served is not None else None
        return entry if entry is not None and entry.key == key else self.by_key(key)


def from_cluster(cluster: Cluster) -> Catalog:
    models = {}
    for key, model in cluster.models.items():
        served = model.served_name or key
        models[served] = ModelEntry(
            key=key,
            served_name=served,
            on_demand=model.scaling.min == 0,
            input_per_mtok=model.pricing.input_per_mtok,
            output_per_mtok=model.pricing.output_per_mtok,
            prefix_chars=model.routing.prefix_chars if model.routing.policy == "prefix" else 0,
            min_prefix_chars=model.routing.min_prefix_chars,
            load_factor=model.routing.load_factor,
            first_byte_timeout=model.routing.first_byte_timeout,
            context_tokens=context_tokens(model),
            listed_adapters=len(model.adapters) if engine(model) == "llama.cpp" else 0,
            max_in_flight=model.routing.max_in_flight or engine_slots(model),
            queue_limit=model.routing.queue_limit,
            queue_timeout=model.routing.queue_timeout,
        )
        for index, adapter in enumerate(model.adapters):
            prices = adapter.pricing or model.pricing
            models[adapter.name] = replace(
                models[served], served_name=adapter.name,
                input_per_mtok=prices.input_per_mtok, output_per_mtok=prices.output_per_mtok,
                adapter=AdapterRoute(served, engine(model), index, adapter.scale,
                                     len(model.adapters)),
                listed_adapters=0,
            )
    served_keys = {model.served_name or key: key for key, model in cluster.models.items()}
    for served in upstreams.served_by_upstreams(cluster):
        # A name only upstreams serve: its own entry, its key the served name itself.
        prices = _upstream_pricing(cluster, served)
        models[served] = ModelEntry(key=served, served_name=served, on_demand=False,
                                    input_per_mtok=prices.input_per_mtok,
                                    output_per_mtok=prices.output_per_mtok)
        served_keys[served] = served
    remotes = {
        name: UpstreamEntry(
            name=name, url=upstream.url, key_file=upstream.api_key_file,
            models={served_keys[served]: (entry.model or served, entry.use)
                    for served, entry in upstream.models.items() if served in served_keys},
            max_in_flight=upstream.max_in_flight, health_path=upstream.health.path,
            interval=upstream.health.interval, timeout=upstream.health.timeout,
            max_backoff=upstream.health.max_backoff)
        for name, upstream in cluster.upstreams.items()
    }
    limits = {name: project.limit() for name, project in cluster.projects.items()}
    budgets = {name: usd for name, (usd, _) in limits.items()}
    periods = {name: period for name, (_, period) in limits.items() if period.kind != "none"}
    caps = {name: project.max_request_usd for name, project in cluster.projects.items()}
    rates = {name: (project.rpm, project.tpm) for name, project in cluster.projects.items()}
    access = {name: None if project.models is None else tuple(project.models)
              for name, project in cluster.projects.items()}
    return Catalog(models=models, budgets=budgets, periods=periods, request_caps=caps,
                   rates=rates,
                   auth=cluster.cluster.auth, access=access, upstreams=remotes)


def _upstream_pricing(cluster: Cluster, served: str) -> Pricing:
    """The prices of a name only upstreams serve: the first (by name) upstream's that sets
    them; none: free."""
    for _, upstream in sorted(cluster.upstreams.items()):
        entry = upstream.models.get(served)
        if entry is not None and entry.pricing is not None:
            return entry.pricing
    return Pricing()


def engine(model: Model) -> str:
    """The engine of the model's first profile (a model with adapters has one engine:
    :func:`llmgw.spec.loras.problems`)."""
    return model.profiles[0].engine


# The engines' flags that set the context length: vLLM, llama.cpp, SGLang.
CONTEXT_FLAGS = ("max-model-len", "ctx-size", "c", "context-length")


def context_tokens(model: Model) -> int | None:
    """The longest context any of ``model``'s profiles states in its engine args, in
    tokens; None when none states one (the engine then takes the model's own)."""
    found = [int(value) for profile in model.profiles
             for args in (profile.args, profile.unchecked_args)
             for flag in CONTEXT_FLAGS
             if isinstance(value := args.get(flag), int | str) and not isinstance(value, bool)
             and str(value).isdigit() and int(value) > 0]
    return max(found) if found else None


# The engines' flags that bound the requests they run at once: llama.cpp, vLLM, SGLang.
SLOT_FLAGS = ("parallel", "np", "max-num-seqs", "max-running-requests")


def engine_slots(model: Model) -> int | None:
    """The fewest requests any of ``model``'s profiles lets its engine run at once, from
    its args; None when none says (the engine's default is then unknown to llmgw, and the
    router sets no cap). The smallest, since the router does not know which profile a
    replica runs: a cap too low queues a little early, one too high overruns an engine."""
    found = [int(value) for profile in model.profiles
             for args in (profile.args, profile.unchecked_args)
             for flag in SLOT_FLAGS
             if isinstance(value := args.get(flag), int | str) and not isinstance(value, bool)
             and str(value).isdigit() and int(value) > 0]
    return min(found) if found else None
