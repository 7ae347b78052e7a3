"""Property: whatever an editor does to the example files, validate answers with places.

Mutations: delete lines, swap two lines' values, inject tabs, duplicate lines
(duplicate keys), replace a value with junk. The loader must never raise
anything but SpecErrors, and every error must carry a file:line:col.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.spec import loading

EXAMPLE = Path(__file__).parents[2] / "cluster.example"
FILES = sorted(p.name for p in EXAMPLE.glob("*.yaml"))

junk = st.sampled_from(["", "-1", "yes", "[1, 2", "{a: b}", "'x", "1h30", "0.5GiB", "null",
                        "h100-48g", "\t", "auto", "99999999", "local", "@", "*anchor"])


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, str]:
    files = {name: (EXAMPLE / name).read_text() for name in FILES}
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(FILES))
        lines = files[name].splitlines()
        if not lines:
            continue
        i = draw(st.integers(0, len(lines) - 1))
        j = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["delete", "swap", "tab", "duplicate", "junk"]))
        if kind == "delete":
            del lines[i]
        elif kind == "swap" and ":" in lines[i] and ":" in lines[j]:
            ki, _, vi = lines[i].partition(":")
            kj, _, vj = lines[j].partition(":")
            lines[i], lines[j] = f"{ki}:{vj}", f"{kj}:{vi}"
        elif kind == "tab":
            lines[i] = "\t" + lines[i].lstrip(" ")
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "junk" and ":" in lines[i]:
            key, _, _ = lines[i].partition(":")
            lines[i] = f"{key}: {draw(junk)}"
        files[name] = "\n".join(lines) + "\n"
    return files


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=mutated())
def test_validate_never_raises_and_always_locates(files: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, text in files.items():
            (root / name).write_text(text)
        shutil.copy(EXAMPLE / "known_hosts", root / "known_hosts")
        try:
            loading.load(root)
        except loading.SpecErrors as exc:
            assert exc.errors
            for error in exc.errors:
                assert error.location is not None, str(error)
                assert error.location.line >= 1 and error.location.col >= 1
                assert Path(error.location.path).name in files
                assert error.message.strip()
