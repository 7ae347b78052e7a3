"""The committed gRPC modules are what agent.proto compiles to today."""

from __future__ import annotations

from pathlib import Path

from llmgw.proto import codegen


def test_generated_modules_match_agent_proto(tmp_path: Path) -> None:
    written = codegen.generate(tmp_path)
    stale = []
    for fresh, name in zip(written, codegen.GENERATED, strict=True):
        committed = codegen.SOURCE_ROOT / name
        if not committed.exists() or committed.read_bytes() != fresh.read_bytes():
            stale.append(name)
    assert not stale, f"stale generated code: {stale}; run `make proto` and commit the result"
