"""The ``systemd_machine`` fixture: systemd as PID 1 of a throwaway ``systemd-nspawn`` container.

``systemd_machine()`` boots one (:func:`llmgw.onboarding.machines.boot`) with
this checkout bound read-only at its own path (the venv's python, the test
engine and the fixture hardware mean the same inside), and returns the
:class:`~llmgw.onboarding.machines.Machine`. Every machine is powered off and
its cgroups removed when the test ends, pass or fail. Skipped, with the reason,
where no container can be booted (no systemd-nspawn, not root).

:func:`runner` runs a command inside the machine, in the shape the systemd
backend takes, so the backend drives the real ``systemctl``; :func:`backend`
is that backend, writing the machine's unit files from outside.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import pytest

from llmgw.agent import commands
from llmgw.agent.settings import SystemdSettings
from llmgw.agent.systemd import SystemdBackend
from llmgw.onboarding import machines
from llmgw.onboarding.machines import Machine

ROOT = Path(__file__).resolve().parents[2]
MachineFactory = Callable[..., Machine]
_numbers = itertools.count(1)


def shared_paths() -> list[Path]:
    """What a machine must see of this host: the checkout, and what its symlinks point at."""
    paths = {ROOT, *machines.python_paths()}
    cache = ROOT / ".cache"
    if cache.is_symlink() or cache.exists():
        paths.add(cache.resolve())
    return sorted(p for p in paths if p.exists())


@pytest.fixture
def systemd_machine() -> Iterator[MachineFactory]:
    why = machines.unavailable()
    if why is not None:
        pytest.skip(why)
    machines.sweep_abandoned()
    made: list[tuple[Machine | None, Path]] = []

    def make(*, binds: Sequence[Path] = (), read_only: Sequence[Path] = (),
             **options: object) -> Machine:
        root = Path(tempfile.mkdtemp(prefix="llmgw-m-", dir="/tmp"))
        made.append((None, root))
        (root / "shared").mkdir()
        name = f"llmgw-t{os.getpid()}-{next(_numbers)}"
        machine = machines.boot(root, name, binds=[root / "shared", *binds],
                                read_only=[*shared_paths(), *read_only],
                                **options)  # type: ignore[arg-type]
        made[-1] = (machine, root)
        return machine

    try:
        yield make
    finally:
        for machine, root in made:
            if machine is not None:
                machine.stop()
            shutil.rmtree(root, ignore_errors=True)


def runner(machine: Machine, default_timeout: float = commands.DEFAULT_TIMEOUT,
           ) -> commands.TimedRunner:
    """Run argv inside ``machine``; a command given no timeout gets ``default_timeout``."""

    async def run(argv: Sequence[str], timeout: float | None = None) -> commands.Completed:
        done = await commands.run(machine.command(argv),
                                  default_timeout if timeout is None else timeout)
        # Report the command as the backend built it, not the nsenter around it.
        return commands.Completed(tuple(argv), done.returncode, done.stdout, done.stderr,
                                  done.error.replace(machines.NSENTER, argv[0], 1))

    return run  # type: ignore[return-value]


def backend(machine: Machine, state: Path | None = None,
            default_timeout: float = commands.DEFAULT_TIMEOUT) -> SystemdBackend:
    """The systemd backend of ``machine``, run from outside: its unit and env files, its
    systemctl, its /proc; drift evidence in ``state`` (default: the machine's own dir)."""
    settings = SystemdSettings(unit_dir=str(machine.units), env_dir=str(machine.env))
    return SystemdBackend(settings, runner(machine, default_timeout), stream=streamer(machine),
                          proc=machine.proc, state_dir=state or machine.root / "evidence")


def streamer(machine: Machine) -> commands.Streamer:
    """Stream argv's output from inside ``machine`` (journalctl, for the backend's logs)."""

    def stream(argv: Sequence[str], *, max_bytes: int | None = None,
               timeout: float | None = None) -> AsyncIterator[bytes]:
        return commands.stream(machine.command(argv), max_bytes=max_bytes, timeout=timeout)

    return stream
