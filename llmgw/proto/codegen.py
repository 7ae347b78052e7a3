"""Generate the Python modules for ``agent.proto`` (a development tool).

``python -m llmgw.proto.codegen`` rewrites ``llmgw/proto/agent_pb2*.py{,i}``
in place; ``generate(out_root)`` writes them under another root, which is
how ``tests/agent/test_proto_sync.py`` checks the committed files are not
stale. Needs the dev extras (grpcio-tools, mypy-protobuf).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

PROTO = "llmgw/proto/agent.proto"
GENERATED = (
    "llmgw/proto/agent_pb2.py",
    "llmgw/proto/agent_pb2.pyi",
    "llmgw/proto/agent_pb2_grpc.py",
    "llmgw/proto/agent_pb2_grpc.pyi",
)
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def _plugin(name: str) -> str:
    # The plugins live next to this interpreter in a venv, which need not be on PATH.
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install the dev extras (pip install -e '.[dev]')")
    return found


def generate(out_root: Path) -> list[Path]:
    """Compile ``agent.proto`` into ``out_root/llmgw/proto/``; returns the files written."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    (out_root / "llmgw" / "proto").mkdir(parents=True, exist_ok=True)
    # Compiling from the source root makes the generated imports absolute
    # (`from llmgw.proto import agent_pb2`), so they work inside the package.
    argv = [
        "grpc_tools.protoc",
        f"-I{SOURCE_ROOT}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        str(SOURCE_ROOT / PROTO),
    ]
    status = protoc.main(argv)
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}: {' '.join(argv)}")
    return [out_root / name for name in GENERATED]


def main() -> int:
    written = generate(SOURCE_ROOT)
    for path in written:
        print(os.path.relpath(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
