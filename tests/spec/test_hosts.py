"""Which hosts a weights URL may name: every spelling of an address (llmgw.spec.hosts)."""

from __future__ import annotations

import socket

import pytest

from llmgw.spec import hosts


@pytest.mark.parametrize(("host", "canonical", "why"), [
    ("127.0.0.1", "127.0.0.1", "127.0.0.1 is a loopback address"),
    ("169.254.169.254", "169.254.169.254", "169.254.169.254 is the cloud metadata address"),
    ("[::1]", "::1", "::1 is a loopback address"),
    ("[::ffff:127.0.0.1]", "127.0.0.1", "::ffff:127.0.0.1 (that is 127.0.0.1) is a loopback"),
    ("[::ffff:a9fe:a9fe]", "169.254.169.254", "the cloud metadata address"),
    ("2130706433", "127.0.0.1", "2130706433 (that is 127.0.0.1) is a loopback address"),
    ("0x7f000001", "127.0.0.1", "loopback"),
    ("0x7f.1", "127.0.0.1", "0x7f.1 (that is 127.0.0.1) is a loopback address"),
    ("0177.0.0.1", "127.0.0.1", "0177.0.0.1 (that is 127.0.0.1) is a loopback address"),
    ("017700000001", "127.0.0.1", "loopback"),
    ("127.1", "127.0.0.1", "127.1 (that is 127.0.0.1) is a loopback address"),
    ("0", "0.0.0.0", "the unspecified address"),
    ("localhost", "localhost", "localhost is this machine (loopback)"),
    ("LocalHost.", "localhost", "is this machine (loopback)"),
    ("x.localhost", "x.localhost", "is this machine (loopback)"),
    ("10.1.2.3", "10.1.2.3", "10.1.2.3 is a private address"),
    ("192.168.0.9", "192.168.0.9", "a private address"),
    ("[fd00::1]", "fd00::1", "a private address"),
    ("[fe80::1]", "fe80::1", "a link-local address"),
    ("100.64.0.1", "100.64.0.1", "a shared (carrier-grade NAT) address"),
    ("224.0.0.251", "224.0.0.251", "a multicast address"),
    ("[ff02::1]", "ff02::1", "a multicast address"),
    ("240.0.0.1", "240.0.0.1", "a reserved address"),
    ("[2002:7f00:1::]", "2002:7f00:1::", "(that is 127.0.0.1) is a loopback"),
    ("[64:ff9b::a9fe:a9fe]", "64:ff9b::a9fe:a9fe", "(that is 169.254.169.254) is the cloud"),
    # Public, or only known once resolved (the fetch checks the answer).
    ("8.8.8.8", "8.8.8.8", None),
    ("[2606:4700::1111]", "2606:4700::1111", None),
    ("huggingface.co", "huggingface.co", None),
    ("Files.Lab.", "files.lab", None),
    ("1.2.3.4.5", "1.2.3.4.5", None),
    ("08.0.0.1", "08.0.0.1", None),  # not octal, so a name, as inet_aton says
])
def test_every_spelling_of_an_address(host: str, canonical: str, why: str | None) -> None:
    assert hosts.canonical(host) == canonical
    found = hosts.literal_refusal(host)
    if why is None:
        assert found is None
    else:
        assert found is not None and why in found


@pytest.mark.parametrize("text", [
    "2130706433", "0x7f.1", "0177.0.0.1", "127.1", "0x7f000001", "1.2.3", "10.257", "0",
    "0300.0250.0.1", "1.0x10.3.4",
])
def test_addresses_read_as_the_resolver_reads_them(text: str) -> None:
    assert str(hosts.address(text)) == socket.inet_ntoa(socket.inet_aton(text))


@pytest.mark.parametrize(("host", "allowed", "listed"), [
    ("files.lab", ["FILES.lab."], True),
    ("012.0.0.7", ["10.0.0.7"], True),
    ("[::ffff:10.0.0.7]", ["10.0.0.7"], True),
    ("2130706433", ["127.0.0.1"], True),
    ("files.lab", ["lab"], False),
    ("evil-files.lab", ["files.lab"], False),
])
def test_listed_compares_canonical_forms(host: str, allowed: list[str], listed: bool) -> None:
    assert hosts.listed(host, allowed) is listed


@pytest.mark.parametrize(("entry", "ok"), [
    ("files.lab", True), ("10.0.0.7", True), ("[::1]", True), ("::1", True),
    ("http://files.lab", False), ("files.lab:8080", False), ("files.lab/x", False),
    ("a b", False), ("", False), ("-x.lab", False),
])
def test_allowed_host_entries(entry: str, ok: bool) -> None:
    if ok:
        assert hosts.check_entry(entry) == entry
    else:
        with pytest.raises(ValueError, match="no scheme, port or path"):
            hosts.check_entry(entry)
