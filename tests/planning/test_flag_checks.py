"""The argv walk of engines/checks.py, token by token, on a small table made here.

Each row is an argv and exactly what is wrong with it: which tokens are taken
as an option's value (and so never reported on their own), which are not,
and the message for each kind of problem. A token after a problem is always
checked too: the walk never stops at the first one.
"""

from __future__ import annotations

import pytest

from llmgw.engines import checks, flags
from llmgw.engines.tables import Option, Removal, Table

OPTIONS = {
    "--on": Option("--on", "none"),
    "--size": Option("--size", "required"),
    "--seed": Option("--seed", "required"),
    "--mode": Option("--mode", "required", ("a", "b")),
    "--level": Option("--level", "optional", ("1", "2")),
    "-n": Option("-n", "required", canonical="--num"),
    "--num": Option("--num", "required"),
    "--config": Option("--config", "required"),
}
VLLM = Table("vllm", "1.0.0", OPTIONS, {"--old": Removal("0.9.3", "--new"),
                                        "--gone": Removal("0.8.0", None)})
SGLANG = Table("sglang", "1.0.0", OPTIONS, {"--old": Removal("0.5.21", None)})


def unknown(name: str, hint: str = "", label: str = "vLLM 1.0.0") -> str:
    return (f"{label} has no option {name}{hint}; a flag newer than llmgw's table goes under "
            "unchecked_args")


def positional(token: str) -> str:
    return f"vLLM 1.0.0 takes no positional argument {token!r} here"


NO_VALUE = "--on takes no value in vLLM 1.0.0; write it as `true` (or `false` for its --no- form)"
NEEDS = "--size needs a value in vLLM 1.0.0"


@pytest.mark.parametrize(("tokens", "found"), [
    ([], []),
    (["pos", "--wrong"], [("pos", positional("pos")), ("--wrong", unknown("--wrong"))]),
    # --name=value: the value is the text after `=`, checked against the choices.
    (["--mode=c", "--mode=a", "--size=3"],
     [("--mode=c", "--mode 'c' is not one of vLLM 1.0.0's choices: a, b")]),
    # A short option is never split at `=`.
    (["-n=3"], [("-n=3", unknown("-n=3"))]),
    # An unknown option's value is skipped with it; an inline one leaves the next token.
    (["--wrong"], [("--wrong", unknown("--wrong"))]),
    (["--wrong", "--bad"], [("--wrong", unknown("--wrong")), ("--bad", unknown("--bad"))]),
    (["--wrong", "v", "pos"], [("--wrong", unknown("--wrong")), ("pos", positional("pos"))]),
    (["--wrong=1", "pos"], [("--wrong=1", unknown("--wrong")), ("pos", positional("pos"))]),
    # An option without a value: one given is reported, and skipped.
    (["--on=1", "pos"], [("--on=1", NO_VALUE), ("pos", positional("pos"))]),
    (["--on", "v", "--wrong"], [("--on", NO_VALUE), ("--wrong", unknown("--wrong"))]),
    (["--on", "--size", "1"], []),
    # A required value: anything but a defined --option (a negative number, a short flag).
    (["--size", "-n"], []),
    (["--size", "--free"], []),
    (["--size"], [("--size", NEEDS)]),
    (["--size", "--on", "--wrong"], [("--size", NEEDS), ("--wrong", unknown("--wrong"))]),
    (["--size", "--size=3"], [("--size", NEEDS)]),
    # An optional value: the next token unless it is an option.
    (["--level", "3", "--level"],
     [("--level", "--level '3' is not one of vLLM 1.0.0's choices: 1, 2")]),
    (["--level", "2", "pos"], [("pos", positional("pos"))]),
    (["--level", "--wrong"], [("--wrong", unknown("--wrong"))]),
    (["--level", "2", "--wrong"], [("--wrong", unknown("--wrong"))]),
    # vLLM takes one key of a JSON option (--config.a.b); its value is not the parent's choice.
    (["--config.a.b", "1", "--mode.x", "z"], []),
    (["--on.x"], [("--on.x", unknown("--on.x"))]),
    # Removed options name the release (vLLM: its minor) and the replacement when known.
    (["--old", "x", "--gone"], [("--old", "`old` was removed in vLLM 0.9; use --new"),
                                ("--gone", "`gone` was removed in vLLM 0.8")]),
    # A hint when exactly one long option starts with what was written.
    (["--si"], [("--si", unknown("--si", " (did you mean size?)"))]),
    (["--s"], [("--s", unknown("--s"))]),
    (["--n"], [("--n", unknown("--n", " (did you mean num?)"))]),
])
def test_vllm_walk(tokens: list[str], found: list[tuple[str, str]]) -> None:
    assert list(checks.problems(tokens, VLLM)) == found


def test_other_engines_keep_dotted_names_and_whole_versions() -> None:
    """Only vLLM's parser splits --option.key; only vLLM's removals are told by minor."""
    assert list(checks.problems(["--config.mode", "3", "--old"], SGLANG)) == [
        ("--config.mode", unknown("--config.mode", label="SGLang 1.0.0")),
        ("--old", "`old` was removed in SGLang 0.5.21"),
    ]


# flags.render on the same kind of table: what a profile's args become.
RENDER = Table("vllm", "1.0.0", {
    "--cache": Option("--cache", "none", negation="--no-cache"),
    "-c": Option("-c", "none", canonical="--cache"),
    "--eager": Option("--eager", "none"),
    "-e": Option("-e", "none", canonical="--eager"),
    "-g": Option("-g", "none", canonical="--ghost"),  # its long name is not in the table
}, {})


@pytest.mark.parametrize(("args", "argv", "problems"), [
    # Sorted by name whatever the dashes, so a reordered YAML map renders the same.
    ({"--beta": 1, "alpha": 2}, ["--alpha", "2", "--beta", "1"], []),
    # A short alias takes its long name's --no- form; none there, none here.
    ({"c": False}, ["--no-cache"], []),
    ({"e": False, "zeta": 1}, ["--zeta", "1"],
     ["args.e: false would need --no-e, but vLLM 1.0.0 defines no --no-e; remove the key "
      "to keep the engine's default"]),
    ({"g": False}, [],
     ["args.g: false would need --no-g, but vLLM 1.0.0 defines no --no-g; remove the key "
      "to keep the engine's default"]),
])
def test_render(args: dict[str, object], argv: list[str], problems: list[str]) -> None:
    rendered = flags.render(args, RENDER)  # type: ignore[arg-type]
    assert rendered.argv == argv
    assert [message for _, message in rendered.problems] == problems
