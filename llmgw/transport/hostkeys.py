"""Pinned host keys: the cluster's ``known_hosts`` file, and why a key was refused.

The daemon logs in to every node with the fleet's key, so a node that answers
with a key nobody pinned must get nothing — not a login attempt, not a
report believed. asyncssh enforces the pin; this module reads the file once
per pool and writes the refusal an operator can act on: which node, the key
it offered (``SHA256:…`` exactly as ``ssh-keygen -l`` prints it), what is
pinned instead, and what to check.

Entries are looked up the OpenSSH way: ``host`` on port 22, ``[host]:port``
otherwise (``ssh-keyscan -p PORT HOST`` writes them like that).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import asyncssh

from llmgw.transport.failures import NodeUnreachable

_KEY_FILES = {
    "ssh-ed25519": "ssh_host_ed25519_key.pub",
    "ssh-rsa": "ssh_host_rsa_key.pub",
    "ecdsa-sha2-nistp256": "ssh_host_ecdsa_key.pub",
    "ecdsa-sha2-nistp384": "ssh_host_ecdsa_key.pub",
    "ecdsa-sha2-nistp521": "ssh_host_ecdsa_key.pub",
}


@dataclass(frozen=True)
class Pinned:
    """The known_hosts file of a cluster, read once; ``problem`` if it cannot be used."""

    path: Path
    known: asyncssh.SSHKnownHosts | None
    problem: str | None = None

    def keys_for(self, host: str, addr: str, port: int) -> list[asyncssh.SSHKey]:
        """Keys pinned for this host and port (deduplicated, in file order)."""
        if self.known is None:
            return []
        found = self.known.match(host, addr, port if port != 22 else None)[0]
        unique: dict[str, asyncssh.SSHKey] = {}
        for key in found:
            unique.setdefault(key.get_fingerprint("sha256"), key)
        return list(unique.values())


def load(path: Path) -> Pinned:
    """Read a known_hosts file; a missing or unreadable file is a ``problem``, not an error.

    Every node then reports the problem as its reason, which is what an
    operator needs to see (``llmgw inventory`` lists it per node).
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Pinned(path, None, f"the pinned host keys file {path} does not exist; create it "
                      "with the nodes' keys (ssh-keyscan -p PORT HOST >> known_hosts, after "
                      "checking each fingerprint on the node)")
    except OSError as exc:
        return Pinned(path, None, f"cannot read the pinned host keys file {path}: {exc.strerror}")
    return Pinned(path, asyncssh.import_known_hosts(text))


def entry(host: str, port: int) -> str:
    """How known_hosts names this host and port."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: asyncssh.SSHKey) -> str:
    """``ssh-ed25519 SHA256:…``: the algorithm and the fingerprint ssh-keygen -l shows."""
    return f"{key.get_algorithm()} {key.get_fingerprint('sha256')}"


def refusal(
    node: str,
    host: str,
    addr: str,
    port: int,
    pinned: Pinned,
    offered: asyncssh.SSHKey | None,
    *,
    revoked: bool = False,
) -> NodeUnreachable:
    """The failure for a node whose host key did not match the pin (or was never pinned)."""
    name = entry(host, port)
    where = f"{node} ({name})"
    if pinned.problem:
        return NodeUnreachable(node, "host key", f"{where}: {pinned.problem}")
    if revoked:
        return NodeUnreachable(
            node, "host key",
            f"{where} offered a key marked @revoked in {pinned.path}; the node must get new "
            "host keys, pinned after checking them on the node",
        )
    if offered is None:
        # asyncssh restricts the key types it accepts to the pinned ones; a node
        # that has none of them fails key exchange before offering anything.
        listed = ", ".join(fingerprint(k) for k in pinned.keys_for(host, addr, port))
        return NodeUnreachable(
            node, "host key",
            f"{where} offered no host key of the pinned type ({listed or 'none pinned'} in "
            f"{pinned.path}); the node's SSH keys were replaced or its sshd is configured "
            "differently — check on the node before changing the pin",
        )
    on_node = _KEY_FILES.get(offered.get_algorithm(), "ssh_host_*_key.pub")
    check = f"`ssh-keygen -lf /etc/ssh/{on_node}` on the node's console"
    keys = pinned.keys_for(host, addr, port)
    if not keys:
        return NodeUnreachable(
            node, "host key",
            f"{where} offered {fingerprint(offered)}, and no key is pinned for {name} in "
            f"{pinned.path}. Compare the fingerprint with {check}; if it matches, add it: "
            f"ssh-keyscan -p {port} {host} >> {pinned.path}",
        )
    pins = ", ".join(fingerprint(k) for k in keys)
    return NodeUnreachable(
        node, "host key",
        f"{where} offered {fingerprint(offered)}, but {pinned.path} pins {pins} for {name}; "
        f"nothing was sent to the node. If it was reinstalled or its keys rotated, compare the "
        f"offered fingerprint with {check}, then replace the {name} line; otherwise treat this "
        "as a possible man-in-the-middle",
    )
