"""systemd's quoting rules, for ExecStart=, Environment=, env files and labels.

From systemd.service(5) "Command lines", systemd.exec(5) and
systemd.syntax(7) (systemd 252). A unit file's line ends at LF, CR, CRLF or
NUL, so no value may carry one raw:

* ``ExecStart=``: a ``%`` starts a specifier and ``$`` a variable, so both are
  doubled — but for ``${LLMGW_WEIGHTS}``, the one variable llmgw means (the
  agent sets it to the fetched weights' path); a word with any other special
  character is double-quoted, with C-style escapes (``\\n``, ``\\r``,
  ``\\xNN``, ``\\uNNNN``) for every control character, DEL, the C1 controls
  and the Unicode line and paragraph separators; a lone ``;`` separates
  commands and is escaped.
* ``Environment=``: specifiers are expanded (``%`` doubled), variables are
  not; the assignment is double-quoted with the same C escapes.
* Env files (``EnvironmentFile=``) follow shell-like double-quote rules:
  ``\\``, ``"``, ``$`` and backquote are escaped; any other character,
  newline and carriage return included, stands for itself inside the quotes
  (systemd keeps a quoted value that spans lines whole).
* ``X-Llmgw-*`` labels and comments are never free text (identifiers,
  numbers, ASCII JSON): :func:`label` refuses anything else.

NUL can be neither escaped nor passed to a process: every function here
raises ValueError on it (``llmgw validate`` refuses it first).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

_PLAIN_WORD = re.compile(r"[A-Za-z0-9_@+=:,./%${}-]+")
WEIGHTS = "${LLMGW_WEIGHTS}"
_ESCAPED_WEIGHTS = "$" + WEIGHTS
_NAMED = {"\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f",
          "\r": "\\r", "\\": "\\\\", '"': '\\"'}
# Characters that must not appear raw between quotes on a unit line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\\\"]")
_LABEL = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError(f"{text[:40]!r}...: a NUL character cannot reach a unit")
    return text


def c_escape(text: str) -> str:
    """``text`` with C escapes for backslash, double quote and every control character."""
    def one(match: re.Match[str]) -> str:
        char = match.group(0)
        if char in _NAMED:
            return _NAMED[char]
        code = ord(char)
        return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"
    return _CONTROL.sub(one, _no_nul(text))


def exec_word(word: str) -> str:
    """One argv element as it must appear on an ``ExecStart=`` line."""
    if word == ";":
        return "\\;"
    # The one variable llmgw means: the agent sets it to the fetched weights' path.
    text = (_no_nul(word).replace("%", "%%").replace("$", "$$")
            .replace(_ESCAPED_WEIGHTS, WEIGHTS))
    if _PLAIN_WORD.fullmatch(text):
        return text
    return f'"{c_escape(text)}"'


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
    return f'"{c_escape(assignment.replace("%", "%%"))}"'


def env_file_value(value: str) -> str:
    """A value quoted for an ``EnvironmentFile=`` line."""
    text = (
        _no_nul(value).replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
        .replace("`", "\\`")
    )
    return f'"{text}"'


def label(value: object) -> str:
    """A value for an ``X-Llmgw-*`` label, a ``Description=`` or a comment: printable
    ASCII on one line, no surrounding spaces, no trailing backslash; anything else is
    refused, never escaped — these hold identifiers, numbers and ASCII JSON only."""
    text = str(value)
    if not _LABEL.fullmatch(text) or text.endswith("\\"):
        raise ValueError(f"{text[:60]!r} cannot be a unit label: identifiers only")
    return text
