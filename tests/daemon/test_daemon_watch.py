"""The daemon's file watch survives the cluster directory being replaced.

Deploy tools replace a directory rather than edit it: ``rm -rf`` and a fresh
copy, a rename swap (``mv new cluster``), or a new git checkout behind a
symlink swapped atomically (git-sync). Each case runs the real reconcile
loop with the real watcher on a real directory and waits for the edit made
*after* the replacement to be loaded: a watcher still bound to the old
directory never sees it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from llmgw.daemon.reconcilers import Daemon
from llmgw.spec import loading

CLUSTER = """\
cluster:
  name: watched
  drift_interval: 1h   # only the watcher may wake the loop
  agent_socket: {socket}
nodes:
  local: {{address: local, weights_dirs: [/models]}}
"""


def model(name: str) -> str:
    return (f"models:\n  {name}:\n    source: /models/{name}.gguf\n    scaling: {{min: 0}}\n"
            "    profiles: [{engine: llama.cpp, cpu: true}]\n")


def write(directory: Path, socket: Path, *models: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cluster.yaml").write_text(CLUSTER.format(socket=socket))
    for name in models:
        (directory / f"{name}.yaml").write_text(model(name))


def git(directory: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(directory), "-c", "user.email=t@t", "-c", "user.name=t",
                    *args], check=True, capture_output=True)


def rm_and_recreate(cluster: Path, socket: Path, tmp: Path) -> None:
    shutil.rmtree(cluster)
    write(cluster, socket, "first")


def rename_swap(cluster: Path, socket: Path, tmp: Path) -> None:
    fresh = tmp / "fresh"
    write(fresh, socket, "first")
    cluster.rename(tmp / "old")
    fresh.rename(cluster)


def new_checkout_behind_symlink(cluster: Path, socket: Path, tmp: Path) -> None:
    """git-sync's way: clone the new revision beside the old, swap a symlink atomically."""
    origin = Path(os.readlink(cluster)).parent / "origin"
    write(origin, socket, "first")
    git(origin, "add", "-A")
    git(origin, "commit", "-qm", "first")
    checkout = tmp / "checkouts" / "rev2"
    subprocess.run(["git", "clone", "-q", str(origin), str(checkout)], check=True)
    link = tmp / "cluster.new"
    link.symlink_to(checkout)
    link.rename(cluster)  # rename(2) over the old symlink: atomic


Replace = Callable[[Path, Path, Path], None]


@pytest.mark.parametrize("replace", [rm_and_recreate, rename_swap, new_checkout_behind_symlink],
                         ids=["rm-and-recreate", "rename-swap", "new-checkout-symlink"])
async def test_the_watcher_follows_a_replaced_cluster_directory(
    replace: Replace, tmp_path: Path
) -> None:
    socket = tmp_path / "nobody.sock"  # no agent: the node is unreachable, which is fine here
    if replace is new_checkout_behind_symlink:
        origin = tmp_path / "checkouts" / "origin"
        write(origin, socket)
        git(origin, "init", "-q")
        git(origin, "add", "-A")
        git(origin, "commit", "-qm", "empty")
        cluster = tmp_path / "cluster"
        cluster.symlink_to(origin)
    else:
        cluster = tmp_path / "cluster"
        write(cluster, socket)
    daemon = Daemon(cluster, loading.load(cluster))
    stop = asyncio.Event()
    loop = asyncio.create_task(daemon.run(stop))
    try:
        await until(lambda: daemon.state.fleet is not None, daemon, "the first observation")
        # The watch is up on the first directory once an edit there is seen.
        (cluster / "zero.yaml").write_text(model("zero"))
        await until(lambda: "zero" in daemon.cluster.models, daemon, "an edit before that")

        replace(cluster, socket, tmp_path)
        await until(lambda: "first" in daemon.cluster.models, daemon, "the replaced directory")

        # An edit inside the new directory is seen too: the watch moved with it.
        (cluster / "second.yaml").write_text(model("second"))
        await until(lambda: "second" in daemon.cluster.models, daemon, "an edit after that")
    finally:
        stop.set()
        await asyncio.wait_for(loop, 30)


async def until(check: Callable[[], bool], daemon: Daemon, what: str,
                timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; models "
                                 f"{sorted(daemon.cluster.models)}, refused "
                                 f"{daemon.state.refused}")
        await asyncio.sleep(0.1)
