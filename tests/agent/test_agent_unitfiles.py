"""Rendered units read back the way systemd reads them (the supervise backend runs them)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import systemd_syntax

from llmgw.agent import unitfiles
from llmgw.agent.unitfiles import UnitFileError

UNIT = """# llmgw-m-r0-s0.service: written by llmgw
[Unit]
Description=llmgw m replica 0
X-Llmgw-Model=m
X-Llmgw-Replica=0
X-Llmgw-Rank=1
X-Llmgw-Digest=abc123
X-Llmgw-Port=18000
X-Llmgw-Spec={"args": {"max-model-len": 8192}}

[Service]
Type=exec
ExecStart=/opt/vllm/bin/vllm serve /models/m \\
    --served-model-name m --port 18000
Environment="CUDA_VISIBLE_DEVICES=GPU-1,GPU-2" NCCL_IB_HCA==mlx5_0
Environment=OMP_NUM_THREADS=8
EnvironmentFile=-/etc/llmgw/env/llmgw-m-r0-s1.service.env
EnvironmentFile=/etc/llmgw/extra.env
TimeoutStopSec=1min 30s
"""


def test_sections_labels_and_continuations() -> None:
    unit = unitfiles.parse("llmgw-m-r0-s1.service", UNIT)
    labels = unitfiles.labels(unit)
    assert (labels.model, labels.replica, labels.rank, labels.digest, labels.port) == (
        "m", 0, 1, "abc123", 18000
    )
    assert labels.raw["X-Llmgw-Spec"] == '{"args": {"max-model-len": 8192}}'
    assert unitfiles.split_command(unit.value("Service", "ExecStart") or "") == [
        "/opt/vllm/bin/vllm", "serve", "/models/m", "--served-model-name", "m", "--port", "18000"
    ]
    assert unitfiles.environment(unit) == {
        "CUDA_VISIBLE_DEVICES": "GPU-1,GPU-2", "NCCL_IB_HCA": "=mlx5_0", "OMP_NUM_THREADS": "8"
    }
    assert unitfiles.environment_files(unit) == [
        ("/etc/llmgw/env/llmgw-m-r0-s1.service.env", True), ("/etc/llmgw/extra.env", False)
    ]
    assert unitfiles.parse_timespan(unit.value("Service", "TimeoutStopSec") or "") == 90.0


@pytest.mark.parametrize(
    ("value", "env", "argv"),
    [
        ("/bin/e --tp ${TP} $EXTRA", {"TP": "8", "EXTRA": "--a  --b"},
         ["/bin/e", "--tp", "8", "--a", "--b"]),
        # systemd splits a word that is exactly $VAR, quoted or not; ${VAR} stays one word.
        ("/bin/e \"$EXTRA\" \"${EXTRA}\"", {"EXTRA": "one two"},
         ["/bin/e", "one", "two", "one two"]),
        ("/bin/e --x=${A}${B}", {"A": "1"}, ["/bin/e", "--x=1"]),
        ("/bin/e $$HOME 100%%", {"HOME": "/root"}, ["/bin/e", "$HOME", "100%"]),
        ("-/bin/e %n", {}, ["/bin/e", "u.service"]),
        ("/bin/e 'single $A' \"dq \\\"x\\\"\"", {"A": "a"}, ["/bin/e", "single $A", 'dq "x"']),
        ("/bin/e $MISSING end", {}, ["/bin/e", "end"]),
    ],
)
def test_execstart_expansion(value: str, env: dict[str, str], argv: list[str]) -> None:
    assert unitfiles.expand(value, env, "u.service") == argv


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("Key=value\n", ":1: expected Key=value inside a section"),
        ("[Unit\n", ":1: malformed section header"),
        ("[Unit]\nX-Llmgw-Replica=0\nX-Llmgw-Digest=d\n", "no X-Llmgw-Model="),
        ("[Unit]\nX-Llmgw-Model=m\nX-Llmgw-Digest=d\n", "no X-Llmgw-Replica="),
        ("[Unit]\nX-Llmgw-Model=m\nX-Llmgw-Replica=one\nX-Llmgw-Digest=d\n", "not a whole number"),
        ("[Unit]\nX-Llmgw-Model=m\nX-Llmgw-Replica=0\nX-Llmgw-Digest=d\nX-Llmgw-Port=70000\n",
         "is not a TCP port"),
    ],
)
def test_units_llmgw_cannot_use(text: str, error: str) -> None:
    with pytest.raises(UnitFileError, match=error):
        unitfiles.labels(unitfiles.parse("u.service", text))


def test_env_files_as_systemd_reads_them() -> None:
    text = (
        "# comment\n; also a comment\nPLAIN=value with spaces\nSQ='it''s'\n"
        'DQ="a \\"quoted\\" $word"\nMULTI="line one\nline two"\nEMPTY=\nnot an assignment\n'
    )
    assert unitfiles.parse_env_file(text) == {
        # Quotes are joined as in the shell: 'it''s' is "its".
        "PLAIN": "value with spaces", "SQ": "its", "DQ": 'a "quoted" $word',
        "MULTI": "line one\nline two", "EMPTY": "",
    }


def test_env_file_lines_end_only_where_systemd_ends_them() -> None:
    text = 'A="one\rtwo\u2028three"\r\nB=x\\\ny\nC=\'lit\\n\'\n'
    assert unitfiles.parse_env_file(text) == {"A": "one\rtwo\u2028three", "B": "xy",
                                              "C": "lit\\n"}


@given(st.dictionaries(
    st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True),
    # Any value a process can hold: control characters, CR, quotes, backslashes.
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
            max_size=30),
    max_size=5,
))
def test_rendered_env_files_read_back_unchanged(env: dict[str, str]) -> None:
    assert unitfiles.parse_env_file(unitfiles.render_env_file(env)) == env


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("30s", 30.0), ("5min", 300.0), ("1min 30s", 90.0), ("500ms", 0.5),
     ("1h", 3600.0), ("infinity", None)],
)
def test_timespans(text: str, seconds: float | None) -> None:
    assert unitfiles.parse_timespan(text) == seconds


def test_bad_timespan() -> None:
    with pytest.raises(UnitFileError, match="invalid time span 'soon'"):
        unitfiles.parse_timespan("soon")


@pytest.mark.parametrize(
    ("text", "argv"),
    [
        ("[Service]\nExecStart=/bin/a \\\n  b\n", ["/bin/a", "b"]),
        # A comment line inside a continuation is skipped, not joined.
        ("[Service]\nExecStart=/bin/a \\\n# not an argument\n  b\n", ["/bin/a", "b"]),
        # CR and CRLF end lines as LF does; U+2028 and form feed do not.
        ("[Service]\r\nExecStart=/bin/a\u2028b\x0cc\r", ["/bin/a\u2028b\x0cc"]),
        ("[Service]\rExecStart=/bin/a\rExecStart=/bin/b\n", ["/bin/b"]),
        ('[Service]\nExecStart=/bin/a "x\\ny\\t\\x1b\\u2028" \\; 100%% $$HOME\n',
         ["/bin/a", "x\ny\t\x1b\u2028", ";", "100%", "$HOME"]),
    ],
)
def test_the_agent_reads_units_as_systemd_does(text: str, argv: list[str]) -> None:
    """The agent's reader and the independent one in tests/support agree on systemd's rules."""
    mine = unitfiles.parse("u.service", text)
    assert unitfiles.expand(mine.value("Service", "ExecStart") or "", {}, "u.service") == argv
    theirs = systemd_syntax.parse_unit(text)
    assert systemd_syntax.exec_argv(theirs.values("Service", "ExecStart")[-1]) == argv
