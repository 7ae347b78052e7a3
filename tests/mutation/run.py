"""Mutation testing of the decision modules: ``make mutation``.

For each module in :data:`MODULES`, mutmut mutates that one file and runs
only the tests that are meant to hold its rules (the list beside it), in a
scratch copy of the tree under ``.cache/mutation/<module>``, so the working
tree is never touched and modules never share results. It prints one line per
module — mutants, killed, survived, score — and, with ``--survivors``, the
diff of every surviving mutant. ``--sample N`` tests N mutants per module,
drawn with a seed made of the module's name (the same code gives the same
sample, so a score before and after new tests compares like with like);
each mutant that survives them, or that mutmut saw no test reach, is then
run against *every* test in the module's test files and counts as caught
when they fail, as survived when they pass. Accepted survivors (equivalent mutants, or
ones argued harmless) are listed with their reasons in docs/testing.md;
``--check`` exits 1 when a module scores under ``--min`` (default 90 %).

Not part of ``make test``: a full run takes minutes, and a score is a
measurement to read, not a gate on every commit.

Usage::

    python tests/mutation/run.py                      # every module
    python tests/mutation/run.py rendering/quoting    # one module, by suffix
    python tests/mutation/run.py --survivors planning/scaling
    python tests/mutation/run.py --sample 60 planning/plans
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRATCH = ROOT / ".cache" / "mutation"

PLANNING = ["tests/planning/test_plan_cases.py", "tests/planning/test_phases.py",
            "tests/planning/test_outputs.py", "tests/planning/test_purity.py"]
RENDERING = ["tests/planning/test_units.py", "tests/planning/test_hostile_units.py",
             "tests/planning/test_quoting.py"]
ENGINES = ["tests/planning/test_engines.py", "tests/planning/test_units.py",
           "tests/planning/test_flag_tables.py", "tests/planning/test_engine_placements.py",
           "tests/planning/test_addresses.py", "tests/planning/test_engine_commands.py",
           "tests/planning/test_synthetic_tables.py", "tests/planning/test_flag_checks.py"]

RESERVATIONS = ["tests/store/test_stores.py", "tests/router/test_accounts.py"]

# module (under llmgw/) → the tests that hold its rules. Slow end-to-end tests
# are left out on purpose: a rule only an e2e test holds is a rule to test closer.
MODULES: dict[str, list[str]] = {
    "planning/diffs.py": [*PLANNING, "tests/planning/test_diffs.py"],
    "planning/drifts.py": [*PLANNING, "tests/planning/test_drifts.py"],
    "planning/fingerprints.py": [*PLANNING, "tests/planning/test_fingerprints.py",
                                 "tests/planning/test_incremental.py"],
    "planning/installs.py": [*PLANNING, "tests/planning/test_install_holds.py"],
    "planning/nodes.py": [*PLANNING, "tests/planning/test_nodes.py",
                          "tests/planning/test_fabric_changes.py",
                          "tests/planning/test_incremental.py"],
    "planning/outputs.py": PLANNING,
    "planning/placements.py": [*PLANNING, "tests/planning/test_placements.py",
                               "tests/planning/test_fabric_changes.py"],
    "planning/plans.py": PLANNING,
    "planning/planners.py": ["tests/planning/test_incremental.py"],
    "planning/replicas.py": [*PLANNING, "tests/planning/test_replicas.py"],
    "planning/scaling.py": [*PLANNING, "tests/planning/test_scaling.py"],
    # The fleet figures `llmgw status`, `inventory` and the admin API show.
    "planning/summaries.py": ["tests/planning/test_summaries.py"],
    # Per node, the same for them and the /admin nodes pages.
    "fleet/summaries.py": ["tests/fleet/test_node_summaries.py",
                           "tests/planning/test_summaries.py",
                           "tests/cli/test_inventory_views.py"],
    # Plan and Change methods (summary(), phases(), ...): the planning tests read them.
    "planning/types.py": [*PLANNING, "tests/planning/test_holds.py",
                          "tests/planning/test_drifts.py", "tests/planning/test_waves.py"],
    "planning/shards.py": [*PLANNING, "tests/planning/test_shards.py",
                           "tests/planning/test_weights_plan.py",
                           "tests/planning/test_engine_placements.py"],
    "rendering/quoting.py": RENDERING,
    "rendering/units.py": RENDERING,
    "spec/checks.py": ["tests/spec/test_broken_corpus.py", "tests/spec/test_cli.py"],
    "engines/addresses.py": ENGINES,
    "engines/checks.py": ENGINES,
    "engines/flags.py": ENGINES,
    "engines/launches.py": ENGINES,
    "engines/llama_cpp.py": ENGINES,
    "engines/nccl.py": ENGINES,
    "engines/parts.py": ENGINES,
    "engines/profiles.py": ENGINES,
    "engines/sglang.py": ENGINES,
    "engines/tables.py": ENGINES,
    "engines/vllm.py": ENGINES,
    # The router stack tests (test_router_access, _budgets, _limits) hold these rules
    # from a client's side too, but start a router and a PostgreSQL per mutant.
    "router/accounts.py": ["tests/router/test_accounts.py",
                           "tests/router/test_router_budgets.py::test_estimate",
                           "tests/router/test_router_budgets.py::"
                           "test_estimate_of_embeddings_has_no_output",
                           "tests/router/test_router_budgets.py::test_what_was_served"],
    # Budget reservations in the store: admission, settling, and the usage write that
    # drops a settled reservation (only those methods: see FUNCTIONS).
    "store/sqlitestores.py": RESERVATIONS,
    "store/postgresstores.py": RESERVATIONS,
    # Rollout gates' decisions, waves, holds and their spec (from the gates work).
    "applying/gates.py": ["tests/applying/test_gates.py"],
    "planning/waves.py": ["tests/planning/test_waves.py"],
    "planning/holds.py": [*PLANNING, "tests/planning/test_holds.py"],
    "spec/rollouts.py": ["tests/spec/test_rollout_specs.py"],
    # `cluster.drift`'s settings (pydantic fields only: mutmut finds no function to mutate).
    "spec/repairs.py": ["tests/planning/test_drifts.py", "tests/spec/test_broken_corpus.py"],
    # `llmgw doctor`'s checks; the CLI run over sshd is end-to-end and left out.
    "onboarding/doctors.py": ["tests/onboarding/test_doctors.py",
                              "tests/onboarding/test_doctor_verdicts.py", "-k", "not over_sshd"],
}

# Modules whose decision is a few methods of a larger file: only those are mutated
# (mutmut's mutant-name globs); the rest of the file is not this measurement's.
FUNCTIONS: dict[str, list[str]] = {
    "store/sqlitestores.py": ["*reserve__mutmut_*", "*settle_reservation__mutmut_*",
                              "*insert_usage__mutmut_*"],
    "store/postgresstores.py": ["*reserve__mutmut_*", "*settle_reservation__mutmut_*",
                                "*insert_usage__mutmut_*"],
}

# Copied into each scratch tree besides llmgw/ and tests/ (mutmut copies those).
ALSO_COPY = ["templates", "llmgw/templates", "llmgw/proto", "llmgw/py.typed", "cluster.example",
             "docs"]

STATUS = {1: "killed", 3: "killed", 0: "survived", 36: "timeout", 24: "timeout",
          -24: "timeout", 152: "timeout", 255: "timeout", 5: "no tests", 33: "no tests",
          34: "skipped", 37: "killed"}


@dataclass
class Score:
    module: str
    counts: dict[str, int]
    survivors: list[str]
    seconds: float

    @property
    def tested(self) -> int:
        return self.counts.get("killed", 0) + self.counts.get("timeout", 0) + len(self.survivors)

    @property
    def percent(self) -> float:
        caught = self.counts.get("killed", 0) + self.counts.get("timeout", 0)
        return 100.0 * caught / self.tested if self.tested else 100.0


def _config(module: str, tests: list[str]) -> str:
    lines = [
        "", "[tool.mutmut]",
        'source_paths = ["llmgw"]',
        f"also_copy = {json.dumps(ALSO_COPY)}",
        f'only_mutate = ["llmgw/{module}"]',
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]',
        "use_git_change_detection = false",
    ]
    return "\n".join(lines) + "\n"


def _prepare(module: str, tests: list[str]) -> Path:
    work = SCRATCH / module.replace("/", "-").removesuffix(".py")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc")
    # .github: templates/llmgw-plan.yml links to the workflow there; docs: the spec CLI
    # tests compare the generated cluster reference with docs/cluster-reference.md.
    for name in ("llmgw", "tests", "templates", "cluster.example", ".github", "docs"):
        source = ROOT / name
        if source.exists():
            shutil.copytree(source, work / name, symlinks=True, ignore=ignore)
    pyproject = (ROOT / "pyproject.toml").read_text()
    (work / "pyproject.toml").write_text(pyproject + _config(module, tests))
    return work


# Prints every mutant name mutmut would make of one file, without running anything.
_NAMES = """
import json, sys
from pathlib import Path
from mutmut.mutation.file_mutation import mutate_file_contents
from mutmut.utils.format_utils import get_mutant_name
path = Path(sys.argv[1])
made = mutate_file_contents(str(path), path.read_text())
print(json.dumps([get_mutant_name(path, name) for name in made.mutant_names]))
"""


def _sample(work: Path, module: str, size: int) -> list[str]:
    listed = subprocess.run([sys.executable, "-c", _NAMES, f"llmgw/{module}"], cwd=work,
                            capture_output=True, text=True, check=True)
    globs = FUNCTIONS.get(module, [])
    names: list[str] = [name for name in json.loads(listed.stdout)
                        if not globs or any(fnmatch.fnmatch(name, g) for g in globs)]
    if len(names) <= size:
        return names
    return sorted(random.Random(module).sample(names, size))


def _pytest(work: Path, tests: list[str], mutant: str) -> int:
    """Exit status of every test in ``tests`` with ``mutant`` active ("" for none)."""
    env = {**os.environ, "MUTANT_UNDER_TEST": mutant}
    command = [sys.executable, "-m", "pytest", "--rootdir=.", "-p", "no:cacheprovider", "-q",
               "-x", *tests]
    return subprocess.run(command, cwd=work / "mutants", env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode


def _run(module: str, tests: list[str], mutmut: str, sample: int = 0) -> Score:
    work = _prepare(module, tests)
    started = time.monotonic()
    log = work / "mutmut.log"
    chosen = _sample(work, module, sample) if sample else FUNCTIONS.get(module, [])
    with log.open("w") as out:
        done = subprocess.run([mutmut, "run", *chosen], cwd=work, stdout=out,
                              stderr=subprocess.STDOUT)
    meta = work / "mutants" / "llmgw" / f"{module}.meta"
    exits: dict[str, int | None] = (json.loads(meta.read_text())["exit_code_by_key"]
                                    if meta.exists() else {})
    # mutmut mutates function bodies only: a module of plain dataclasses has no mutants,
    # and mutmut then stops with an error that is not one.
    if not exits and meta.exists():
        return Score(module, {}, [], time.monotonic() - started)
    if done.returncode != 0 or not meta.exists():
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise SystemExit(f"mutmut failed on {module} (log: {log}):\n" + "\n".join(tail))
    counts: dict[str, int] = {}
    survivors = []
    for name, code in sorted(exits.items()):
        status = STATUS.get(code, "suspicious") if code is not None else "not checked"
        counts[status] = counts.get(status, 0) + 1
        if status == "survived" or (sample and status == "no tests"):
            survivors.append(name)
    if sample and survivors:
        # mutmut ran only the tests it saw reach the mutated function (none, for
        # "no tests"); the module's whole test files get the last word, after they
        # pass with no mutant.
        if _pytest(work, tests, "") != 0:
            raise SystemExit(f"{module}: its tests fail with no mutant active (in {work})")
        caught = [name for name in survivors if _pytest(work, tests, name) != 0]
        counts.pop("no tests", None)
        counts["killed"] = counts.get("killed", 0) + len(caught)
        counts["survived"] = len(survivors) - len(caught)
        survivors = [name for name in survivors if name not in caught]
    return Score(module, counts, survivors, time.monotonic() - started)


def _show(work: Path, mutant: str, mutmut: str) -> str:
    shown = subprocess.run([mutmut, "show", mutant], cwd=work, capture_output=True, text=True)
    return shown.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="module suffixes, e.g. planning/scaling")
    parser.add_argument("--survivors", action="store_true", help="print each survivor's diff")
    parser.add_argument("--check", action="store_true", help="exit 1 below --min")
    parser.add_argument("--min", type=float, default=90.0, help="score to reach, percent")
    parser.add_argument("--sample", type=int, default=0,
                        help="test this many mutants per module (0: every one)")
    args = parser.parse_args(argv)
    mutmut = shutil.which("mutmut", path=str(Path(sys.executable).parent))
    if mutmut is None:
        raise SystemExit("mutmut is not installed in this venv (make mutation installs it)")
    chosen = [m for m in MODULES
              if not args.modules or any(m.removesuffix(".py").endswith(s.removesuffix(".py"))
                                         for s in args.modules)]
    if not chosen:
        raise SystemExit(f"no module matches {args.modules}; known: {', '.join(MODULES)}")
    scores = []
    print(f"{'module':28} {'mutants':>7} {'killed':>7} {'timeout':>7} {'survived':>8} "
          f"{'score':>7} {'time':>6}")
    for index, module in enumerate(chosen, 1):
        print(f"[{index}/{len(chosen)}] mutating llmgw/{module} …", file=sys.stderr, flush=True)
        score = _run(module, MODULES[module], mutmut, args.sample)
        scores.append(score)
        if not score.tested:
            print(f"{module:28} {0:7}  no function code to mutate", flush=True)
            continue
        print(f"{module:28} {score.tested:7} {score.counts.get('killed', 0):7} "
              f"{score.counts.get('timeout', 0):7} {len(score.survivors):8} "
              f"{score.percent:6.1f}% {score.seconds:5.0f}s", flush=True)
        if args.survivors:
            work = SCRATCH / module.replace("/", "-").removesuffix(".py")
            for mutant in score.survivors:
                print(f"\n# {mutant}\n{_show(work, mutant, mutmut)}\n")
    low = [s for s in scores if s.percent < args.min]
    total = sum(s.tested for s in scores)
    caught = sum(s.tested - len(s.survivors) for s in scores)
    print(f"{'all':28} {total:7} {'':7} {'':7} {total - caught:8} "
          f"{100.0 * caught / max(total, 1):6.1f}%")
    if low:
        print(f"under {args.min:.0f}%: {', '.join(s.module for s in low)}")
    return 1 if args.check and low else 0


if __name__ == "__main__":
    sys.exit(main())
