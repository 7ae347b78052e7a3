"""The C compiler ``node add`` installs on a GPU node that has none.

Triton (vLLM's and SGLang's kernels) compiles a small launcher in C the first
time an engine loads a model: ``$CC``, else ``gcc``, else ``clang`` on PATH
(``llmgw.agent.reports.c_compiler``), with the include directory of the
engine's Python (the launcher includes ``Python.h``). The agent runs
unprivileged and cannot install either, so it only refuses such an install
when there is no compiler (``llmgw.agent.installs.no_compiler``); ``node add``
logs in as root or a sudo user, and installs them here.

Looking before acting: preflight's :data:`PROBE` (read-only) says which of
``gcc``, ``clang`` and ``cc`` are on the login PATH, their version, whether
``python3`` (the agent's, and so the engines', interpreter) has ``Python.h``,
and which package manager there is; :func:`decide` turns those facts and the
GPUs of the first report into one :class:`Action`; only ``install`` changes the
node, with :func:`install_command` (the package manager, non-interactive, under
``sudo -n`` unless root), after which the probe runs again to prove it worked.

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
# How each package manager installs, non-interactively.
INSTALLS: dict[str, list[str]] = {
    # The lock: wait for unattended-upgrades, as apt itself would not.
    "apt-get": ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-o",
                "DPkg::Lock::Timeout=120", "install", "-y", "--no-install-recommends"],
    "dnf": ["dnf", "-y", "install"],
    "yum": ["yum", "-y", "install"],
    "zypper": ["zypper", "--non-interactive", "install"],
}
# gcc, and the C library's headers and start files (Debian's gcc only recommends
# libc6-dev, which --no-install-recommends drops; on the RPM distributions gcc requires
# glibc-devel).
COMPILER_PACKAGES = {"apt-get": ["gcc", "libc6-dev"], "dnf": ["gcc"], "yum": ["gcc"],
                     "zypper": ["gcc"]}
# Python.h of the distribution's python3 (python3-dev pulls the default version's).
HEADER_PACKAGES = {"apt-get": "python3-dev", "dnf": "python3-devel", "yum": "python3-devel",
                   "zypper": "python3-devel"}
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
python3 -c '
import os, sysconfig as s
k = s.get_default_scheme()
k = "posix_prefix" if k == "posix_local" else k
h = os.path.join(s.get_paths(k)["include"], "Python.h")
print("python_h=" + ("yes" if os.path.exists(h) else "no"))' 2>/dev/null
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
    # python3's Python.h, where Triton looks (Debian's posix_local scheme read as
    # posix_prefix, as Triton does); None: python3 did not say
    python_headers: bool | None = None


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
                 python_headers={"yes": True, "no": False}.get(values.get("python_h", "").strip()),
                 package_manager=manager if manager in MANAGERS else "")


Kind = Literal["skip", "present", "install", "cannot"]


@dataclass(frozen=True)
class Action:
    """What the step does: ``detail`` is its progress line (``install``: while it runs),
    ``command`` the shell that installs (``install`` only)."""

    kind: Kind
    detail: str
    command: str = ""
    what: str = ""  # what it installs, in words ("gcc", "gcc and python3-dev")


def install_command(manager: str, root: bool, packages: list[str]) -> str:
    """The shell that installs ``packages`` with ``manager``, as root or under ``sudo -n``
    (never a password prompt: node add has no terminal to give it one).

    >>> install_command("dnf", False, ["gcc"])
    'sudo -n dnf -y install gcc'
    """
    sudo = [] if root else ["sudo", "-n"]

    def line(argv: list[str]) -> str:
        return shlex.join([*sudo, *argv])

    install = line([*INSTALLS[manager], *packages])
    if manager in REFRESH:
        return f"{install} || {{ {line(REFRESH[manager])} && {install}; }}"
    return install


def decide(found: Found, *, gpus: int, root: bool, wanted: bool) -> Action:
    """What the step does on a node with ``gpus`` NVIDIA GPUs (its first report's) and
    ``found`` on its PATH; ``wanted`` is False with ``--no-compiler``.

    This is a purely computational function with no side effects."""
    if gpus == 0:
        return Action("skip", "skipped: no GPU, vLLM and SGLang are not installed here")
    seen = " ".join(filter(None, (found.compiler, found.version)))
    headers = found.python_headers is not False  # unknown: not installed blind
    if found.compiler and headers:
        return Action("present", f"{seen} already there")
    manager = found.package_manager
    missing = ([] if found.compiler else ["gcc or clang"]) + ([] if headers else
                                                              ["python3's Python.h"])
    cc = " (a cc is there, but Triton looks for gcc or clang)" if found.cc else ""
    there = f" ({seen} is there)" if found.compiler else cc
    if not wanted:
        return Action("skip", f"skipped (--no-compiler): no {' and no '.join(missing)} "
                      f"here{there}; Triton needs them when vLLM or SGLang first loads a model")
    if not manager:
        return Action("cannot", f"no {' and no '.join(missing)} here{there}, and no "
                      f"{', '.join(MANAGERS[:-1])} or {MANAGERS[-1]} to install them: "
                      "install gcc (and python3's headers), or pass --no-compiler")
    packages = ([] if found.compiler else COMPILER_PACKAGES[manager]) + (
        [] if headers else [HEADER_PACKAGES[manager]])
    what = " and ".join(([] if found.compiler else ["gcc"])
                        + ([] if headers else [HEADER_PACKAGES[manager]]))
    return Action("install", f"installing {what} with {manager}{there}",
                  install_command(manager, root, packages), what)


def installed(action: Action, before: Found, after: Found) -> str:
    """The step's line after ``action`` ran, or "" when ``after`` shows it did not work."""
    if not after.compiler or after.python_headers is False:
        return ""
    seen = " ".join(filter(None, (after.compiler, after.version)))
    if before.compiler:
        return f"{action.what} installed with {before.package_manager} ({seen} was there)"
    extra = f", and {action.what.removeprefix('gcc and ')}" if " and " in action.what else ""
    return f"{seen} installed with {before.package_manager}{extra}"


def failure(action: Action, manager: str, status: int | None, stderr: str) -> str:
    """Why an install failed, and the fix: the package manager's last line, cut short."""
    lines = stderr.strip().splitlines()
    words = lines[-1].strip()[-300:] if lines else ""
    code = "no exit" if status is None else f"exit {status}"
    return (f"installing {action.what} with {manager} failed ({code})"
            f"{': ' + words if words else ''}; install it yourself, or pass --no-compiler")
