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
