"""What ``node add`` checks on a machine before it changes anything, and what it names it.

:data:`PREFLIGHT` is the shell it runs there; :func:`parse_preflight` reads its output
into :class:`Facts`. A *problem* stops node add (nothing after works without it); a
*doubt* stops it too unless the operator says to go on past it (``--continue-past``),
and is then written above the node's entry in ``nodes.yaml``. What the machine says of
itself (its hostname, a process name in a report) is untrusted text: :func:`node_name`
validates it and :func:`one_line` makes it fit for a YAML comment.

>>> parse_preflight("uid=0\\nhostname=gpu-07.rack2\\n").hostname
'gpu-07.rack2'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from llmgw.fleet.types import NodeReport
from llmgw.onboarding import compilers
from llmgw.spec.models import NAME_PATTERN

MIN_PYTHON = (3, 11)
MIN_DISK = 2 << 30


class PreflightError(Exception):
    """The machine cannot be taken in as it is (a name it cannot have)."""


@dataclass
class Facts:
    """What preflight found on the node."""

    uid: int = -1
    sudo: bool = False
    python: str = ""
    venv: bool = False
    init: str = ""
    disk_free: int = 0
    home: str = ""
    hostname: str = ""  # as the machine names itself (`hostname`), not as it was reached
    # gcc or clang on the login PATH, and the package manager (:mod:`.compilers`)
    compiler: compilers.Found = field(default_factory=compilers.Found)

    @property
    def systemd(self) -> bool:
        return self.init == "systemd"

    def problems(self) -> list[str]:
        """What stops node add before anything is changed: nothing after works without it."""
        found = []
        if self.uid != 0 and not self.sudo:
            found.append("neither root nor password-less sudo: make the SSH user root, or "
                         "allow it `sudo` without a password")
        version = tuple(int(p) for p in self.python.split(".")[:2] if p.isdigit())
        if not self.python:
            found.append("no python3: install Python 3.11 or newer")
        elif version < MIN_PYTHON:
            found.append(f"python3 is {self.python}; llmgw needs 3.11 or newer")
        elif not self.venv:
            found.append("python3 has no venv module: install python3-venv")
        return found

    def doubts(self) -> list[str]:
        """What may not stop the install but an operator should know: node add goes on past
        these only when told to (``--continue-past``, or yes at a terminal)."""
        if self.disk_free < MIN_DISK:
            return [f"{self.disk_free >> 20} MiB free under the prefix; the agent and its "
                    f"engines want {MIN_DISK >> 30} GiB"]
        return []


PREFLIGHT = r"""
echo uid=$(id -u)
if sudo -n true 2>/dev/null; then echo sudo=yes; else echo sudo=no; fi
echo python=$(python3 -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)
if python3 -c 'import venv, ensurepip' 2>/dev/null; then echo venv=yes; else echo venv=no; fi
echo init=$(cat /proc/1/comm 2>/dev/null)
echo hostname=$(hostname 2>/dev/null || uname -n)
d={prefix}; while [ ! -d "$d" ]; do d=$(dirname "$d"); done
echo disk_kib=$(df -Pk "$d" | awk 'NR==2 {{print $4}}')
""" + compilers.PROBE  # no braces in it: PREFLIGHT is a format string


def parse_preflight(stdout: str) -> Facts:
    values = dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)

    def number(key: str, absent: int) -> int:
        text = values.get(key, "").strip()
        return int(text) if text.isdigit() else absent

    return Facts(uid=number("uid", -1), sudo=values.get("sudo") == "yes",
                 python=values.get("python", "").strip(), venv=values.get("venv") == "yes",
                 init=values.get("init", "").strip(), disk_free=number("disk_kib", 0) * 1024,
                 hostname=values.get("hostname", "").strip(),
                 compiler=compilers.parse(stdout))


def node_name(hostname: str) -> str:
    """The node's default name: the first label of the machine's own hostname, lower case.

    >>> node_name("GPU-07.rack2.example.com")
    'gpu-07'
    """
    name = hostname.split(".")[0].lower()
    if not re.fullmatch(NAME_PATTERN, name):
        shown = hostname if hostname.isprintable() and len(hostname) <= 64 else "?"
        raise PreflightError(f"the machine calls itself {shown!r}, which is no valid node name "
                         "(lower case letters, digits and -): pass --name")
    return name


def one_line(text: str, limit: int = 300) -> str:
    """``text`` fit for a YAML comment: one printable line, at most ``limit`` characters
    (what a node reports, such as a process name, can hold anything)."""
    line = "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))
    return line if len(line) <= limit else line[: limit - 1] + "…"


def report_doubts(report: NodeReport) -> list[str]:
    """What the first report shows that makes the node unfit for work as it is: its GPUs'
    faults (MIG, ECC, memory held by others) and the agent's warnings."""
    return [fault for gpu in report.gpus for fault in gpu.faults] + list(report.warnings)
