"""`make run`'s model, fetched: the real engine serves Gemma from a repo on a local mirror.

The same cluster as ``make run`` (``cluster.example/local``) with the source
changed from a path to ``google/gemma-3-270m-it-GGUF:Q4_K_M`` and
``cluster.weights.endpoint`` pointing at ``llmgw mirror serve`` (a real
subprocess over a directory filled with ``llmgw mirror add``). The agent
fetches into an empty weights directory, then llama-server starts from the
local snapshot path with HF_HUB_OFFLINE=1 and answers through the router.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support import nodes
from test_real_engine import MODEL, ROOT, daemon, engine_processes, wait_status  # noqa: F401

from llmgw.cli.main import main

REPO = "google/gemma-3-270m-it-GGUF"


@pytest.fixture
def mirror(tmp_path: Path) -> Any:
    directory = tmp_path / "mirror"
    subprocess.run([sys.executable, "-m", "llmgw", "mirror", "add", str(directory), REPO,
                    str(MODEL)], check=True, timeout=120)
    port = nodes.free_port()
    process = subprocess.Popen([sys.executable, "-m", "llmgw", "mirror", "serve", str(directory),
                                "--listen", f"127.0.0.1:{port}"])
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            httpx.get(f"{url}/api/models/{REPO}", timeout=2)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield url
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture
def local_cluster(tmp_path: Path, mirror: str) -> Path:
    """make run's cluster, its model a repo on the mirror, its weights directory empty."""
    directory = tmp_path / "local"
    directory.mkdir()
    text = (ROOT / "cluster.example" / "local" / "cluster.yaml").read_text()
    for name, default in (("router", 8000), ("admin", 8001), ("metrics", 9400)):
        text = text.replace(f"{name}: 127.0.0.1:{default}",
                            f"{name}: 127.0.0.1:{nodes.free_port()}")
    text = text.replace("    address: local\n", "    address: local\n"
                        f"    engine_ports_from: {nodes.free_ports(32)}\n")
    text = text.replace("../../.cache/models/gemma3-270m-q4_k_m.gguf", f"{REPO}:Q4_K_M")
    text = text.replace("../../.cache/models", f"{tmp_path}/weights")
    text = text.replace("../../.cache/local/", f"{tmp_path}/state/")
    text = text.replace("  auth: none", f"  auth: none\n  weights: {{endpoint: {mirror}}}")
    (directory / "cluster.yaml").write_text(text)
    return directory


def test_the_real_engine_serves_weights_fetched_from_the_mirror(
    daemon: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
) -> None:
    assert REPO in (daemon["dir"] / "cluster.yaml").read_text()
    wait_status(daemon, lambda s: any(r["state"] == "ready" for r in s["replicas"]),
                "the fetched model to be ready", timeout=300)
    weights = tmp_path / "weights"
    (pid, argv), = ((p, a) for p, a in engine_processes().items() if str(weights) in " ".join(a))
    path = argv[argv.index("--model") + 1]
    assert path.startswith(f"{weights}/hub/models--google--gemma-3-270m-it-GGUF/snapshots/")
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"HF_HUB_OFFLINE=1" in environ
    client = openai.OpenAI(base_url=f"{daemon['router']}/v1", api_key="unused",
                           max_retries=0)
    completion = client.completions.create(model="gemma3-270m",
                                           prompt="The capital of France is", max_tokens=8)
    assert completion.choices[0].text.strip()
    assert main(["weights", "list", "--cluster", str(daemon["dir"])]) == 0
    listing = capsys.readouterr().out
    assert f"{REPO}:Q4_K_M  253 MB" in listing and "used by: llmgw-gemma3-270m-r0-s0" in listing
    assert main(["weights", "reclaim", "--cluster", str(daemon["dir"])]) == 0
    assert "keep google/gemma-3-270m-it-GGUF:Q4_K_M (used by" in capsys.readouterr().out
