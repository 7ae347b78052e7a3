"""docs/quick-install.md: every command on it exists, and what it shows was printed.

The page is commands only, for a bare machine and real servers, so most of it cannot
run here. What can be checked is:

* every ``llmgw`` command line in its code blocks (``$(llmgw …)`` included) parses with
  llmgw's own argument parser: the command, its subcommand and every flag exist;
* every ``make`` target it names is a target of the Makefile;
* the blocks it shows output for run as written (``<!-- run: quick-install -->``: the
  version, the repository ``llmgw init`` writes; then ``quick-install-validate`` in
  that repository, with the page's own ``models.yaml``), matched as the docs' sessions
  are (:mod:`sessions`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from pathlib import Path

import pytest
import sessions

from llmgw.cli.main import build_parser

PAGE = sessions.ROOT / "docs" / "quick-install.md"
MAKEFILE = sessions.ROOT / "Makefile"
FENCE = re.compile(r"^```([a-z]*)\n(.*?)^```", flags=re.S | re.M)


def code_lines() -> list[str]:
    """The command lines of the page: every line of a plain code block (what to type),
    the ``$ `` lines of a console block (the rest is output); ``text`` blocks are output."""
    lines = []
    for kind, block in FENCE.findall(PAGE.read_text()):
        for line in block.splitlines():
            if kind == "" and line.strip():
                lines.append(line.strip())
            elif kind == "console" and line.startswith("$ "):
                lines.append(line[2:].strip())
    return lines


def llmgw_commands() -> list[list[str]]:
    """Each llmgw invocation of the page's code blocks, as argv after ``llmgw``."""
    found = []
    for line in code_lines():
        for part in re.split(r"&&|\|\||;|\||\$\(|\)", line):
            words = shlex.split(part, comments=True) if part.strip() else []
            if words and words[0] == "llmgw":
                found.append(words[1:])
    return found


def make_targets() -> list[str]:
    targets = []
    for line in code_lines():
        for part in re.split(r"&&|;", line):
            words = part.split()
            if words and words[0] == "make":
                targets += [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return targets


def refusal(argv: list[str]) -> str | None:
    """What llmgw's parser says of ``argv``: None when it accepts it."""
    parser = build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1]
    except argparse.ArgumentError as exc:
        return str(exc)
    return None


def test_the_page_names_the_commands_from_install_to_a_request() -> None:
    firsts = [argv[0] for argv in llmgw_commands() if argv]
    for command in ("init", "node", "doctor", "validate", "plan", "apply", "keys"):
        assert command in firsts, f"quick-install.md runs no `llmgw {command}`"


@pytest.mark.parametrize("argv", llmgw_commands(), ids=lambda argv: " ".join(argv)[:60])
def test_every_llmgw_command_parses(argv: list[str]) -> None:
    assert refusal(argv) is None, f"llmgw {' '.join(argv)}: {refusal(argv)}"


def test_a_command_that_does_not_exist_is_refused() -> None:
    """The check above can fail: a misspelt subcommand or flag is refused."""
    assert refusal(["node", "ad", "root@gpu-01"]) is not None
    assert refusal(["node", "add", "root@gpu-01", "--weights-directory", "/models"]) is not None


def test_every_make_target_is_in_the_makefile() -> None:
    defined = set(re.findall(r"^([a-z][a-z0-9-]*):", MAKEFILE.read_text(), flags=re.M))
    named = make_targets()
    assert named, "quick-install.md runs no make target"
    missing = sorted(set(named) - defined)
    assert not missing, f"not Makefile targets: {missing}"


def page_models_yaml() -> str:
    match = re.search(r"^cat > cluster/models.yaml <<'EOF'\n(.*?)^EOF$", PAGE.read_text(),
                      flags=re.S | re.M)
    assert match, "quick-install.md writes no cluster/models.yaml"
    return match.group(1)


def test_the_output_it_shows_is_what_the_commands_print(tmp_path: Path) -> None:
    env = sessions.environment([Path(sys.executable).parent])
    env["HOME"] = str(tmp_path)  # no key of this machine's user: init's output is the same
    first = sessions.commands([PAGE], "quick-install")
    assert [c.text for c in first][:1] == ["llmgw --version"]
    outputs = sessions.run(first, tmp_path, env, timeout=300)
    differences = sessions.differences(first, outputs)
    repository = tmp_path / "acme-gpu"
    (repository / "cluster" / "models.yaml").write_text(page_models_yaml())
    second = sessions.commands([PAGE], "quick-install-validate")
    assert second, "no quick-install-validate block"
    differences += sessions.differences(second, sessions.run(second, repository, env,
                                                             timeout=300))
    assert not differences, "\n\n".join(differences)
