"""A :class:`loading.Reader` loads what :func:`loading.load` loads, error for error.

One reader lives through a seeded random walk of edits to a cluster directory,
as the daemon's does through edits: files replaced by others (valid ones and
every file of the broken corpus), added, removed, put back as they were, a
line dropped or doubled. After each edit the reader's result must equal a full
load's: the same cluster and the same sources, or the same located errors. The
walk runs with the directory's value budget as shipped and with one small
enough that the budget runs out part-way through the files, so a file whose
parse is kept is read again under less budget than it was parsed with.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from llmgw.engines import profiles
from llmgw.planning import fits
from llmgw.spec import loading

ROOT = Path(__file__).resolve().parents[2]
CHECKS = [profiles.check, fits.check]
STEPS = 60


def _texts() -> list[str]:
    """Every YAML file of the example cluster and of the broken corpus."""
    files = sorted((ROOT / "cluster.example").glob("*.yaml"))
    files += sorted((Path(__file__).parent / "broken").glob("*/*.yaml"))
    return [f.read_text() for f in files]


def _outcome(load: Any, directory: Path) -> tuple[str, Any]:
    try:
        cluster, sources = load(directory, CHECKS)
    except loading.SpecErrors as exc:
        return "errors", [(e.location, e.message) for e in exc.errors]
    return "cluster", (cluster.model_dump(), sources.keys, sources.values, sources.files)


class Walk:
    def __init__(self, seed: int, directory: Path) -> None:
        self.rng = random.Random(seed)
        self.directory = directory
        self.texts = _texts()
        self.before: dict[str, str] = {}  # file → its content before the last edit of it
        self.next = 0
        for path in sorted((ROOT / "cluster.example").glob("*.yaml")):
            shutil.copy(path, directory / path.name)

    def files(self) -> list[Path]:
        return sorted(self.directory.glob("*.yaml"))

    def edit(self) -> str:
        rng, files = self.rng, self.files()
        kind = rng.choice(["replace", "add", "remove", "put back", "drop line",
                           "double line", "touch"])
        if kind == "add" or not files:
            self.next += 1
            path = self.directory / f"{rng.choice('aknz')}{self.next:02d}.yaml"
            path.write_text(rng.choice(self.texts))
            return f"add {path.name}"
        path = rng.choice(files)
        text = path.read_text()
        if kind == "remove" and len(files) > 1:
            self.before[path.name] = text
            path.unlink()
            return f"remove {path.name}"
        if kind == "put back" and self.before:
            name = rng.choice(sorted(self.before))
            (self.directory / name).write_text(self.before.pop(name))
            return f"put back {name}"
        if kind == "touch":
            path.write_text(text)  # the same content, written again
            return f"touch {path.name}"
        self.before[path.name] = text
        lines = text.splitlines(keepends=True)
        if kind in ("drop line", "double line") and lines:
            at = rng.randrange(len(lines))
            lines[at:at + 1] = [] if kind == "drop line" else [lines[at]] * 2
            path.write_text("".join(lines))
            return f"{kind} {at + 1} of {path.name}"
        path.write_text(rng.choice(self.texts))
        return f"replace {path.name}"


@pytest.mark.parametrize("budget", [loading.bounds.YAML_MAX_DIRECTORY_VALUES, 400],
                         ids=["budget as shipped", "budget of 400 values"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_reader_loads_what_a_full_load_loads(
    seed: int, budget: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # files are displayed relative to the working directory
    shipped = loading._Budget
    monkeypatch.setattr(loading, "_Budget", lambda: dataclasses.replace(shipped(), values=budget))
    directory = tmp_path / "cluster"
    directory.mkdir()
    walk = Walk(seed, directory)
    reader = loading.Reader()
    kinds = set()
    for step in range(STEPS):
        done = walk.edit() if step else "start"
        full = _outcome(loading.load_with_sources, directory)
        kinds.add(full[0])
        assert _outcome(reader.load_with_sources, directory) == full, f"step {step}: {done}"
    assert kinds == {"errors", "cluster"} or budget < 1000, "the walk met both outcomes"


def test_a_reader_parses_only_what_changed(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    shutil.copytree(ROOT / "cluster.example", directory,
                    ignore=shutil.ignore_patterns("local", "agent"))
    reader = loading.Reader()
    first = reader.load(directory, CHECKS)
    assert reader.parsed == len(loading.yaml_files(directory))
    assert reader.load(directory, CHECKS) == first
    assert reader.parsed == 0
    models = directory / "models.yaml"
    models.write_text(models.read_text() + "\n# a comment\n")
    reader.load(directory, CHECKS)
    assert reader.parsed == 1


def test_a_kept_parse_is_checked_against_the_budget_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # b.yaml fits the directory's budget alone and is kept; a.yaml, read before it,
    # then leaves it too little: the full load's error, not the kept count.
    monkeypatch.chdir(tmp_path)
    shipped = loading._Budget
    monkeypatch.setattr(loading, "_Budget", lambda: dataclasses.replace(shipped(), values=100))
    directory = tmp_path / "cluster"
    directory.mkdir()
    listed = ", ".join(str(i) for i in range(60))
    (directory / "b.yaml").write_text(f"cluster:\n  name: b\n  labels: [{listed}]\n")
    reader = loading.Reader()
    assert _outcome(reader.load_with_sources, directory) == _outcome(
        loading.load_with_sources, directory)
    (directory / "a.yaml").write_text(f"spare: [{listed}]\n")
    full = _outcome(loading.load_with_sources, directory)
    assert full[0] == "errors" and any("holds more than 500,000 values" in m for _, m in full[1])
    assert _outcome(reader.load_with_sources, directory) == full
