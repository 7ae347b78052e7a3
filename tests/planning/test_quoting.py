"""systemd quoting, one exact string per rule of docs and systemd.syntax(7).

Each row is a word and the exact text it must become on a unit line; the
hostile-input property tests in test_hostile_units.py check round trips, these
check the spelling (which escape, which characters stay plain).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from llmgw.rendering import quoting


@pytest.mark.parametrize(("text", "expected"), [
    ("plain", "plain"),
    ("\a\b\t\n\v\f\r", "\\a\\b\\t\\n\\v\\f\\r"),
    ("back\\slash", "back\\\\slash"),
    ('say "hi"', 'say \\"hi\\"'),
    ("\x01", "\\x01"),
    ("\x1b[0m", "\\x1b[0m"),
    ("\x1f", "\\x1f"),
    ("\x7f", "\\x7f"),
    ("\x80", "\\u0080"),
    ("\x9f", "\\u009f"),
    ("\xa0é", "\xa0é"),
    ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),
    (" ~'$%;", " ~'$%;"),
])
def test_c_escape_spells_each_control_character(text: str, expected: str) -> None:
    assert quoting.c_escape(text) == expected


@pytest.mark.parametrize(("word", "expected"), [
    (";", "\\;"),
    (";;", '";;"'),
    ("a;b", '"a;b"'),
    ("--port=8000", "--port=8000"),
    ("a@b+c=d:e,f./g-h_9", "a@b+c=d:e,f./g-h_9"),
    ("100%", "100%%"),
    ("%n", "%%n"),
    ("$HOME", "$$HOME"),
    ("${OTHER}", "$${OTHER}"),
    ("${LLMGW_WEIGHTS}", "${LLMGW_WEIGHTS}"),
    ("${LLMGW_WEIGHTS}/model.gguf", "${LLMGW_WEIGHTS}/model.gguf"),
    ("--model=${LLMGW_WEIGHTS}", "--model=${LLMGW_WEIGHTS}"),
    ("", '""'),
    ("a b", '"a b"'),
    ("it's", '"it\'s"'),
    ("a*b", '"a*b"'),
    ("line\nbreak", '"line\\nbreak"'),
    ("tab\there", '"tab\\there"'),
    ("cr\r", '"cr\\r"'),
    ('q"uote', '"q\\"uote"'),
    ("50% of $x", '"50%% of $$x"'),
    ("sep\u2028", '"sep\\u2028"'),
])
def test_exec_word_doubles_specifiers_and_quotes_specials(word: str, expected: str) -> None:
    assert quoting.exec_word(word) == expected


def test_exec_line_joins_words_with_single_spaces() -> None:
    argv = ["llama-server", "--model", "${LLMGW_WEIGHTS}/m.gguf", "--alias", "a b", ";"]
    assert quoting.exec_line(argv) == (
        'llama-server --model ${LLMGW_WEIGHTS}/m.gguf --alias "a b" \\;')
    assert quoting.exec_line([]) == ""


@pytest.mark.parametrize(("steps", "final", "script"), [
    ([], ["llama-server", "--port", "8000"], "exec llama-server --port 8000"),
    ([["mkdir", "-p", "/a b"]], ["srv"], "mkdir -p '/a b' && exec srv"),
    ([["true"], ["echo", "x;y"]], ["srv", "it's"],
     "true && echo 'x;y' && exec srv 'it'\"'\"'s'"),
])
def test_shell_script_runs_steps_then_execs_final(
        steps: list[list[str]], final: list[str], script: str) -> None:
    assert quoting.shell_script(steps, final) == ["/bin/sh", "-c", script]


@pytest.mark.parametrize(("assignment", "expected"), [
    ("A=1", '"A=1"'),
    ("A=50%", '"A=50%%"'),
    ("A=$B", '"A=$B"'),
    ('A=x"y', '"A=x\\"y"'),
    ("A=a\nb", '"A=a\\nb"'),
    ("A=a\\b", '"A=a\\\\b"'),
])
def test_systemd_env_quotes_and_doubles_percent(assignment: str, expected: str) -> None:
    assert quoting.systemd_env(assignment) == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("plain", '"plain"'),
    ("a\\b", '"a\\\\b"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("$HOME", '"\\$HOME"'),
    ("`id`", '"\\`id\\`"'),
    ("a\nb\rc", '"a\nb\rc"'),
    ("50%", '"50%"'),
    ("\\$", '"\\\\\\$"'),
])
def test_env_file_value_escapes_shell_specials_only(value: str, expected: str) -> None:
    assert quoting.env_file_value(value) == expected


@pytest.mark.parametrize("value", ["abc", "a b", "!", "~", '{"a": [1, 2]}', "x-y_z.1"])
def test_label_accepts_printable_ascii(value: str) -> None:
    assert quoting.label(value) == value


def test_label_formats_non_strings() -> None:
    assert quoting.label(3) == "3"
    assert quoting.label(1.5) == "1.5"


@pytest.mark.parametrize("value", ["", " a", "a ", "a\\", "a\nb", "a\tb", "é", "\x7f", "a\x1fb"])
def test_label_refuses_anything_else(value: str) -> None:
    with pytest.raises(ValueError, match="cannot be a unit label: identifiers only"):
        quoting.label(value)


@pytest.mark.parametrize("call", [
    lambda: quoting.c_escape("a\x00b"),
    lambda: quoting.exec_word("a\x00b"),
    lambda: quoting.exec_line(["ok", "\x00"]),
    lambda: quoting.systemd_env("A=\x00"),
    lambda: quoting.env_file_value("\x00"),
])
def test_nul_is_refused_everywhere(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="a NUL character cannot reach a unit"):
        call()


def test_nul_error_echoes_at_most_40_characters() -> None:
    text = "a" * 50 + "\x00"
    with pytest.raises(ValueError) as refused:
        quoting.c_escape(text)
    assert str(refused.value) == f"{'a' * 40!r}...: a NUL character cannot reach a unit"


def test_label_error_echoes_at_most_60_characters() -> None:
    text = "é" * 70
    with pytest.raises(ValueError) as refused:
        quoting.label(text)
    assert str(refused.value) == f"{'é' * 60!r} cannot be a unit label: identifiers only"
