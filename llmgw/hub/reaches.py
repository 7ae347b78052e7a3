"""Where a fetch may connect: the address that was checked is the address dialled.

A URL source names a host; :mod:`llmgw.spec.hosts` says which addresses are
public. Checking the name and then letting the HTTP client resolve it again
would leave a gap (DNS rebinding: the first answer public, the second
127.0.0.1). So :meth:`Reach.dial` resolves once, refuses the host when any of
its addresses is not public, and returns the address the connection then
dials; the connection keeps the name for its ``Host`` header and for TLS
(SNI and the certificate check), so nothing else changes. Every redirect hop
goes through it again.

Hosts the site lists (``cluster.weights.allowed_hosts``) and the configured
mirror's host may have any address.

>>> Reach.of(["mirror.lab"], "http://10.0.0.9:8090").allowed
('10.0.0.9', 'mirror.lab')
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from llmgw.spec import hosts

Resolve = Callable[[str, int], list[str]]


class Refused(Exception):
    """A host a fetch may not reach; the message says why and what would allow it."""


def _resolve(host: str, port: int) -> list[str]:
    # Looked up at call time, so tests that give the process a resolver reach this one.
    answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in answers]


@dataclass(frozen=True)
class Reach:
    """The hosts a fetch may reach beyond public addresses (canonical forms, sorted)."""

    allowed: tuple[str, ...] = ()

    @classmethod
    def of(cls, allowed_hosts: Iterable[str], endpoint: str | None) -> Reach:
        names = {hosts.canonical(h) for h in allowed_hosts}
        mirror = urlsplit(endpoint).hostname if endpoint else None
        if mirror:
            names.add(hosts.canonical(mirror))
        return cls(tuple(sorted(names)))

    def refusal(self, host: str) -> str | None:
        """Why ``host`` as written may not be reached (no DNS asked); None if it may be."""
        if hosts.listed(host, self.allowed):
            return None
        why = hosts.literal_refusal(host)
        return None if why is None else self._advice(host, why)

    def dial(self, host: str, port: int, resolve: Resolve | None = None) -> list[str]:
        """The addresses to try, in order, for ``host``: resolved once and checked; or
        Refused (when any of them is not public: a name is refused whole)."""
        why = self.refusal(host)
        if why is not None:
            raise Refused(why)
        try:
            found = (resolve or _resolve)(host, port)
        except OSError as exc:
            raise OSError(f"cannot resolve {host}: {exc.strerror or exc}") from None
        if not found:
            raise OSError(f"cannot resolve {host}: no address")
        if not hosts.listed(host, self.allowed):
            for item in found:
                bad = hosts.kind(hosts.address(item))
                if bad is not None:
                    raise Refused(self._advice(host, f"{host} resolves to {item}, {bad}"))
        return list(dict.fromkeys(found))

    def connection(self, url: str, timeout: float,
                   resolve: Resolve | None = None) -> http.client.HTTPConnection:
        """An unopened connection for ``url`` that will dial the checked address."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Refused(f"{url}: only http and https URLs are fetched")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        dialled = self.dial(parts.hostname, port, resolve)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else \
            http.client.HTTPConnection
        connection = kind(parts.hostname, parts.port, timeout=timeout)

        def create(address: tuple[str, int], timeout: float | None = None,
                   source: tuple[str, int] | None = None) -> socket.socket:
            # As socket.create_connection tries each address of a name, but only
            # those checked: each is a literal, so nothing is resolved again.
            failure: OSError | None = None
            for item in dialled:
                try:
                    return socket.create_connection((item, address[1]), timeout, source)
                except OSError as exc:
                    failure = exc
            assert failure is not None
            raise failure

        connection._create_connection = create  # type: ignore[attr-defined]
        return connection

    @staticmethod
    def _advice(host: str, why: str) -> str:
        return (f"{why}: weights are fetched from public addresses only; list "
                f"{hosts.canonical(host)} under cluster.weights.allowed_hosts if the site "
                "means it")
