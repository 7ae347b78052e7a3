"""The C compiler ``node add`` installs on a GPU node that has none.

Triton (vLLM's and SGLang's kernels) compiles a small launcher in C the first
time an engine loads a model: ``$CC``, else ``gcc``, else ``clang`` on PATH
(``llmgw.agent.reports.c_compiler``). The agent runs unprivileged and cannot
install one, so it only refuses such an install (``llmgw.agent.installs.no_compiler``);
``node add`` logs in as root or a sudo user, and installs one here.

Looking before acting: preflight's :data:`PROBE` (read-only) says which of
``gcc``, ``clang`` and ``cc`` are on the login PATH, their version, and which
package manager there is; :func:`decide` turns those facts and the GPUs of the
first report into one :class:`Action`; only ``install`` changes the node, with
:func:`install_command` (the package manager, non-interactive, under ``sudo -n``
unless root), after which the probe runs again to prove the compiler is there.

>>> found = parse("compiler=gcc\\ncompiler_version=12.2.0\\npackage_manager=apt-get\\n")
>>> decide(found, gpus=8, root=True, wanted=True).detail
'gcc 12.2.0 already there'
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Literal

# Triton's order (``triton/runtime/build.py``); ``cc`` is noted, but Triton does not look for it.
COMPILERS = ("gcc", "clang")
MANAGERS = ("apt-get", "dnf", "yum", "zypper")
# What each package manager installs, non-interactively: gcc and the C library's headers
# and start files (Debian's gcc only recommends libc6-dev, and --no-install-recommends
# drops it; on the RPM distributions gcc requires glibc-devel).
INSTALLS: dict[str, list[str]] = {
    # The lock: wait for unattended-upgrades, as apt itself would not.
    "apt-get": ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-o",
                "DPkg::Lock::Timeout=120", "install", "-y", "--no-install-recommends", "gcc",
                "libc6-dev"],
    "dnf": ["dnf", "-y", "install", "gcc"],
    "yum": ["yum", "-y", "install", "gcc"],
    "zypper": ["zypper", "--non-interactive", "install", "gcc"],
}
# apt's package lists are empty on many fresh images ("Unable to locate package gcc"):
# read them once, and try again.
REFRESH: dict[str, list[str]] = {
    "apt-get": ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "update", "-q"],
}

# A bound, not a wait: a package manager that hangs (a mirror gone quiet) is a failure.
INSTALL_TIMEOUT = 900.0

# Part of preflight's shell (``llmgw.onboarding.preflights.PREFLIGHT``), run again after an
# install: only `command -v` and the compiler's own version, nothing that changes the node.
PROBE = r"""
for c in gcc clang; do
  if command -v $c >/dev/null 2>&1; then
    echo compiler=$c
    echo compiler_version=$($c -dumpfullversion -dumpversion 2>/dev/null | head -n 1)
    break
  fi
done
command -v cc >/dev/null 2>&1 && echo cc=yes
for m in apt-get dnf yum zypper; do
  if command -v $m >/dev/null 2>&1; then echo package_manager=$m; break; fi
done
"""


@dataclass(frozen=True)
class Found:
    """What :data:`PROBE` saw on the node's PATH."""

    compiler: str = ""  # gcc or clang, the first Triton would find; "": neither
    version: str = ""
    cc: bool = False  # a `cc` on PATH (which Triton does not look for)
    package_manager: str = ""  # the first of MANAGERS on PATH; "": none


def parse(stdout: str) -> Found:
    """:data:`PROBE`'s output (within preflight's, one ``key=value`` a line)."""
    values = dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)
    compiler = values.get("compiler", "").strip()
    manager = values.get("package_manager", "").strip()
    version = values.get("compiler_version", "").strip()
    if len(version) > 32 or not version.replace(".", "").isalnum():  # the node's own words
        version = ""
    return Found(compiler=compiler if compiler in COMPILERS else "", version=version,
                 cc=values.get("cc", "").strip() == "yes",
                 package_manager=manager if manager in MANAGERS else "")


Kind = Literal["skip", "present", "install", "cannot"]


@dataclass(frozen=True)
class Action:
    """What the step does: ``detail`` is its progress line (``install``: while it runs),
    ``command`` the shell that installs (``install`` only)."""

    kind: Kind
    detail: str
    command: str = ""


def install_command(manager: str, root: bool) -> str:
    """The shell that installs gcc with ``manager``, as root or under ``sudo -n`` (never a
    password prompt: node add has no terminal to give it one).

    >>> install_command("dnf", root=False)
    'sudo -n dnf -y install gcc'
    """
    sudo = [] if root else ["sudo", "-n"]

    def line(argv: list[str]) -> str:
        return shlex.join([*sudo, *argv])

    install = line(INSTALLS[manager])
    if manager in REFRESH:
        return f"{install} || {{ {line(REFRESH[manager])} && {install}; }}"
    return install


def decide(found: Found, *, gpus: int, root: bool, wanted: bool) -> Action:
    """What the step does on a node with ``gpus`` NVIDIA GPUs (its first report's) and
    ``found`` on its PATH; ``wanted`` is False with ``--no-compiler``.

    This is a purely computational function with no side effects."""
    if gpus == 0:
        return Action("skip", "skipped: no GPU, vLLM and SGLang are not installed here")
    if found.compiler:
        return Action("present", " ".join(filter(None, (found.compiler, found.version)))
                      + " already there")
    cc = " (a cc is there, but Triton looks for gcc or clang)" if found.cc else ""
    if not wanted:
        return Action("skip", f"skipped (--no-compiler): no gcc or clang here{cc}; vLLM and "
                      "SGLang installs refuse this node until one is installed")
    if not found.package_manager:
        return Action("cannot", f"no gcc or clang here{cc}, and no {', '.join(MANAGERS[:-1])} "
                      f"or {MANAGERS[-1]} to install one: install gcc, or pass --no-compiler")
    return Action("install", f"installing gcc with {found.package_manager}{cc}",
                  install_command(found.package_manager, root))


def failure(manager: str, status: int | None, stderr: str) -> str:
    """Why an install failed, and the fix: the package manager's last line, cut short."""
    lines = stderr.strip().splitlines()
    words = lines[-1].strip()[-300:] if lines else ""
    code = "no exit" if status is None else f"exit {status}"
    return (f"installing gcc with {manager} failed ({code}){': ' + words if words else ''}"
            "; install gcc yourself, or pass --no-compiler")
