"""``llmgw engine install``: an engine version onto nodes, from the control host.

For each node, in parallel (bounded by ``cluster.ssh.max_parallel``):

1. **ask** — the node's report says where its agent installs engines
   (``engines_dir``) and what is there; an installed version is left alone.
2. **ship** (llama.cpp) — the ``llama-server`` given here is copied over SFTP
   into ``<engines_dir>/.incoming/`` on the pooled SSH connection: the node
   needs no internet and no compiler. vLLM and SGLang ship nothing: the
   node's agent downloads the hash-pinned requirements from the index.
3. **install** — ``InstallEngine`` on the agent, whose progress is printed
   one line per step as it changes (bytes for copies and downloads), until
   it is done, failed (with the agent's reason) or skipped (no GPU).

The agent does the installing (:mod:`llmgw.agent.installs`): versioned
directories, built under a scratch name and moved into place once the binary
runs. Failures are values (:class:`Outcome`), so one node's failure never
stops the others.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import grpc

from llmgw.agent import installs
from llmgw.planning.nodes import human_bytes
from llmgw.transport import pools
from llmgw.transport.failures import NodeUnreachable
from llmgw.transport.transports import LocalTransport
from llmgw.transport.tunnels import SSHTransport

INCOMING = ".incoming"  # the agent's llmgw.agent.installs.INCOMING


class ShipError(Exception):
    """The binary could not be copied to the node."""


class WantedError(Exception):
    """What should install an engine version is not usable; the message is located."""


@dataclass(frozen=True)
class Wanted:
    """One engine version, with what it is installed from."""

    engine: str
    version: str
    binary: Path | None = None  # llama.cpp: the llama-server to ship
    requirements: str = ""  # vLLM, SGLang: hash-pinned requirements
    index_url: str = ""  # empty: the agent's engines.index_url
    extra_index_urls: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        return f"{self.engine} {self.version}"


def requirements_path(directory: Path, engine: str, version: str) -> Path:
    """Where a cluster directory keeps the requirements of a vLLM or SGLang version
    (what ``llmgw apply`` and the daemon's ``install: auto`` install)."""
    return directory / "engines" / f"{engine}-{version}.txt"


def from_requirements(engine: str, version: str, requirements: Path, *, index_url: str = "",
                      extra_index_urls: tuple[str, ...] = ()) -> Wanted:
    """The vLLM or SGLang version installed from a requirements file, checked as the
    agent checks it; :class:`WantedError` says what is wrong, at ``file:line:col``."""
    try:
        text = requirements.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise WantedError(f"{requirements}: cannot read: {exc}") from None
    try:
        installs.request(engine, version, requirements=text, index_url=index_url,
                         extra_index_urls=extra_index_urls)
    except installs.RequirementsError as exc:
        raise WantedError(f"{requirements}:{exc.line}:1: {exc.detail}") from None
    except installs.InstallError as exc:
        raise WantedError(f"{requirements}: {exc}") from None
    return Wanted(engine, version, requirements=text, index_url=index_url,
                  extra_index_urls=extra_index_urls)


@dataclass(frozen=True)
class Outcome:
    node: str
    state: str  # done | already | skipped | failed
    detail: str  # the directory, or why


class _Shown:
    """Prints a node's progress, one line each time what it says changes."""

    def __init__(self, node: str, say: Callable[[str], None]) -> None:
        self.node, self.say, self.last = node, say, ""

    def __call__(self, text: str) -> None:
        if text != self.last:
            self.last = text
            self.say(f"{self.node}  {text}")


async def install(pool: pools.Pool, nodes: list[str], wanted: Wanted,
                  say: Callable[[str], None]) -> dict[str, Outcome]:
    """Install ``wanted`` on every node of ``nodes``; the outcome per node."""
    async def one(node: str) -> Outcome:
        shown = _Shown(node, say)
        try:
            return await _install(pool, node, wanted, shown)
        except NodeUnreachable as exc:
            outcome = Outcome(node, "failed", f"unreachable: {exc}")
        except ShipError as exc:
            outcome = Outcome(node, "failed", str(exc))
        except grpc.aio.AioRpcError as exc:
            outcome = Outcome(node, "failed", f"the agent refused: {exc.details()}")
        shown(f"FAILED: {outcome.detail}")
        return outcome
    return await pools.fan_out(nodes, one, pool.max_parallel)


async def _install(pool: pools.Pool, node: str, wanted: Wanted, shown: _Shown) -> Outcome:
    report = await pool.report(node)
    facts = report.host
    if report.error or facts is None or facts.engines_dir is None:
        why = report.error or "its agent installs no engines (older than this llmgw: run " \
              "`llmgw node add` again to upgrade it)"
        return Outcome(node, "failed", why)
    for found in facts.installed_engines:
        if (found.engine, found.version) == (wanted.engine, wanted.version):
            shown(f"{wanted.target} already installed in {found.path}")
            return Outcome(node, "already", found.path)
    binary = ""
    if wanted.binary is not None:
        binary = await _ship(pool, node, wanted, facts.engines_dir, shown)
    agent = await pool.client(node)
    last = None
    async for progress in agent.install_engine(
            wanted.engine, wanted.version, binary=binary, requirements=wanted.requirements,
            index_url=wanted.index_url, extra_index_urls=wanted.extra_index_urls):
        last = progress
        fetch = progress.fetch
        amount = f" ({human_bytes(fetch.bytes_done)})" if fetch.bytes_done else ""
        if fetch.state == "running":
            shown(f"{progress.step}{amount}")
    if last is None:
        return Outcome(node, "failed", "the agent ended the install without an answer")
    fetch = last.fetch
    if fetch.state == "done":
        shown(f"installed {wanted.target} in {last.path}")
        return Outcome(node, "done", last.path)
    if fetch.state == "skipped":
        shown(f"skipped: {fetch.error}")
        return Outcome(node, "skipped", fetch.error)
    shown(f"FAILED: {fetch.error}")
    return Outcome(node, "failed", fetch.error)


async def _ship(pool: pools.Pool, node: str, wanted: Wanted, engines_dir: str,
                shown: _Shown) -> str:
    """Copy the binary into the node's incoming directory; its path there."""
    assert wanted.binary is not None
    remote = (f"{engines_dir}/{INCOMING}/{wanted.engine}-{wanted.version}."
              f"{secrets.token_hex(4)}.{wanted.binary.name}")
    size = wanted.binary.stat().st_size
    transport = pool.transport(node)
    quarters = [0]

    def progress(done: int, total: int) -> None:
        quarter = done * 4 // max(total, 1)
        if quarter > quarters[0] and done < total:
            quarters[0] = quarter
            shown(f"shipping: {human_bytes(done)} of {human_bytes(total)}")

    shown(f"shipping {wanted.binary.name} ({human_bytes(size)}) over SFTP")
    begun = time.monotonic()
    try:
        if isinstance(transport, SSHTransport):
            await transport.upload(wanted.binary, remote, progress)
        elif isinstance(transport, LocalTransport):
            os.makedirs(os.path.dirname(remote), exist_ok=True)
            shutil.copyfile(wanted.binary, remote)
        else:
            raise ShipError("this transport cannot copy files")
    except (OSError, asyncssh.Error) as exc:
        raise ShipError(f"copying {wanted.binary.name} to {remote} failed: {exc}") from None
    shown(f"shipped {human_bytes(size)} in {time.monotonic() - begun:.1f}s")
    return remote
