"""systemd's quoting rules, for ExecStart=, Environment= and env files.

From systemd.service(5) "Command lines" and systemd.exec(5) (systemd 252):
in ``ExecStart=`` a ``%`` starts a specifier and ``$`` a variable, so both are
doubled; words with other special characters are double-quoted with C-style
escapes; a lone ``;`` separates commands and is escaped. ``Environment=``
expands specifiers but not variables. Env files (``EnvironmentFile=``) follow
shell-like double-quote rules: ``\\``, ``"``, ``$`` and backquote are escaped.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

_PLAIN_WORD = re.compile(r"[A-Za-z0-9_@+=:,./%${}-]+")
WEIGHTS = "${LLMGW_WEIGHTS}"
_ESCAPED_WEIGHTS = "$" + WEIGHTS


def exec_word(word: str) -> str:
    """One argv element as it must appear on an ``ExecStart=`` line."""
    if word == ";":
        return "\\;"
    # The one variable llmgw means: the agent sets it to the fetched weights' path.
    text = word.replace("%", "%%").replace("$", "$$").replace(_ESCAPED_WEIGHTS, WEIGHTS)
    if _PLAIN_WORD.fullmatch(text):
        return text
    escaped = (
        text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    )
    return f'"{escaped}"'


def exec_line(argv: Sequence[str]) -> str:
    """A whole command line for ``ExecStart=``."""
    return " ".join(exec_word(word) for word in argv)


def shell_script(steps: Sequence[Sequence[str]], final: Sequence[str]) -> list[str]:
    """argv running ``steps`` in order, then ``exec``-ing ``final``, all in one unit.

    The engine replaces the shell, so signals reach it directly and the unit's
    main process is the engine.
    """
    script = " && ".join([*(shlex.join(step) for step in steps), "exec " + shlex.join(final)])
    return ["/bin/sh", "-c", script]


def systemd_env(assignment: str) -> str:
    """``NAME=value`` quoted for an ``Environment=`` line."""
    text = assignment.replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def env_file_value(value: str) -> str:
    """A value quoted for an ``EnvironmentFile=`` line."""
    if "\n" in value:
        raise ValueError("an environment value cannot span lines")
    text = (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    )
    return f'"{text}"'
