"""Listening sockets and their holders, parsed from real /proc output (tests/fixtures/proc)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.discovery import limits, sockets

PROC = Path(__file__).resolve().parents[1] / "fixtures" / "proc"


def recorded(name: str) -> str:
    return (PROC / name).read_text()


def test_only_listeners_are_read_from_the_ipv4_table() -> None:
    assert sockets.parse(recorded("net-tcp.txt")) == [
        sockets.Listener("0100007F", 18000, 0, 17949),
    ]


def test_ipv6_listeners_keep_their_address_and_inode() -> None:
    found = sockets.parse(recorded("net-tcp6.txt"))
    assert [(s.port, s.inode) for s in found] == [(18002, 17953), (18001, 17950)]
    assert found[0].address == "00000000000000000000000001000000"  # ::1


@pytest.mark.parametrize(("port", "inodes"), [
    pytest.param(18000, [17949], id="ipv4"),
    pytest.param(18001, [17950], id="ipv6-any"),
    pytest.param(18003, [], id="udp-is-not-tcp"),
    pytest.param(0x8552, [], id="a-connection-is-not-a-listener"),
])
def test_listeners_on_a_port_from_both_tables(port: int, inodes: list[int]) -> None:
    tables = [recorded("net-tcp.txt"), recorded("net-tcp6.txt")]
    assert [s.inode for s in sockets.on_port(tables, port)] == inodes


def test_socket_links_name_their_inodes_and_nothing_else_does() -> None:
    links = [line.split(" -> ", 1)[1] for line in recorded("fd-links.txt").splitlines()]
    assert [i for i in map(sockets.socket_inode, links) if i is not None] == [
        17949, 17950, 17951, 17952, 17953, 17954,
    ]


@pytest.mark.parametrize(("table", "ports"), [
    pytest.param("", set(), id="empty"),
    pytest.param("  sl  local_address rem_address   st\n", set(), id="header-only"),
    pytest.param("  0: 0100007F:ZZZZ 00000000:0000 0A 0 0 0 0 0 1", set(), id="garbled-port"),
    pytest.param("  0: 0100007F:4650 00000000:0000 0A 0 0 0 x 0 zz", set(), id="garbled-inode"),
    pytest.param("  0: 0100007F:4650 00000000:0000 0A", set(), id="cut-short"),
])
def test_garbled_rows_are_skipped(table: str, ports: set[int]) -> None:
    assert {s.port for s in sockets.parse(table)} == ports


def test_the_doctors_ports_are_the_same_listeners() -> None:
    assert limits.parse_listening(recorded("net-tcp6.txt")) == {18001, 18002}


@pytest.mark.parametrize(("cmdline", "said"), [
    pytest.param(b"/usr/bin/python3\0-m\0http.server\x0018000\0", "pid 7539 (python3 -m "
                 "http.server 18000)", id="program-by-its-base-name"),
    pytest.param(b"", "pid 7539", id="a-kernel-thread-or-gone"),
    pytest.param(None, "pid 7539", id="unreadable"),
    pytest.param(b"python3\0-c\0import x\nprint(1)\0", "pid 7539 (python3 -c import x print(1))",
                 id="newlines-folded"),
    pytest.param(b"llama-server\0" + b"--flag\0" * 20, "pid 7539 (llama-server --flag --flag "
                 "--flag --flag --flag --flag --fl…)", id="long-lines-cut"),
])
def test_a_holder_in_words(cmdline: bytes | None, said: str) -> None:
    assert sockets.holder(7539, cmdline) == said
