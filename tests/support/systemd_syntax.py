"""systemd's unit-file and env-file syntax, written from its documentation and source,
independently of llmgw's own reader (``llmgw/agent/unitfiles.py``).

Tests render units and read them back through this module, so a rendering bug
and a matching reader bug cannot hide each other. The rules, from
systemd.syntax(7), systemd.service(5), systemd.exec(5) and systemd's
``read_line_full``, ``config_parse``, ``extract_first_word``, ``cunescape_one``
and ``parse_env_file_internal``:

* a line ends at LF, CR, CRLF or NUL; leading and trailing whitespace
  (space, tab, LF, CR) is dropped;
* a line whose last character is a backslash continues on the next one (the
  backslash becomes a space); comment lines inside a continuation are skipped;
* ``#`` and ``;`` start a comment line; ``[Name]`` starts a section;
  ``Key=value`` assigns, both sides stripped;
* ``ExecStart=`` and ``Environment=`` expand specifiers first (``%%`` is a
  ``%``; any other specifier is reported, since llmgw never writes one), then
  split into words: double and single quotes group, backslash escapes are C
  escapes in and out of quotes;
* in ``ExecStart=`` words, ``$$`` is a ``$`` at run time, and a ``$`` that is
  not doubled is a variable reference: reported, but for ``${LLMGW_WEIGHTS}``
  (the agent's weights path), which is kept as written;
* env files: ``KEY=value`` where a double-quoted value escapes only
  backslash, double quote, ``$`` and backquote and may span lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WHITESPACE = " \t\n\r"
WEIGHTS = "${LLMGW_WEIGHTS}"  # set by the agent to the fetched weights' path
_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
              "\\": "\\", '"': '"', "'": "'", "s": " "}


class SyntaxProblem(AssertionError):
    """The text is not what systemd would accept, or uses something llmgw never writes."""


@dataclass
class Unit:
    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def keys(self) -> list[tuple[str, str]]:
        return [(name, key) for name, pairs in self.sections.items() for key, _ in pairs]

    def values(self, section: str, key: str) -> list[str]:
        return [v for k, v in self.sections.get(section, []) if k == key]


def physical_lines(text: str) -> list[str]:
    lines, current, i = [], [], 0
    while i < len(text):
        char = text[i]
        if char in "\n\r\x00":
            lines.append("".join(current))
            current = []
            if char == "\r" and text[i + 1:i + 2] == "\n":
                i += 1
        else:
            current.append(char)
        i += 1
    if current:
        lines.append("".join(current))
    return lines


def parse_unit(text: str) -> Unit:
    unit = Unit()
    section: str | None = None
    continued: str | None = None
    for raw in physical_lines(text):
        line = raw.strip(WHITESPACE)
        if continued is not None and line[:1] in ("#", ";"):
            continue  # a comment inside a continuation is skipped
        if continued is None and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            continued = (continued or "") + line[:-1] + " "
            continue
        if continued is not None:
            line, continued = continued + line, None
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            unit.sections.setdefault(section, [])
            continue
        key, sep, value = line.partition("=")
        if not sep or section is None:
            raise SyntaxProblem(f"not an assignment inside a section: {line!r}")
        unit.sections[section].append((key.strip(WHITESPACE), value.strip(WHITESPACE)))
    if continued is not None:
        raise SyntaxProblem("the file ends inside a continuation")
    return unit


def expand_specifiers(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        if value[i] == "%":
            if value[i + 1:i + 2] != "%":
                raise SyntaxProblem(f"specifier %{value[i + 1:i + 2]} in {value!r}")
            out.append("%")
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _escape(value: str, i: int) -> tuple[str, int]:
    """The C escape whose letter is at ``value[i]``; systemd refuses unknown ones and NUL."""
    char = value[i] if i < len(value) else ""
    if char in _C_ESCAPES:
        return _C_ESCAPES[char], i + 1
    widths = {"x": 2, "u": 4, "U": 8}
    if char in widths:
        digits = value[i + 1:i + 1 + widths[char]]
        if len(digits) != widths[char] or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise SyntaxProblem(f"bad \\{char} escape in {value!r}")
        code, end = int(digits, 16), i + 1 + widths[char]
    elif char and char in "01234567":
        digits = value[i:i + 3]
        if len(digits) != 3 or any(d not in "01234567" for d in digits):
            raise SyntaxProblem(f"bad octal escape in {value!r}")
        code, end = int(digits, 8), i + 3
    else:
        raise SyntaxProblem(f"unknown escape \\{char} in {value!r}")
    if code == 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        raise SyntaxProblem(f"escape of an impossible character in {value!r}")
    return chr(code), end


LITERAL_SEMICOLON = "\0;"  # a `\;` word on a command line: a literal ";" argument


def split_words(value: str, command_line: bool = False) -> list[str]:
    """``extract_first_word`` with EXTRACT_UNQUOTE | EXTRACT_CUNESCAPE, over a whole value.

    On a command line a word written ``\\;`` is a literal semicolon (``config_parse_exec``
    checks for it before unquoting); it comes back as :data:`LITERAL_SEMICOLON`.
    """
    words: list[str] = []
    i = 0
    while True:
        while i < len(value) and value[i] in WHITESPACE:
            i += 1
        if i >= len(value):
            return words
        if command_line and value[i:i + 2] == "\\;" and value[i + 2:i + 3] in ("", *WHITESPACE):
            words.append(LITERAL_SEMICOLON)
            i += 2
            continue
        word: list[str] = []
        quote = ""
        while i < len(value):
            char = value[i]
            if char == "\\":
                text, i = _escape(value, i + 1)
                word.append(text)
            elif quote:
                if char == quote:
                    quote = ""
                else:
                    word.append(char)
                i += 1
            elif char in "\"'":
                quote = char
                i += 1
            elif char in WHITESPACE:
                break
            else:
                word.append(char)
                i += 1
        if quote:
            raise SyntaxProblem(f"unbalanced quote in {value!r}")
        words.append("".join(word))


def exec_argv(value: str) -> list[str]:
    """``ExecStart=`` as the argv the process receives (no variables set by llmgw's units)."""
    if value[:1] in "-@:+!|":
        raise SyntaxProblem(f"ExecStart= prefix in {value!r}")
    argv = []
    for word in split_words(expand_specifiers(value), command_line=True):
        if word == ";":
            raise SyntaxProblem(f"a second command on one line: {value!r}")
        if word == LITERAL_SEMICOLON:
            argv.append(";")
            continue
        out, i = [], 0
        while i < len(word):
            if word.startswith(WEIGHTS, i):
                out.append(WEIGHTS)  # the one variable llmgw writes: kept as written
                i += len(WEIGHTS)
            elif word[i] == "$":
                if word[i + 1:i + 2] != "$":
                    raise SyntaxProblem(f"variable reference in {word!r}")
                out.append("$")
                i += 2
            else:
                out.append(word[i])
                i += 1
        argv.append("".join(out))
    return argv


def environment(values: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in values:
        for word in split_words(expand_specifiers(value)):
            name, sep, text = word.partition("=")
            if not sep or not name:
                raise SyntaxProblem(f"not an assignment: {word!r}")
            env[name] = text
    return env


def parse_env_file(text: str) -> dict[str, str]:
    """``parse_env_file_internal``, state by state."""
    env: dict[str, str] = {}
    state, key, value, trailing = "PRE_KEY", "", "", 0
    for char in text + "\n":
        newline = char in "\n\r"
        if state == "PRE_KEY":
            if char in "#;":
                state = "COMMENT"
            elif char not in WHITESPACE:
                state, key = "KEY", char
        elif state == "COMMENT":
            if newline:
                state = "PRE_KEY"
        elif state == "KEY":
            if newline:
                state = "PRE_KEY"
            elif char == "=":
                state, value = "PRE_VALUE", ""
            else:
                key += char
        elif state == "PRE_VALUE" or state == "VALUE":
            if newline:
                env[key.strip(WHITESPACE)] = value[:len(value) - trailing] if trailing else value
                state, trailing = "PRE_KEY", 0
            elif char == "'":
                state, trailing = "SINGLE", 0
            elif char == '"':
                state, trailing = "DOUBLE", 0
            elif char == "\\":
                state, trailing = "VALUE_ESCAPE", 0
            elif state == "VALUE" or char not in WHITESPACE:
                value += char
                trailing = trailing + 1 if char in WHITESPACE else 0
                state = "VALUE"
        elif state == "VALUE_ESCAPE":
            state = "VALUE"
            if not newline:
                value += char
        elif state == "SINGLE":
            if char == "'":
                state = "PRE_VALUE"
            else:
                value += char
        elif state == "DOUBLE":
            if char == '"':
                state = "PRE_VALUE"
            elif char == "\\":
                state = "DOUBLE_ESCAPE"
            else:
                value += char
        elif state == "DOUBLE_ESCAPE":
            state = "DOUBLE"
            if char in '"\\`$':
                value += char
            elif char != "\n":
                value += "\\" + char
    return env
