"""Whether a model fits a profile's GPUs: weights, plus KV cache, plus overhead.

Per GPU of a replica with tensor-parallel size ``tp`` and pipeline-parallel
size ``pp`` (``n = tp × pp`` GPUs)::

    weights   = the files' bytes, or parameters × bytes per parameter
    kv        = 2 × ⌈layers / pp⌉ × ⌈kv_heads / tp⌉ × head_dim × kv_bytes × context × sequences
    overhead  = 1 GiB + 10% of weights / n          (CUDA context, workspaces, activations)
    need      = weights / n + kv + overhead
    have      = GPU class memory × 0.90              (vLLM's gpu_memory_utilization default;
                                                      the profile's own value when it sets one)

It fits when ``need ≤ have``. Bytes per parameter follow the profile: its
``quantization`` (fp8 and int8: 1; awq, gptq and other 4-bit methods: 4.5 bits),
else its ``dtype`` (16-bit: 2, float32: 4), else the files as they are (their
size, when a node or the hub said it or ``shape.weights_size`` declares it),
else the stored ``shape.dtype`` (float32 loads as 16 bits on vLLM and SGLang).
``kv_bytes`` is 1 for an fp8 ``kv_cache_dtype``, else 2 (llama.cpp: its
``cache-type-k/v``). The context is the profile's own (``max-model-len``,
``context-length``, ``ctx-size``), else the model's ``shape.context_length``.

Where a figure is unknown, so is the part it feeds, and an unknown part
never refuses: without the KV figures the weights and overhead alone are a
lower bound, and a lower bound over ``have`` still cannot fit. The figures
come from the cluster file (``models.X.shape``) and, in ``plan``, from the
sizes nodes and the hub report (observed state, as for disks).

A purely computational module with no side effects.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from llmgw.fleet.types import Fleet
from llmgw.spec import checks, sources
from llmgw.spec.checks import Problem
from llmgw.spec.gpus import GpuClass
from llmgw.spec.models import Cluster, Model, Profile
from llmgw.spec.shapes import Shape

GIB = 1024**3
OVERHEAD = 1 * GIB  # per GPU: CUDA context, cuBLAS and NCCL workspaces
ACTIVATIONS = 0.10  # of the weights on each GPU: activations, allocator slack
UTILISATION = 0.90  # of a GPU's memory an engine takes (vLLM's default)

# Bytes per parameter (or per KV element) by dtype, quantization method or ggml cache type.
_DTYPES = {"bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0, "half": 2.0,
           "float32": 4.0, "float": 4.0, "fp32": 4.0, "f32": 4.0, "f16": 2.0}
_QUANTISATIONS = {
    "fp8": 1.0, "fbgemm_fp8": 1.0, "modelopt": 1.0, "int8": 1.0, "w8a8": 1.0,
    "w8a8_int8": 1.0, "w8a8_fp8": 1.0, "experts_int8": 1.0, "qqq": 0.5625,
    "awq": 0.5625, "awq_marlin": 0.5625, "gptq": 0.5625, "gptq_marlin": 0.5625,
    "marlin": 0.5625, "bitsandbytes": 0.5625, "int4": 0.5625, "mxfp4": 0.5625,
    "modelopt_fp4": 0.5625, "fp4": 0.5625,
}
_CACHE_TYPES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32,
                "q5_0": 22 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32}
_CONTEXT_FLAGS = {"vllm": ("max-model-len",), "sglang": ("context-length",),
                  "llama.cpp": ("ctx-size", "c")}
_UTILISATION_FLAGS = {"vllm": "gpu-memory-utilization", "sglang": "mem-fraction-static"}
CATALOG_CLASSES = ("l4-22g", "l40s-45g", "a100-80g", "h100-80g", "h200-140g")  # a few common
SEARCHED_COUNTS = (1, 2, 4, 8)  # GPUs of one node the catalog's "needs N×" tries


@dataclass(frozen=True)
class Inputs:
    """What one estimate reads; ``None`` is unknown."""

    weights: int | None
    basis: str  # where the weights figure came from, for people
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    kv_bytes: float = 2.0
    context: int | None = None
    sequences: int = 1
    utilisation: float = UTILISATION

    @property
    def kv_known(self) -> bool:
        return None not in (self.layers, self.kv_heads, self.head_dim, self.context)


@dataclass(frozen=True)
class Estimate:
    gpu_class: str
    tp: int
    pp: int
    inputs: Inputs
    weights: int | None  # per GPU
    kv: int | None  # per GPU
    overhead: int | None  # per GPU
    have: int  # per GPU
    memory_gib: int  # the class's

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def need(self) -> int | None:
        """Bytes per GPU; without the KV cache a lower bound (see :attr:`fits`)."""
        if self.weights is None or self.overhead is None:
            return None
        return self.weights + (self.kv or 0) + self.overhead

    @property
    def fits(self) -> bool | None:
        """True or False when it is known; None when a figure is missing and the known ones
        do not already exceed the GPU."""
        need = self.need
        if need is None:
            return None
        if need > self.have:
            return False
        return True if self.kv is not None else None

    def sentence(self) -> str:
        """``needs 94.6 GiB per GPU on 8× h100-80g (…), has 72.0 GiB (90% of 80 GiB)``."""
        share = f"{self.inputs.utilisation:.0%} of {self.memory_gib} GiB"
        where = f"{self.gpus}× {self.gpu_class}"
        if self.need is None:
            return f"unknown on {where}: the weights' size is unknown ({self.inputs.basis})"
        weights = self.inputs.weights or 0
        split = f" / {self.gpus} = {gib(self.weights or 0)} GiB" if self.gpus > 1 else ""
        parts = [f"weights {gib(weights)} GiB{split} ({self.inputs.basis})"]
        if self.kv is not None:
            parts.append(f"KV cache {gib(self.kv)} GiB at {tokens(self.inputs.context)} "
                         f"tokens{_times(self.inputs.sequences)}")
        else:
            parts.append("KV cache unknown (no layers, kv_heads, head_dim or context)")
        parts.append(f"overhead {gib(OVERHEAD)} GiB + {ACTIVATIONS:.0%} of the weights = "
                     f"{gib(self.overhead or 0)} GiB")
        at_least = "" if self.kv is not None else "at least "
        return (f"needs {at_least}{gib(self.need)} GiB per GPU on {where} "
                f"({'; '.join(parts)}), has {gib(self.have)} GiB ({share})")


def estimate(inputs: Inputs, gpu_class: GpuClass, tp: int = 1, pp: int = 1) -> Estimate:
    """The figures of ``inputs`` on ``tp × pp`` GPUs of ``gpu_class``."""
    gpus = tp * pp
    have = int(gpu_class.memory_gib * GIB * inputs.utilisation)
    weights = overhead = None
    if inputs.weights is not None:
        weights = math.ceil(inputs.weights / gpus)
        overhead = OVERHEAD + int(ACTIVATIONS * weights)
    kv = None
    if inputs.kv_known:
        assert inputs.layers and inputs.kv_heads and inputs.head_dim and inputs.context
        kv = int(2 * math.ceil(inputs.layers / pp) * math.ceil(inputs.kv_heads / tp)
                 * inputs.head_dim * inputs.kv_bytes * inputs.context * inputs.sequences)
    return Estimate(gpu_class.name, tp, pp, inputs, weights, kv, overhead, have,
                    gpu_class.memory_gib)


# -- the inputs of a profile -------------------------------------------------


def inputs(model: Model, profile: Profile, files: int | None = None) -> Inputs:
    """What :func:`estimate` reads for ``profile`` of ``model``; ``files`` is the weights'
    size as a node or the hub reported it (observed), when known."""
    shape = model.shape or Shape()
    weights, basis = _weights(shape, profile, files)
    return Inputs(
        weights=weights, basis=basis, layers=shape.layers, kv_heads=shape.kv_heads,
        head_dim=shape.head_dim, kv_bytes=_kv_bytes(profile), sequences=profile.fit_sequences,
        context=context(profile) or shape.context_length, utilisation=_utilisation(profile),
    )


def of_shape(shape: Shape, files: int | None) -> Inputs:
    """Inputs for a model not yet in a cluster (``llmgw models show``): its files loaded as
    they are (else its parameters at the stored dtype), a 16-bit KV cache, one sequence."""
    profile = Profile(engine="vllm", gpu_class="any")
    weights, basis = _weights(shape, profile, files)
    return Inputs(weights=weights, basis=basis, layers=shape.layers, kv_heads=shape.kv_heads,
                  head_dim=shape.head_dim, context=shape.context_length)


def _weights(shape: Shape, profile: Profile, files: int | None) -> tuple[int | None, str]:
    converted = _converted(profile)
    params = shape.params_b
    if params is not None and converted is not None:
        return (round(params * 1e9 * converted[0]),
                f"{params:g}B parameters × {_bytes(converted[0])}, {converted[1]}")
    said = "the files, as reported" if files is not None else "shape.weights_size"
    files = files if files is not None else shape.weights_size
    if files is not None and profile.quantization is None:
        return files, said
    if profile.quantization is not None:
        return None, f"{profile.quantization} of unknown parameters: declare shape.params_b"
    if params is not None and profile.engine != "llama.cpp":
        stored = _DTYPES.get(shape.dtype or "")
        size = 2.0 if stored is None or stored > 2 else stored  # auto loads fp32 as 16 bits
        named = shape.dtype if stored == size and shape.dtype else "16-bit"
        return round(params * 1e9 * size), f"{params:g}B parameters × {_bytes(size)}, {named}"
    return None, "no size reported and no shape.params_b or shape.weights_size"


def _converted(profile: Profile) -> tuple[float, str] | None:
    """Bytes per parameter the profile loads the weights at, when it says."""
    if profile.quantization is not None:
        size = _QUANTISATIONS.get(profile.quantization.lower())
        return (size, profile.quantization) if size is not None else None
    if profile.dtype is not None and profile.dtype.lower() != "auto":
        size = _DTYPES.get(profile.dtype.lower())
        return (size, profile.dtype) if size is not None else None
    return None


def _kv_bytes(profile: Profile) -> float:
    if profile.engine == "llama.cpp":
        kinds = [_arg(profile, "cache-type-k", "ctk"), _arg(profile, "cache-type-v", "ctv")]
        return sum(_CACHE_TYPES.get(str(k).lower(), 2.0) for k in kinds) / 2
    if profile.kv_cache_dtype and "fp8" in profile.kv_cache_dtype.lower():
        return 1.0
    return 2.0


def context(profile: Profile) -> int | None:
    """The context the profile's own flags set; None when they set none (or 0: the model's)."""
    for flag in _CONTEXT_FLAGS[profile.engine]:
        value = _arg(profile, flag)
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and value > 0:
            return value
        if isinstance(value, str) and value.isdigit() and int(value) > 0:
            return int(value)
    return None


def _utilisation(profile: Profile) -> float:
    flag = _UTILISATION_FLAGS.get(profile.engine)
    value = _arg(profile, flag) if flag else None
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1:
        return float(value)
    return UTILISATION


def _arg(profile: Profile, *names: str) -> object:
    for name in names:
        for table in (profile.args, profile.unchecked_args):
            if table.get(name) is not None:
                return table[name]
    return None


# -- refusals: validate and plan ----------------------------------------------


def refusal(model: Model, profile: Profile, classes: Mapping[str, GpuClass],
            files: int | None = None) -> str | None:
    """Why ``profile`` cannot fit any of its GPU classes, with the numbers; None when it
    fits one, or when it is not known (a class not in ``classes``, figures missing)."""
    if profile.cpu:
        return None  # CPU replicas: min_memory_gb is the operator's figure, checked there
    found = inputs(model, profile, files)
    sentences = []
    for name in profile.gpu_classes:
        gpu_class = classes.get(name)
        if gpu_class is None:
            return None
        figures = estimate(found, gpu_class, profile.tensor_parallel, profile.pipeline_parallel)
        if figures.fits is not False:
            return None
        sentences.append(figures.sentence())
    if not sentences:
        return None
    tried = label_context(found.context)
    return f"does not fit{tried}: " + "; ".join(sentences)


def reported(fleet: Fleet, source: str) -> int | None:
    """The weights' size as observed: what the hub said of a fetched source, else the
    largest complete copy a node reports (its cached fetch, or a path source's files)."""
    known = fleet.sources.get(source)
    if known is not None and known.size_bytes is not None:
        return known.size_bytes
    is_path = sources.is_path(source)
    sizes = [c.size_bytes for report in fleet.nodes.values() for c in report.cached_weights
             if c.source == source]
    sizes += [w.size_bytes for report in fleet.nodes.values() for w in report.weights
              if is_path and w.path == source]
    return max(sizes, default=None)


class Reported:
    """:func:`reported` for one fleet, indexed once: a plan asks it for every replica it
    places, and scanning every node's weights each time costs seconds at 10,000 nodes."""

    def __init__(self, fleet: Fleet) -> None:
        self._known = fleet.sources
        self._cached: dict[str, list[int]] = {}
        self._paths: dict[str, list[int]] = {}
        for report in fleet.nodes.values():
            for c in report.cached_weights:
                self._cached.setdefault(c.source, []).append(c.size_bytes)
            for w in report.weights:
                self._paths.setdefault(w.path, []).append(w.size_bytes)

    def size(self, source: str) -> int | None:
        """What ``reported(fleet, source)`` says."""
        known = self._known.get(source)
        if known is not None and known.size_bytes is not None:
            return known.size_bytes
        sizes = list(self._cached.get(source, ()))
        if sources.is_path(source):
            sizes += self._paths.get(source, ())
        return max(sizes, default=None)


def check(cluster: Cluster) -> Iterator[Problem]:
    """Every profile whose declared figures cannot fit its GPUs, in the loader's form
    (``extra_checks``), so ``validate`` locates it at the profile."""
    classes = checks.known_classes(cluster)
    for name, model in cluster.models.items():
        for index, profile in enumerate(model.profiles):
            why = refusal(model, profile, classes)
            if why:
                yield Problem(("models", name, "profiles", index),
                              f"models.{name}.profiles[{index}] {why}", at_key=True)


# -- the catalog: how many GPUs of each class -----------------------------------


def fewest(found: Inputs, gpu_class: GpuClass,
           counts: Iterable[int] = SEARCHED_COUNTS) -> tuple[int | None, Estimate]:
    """The fewest GPUs of one node (tensor parallel) that hold ``found``, and that estimate;
    None with the last estimate when none does, or when a figure is unknown."""
    figures = None
    for count in counts:
        figures = estimate(found, gpu_class, tp=count)
        if figures.fits is not False:
            return (count if figures.fits else None), figures
    assert figures is not None
    return None, figures


def fit_line(found: Inputs, gpu_class: GpuClass, contexts: Iterable[int]) -> str:
    """``fits on 1× l40s-45g at 8k context; needs 2× for 32k`` (or why it is not known)."""
    groups: list[tuple[int, list[int]]] = []  # GPU count → the contexts it holds
    for wanted in contexts:
        count, figures = fewest(replace(found, context=wanted), gpu_class)
        if count is None:
            if figures.fits is None:
                return f"unknown on {gpu_class.name}: {figures.sentence()}"
            most = SEARCHED_COUNTS[-1]
            if not groups:
                return f"does not fit {most}× {gpu_class.name} at {tokens(wanted)} context"
            return _groups(groups, gpu_class) + f"; more than {most}× for {tokens(wanted)}"
        if groups and groups[-1][0] == count:
            groups[-1][1].append(wanted)
        else:
            groups.append((count, [wanted]))
    return _groups(groups, gpu_class)


def _groups(groups: list[tuple[int, list[int]]], gpu_class: GpuClass) -> str:
    parts = []
    for position, (count, held) in enumerate(groups):
        named = [tokens(t) for t in held]
        at = " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
        parts.append(f"fits on {count}× {gpu_class.name} at {at} context" if position == 0
                     else f"needs {count}× for {at}")
    return "; ".join(parts)


def tokens(count: int | None) -> str:
    """``8k`` for 8192 tokens, ``131072`` → ``128k``; other counts as they are."""
    if count is None:
        return "unknown"
    return f"{count // 1024}k" if count % 1024 == 0 else str(count)


def label_context(count: int | None) -> str:
    return f" at {tokens(count)} context" if count else ""


def _times(sequences: int) -> str:
    return f" × {sequences} sequences" if sequences > 1 else ""


def _bytes(size: float) -> str:
    return "1 byte" if size == 1 else f"{size:g} bytes"


def gib(size: float) -> str:
    """``94.5``: bytes as GiB with one decimal, as every sentence here counts them."""
    return f"{size / GIB:.1f}"
