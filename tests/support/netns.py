"""A network namespace of its own for a command whose transcript shows the default ports.

The docs' sessions run ``llmgw lab up`` and ``llmgw serve`` as a reader would,
with the default ports the pages show (SSH from 2201, engines from 21000, the
router on 8000). Another program on this machine may hold those; in a network
namespace of its own (``unshare -n``, loopback brought up) every port is free
and nothing the session starts can reach or disturb other programs' ports.
Processes stay in this machine's pid namespace, so they are found and stopped
as any other.

Usage::

    subprocess.run(netns.isolated(["bash", "-c", script]), ...)
"""

from __future__ import annotations

import functools
import shutil
import subprocess

# Bring loopback up, then run the command in place of this shell.
_LOOPBACK = 'ip link set lo up && exec "$@"'


@functools.cache
def available() -> bool:
    """Whether ``unshare -n`` works here (root, or unprivileged user namespaces)."""
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    probe = subprocess.run([*_prefix(), "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def _prefix() -> list[str]:
    return ["unshare", "--net", "--", "sh", "-c", _LOOPBACK, "sh"]


def isolated(argv: list[str]) -> list[str]:
    """``argv`` run in a network namespace of its own where this machine allows one, else as is."""
    return [*_prefix(), *argv] if available() else list(argv)
