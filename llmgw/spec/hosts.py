"""Which hosts a weights URL may name: public addresses, or hosts the site lists.

Cluster files come from pull requests, and a URL source is fetched twice: the
control host asks its size (``plan``), and the node downloads it. Either
would carry a request to the cloud's metadata address or a service on
loopback. So a URL's host must be public unless ``cluster.weights.allowed_hosts``
lists it or it is the configured mirror (``cluster.weights.endpoint``).

An address has many spellings, and resolvers accept more than
:mod:`ipaddress` does: ``2130706433``, ``0x7f.1``, ``0177.0.0.1`` and ``127.1``
are all 127.0.0.1 to ``inet_aton``. :func:`address` reads every one of them,
and IPv6 forms that carry an IPv4 address (``::ffff:127.0.0.1``, 6to4,
Teredo, NAT64) are judged by the address they carry.

>>> literal_refusal("0x7f.1")
'0x7f.1 (that is 127.0.0.1) is a loopback address'

A purely computational module with no side effects: names are resolved at
fetch time (:mod:`llmgw.hub.reaches`), where the answer is checked again.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_METADATA = ipaddress.ip_address("169.254.169.254")
# One part of an inet_aton address: decimal, 0-prefixed octal or 0x hex.
_PART = re.compile(r"^(0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*)$")
_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
                   r"(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$")


def canonical(host: str) -> str:
    """``host`` as compared: lower case, no brackets, no trailing dot; an address in its
    standard form (``0x7f.1`` and ``::ffff:127.0.0.1`` → ``127.0.0.1``)."""
    text = host.strip().lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.rstrip(".") if text != "." else text
    found = address(text)
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        found = found.ipv4_mapped  # the same host: listing 10.0.0.5 covers ::ffff:10.0.0.5
    return str(found) if found is not None else text


def address(host: str) -> IPAddress | None:
    """The IP address ``host`` spells, in any form a resolver accepts; None for a name."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if ":" in text:
        try:
            return ipaddress.IPv6Address(text)
        except ValueError:
            return None
    return _inet_aton(text.rstrip("."))


def _inet_aton(text: str) -> ipaddress.IPv4Address | None:
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(_PART.match(p) for p in parts):
        return None
    try:
        values = [int(p, 16) if p[:2].lower() == "0x" and len(p) > 2 else
                  int(p, 8) if p.startswith("0") and len(p) > 1 else
                  0 if p.lower() == "0x" else int(p) for p in parts]
    except ValueError:
        return None
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):
        return None
    number = 0
    for value in head:
        number = number << 8 | value
    number = number << 8 * (5 - len(values)) | last
    return ipaddress.IPv4Address(number)


def carried(found: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo, NAT64), else itself."""
    if isinstance(found, ipaddress.IPv4Address):
        return found
    if found.ipv4_mapped is not None:
        return found.ipv4_mapped
    if found.sixtofour is not None:
        return found.sixtofour
    if found.teredo is not None:
        return found.teredo[1]
    if found in _NAT64:
        return ipaddress.IPv4Address(int(found) & 0xFFFFFFFF)
    return found


def refusal(found: IPAddress | None, written: str | None = None) -> str | None:
    """Why a fetch may not connect to ``found`` (spelt ``written``); None if it is public."""
    what = kind(found)
    if found is None or what is None:
        return None
    inner = carried(found)
    shown = written or str(found)
    if shown != str(inner):
        shown = f"{shown} (that is {inner})"
    return f"{shown} is {what}"


def kind(found: IPAddress | None) -> str | None:
    """What sort of address ``found`` is when it is not public (``a loopback address``)."""
    if found is None:
        return None
    inner = carried(found)
    if inner.is_loopback:
        return "a loopback address"
    if inner == _METADATA:
        return "the cloud metadata address"
    if inner.is_link_local:
        return "a link-local address"
    if inner.is_unspecified:
        return "the unspecified address"
    if inner.is_multicast:
        return "a multicast address"
    if isinstance(inner, ipaddress.IPv4Address) and inner in _SHARED:
        return "a shared (carrier-grade NAT) address"
    if inner.is_reserved:
        return "a reserved address"
    if inner.is_private:
        return "a private address"
    if not inner.is_global:
        return "a reserved address"
    return None


def literal_refusal(host: str) -> str | None:
    """Why ``host`` as written is never public (an address, or ``localhost``); else None."""
    name = canonical(host)
    if name == "localhost" or name.endswith(".localhost"):
        return f"{host} is this machine (loopback)"
    return refusal(address(host), host.strip("[]"))


def listed(host: str, allowed: Iterable[str]) -> bool:
    """Whether ``host`` is one of ``allowed`` (compared in :func:`canonical` form)."""
    name = canonical(host)
    return any(canonical(entry) == name for entry in allowed)


def check_entry(entry: str) -> str:
    """``entry`` of ``allowed_hosts`` if it is a host name or an IP address; else ValueError."""
    text = entry.strip()
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if address(bare) is not None or _NAME.match(bare.lower().rstrip(".")):
        return text
    raise ValueError(f"expected a host name or IP address such as mirror.lab or 10.0.0.5 "
                     f"(no scheme, port or path); got {entry!r}")
