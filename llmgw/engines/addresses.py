"""Host and port joined the way each rendezvous string expects.

``10.0.0.1:18001``, but ``[fd00::1]:18001``: ``--dist-init-addr``,
``RAY_ADDRESS`` and ``ray start --address`` split host from port at the last
colon only when the host is bracketed, so a bare IPv6 address is misread.
"""

from __future__ import annotations

import ipaddress


def host_port(host: str, port: int | None) -> str:
    """``host:port``, with an IPv6 literal in brackets."""
    bare = host.strip("[]")
    try:
        literal = ipaddress.ip_address(bare)
    except ValueError:
        return f"{host}:{port}"
    return f"[{bare}]:{port}" if literal.version == 6 else f"{bare}:{port}"
