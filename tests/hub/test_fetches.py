"""Fetching with the real huggingface_hub client from a real local hub-compatible server.

The server is `llmgw mirror serve`'s aiohttp application over a hub cache
holding the gemma GGUF (253 MB) and a tiny safetensors model written here.
Bytes moved are measured at the server.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mirror_support import GEMMA, GEMMA_REPO, gemma_repo, serving, tiny_model

from llmgw.discovery import weights
from llmgw.hub import caches, fetches, reclaims
from llmgw.spec import sources

pytestmark = pytest.mark.skipif(not GEMMA.exists(), reason="run `make model` (make test does)")
GGUF = f"{GEMMA_REPO}:Q4_K_M"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def test_the_hub_client_itself_downloads_from_the_mirror(tmp_path: Path) -> None:
    root = tmp_path / "mirror" / "hub"
    commit = caches.add(root, "acme/tiny", tiny_model(tmp_path / "tiny"))
    with serving(root) as mirror:
        env = {**os.environ, "HF_ENDPOINT": mirror.url, "HF_HUB_CACHE": str(tmp_path / "c"),
               "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        out = subprocess.run([sys.executable, "-c", (
            "from huggingface_hub import snapshot_download, hf_hub_download\n"
            "print(snapshot_download('acme/tiny'))\n"
            "print(hf_hub_download('acme/tiny', 'config.json', revision='main'))\n")],
            env=env, capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert out[0].endswith(f"snapshots/{commit}")
    assert sha256(Path(out[0]) / "model.safetensors") == sha256(tmp_path / "tiny" /
                                                                "model.safetensors")
    # What the client wrote is complete weights to discovery.
    found = weights.find([str(tmp_path / "c")])
    assert [w.format for w in found.weights] == ["safetensors"]


def test_fetch_selects_one_quantisation_verifies_and_reuses(tmp_path: Path) -> None:
    root = tmp_path / "mirror" / "hub"
    gemma_repo(root, tiny_model(tmp_path / "tiny"))
    node = tmp_path / "node"
    with serving(root) as mirror:
        done = fetches.fetch(sources.parse(GGUF), node, endpoint=mirror.url)
        assert mirror.sent == GEMMA.stat().st_size  # the GGUF only, not the whole repo
        again = fetches.fetch(sources.parse(GGUF), node, endpoint=mirror.url)
        assert mirror.sent == GEMMA.stat().st_size  # present: nothing moves
    assert again.path == done.path and done.path.endswith(".gguf")
    assert sha256(Path(done.path)) == sha256(GEMMA)
    assert "/hub/models--google--gemma-3-270m-it-GGUF/snapshots/" in done.path
    found = weights.find([str(node)])
    assert [(w.format, w.size_bytes) for w in found.weights] == [("gguf", GEMMA.stat().st_size)]


def test_sigkill_mid_download_then_resume_moves_only_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "mirror" / "hub"
    gemma_repo(root)
    node = tmp_path / "node"
    size = GEMMA.stat().st_size
    with serving(root, max_rate=40e6) as mirror:
        code = (f"from llmgw.hub import fetches; from llmgw.spec import sources;"
                f"fetches.fetch(sources.parse({GGUF!r}), {str(node)!r}, endpoint={mirror.url!r})")
        child = subprocess.Popen([sys.executable, "-c", code])
        blobs = node / "hub" / caches.repo_dir(Path(), GEMMA_REPO).name / "blobs"
        deadline = time.monotonic() + 120
        partial = None
        while time.monotonic() < deadline:
            partial = next(iter(blobs.glob("*.incomplete")), None) if blobs.exists() else None
            if partial is not None and partial.stat().st_size > size // 4:
                break
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert partial is not None and partial.exists()
        kept = partial.stat().st_size
        assert 0 < kept < size
        assert fetches.present(sources.parse(GGUF), node) is None  # never reported partial
        assert not weights.find([str(node)]).weights
        before = mirror.sent
        progress = fetches.Progress("weights", GGUF)
        done = fetches.fetch(sources.parse(GGUF), node, endpoint=mirror.url, progress=progress)
        moved = mirror.sent - before
    assert moved == size - kept == progress.bytes_transferred
    assert sha256(Path(done.path)) == sha256(GEMMA)


def test_a_corrupted_byte_is_caught_and_fetched_again(tmp_path: Path) -> None:
    root = tmp_path / "mirror" / "hub"
    gemma_repo(root)
    node = tmp_path / "node"
    remote_etag = sha256(GEMMA)
    blobs = node / "hub" / caches.repo_dir(Path(), GEMMA_REPO).name / "blobs"
    blobs.mkdir(parents=True)
    # A partial download whose bytes went bad on disk.
    with GEMMA.open("rb") as handle:
        data = bytearray(handle.read(10_000_000))
    data[5_000_000] ^= 0xFF
    (blobs / f"{remote_etag}.incomplete").write_bytes(bytes(data))
    with serving(root) as mirror:
        done = fetches.fetch(sources.parse(GGUF), node, endpoint=mirror.url)
        # The resumed bytes failed the sha256; the whole file came again.
        assert mirror.sent == GEMMA.stat().st_size * 2 - len(data)
    assert sha256(Path(done.path)) == remote_etag


def test_a_source_serving_other_bytes_than_it_lists_fails_with_the_reason(
    tmp_path: Path,
) -> None:
    root = tmp_path / "mirror" / "hub"
    caches.add(root, "acme/tiny", tiny_model(tmp_path / "tiny"))
    blob = next(p for p in (root / "models--acme--tiny" / "blobs").iterdir() if len(p.name) == 64)
    raw = bytearray(blob.read_bytes())
    raw[-1] ^= 1
    blob.write_bytes(bytes(raw))
    with serving(root) as mirror, pytest.raises(fetches.FetchError, match="sha256 mismatch"):
        fetches.fetch(sources.parse("acme/tiny"), tmp_path / "node", endpoint=mirror.url)
    assert fetches.present(sources.parse("acme/tiny"), tmp_path / "node") is None
    assert not list((tmp_path / "node" / "hub").rglob("snapshots/*/model.safetensors"))


def test_gated_repos_need_the_token(tmp_path: Path) -> None:
    root = tmp_path / "mirror" / "hub"
    caches.add(root, "acme/tiny", tiny_model(tmp_path / "tiny"))
    with serving(root, token="s3cret") as mirror:
        with pytest.raises(fetches.FetchError, match="401"):
            fetches.fetch(sources.parse("acme/tiny"), tmp_path / "node", endpoint=mirror.url)
        done = fetches.fetch(sources.parse("acme/tiny"), tmp_path / "node",
                             endpoint=mirror.url, token="s3cret")
    assert Path(done.path, "config.json").is_file()


def test_too_little_disk_is_refused_before_a_byte_moves(tmp_path: Path) -> None:
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    with pytest.raises(fetches.FetchError, match=rf"needs .*free in {tmp_path}"):
        fetches.check_space(tmp_path, free, 0.05)
    fetches.check_space(tmp_path, 1024, 0.05)


def test_reclaim_removes_only_unused_fetches_never_foreign_files(tmp_path: Path) -> None:
    root = tmp_path / "mirror" / "hub"
    gemma_repo(root)
    caches.add(root, "acme/tiny", tiny_model(tmp_path / "tiny"))
    node = tmp_path / "node"
    foreign = node / "hub" / "models--someone--else" / "blobs" / "x.gguf"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"not llmgw's")
    by_hand = node / "by-hand.gguf"
    by_hand.write_bytes(b"an operator's file")
    with serving(root) as mirror:
        used = fetches.fetch(sources.parse(GGUF), node, endpoint=mirror.url)
        unused = fetches.fetch(sources.parse("acme/tiny"), node, endpoint=mirror.url)
    in_use = {GGUF: ["llmgw-gemma-r0-s0.service"]}
    dry = reclaims.reclaim(str(node), in_use, remove=False)
    assert {(r.source, r.removed, r.kept_because) for r in dry} == {
        (GGUF, False, "used by llmgw-gemma-r0-s0.service"), ("acme/tiny", False, "")}
    assert Path(unused.path, "model.safetensors").exists()  # a dry run removes nothing
    done = reclaims.reclaim(str(node), in_use, remove=True)
    freed = [r for r in done if r.removed]
    assert [r.source for r in freed] == ["acme/tiny"] and freed[0].size_bytes > 1_000_000
    assert not Path(unused.path).exists()
    assert fetches.present(sources.parse("acme/tiny"), node) is None
    assert fetches.present(sources.parse(GGUF), node) is not None
    assert sha256(Path(used.path)) == sha256(GEMMA)
    assert foreign.read_bytes() == b"not llmgw's" and by_hand.exists()


def test_an_url_source_is_fetched_verified_and_refused_when_its_hash_differs(
    tmp_path: Path,
) -> None:
    root = tmp_path / "mirror" / "hub"
    commit = gemma_repo(root)
    node = tmp_path / "node"
    with serving(root) as mirror:
        url = f"{mirror.url}/{GEMMA_REPO}/resolve/{commit}/gemma-3-270m-it-Q4_K_M.gguf"
        # The mirror is on loopback: a site lists such hosts (cluster.weights.allowed_hosts).
        done = fetches.fetch(sources.parse(f"{url}#sha256={sha256(GEMMA)}"), node,
                             allowed_hosts=("127.0.0.1",))
        wrong = sources.parse(f"{url}#sha256={'0' * 64}")
        with pytest.raises(fetches.FetchError, match="sha256 mismatch"):
            fetches.fetch(wrong, node, allowed_hosts=("127.0.0.1",))
    assert done.path.startswith(f"{node}/urls/") and done.path.endswith(".gguf")
    assert sha256(Path(done.path)) == sha256(GEMMA)
    assert fetches.present(wrong, node) is None
