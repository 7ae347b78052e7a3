"""A path source resolves, symlinks followed, into the node's weights_dirs, or its unit
does not start (issue 23: a cluster file pointed llama-server at /etc/passwd, and the
engine's error line, which plans quote, showed the file's first bytes)."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_support import node_settings, served_agent, short_dir, unit_name, unit_text

from llmgw.agent import confines, servers
from llmgw.discovery.fabrics import Declaration
from llmgw.proto.conversions import UnitChange
from llmgw.transport.agent_client import AgentClient

SECRET = "root:x:0:0:secret-first-bytes"


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def layout(root: Path) -> Path:
    """``root/models`` with a real file, links in and out, and a secret outside it."""
    models, outside, disk = root / "models", root / "etc", root / "disk"
    for directory in (models, outside, disk):
        directory.mkdir()
    (outside / "passwd").write_text(SECRET)
    (models / "real.gguf").write_text("GGUF")
    (models / "inner.gguf").symlink_to(models / "real.gguf")
    (models / "passwd.gguf").symlink_to(outside / "passwd")
    (models / "etc").symlink_to(outside)
    (disk / "m.gguf").write_text("GGUF")
    (root / "linked").symlink_to(disk)
    return models


@pytest.mark.parametrize(("path", "dirs", "refused"), [
    pytest.param("models/real.gguf", ["models"], False, id="a-file-inside"),
    pytest.param("models/inner.gguf", ["models"], False, id="a-link-inside-to-inside"),
    pytest.param("models/missing.gguf", ["models"], False, id="missing-the-engine-says-so"),
    pytest.param("linked/m.gguf", ["linked"], False, id="the-weights-dir-is-itself-a-link"),
    pytest.param("models/passwd.gguf", ["models"], True, id="a-link-out"),
    pytest.param("models/etc/passwd", ["models"], True, id="a-linked-directory-out"),
    pytest.param("etc/passwd", ["models", "disk"], True, id="outside-every-dir"),
    pytest.param("etc/passwd", [], True, id="no-weights-dirs-serves-no-path"),
    pytest.param("models/m.gguf", [], True, id="no-weights-dirs-not-even-a-model"),
])
def test_a_path_resolves_into_the_weights_dirs(
    root: Path, path: str, dirs: list[str], refused: bool,
) -> None:
    layout(root)
    why = confines.refusal(str(root / path), [str(root / d) for d in dirs])
    assert (why is not None) == refused, why
    if why is not None:
        wanted = "declares no weights_dirs" if not dirs else "outside this node's weights_dirs"
        assert wanted in why and SECRET not in why


def change_for(source: str, model: str = "m1", adapters: list[str] | None = None) -> UnitChange:
    doc: dict[str, object] = {"v": 1, "source": source}
    if adapters is not None:
        doc["adapters"] = adapters
    spec = json.dumps(doc, separators=(",", ":"))
    text = unit_text(model).replace('X-Llmgw-Spec={"v":1}', f"X-Llmgw-Spec={spec}")
    return UnitChange(unit_name(model), text)


def client_of(root: Path) -> contextlib.AbstractAsyncContextManager[
        tuple[servers.Agent, AgentClient]]:
    return served_agent(node_settings("cpu-only", root))


async def test_the_agent_refuses_a_unit_whose_source_links_out(root: Path) -> None:
    models = layout(root)
    async with client_of(root) as (agent, client):
        # The daemon's declaration, sent with each report, is what the agent confines to.
        await client.report(Declaration("cpu-01", (), (str(models),)))
        [refused] = await client.apply_units([change_for(str(models / "passwd.gguf"))])
        assert not refused.ok and not refused.changed
        assert refused.error == (
            f"refused: {models / 'passwd.gguf'} (a link to {root / 'etc' / 'passwd'}) is "
            f"outside this node's weights_dirs ({models}); an engine serves only files under "
            "them")
        assert [u.name for u in await agent.monitor.refresh()] == [], "nothing started"
        [started] = await client.apply_units([change_for(str(models / "inner.gguf"), "m2")])
        assert started.ok and started.changed, started
        assert [u.name for u in await agent.monitor.refresh()] == [unit_name("m2")]


@pytest.mark.parametrize(("adapters", "refused"), [
    pytest.param(["models/inner.gguf"], None, id="an-adapter-inside"),
    pytest.param(["models/real.gguf", "models/passwd.gguf"], "models/passwd.gguf",
                 id="an-adapter-links-out"),
    pytest.param(["etc/passwd"], "etc/passwd", id="an-adapter-outside"),
])
def test_a_lora_adapter_resolves_into_the_weights_dirs_too(
        root: Path, adapters: list[str], refused: str | None) -> None:
    """An adapter is a file the engine opens as well (llama.cpp --lora-scaled, vLLM
    --lora-modules): the same confinement as the model's own source."""
    models = layout(root)
    change = change_for(str(models / "real.gguf"),
                        adapters=[str(root / a) for a in adapters])
    why = confines.refused(change, [str(models)])
    if refused is None:
        assert why is None
    else:
        assert why is not None and str(root / refused) in why and SECRET not in why
        assert "outside this node's weights_dirs" in why


def test_an_adapter_that_is_not_a_path_is_refused(root: Path) -> None:
    models = layout(root)
    why = confines.refused(change_for(str(models / "real.gguf"), adapters=["org/lora"]),
                           [str(models)])
    assert why == "refused: the LoRA adapter 'org/lora' is not a path on this node"
