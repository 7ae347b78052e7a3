"""Engine versions the agent installs: one directory each, never half there.

Layout: ``<engines.dir>/<engine>-<version>`` (``vllm-0.11.0``,
``llama.cpp-11434.0.0``), whose ``bin/`` holds what units run:

* llama.cpp: ``bin/llama-server``, copied from a binary the control host
  shipped over SFTP into ``<engines.dir>/.incoming/`` (so an offline node
  needs nothing but SSH);
* vLLM, SGLang: a fresh venv (``python -m venv``: never the system Python's
  site-packages) into which its own pip installs a requirements file whose
  every requirement is pinned by ``--hash``: ``pip download --require-hashes
  --no-deps`` from the index (configurable: an offline site points it at its
  mirror), then ``pip install --require-hashes --no-deps --no-index`` from
  those files. A wrong hash fails the download with pip's own lines saying
  which package, what was expected and what came. A node without a GPU skips
  them (state ``skipped`` in the answer, and nothing in the report): not a
  fault. A node without a C compiler fails them before anything is fetched:
  Triton builds its launcher with ``gcc`` (or ``clang``) when the engine first
  loads a model, so the install would only fail later, at the worst moment;
  the error names the fix: ``llmgw node add`` run again for the node installs
  gcc (the agent runs unprivileged and cannot), or ``apt-get install gcc``.

An install is built under a scratch name (``.<engine>-<version>.partial-<random>``)
and its program run (``llama-server --version``, ``vllm --version``, for
SGLang ``python -c "import sglang; print(sglang.__version__)"``: exit 0, and
vLLM and SGLang must print the version asked for); only then is it renamed to its final name.
A directory with the final name is therefore a complete install; a failed
one leaves nothing, and scratch directories a killed agent left are removed
when the next starts. One install per (engine, version) runs at a time: a
second request joins it. Progress and failures are reported as
:class:`~llmgw.fleet.types.Fetch` entries of kind ``engine``.

Units whose spec names an ``engine_version`` run that version's ``bin/``
first on their PATH (engines' argv start with ``/usr/bin/env PROGRAM``).
Until it is installed they are held stopped and reported ``failed`` (nothing
is installing: what to run) or ``fetching`` with ``installing vllm 0.11.0:
<step>`` as detail; when the install completes they start.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from llmgw.agent import fetchers, reports, unitfiles
from llmgw.agent.settings import EngineSettings
from llmgw.agent.units import UnitChange, UnitResult
from llmgw.fleet.types import Fetch, InstalledEngine

log = logging.getLogger(__name__)

ENGINES = ("vllm", "sglang", "llama.cpp")
GPU_ONLY = frozenset({"vllm", "sglang"})
VERSION = re.compile(r"^\d+(\.\d+){0,3}([.-]?(post|rc|dev)\d+)?$")
INCOMING = ".incoming"
PARTIAL = ".partial-"
MAX_REQUIREMENTS = 1 << 20
# pip's "    vllm==0.11.0 from https://…/vllm-0.11.0-py3-none-any.whl#sha256=… (from -r …):"
FROM = re.compile(r"^\s+(?P<requirement>\S+==\S+) from (?P<url>[^\s#]+)")
URL = re.compile(r"^https?://[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]+$")
CHECK_TIMEOUT = 120.0
OUTPUT_LINES = 40
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What proves an install runs, relative to its directory.
CHECKS: dict[str, tuple[str, ...]] = {
    "llama.cpp": ("bin/llama-server", "--version"),
    "vllm": ("bin/vllm", "--version"),
    # SGLang's install guide verifies an install so; the version must be the one asked for.
    "sglang": ("bin/python", "-c", "import sglang; print(sglang.__version__)"),
}
# A requirement line: name, optional extras, ==version, then its hashes.
REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?==\S+"
                         r"(\s*;[^#]*?)?(\s+--hash=sha256:[0-9a-f]{64})+$")

Start = Callable[[Sequence[UnitChange]], Awaitable[list[UnitResult]]]
HasGpu = Callable[[], Awaitable[bool]]
Compiler = Callable[[], str]  # the C compiler engines find, "" for none (reports.c_compiler)
COMPILER_FIX = "apt-get install gcc"
# node add logs in as root or a sudo user, and installs gcc on a GPU node that has none.
NODE_ADD_FIX = "run `llmgw node add` for this node again, which installs gcc"


def no_compiler(engine: str) -> str:
    """Why a vLLM or SGLang install stops on a node without a C compiler, and the fix."""
    return (f"no C compiler on this node (gcc or clang on PATH): Triton compiles its "
            f"launcher with one when {engine} first loads a model, and fails without; "
            f"install one: {NODE_ADD_FIX}, or `{COMPILER_FIX}` (Debian, Ubuntu; `dnf install "
            "gcc` on Fedora, RHEL)")


def free_bytes(root: Path) -> int | None:
    """Free bytes (for an unprivileged user) on the filesystem that holds ``root``, or
    will once it is made: its nearest existing parent's; None when none can be asked."""
    for candidate in (root, *root.parents):
        try:
            found = os.statvfs(candidate)
        except OSError:
            continue
        return found.f_bavail * found.f_frsize
    return None


class InstallError(Exception):
    """An install that cannot be done; the message is for the operator."""


class RequirementsError(InstallError):
    """A requirements line that is not ``name==version --hash=sha256:…``; ``line`` is 1-based."""

    def __init__(self, line: int, detail: str) -> None:
        super().__init__(f"requirements line {line}: {detail}")
        self.line, self.detail = line, detail


@dataclass(frozen=True)
class Request:
    """One engine version to install, checked (see :func:`request`)."""

    engine: str
    version: str
    binary: str = ""
    requirements: str = ""
    index_url: str = ""
    extra_index_urls: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.engine, self.version)

    @property
    def name(self) -> str:
        return f"{self.engine}-{self.version}"


@dataclass
class Progress:
    """Where one install stands; read by reports and the InstallEngine stream."""

    target: str
    state: str = "queued"  # queued | running | done | failed | skipped
    step: str = "queued"
    bytes_done: int = 0
    bytes_total: int | None = None
    rate_bps: float | None = None
    error: str = ""
    path: str = ""
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    def at(self, step: str, **changes: object) -> None:
        self.step = step
        for name, value in changes.items():
            setattr(self, name, value)
        self.updated_at = time.time()

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "skipped")


def request(engine: str, version: str, *, binary: str = "", requirements: str = "",
            index_url: str = "", extra_index_urls: Sequence[str] = ()) -> Request:
    """A checked request; raises :class:`InstallError` saying what is wrong."""
    if engine not in ENGINES:
        raise InstallError(f"engine {engine!r} is not one of {', '.join(ENGINES)}")
    if not VERSION.match(version):
        raise InstallError(f"engine version {version!r} is not a version such as 0.11.0")
    if engine == "llama.cpp":
        if not binary or requirements:
            raise InstallError("llama.cpp installs a shipped llama-server binary: give binary, "
                               "not requirements")
    else:
        if binary or not requirements:
            raise InstallError(f"{engine} installs a venv from requirements pinned by hash: "
                               "give requirements, not a binary")
        check_requirements(requirements)
        for url in ([index_url] if index_url else []) + list(extra_index_urls):
            if not URL.match(url):
                raise InstallError(f"index URL {url!r} is not an http(s) URL")
    if engine == "llama.cpp" and (index_url or extra_index_urls):
        raise InstallError("llama.cpp installs a shipped binary: it uses no index")
    return Request(engine, version, binary, requirements, index_url, tuple(extra_index_urls))


def check_requirements(text: str) -> None:
    """Every requirement pinned (``==``) with a sha256 ``--hash``; no options, no URLs.

    Options (``--index-url``, ``-e``, ``-r``) would let the file point pip
    elsewhere than the index the node was told to use: refused.
    """
    if len(text.encode()) > MAX_REQUIREMENTS:
        raise InstallError(f"the requirements are over {MAX_REQUIREMENTS >> 20} MiB")
    logical: list[tuple[int, str]] = []  # (first line number, joined continuation lines)
    for number, raw in enumerate(text.splitlines(), 1):
        line = "" if raw.lstrip().startswith("#") else raw.split(" #", 1)[0].strip()
        continued = bool(logical) and logical[-1][1].endswith("\\")
        if continued:
            first, before = logical.pop()
            logical.append((first, f"{before[:-1].strip()} {line}".strip()))
        elif line:
            logical.append((number, line))
    if logical and logical[-1][1].endswith("\\"):
        logical[-1] = (logical[-1][0], logical[-1][1][:-1].strip())
    if not logical:
        raise InstallError("the requirements name no package")
    for number, line in logical:
        if not REQUIREMENT.match(line):
            raise RequirementsError(number, f"{line[:120]!r} is not `name==version "
                                    "--hash=sha256:…` (options and URLs are refused)")


def directory_name(engine: str, version: str) -> str:
    return f"{engine}-{version}"


def spec_version(change: UnitChange) -> tuple[str, str] | None:
    """(engine, engine_version) a unit's spec names, or None when it names no version."""
    spec = fetchers.spec_of(change.unit_text, change.name)
    engine, version = spec.get("engine"), spec.get("engine_version")
    if engine in ENGINES and isinstance(version, str) and VERSION.match(version):
        return str(engine), version
    return None


class Installer:
    """Installs for one agent: deduplicated, atomic, reported; units wait for them."""

    def __init__(self, settings: EngineSettings, start: Start, has_gpu: HasGpu,
                 poke: Callable[[], None], *, group: str | None = None,
                 compiler: Compiler | None = None) -> None:
        self.root = Path(settings.dir)
        self.settings = settings
        self._start = start
        self._has_gpu = has_gpu
        self._poke = poke
        self._group = group
        self._compiler = compiler or reports.c_compiler  # what the report says too
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._progress: dict[tuple[str, str], Progress] = {}
        self._waiting: dict[str, tuple[tuple[str, str], UnitChange]] = {}

    # ---- what is there -------------------------------------------------------

    def path(self, engine: str, version: str) -> Path | None:
        """The complete install of (engine, version), or None."""
        found = self.root / directory_name(engine, version)
        return found if found.is_dir() else None

    def installed(self) -> list[InstalledEngine]:
        """Complete installs under the root (scratch and incoming never count)."""
        found = []
        try:
            entries = sorted(self.root.iterdir())
        except OSError:
            return []
        for entry in entries:
            for engine in ENGINES:
                version = entry.name.removeprefix(f"{engine}-")
                if version != entry.name and VERSION.match(version) and entry.is_dir():
                    found.append(InstalledEngine(engine=engine, version=version,
                                                 path=str(entry), program=CHECKS[engine][0]))
        return found

    def reports(self) -> list[Fetch]:
        """Installs under way, done or failed; a skip is no fault, so it is not reported."""
        found = []
        for key, progress in sorted(self._progress.items()):
            if progress.state == "skipped":
                continue
            units = sorted(u for u, (k, _) in self._waiting.items() if k == key)
            found.append(fetch_of(progress, units))
        return found

    def overlay(self, unit: str) -> tuple[str, str] | None:
        """A held unit's state: ("fetching"|"failed", detail)."""
        waiting = self._waiting.get(unit)
        if waiting is None:
            return None
        (engine, version), _ = waiting
        progress = self._progress.get(waiting[0])
        if progress is None:
            return "failed", (f"engine {engine} {version} is not installed on this node: run "
                              f"`llmgw engine install {engine}=={version} NODE`")
        if progress.state == "failed":
            return "failed", f"installing {engine} {version} failed: {progress.error}"
        if progress.state == "skipped":
            return "failed", f"{engine} {version} skipped: {progress.error}"
        # "fetching": the unit waits for something to arrive before its engine starts, as
        # for weights; every consumer of unit states knows it (plans keep the replica).
        return "fetching", f"installing {engine} {version}: {progress.step}"

    # ---- units ---------------------------------------------------------------

    async def admit(self, changes: Sequence[UnitChange]) -> list[UnitChange]:
        """Units of an installed version get its PATH; the others are held stopped."""
        now = []
        for change in changes:
            wanted = spec_version(change) if change.action == "start" else None
            if wanted is None:
                self._waiting.pop(change.name, None)
                now.append(change)
                continue
            found = self.path(*wanted)
            if found is not None:
                self._waiting.pop(change.name, None)
                now.append(with_engine(change, found))
                continue
            self._waiting[change.name] = (wanted, change)
            now.append(replace(change, action="stop"))
        return now

    # ---- installing ----------------------------------------------------------

    def sweep(self) -> None:
        """Remove what a killed install left (when the agent starts; nothing is made)."""
        for entry in self.root.glob(f".*{PARTIAL}*"):
            log.info("removing %s, left by an install that did not finish", entry)
            shutil.rmtree(entry, ignore_errors=True)

    def prepare(self) -> None:
        """Make the root and its incoming directory (first install), and sweep."""
        incoming = self.root / INCOMING
        incoming.mkdir(parents=True, exist_ok=True)
        # The SSH user ships binaries here; the agent's group may write.
        with contextlib.suppress(OSError, KeyError):
            os.chmod(incoming, 0o2770)
            if self._group:
                os.chown(incoming, -1, grp.getgrnam(self._group).gr_gid)
        self.sweep()

    def start(self, wanted: Request) -> Progress:
        """Start the install of ``wanted``, or join the one running; its progress."""
        task = self._tasks.get(wanted.key)
        if task is not None and not task.done():
            return self._progress[wanted.key]
        progress = Progress(f"{wanted.engine} {wanted.version}")
        self._progress[wanted.key] = progress
        self._tasks[wanted.key] = asyncio.create_task(self._run(wanted, progress))
        return progress

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, wanted: Request, progress: Progress) -> None:
        final = self.root / wanted.name
        try:
            if final.is_dir():
                progress.at("already installed", state="done", path=str(final))
            elif wanted.engine in GPU_ONLY and not await self._has_gpu():
                progress.at("skipped", state="skipped",
                            error=f"this node has no GPU: {wanted.engine} is not installed here")
            elif wanted.engine in GPU_ONLY and not self._compiler():
                # Found now rather than at the first model load, hours later.
                progress.at("failed", state="failed", error=no_compiler(wanted.engine))
                log.warning("installing %s: %s", progress.target, progress.error)
            else:
                progress.at("starting", state="running")
                async with asyncio.timeout(self.settings.install_timeout):
                    await self._install(wanted, progress, final)
                progress.at("installed", state="done", path=str(final))
                log.info("installed %s into %s", progress.target, final)
        except TimeoutError:
            progress.at("failed", state="failed",
                        error=f"gave up after {self.settings.install_timeout:.0f}s")
        except (InstallError, OSError) as exc:
            # OSError: the node's disk said no (full, read-only, permissions).
            progress.at("failed", state="failed", error=str(exc))
            log.warning("installing %s failed: %s", progress.target, exc)
        self._poke()
        if progress.state == "done":
            await self._release(wanted.key, final)

    async def _release(self, key: tuple[str, str], final: Path) -> None:
        """Start the units that waited for this install."""
        changes = [change for _, (k, change) in list(self._waiting.items()) if k == key]
        for change in changes:
            self._waiting.pop(change.name, None)
        if changes:
            for result in await self._start([with_engine(c, final) for c in changes]):
                if not result.ok:
                    log.warning("starting %s after its engine install: %s", result.name,
                                result.error)
        self._poke()

    async def _install(self, wanted: Request, progress: Progress, final: Path) -> None:
        self.prepare()
        shipped = self._shipped(wanted) if wanted.engine == "llama.cpp" else None
        scratch = self.root / f".{wanted.name}{PARTIAL}{secrets.token_hex(4)}"
        scratch.mkdir(mode=0o755)
        try:
            if shipped is not None:
                await asyncio.to_thread(_copy_binary, shipped, progress, scratch)
            else:
                indexes = [wanted.index_url or self.settings.index_url, *wanted.extra_index_urls]
                await _venv(wanted, progress, scratch, indexes)
            progress.at("checking that it runs")
            await _check(wanted, scratch)
            if wanted.engine != "llama.cpp":
                _relocate(scratch, final)
            try:
                os.rename(scratch, final)
            except OSError:
                if not final.is_dir():
                    raise InstallError(f"cannot move the install into {final}") from None
                # Another agent finished it first: that one is complete too.
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            if shipped is not None:  # copied or not, a new attempt ships it again
                shipped.unlink(missing_ok=True)

    def _shipped(self, wanted: Request) -> Path:
        """The shipped binary, which must be in the incoming directory (nowhere else)."""
        incoming = (self.root / INCOMING).resolve()
        source = Path(wanted.binary).resolve()
        if incoming not in source.parents:
            raise InstallError(f"the binary must be under {incoming}, where `llmgw engine "
                               f"install` ships it; got {wanted.binary}")
        if not source.is_file():
            raise InstallError(f"{wanted.binary}: no such file (was it shipped?)")
        return source


def _copy_binary(source: Path, progress: Progress, scratch: Path) -> None:
    """``source`` to ``scratch/bin/llama-server``, executable, its bytes counted."""
    size = source.stat().st_size
    (scratch / "bin").mkdir()
    target = scratch / "bin" / "llama-server"
    progress.at("copying llama-server", bytes_total=size)
    begun = time.monotonic()
    with source.open("rb") as src, target.open("wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
            progress.bytes_done += len(chunk)
            elapsed = time.monotonic() - begun
            progress.rate_bps = progress.bytes_done / elapsed if elapsed > 0 else None
            progress.updated_at = time.time()
    target.chmod(0o755)


def with_engine(change: UnitChange, installed: Path) -> UnitChange:
    """The change with the install's ``bin/`` first on the engine's PATH."""
    path = f"{installed}/bin:{os.environ.get('PATH') or SYSTEM_PATH}"
    return replace(change, env_text=change.env_text + unitfiles.render_env_file({"PATH": path}))


def fetch_of(progress: Progress, units: Sequence[str] = ()) -> Fetch:
    return Fetch(
        kind="engine", target=progress.target,
        state=progress.state,  # Progress sets only the states Fetch has
        bytes_done=progress.bytes_done, bytes_total=progress.bytes_total,
        rate_bps=progress.rate_bps, error=progress.error, units=list(units),
        started_at=progress.started_at, updated_at=progress.updated_at,
    )


async def _venv(wanted: Request, progress: Progress, scratch: Path,
                indexes: Sequence[str]) -> None:
    """A fresh venv in ``scratch``, with the hash-pinned requirements installed by its own pip."""
    progress.at("creating the venv")
    # The base interpreter the agent runs on; a venv of it, never its site-packages.
    python = getattr(sys, "_base_executable", sys.executable)
    # -P (here and for pip): the agent's working directory is not on sys.path, so a
    # venv.py or pip.py lying there never runs instead.
    await _command([python, "-P", "-m", "venv", str(scratch)], "creating the venv")
    requirements = scratch / "requirements.txt"
    requirements.write_text(wanted.requirements)
    wheels = scratch / ".wheels"
    pip = [str(scratch / "bin" / "python"), "-P", "-m", "pip", "--isolated",
           "--disable-pip-version-check", "--no-input"]
    progress.at("downloading wheels")
    download = asyncio.create_task(_command(
        [*pip, "download", "--require-hashes", "--no-deps", "--only-binary", ":all:",
         "--progress-bar", "off", "--index-url", indexes[0],
         *(f"--extra-index-url={url}" for url in indexes[1:]), "--dest", str(wheels),
         "-r", str(requirements)], "pip download"))
    begun = time.monotonic()
    while not download.done():
        await asyncio.wait([download], timeout=0.5)
        done = _size(wheels)
        count = len(list(wheels.glob("*.whl"))) if wheels.is_dir() else 0
        elapsed = time.monotonic() - begun
        progress.at(f"downloading wheels ({count} so far)", bytes_done=done,
                    rate_bps=done / elapsed if elapsed > 0 else None)
    await download
    progress.at("installing wheels")
    await _command([*pip, "install", "--require-hashes", "--no-deps", "--no-index",
                    "--find-links", str(wheels), "-r", str(requirements)], "pip install")
    shutil.rmtree(wheels, ignore_errors=True)


async def _check(wanted: Request, scratch: Path) -> None:
    program, *args = CHECKS[wanted.engine]
    argv = [str(scratch / program), *args]
    if not Path(argv[0]).exists():
        raise InstallError(f"the install has no {program}")
    name = f"{Path(program).name} {' '.join(args)}"
    output = await _command(argv, name, timeout=CHECK_TIMEOUT)
    if wanted.engine != "llama.cpp" and wanted.version not in output:
        raise InstallError(f"{name} says {output.strip()[:200]!r}, not {wanted.version}: "
                           "the requirements install another version")


def _relocate(scratch: Path, final: Path) -> None:
    """Point the venv's scripts at the final directory (pip writes absolute shebangs)."""
    old, new = str(scratch).encode(), str(final).encode()
    for script in (scratch / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if old in data[:4096]:
            script.write_bytes(data.replace(old, new))


def _size(directory: Path) -> int:
    total = 0
    with contextlib.suppress(OSError):
        for entry in directory.iterdir():
            with contextlib.suppress(OSError):
                total += entry.stat().st_size
    return total


async def _command(argv: list[str], what: str, *, timeout: float | None = None) -> str:
    """Run ``argv``; its output, or :class:`InstallError` with the lines that say why."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        raise InstallError(f"{what}: cannot run {argv[0]}: {exc.strerror or exc}") from None
    try:
        async with asyncio.timeout(timeout):
            out, _ = await process.communicate()
    except TimeoutError:
        raise InstallError(f"{what}: no answer after {timeout or 0:.0f}s") from None
    finally:
        if process.returncode is None:  # timed out, or the agent is stopping
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 9)
            # Read what is left rather than wait() alone: in Python 3.11 wait() returns
            # only once the pipe has closed, and a reader paused on a full buffer (pip
            # is chatty) never closes it (see commands.stream).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.communicate(), 30.0)
    text = out.decode(errors="replace")
    if process.returncode != 0:
        raise InstallError(f"{what} exited {process.returncode}: {_why(text)}")
    return text


def _why(output: str) -> str:
    """The lines of a failed command that say why: pip's ERROR (its first sentence), the
    package and where it came from, Expected and Got; else the last lines."""
    telling = []
    for line in output.splitlines():
        text = " ".join(line.split())
        if text.startswith("ERROR"):
            telling.append(text.split(". ", 1)[0].rstrip(".") + ".")
        elif text.startswith(("Expected", "Got")):
            telling.append(text)
        elif found := FROM.match(line):
            telling.append(f"{found['requirement']} from {found['url']}")
    lines = [" ".join(line.split()) for line in output.splitlines() if line.strip()]
    return " | ".join(telling or lines[-5:])[:2000] or "no output"
