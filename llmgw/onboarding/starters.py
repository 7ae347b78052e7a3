"""The starter model ``llmgw init`` declares: what fits the nodes it found.

On GPU nodes the largest of a few candidates that fits one GPU of a class
found, by the fit check (:mod:`llmgw.planning.fits`) at :data:`GPU_CONTEXT`;
on CPU only, Gemma 3 270M as a GGUF (the file ``make model`` assembles, the
one the tests serve), from this machine's file where there is one, else from
the hub (or the site's mirror).

Usage::

    chosen = starters.for_gpus({"l40s-45g": 2}, checks.known_classes(cluster))
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.discovery import gpus as gpu_facts
from llmgw.planning import fits
from llmgw.spec.gpus import GpuClass
from llmgw.spec.shapes import Shape

STARTER_FILE = "gemma3-270m-q4_k_m.gguf"  # what `make model` assembles
STARTER_REPO = "google/gemma-3-270m-it-GGUF"  # the same file on the hub (docs/weights.md)
STARTER_REPO_FILE = "gemma-3-270m-it-Q4_K_M.gguf"
NAME = "gemma3-270m"


@dataclass(frozen=True)
class Candidate:
    """A starter model for GPU nodes, with the figures the fit check reads."""

    name: str
    source: str
    shape: Shape


# Largest first: the first that fits one GPU of the node's class is the starter.
# Figures from each repo's config.json (layers, KV heads, head dim, context).
GPU_CANDIDATES = (
    Candidate("qwen2.5-32b", "Qwen/Qwen2.5-32B-Instruct", Shape(
        params_b=32.8, dtype="bfloat16", layers=64, kv_heads=8, head_dim=128,
        context_length=32768)),
    Candidate("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", Shape(
        params_b=7.62, dtype="bfloat16", layers=28, kv_heads=4, head_dim=128,
        context_length=32768)),
    Candidate("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct", Shape(
        params_b=0.49, dtype="bfloat16", layers=24, kv_heads=2, head_dim=64,
        context_length=32768)),
)
GPU_CONTEXT = 8192  # the starter's max-model-len: what the fit check is asked about


def local_gpus(run_command: Callable[[list[str]], str | None] | None = None) -> dict[str, int]:
    """This machine's GPUs by class, from ``nvidia-smi`` (none where it is missing)."""
    def default(argv: list[str]) -> str | None:
        if shutil.which(argv[0]) is None:
            return None
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    stdout = (run_command or default)(gpu_facts.query_command())
    if not stdout:
        return {}
    counts: dict[str, int] = {}
    for record in gpu_facts.parse_query(stdout).gpus:
        name = gpu_facts.class_of(record)
        counts[name] = counts.get(name, 0) + 1
    return counts


def gguf(given: Path | None) -> Path | None:
    """The starter's GGUF on this machine: ``given``, else ``make model``'s in the
    working directory's or llmgw's own checkout, else None."""
    if given is not None:
        return given.resolve() if given.is_file() else None
    checkout = Path(__file__).resolve().parents[2]
    for root in (Path.cwd(), checkout):
        found = root / ".cache" / "models" / STARTER_FILE
        if found.is_file():
            return found.resolve()
    return None


def for_gpus(classes: Mapping[str, int],
             known: Mapping[str, GpuClass]) -> tuple[Candidate, str] | None:
    """The largest candidate that fits one GPU of a class found, by the fit check."""
    for candidate in GPU_CANDIDATES:
        found = dataclasses.replace(fits.of_shape(candidate.shape, None), context=GPU_CONTEXT)
        for name in sorted(classes):
            gpu_class = known.get(name)
            if gpu_class is None:
                continue
            figures = fits.estimate(found, gpu_class)
            if figures.fits:
                return candidate, name
    return None


PRICING = {"input_per_mtok": 0.10, "output_per_mtok": 0.40}


def gpu_entry(candidate: Candidate, gpu_class: str) -> dict[str, Any]:
    """models.yaml's entry for ``candidate`` on one GPU of ``gpu_class``, with vLLM."""
    return {"source": candidate.source, "shape": candidate.shape.model_dump(exclude_none=True),
            "scaling": {"min": 1, "max": 1}, "pricing": dict(PRICING),
            "profiles": [{"engine": "vllm", "gpu_class": gpu_class,
                          "args": {"max-model-len": GPU_CONTEXT}}]}


def cpu_entry(source: str) -> dict[str, Any]:
    """models.yaml's entry for Gemma 3 270M on CPU, with llama.cpp (as the lab's)."""
    return {"source": source, "scaling": {"min": 1, "max": 1}, "pricing": dict(PRICING),
            "profiles": [{"engine": "llama.cpp", "cpu": True, "min_memory_gb": 1,
                          "args": {"ctx-size": 2048, "threads": 1, "parallel": 1,
                                   "no-jinja": True, "chat-template": "gemma"}}]}
