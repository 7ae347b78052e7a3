"""Run the shell sessions of the docs and compare what they print with what the docs show.

A ```` ```console ```` block preceded by ``<!-- run: NAME -->`` belongs to
session NAME. Its ``$ `` lines are commands; the lines after each command,
up to the next, are what it printed. All blocks of a session (across pages,
in the order given) run in **one** bash process in a scratch directory, so
``cd``, variables and ``$?`` carry over as they would in a terminal.

Comparison keeps to the stable parts:

* a line ``…`` in the docs stands for any number of printed lines;
* ``…`` inside a line stands for any text;
* times, dates, durations, ages, revisions, unit digests, host key
  fingerprints and git object ids are replaced by placeholders on both sides.

``python tests/docs/sessions.py lab DIR`` runs the lab session in DIR and prints
each command with what it printed now (how the docs' transcripts are refreshed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

if __name__ == "__main__":  # run as a tool, not by pytest: tests/ holds the support package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import pytest  # noqa: E402
from support import netns  # noqa: E402

from llmgw.onboarding import enrolments  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"^<!-- run: ([a-z-]+) -->$")
SEPARATOR = "@@docs-session-command-{}@@"

VOLATILE = [
    (re.compile(r"\b\d{4}-\d{2}-\d{2}\b"), "<date>"),
    (re.compile(r"\b\d{2}:\d{2}(:\d{2})?\b"), "<time>"),
    (re.compile(r"SHA256:[A-Za-z0-9+/]{43}"), "SHA256:<fingerprint>"),
    (re.compile(r"\b\d+(\.\d+)?s\b"), "<duration>"),
    (re.compile(r"\b[0-9a-f]{16}\b"), "<digest>"),
    (re.compile(r"\b[0-9a-f]{12}(\+dirty)?\b"), "<revision>"),
    (re.compile(r"\bindex [0-9a-f]{7,}\.\.[0-9a-f]{7,}"), "index <ids>"),
    (re.compile(r"\b[0-9a-f]{7}\b(?= \()"), "<commit>"),
]


@dataclass
class Command:
    page: str
    line: int
    text: str
    expected: list[str] = field(default_factory=list)


def commands(pages: list[Path], session: str) -> list[Command]:
    """The session's commands with the output the docs show, in page order."""
    found: list[Command] = []
    for page in pages:
        lines = page.read_text().splitlines()
        index = 0
        while index < len(lines):
            mark = MARK.match(lines[index].strip())
            index += 1
            if not mark or mark.group(1) != session:
                continue
            assert lines[index].strip() == "```console", f"{page}:{index + 1}: not a console block"
            index += 1
            while lines[index].strip() != "```":
                text = lines[index]
                if text.startswith("$ "):
                    found.append(Command(page.name, index + 1, text[2:]))
                else:
                    assert found, f"{page}:{index + 1}: output before any command"
                    found[-1].expected.append(text)
                index += 1
    return found


def normalise(line: str) -> str:
    line = line.rstrip()
    for pattern, placeholder in VOLATILE:
        line = pattern.sub(placeholder, line)
    return line


def _line_matches(expected: str, actual: str) -> bool:
    parts = [re.escape(part) for part in normalise(expected).split("…")]
    return re.fullmatch(".*".join(parts), normalise(actual)) is not None


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` fits ``expected``, where a line ``…`` stands for any lines."""
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    if head.strip() == "…":
        return any(matches(rest, actual[skip:]) for skip in range(len(actual) + 1))
    return bool(actual) and _line_matches(head, actual[0]) and matches(rest, actual[1:])


def differences(cmds: list[Command], outputs: list[list[str]]) -> list[str]:
    """Each command whose output does not fit the page, with both: what a test reports."""
    return [
        f"{c.page}:{c.line}: $ {c.text}\n  docs:\n    " + "\n    ".join(c.expected)
        + "\n  now:\n    " + "\n    ".join(output)
        for c, output in zip(cmds, outputs, strict=True)
        if not matches(c.expected, output)
    ]


def run(cmds: list[Command], directory: Path, env: dict[str, str],
        timeout: float = 1200) -> list[list[str]]:
    """Run every command in one bash, in ``directory``; what each printed (stdout + stderr)."""
    # As root, `llmgw lab up` enrols the nodes with node add as the llmgw account, which
    # reaches its agents' sockets through the directories above the lab (pytest's are
    # 0700): open them for traversal, as /opt is on a real node.
    for above in [directory, *directory.parents]:
        if above == Path(tempfile.gettempdir()):
            break
        above.chmod(above.stat().st_mode | 0o011)
    script = []
    for number, command in enumerate(cmds):
        # Keep the previous command's status for `echo $?` across the separator.
        script.append(f"__rc=$?; echo {SEPARATOR.format(number)}; (exit $__rc)")
        script.append(command.text)
    script.append(f"echo {SEPARATOR.format(len(cmds))}")
    # Its own network namespace: the pages show the default ports, which another
    # program on this machine may hold (support/netns.py).
    done = subprocess.run(netns.isolated(["bash", "-c", "\n".join(script)]), cwd=directory,
                          env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    outputs: list[list[str]] = []
    text = done.stdout
    for number in range(len(cmds)):
        start = text.index(SEPARATOR.format(number)) + len(SEPARATOR.format(number)) + 1
        end = text.index(SEPARATOR.format(number + 1))
        outputs.append(text[start:end].splitlines())
    return outputs


def build_wheels() -> None:
    """The wheels ``llmgw lab up``'s node adds ship (the checkout's ``.cache/wheels``), built
    here, before the session: it runs in a network namespace, where pip reaches no index."""
    try:
        enrolments.build_wheels(ROOT / ".cache" / "wheels")
    except enrolments.EnrolError as exc:
        pytest.skip(f"cannot build the wheels node add ships (no package index here?): {exc}")


def environment(extra_path: list[Path]) -> dict[str, str]:
    # The test run's identity stays: the leak check finds what the session leaves by it.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST", "LLMGW")) or k in ("LLMGW_TEST_RUN", "LLMGW_STATE_DIR")}
    env["PATH"] = os.pathsep.join([*map(str, extra_path), env.get("PATH", "")])
    env["GIT_AUTHOR_NAME"] = env["GIT_COMMITTER_NAME"] = "Docs"
    env["GIT_AUTHOR_EMAIL"] = env["GIT_COMMITTER_EMAIL"] = "docs@example.com"
    env["COLUMNS"] = "100"
    return env


LAB_PAGES = [ROOT / "docs" / name for name in ("quickstart.md", "gitops.md", "operations.md")]


if __name__ == "__main__":  # pragma: no cover - a tool for refreshing transcripts
    session, where = sys.argv[1], Path(sys.argv[2])
    cmds = commands(LAB_PAGES, session)
    env = environment([Path(sys.executable).parent])
    for command, output in zip(cmds, run(cmds, where, env), strict=True):
        flag = "" if matches(command.expected, output) else "   <<< DIFFERS"
        print(f"--- {command.page}:{command.line}{flag}\n$ {command.text}")
        print("\n".join(output))
