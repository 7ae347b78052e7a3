"""Rendezvous addresses: host and port joined so each engine splits them back right.

Table tests with exact strings: an IPv6 literal is bracketed (once, whether or
not it came bracketed), an IPv4 literal never is, and a hostname is left as
written.
"""

from __future__ import annotations

import pytest

from llmgw.engines.addresses import host_port


@pytest.mark.parametrize(("host", "port", "expected"), [
    ("10.0.0.1", 18001, "10.0.0.1:18001"),
    ("127.0.0.1", 1, "127.0.0.1:1"),
    ("fd00::1", 18001, "[fd00::1]:18001"),
    ("::1", 29500, "[::1]:29500"),
    ("[fd00::1]", 18001, "[fd00::1]:18001"),
    ("[::ffff:10.0.0.1]", 6379, "[::ffff:10.0.0.1]:6379"),
    ("[10.0.0.1]", 8000, "10.0.0.1:8000"),
    ("node-a.lan", 8000, "node-a.lan:8000"),
    ("[node-a]", 8000, "[node-a]:8000"),
    ("gpu01", None, "gpu01:None"),
    # Only brackets come off: a name that merely wraps an address stays whole.
    ("X10.0.0.1", 80, "X10.0.0.1:80"),
    ("10.0.0.1X", 80, "10.0.0.1X:80"),
])
def test_host_port_brackets_ipv6_only(host: str, port: int | None, expected: str) -> None:
    assert host_port(host, port) == expected
