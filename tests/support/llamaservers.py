"""The real llama-server for end-to-end tests: started, awaited until healthy, stopped.

``make engine model`` builds it into ``.cache``; tests skip on :data:`BUILT` without it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from support import nodes

ROOT = Path(__file__).parents[2]
ENGINE = ROOT / ".cache" / "engine" / "bin" / "llama-server"
MODEL = ROOT / ".cache" / "models" / "gemma3-270m-q4_k_m.gguf"
BUILT = ENGINE.exists() and MODEL.exists()
NOT_BUILT = "the real engine and model are not built: run `make engine model` (make test does)"


def start(argv: tuple[str, ...] | list[str], log: Path, env: dict[str, str] | None = None,
          bin_dir: Path = ENGINE.parent) -> subprocess.Popen[bytes]:
    """The engine ``argv``, its program found in ``bin_dir``, output to ``log``."""
    full = {**os.environ, **(env or {}),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=full)  # noqa: S603


def wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path,
                 timeout: float = 60) -> None:
    """Until ``url``/health answers 200; fails at once if the engine exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the engine exited:\n{log.read_text()[-3000:]}"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"engine not healthy in {timeout:g} s:\n{log.read_text()[-3000:]}")


def stop(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; reaped either way."""
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


@contextlib.contextmanager
def serving(log: Path, *args: str) -> Iterator[str]:
    """The test model served as ``gemma`` on a free loopback port, one thread; its URL.
    ``args``: more llama-server flags (``--parallel 2``, ``--no-jinja``)."""
    port = nodes.free_port()
    process = start([str(ENGINE), "--model", str(MODEL), "--alias", "gemma",
                     "--host", "127.0.0.1", "--port", str(port), "--n-gpu-layers", "0",
                     "--threads", "1", "--ctx-size", "2048", *args], log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process, log, timeout=120)
        yield url
    finally:
        stop(process)
