"""Two nodes on one shared weights directory fetch a source once: the fetch's lock is a
file in the directory (``.llmgw/locks``), so the second agent waits for the first and
finds the weights complete. Two processes stand for the two nodes' agents, against the
real mirror server; bytes are counted at the server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mirror_support import serving, tiny_model

from llmgw.hub import caches, fetches

FETCH = """
import sys
from llmgw.hub import fetches
from llmgw.spec import sources
done = fetches.fetch(sources.parse("acme/tiny"), sys.argv[1], endpoint=sys.argv[2])
print(done.path)
"""


def test_two_agents_on_one_shared_directory_fetch_once(tmp_path: Path) -> None:
    root = tmp_path / "mirror" / "hub"
    files = tiny_model(tmp_path / "tiny")
    caches.add(root, "acme/tiny", files)
    size = sum(path.stat().st_size for path in files.values())
    shared = tmp_path / "filer" / "models"  # what both nodes mount
    with serving(root, max_rate=size) as mirror:  # about a second each: they overlap
        agents = [subprocess.Popen([sys.executable, "-c", FETCH, str(shared), mirror.url],
                                   stdout=subprocess.PIPE, text=True) for _ in range(2)]
        paths = [agent.communicate(timeout=120)[0].strip() for agent in agents]
        assert [agent.returncode for agent in agents] == [0, 0]
        assert mirror.sent == size  # once, not once per node
    assert paths[0] == paths[1]
    assert [r.source for r in fetches.records(shared)] == ["acme/tiny"]


def test_a_filesystem_that_refuses_flock_fails_the_fetch_with_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lustre mounted without ``-o flock`` answers ENOSYS (a stand-in here: no Lustre)."""
    import errno
    import fcntl

    from llmgw.spec import sources

    def refuse(handle: object, operation: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", refuse)
    with pytest.raises(fetches.FetchError, match="mount with -o flock") as caught:
        fetches.fetch(sources.parse("acme/tiny"), tmp_path, endpoint="http://127.0.0.1:9")
    assert not caught.value.retry


def test_an_agent_waiting_for_another_nodes_fetch_says_so(tmp_path: Path) -> None:
    """While another node holds the fetch's lock, the unit's detail says what it waits for;
    once that fetch is done, this one reuses it and moves no byte."""
    import fcntl
    import threading
    import time

    from llmgw.agent import fetchers
    from llmgw.spec import sources

    root = tmp_path / "mirror" / "hub"
    caches.add(root, "acme/tiny", tiny_model(tmp_path / "tiny"))
    shared = tmp_path / "filer" / "models"
    source = sources.parse("acme/tiny")
    with serving(root) as mirror:
        fetches.fetch(source, shared, endpoint=mirror.url)  # the other node's, done
        sent = mirror.sent
        locks = shared / ".llmgw" / "locks" / f"{fetches.record_id(source)}.lock"
        progress = fetches.Progress("weights", source.text)
        with locks.open("w") as other:
            fcntl.flock(other, fcntl.LOCK_EX)  # the other node is still at it
            worker = threading.Thread(target=fetches.fetch, args=(source, shared),
                                      kwargs={"endpoint": mirror.url, "progress": progress})
            worker.start()
            deadline = time.monotonic() + 30
            while not progress.waiting and time.monotonic() < deadline:
                time.sleep(0.01)
            assert fetchers.describe(progress).startswith(
                f"waiting for another fetch of acme/tiny into {shared}")
            fcntl.flock(other, fcntl.LOCK_UN)
        worker.join(30)
        assert progress.state == "done" and progress.waiting == ""
        assert mirror.sent == sent
