"""A real `llmgw mirror` aiohttp server in a background thread, and small real repos."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aiohttp import web

from llmgw.cli import mirror_cmd
from llmgw.hub import caches, mirrors

ROOT = Path(__file__).parents[2]
GEMMA = ROOT / ".cache" / "models" / "gemma3-270m-q4_k_m.gguf"
GEMMA_REPO = "google/gemma-3-270m-it-GGUF"


def tiny_safetensors(path: Path, tensors: int = 4, size: int = 256 * 1024) -> None:
    """A real safetensors file: JSON header, then each tensor's float32 bytes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for index in range(tensors):
        header[f"layer.{index}.weight"] = {"dtype": "F32", "shape": [size // 4],
                                           "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        for index in range(tensors):
            handle.write(bytes([index % 251]) * size)


def tiny_model(directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    tiny_safetensors(directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden": 64}))
    return {"model.safetensors": directory / "model.safetensors",
            "config.json": directory / "config.json"}


class Mirror:
    def __init__(self, application: web.Application, port: int,
                 runner: web.AppRunner) -> None:
        self.app = application
        self.url = f"http://127.0.0.1:{port}"
        self._runner = runner

    @property
    def connections(self) -> int:
        """Client connections the server holds open now."""
        server = self._runner.server
        return len(server.connections) if server is not None else 0

    @property
    def sent(self) -> int:
        return self.app[mirrors.SENT].bytes_sent


@contextmanager
def serving(root: Path, token: str = "", max_rate: float = 0.0,
            header_timeout: float = mirror_cmd.HEADER_TIMEOUT,
            send_stall: float = mirrors.SEND_STALL) -> Iterator[Mirror]:
    """`llmgw mirror serve`'s application over ``root`` (a hub cache), on a free port,
    on the connections `llmgw mirror serve` runs it on."""
    application = mirrors.app(root, token=token, max_rate=max_rate, send_stall=send_stall)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, object] = {}

    async def start() -> None:
        runner = await mirror_cmd.start(application, "127.0.0.1", 0,
                                        header_timeout=header_timeout)
        box["runner"] = runner
        box["port"] = runner.addresses[0][1]
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()),
                                              loop.run_forever()), daemon=True)
    thread.start()
    started.wait(30)
    try:
        yield Mirror(application, int(box["port"]), box["runner"])  # type: ignore[call-overload, arg-type]
    finally:
        runner = box["runner"]
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)  # type: ignore[attr-defined]
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def gemma_repo(root: Path, extra: dict[str, Path] | None = None) -> str:
    """The gemma GGUF (and ``extra`` files) as a repo in the hub cache ``root``."""
    return caches.add(root, GEMMA_REPO, {"gemma-3-270m-it-Q4_K_M.gguf": GEMMA, **(extra or {})})
