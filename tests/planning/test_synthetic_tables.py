"""Findings against synthetic flag tables: versions that lack an option, or declare choices.

No shipped table lacks an option llmgw renders on some rank, or declares
choices for one llmgw sets from the placement, so the shipped tables cannot
show that :func:`launches.findings` renders *every* rank of a profile (rank 0
and a follower, each with its own options) with the placeholder placement it
names in its messages. These tests write tables that do, built from a real
one with options removed or restricted, and load them in place of the shipped
ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from llmgw.engines import launches, profiles, tables
from llmgw.engines.launches import Launch
from llmgw.spec.models import Cluster, Profile

# (engine, base version, synthetic version, options to drop, choices to declare)
Write = Callable[..., str]


@pytest.fixture
def synthetic(tmp_path: Path) -> Iterator[Write]:
    """Write synthetic tables; while the test runs they are the only tables there are."""

    def write(engine: str, base: str, version: str = "9.0.0", *, drop: tuple[str, ...] = (),
              choices: Mapping[str, list[str]] | None = None) -> str:
        data = json.loads((shipped / f"{engine}-{base}.json").read_text())
        data["version"] = version
        for name in drop:
            del data["options"][name]
        for name, allowed in (choices or {}).items():
            data["options"][name]["choices"] = allowed
        (tmp_path / f"{engine}-{version}.json").write_text(json.dumps(data))
        return version

    shipped = tables.DIRECTORY
    tables.DIRECTORY = tmp_path
    tables.available.cache_clear()
    tables.load.cache_clear()
    try:
        yield write
    finally:
        tables.DIRECTORY = shipped
        tables.available.cache_clear()
        tables.load.cache_clear()


def _profile(**fields: Any) -> Profile:
    return Profile.model_validate({"gpu_class": "h100-80g", **fields})


def _found(profile: Profile, *args: Any) -> list[tuple[tuple[str, ...], str]]:
    return [(f.where, f.message) for f in launches.findings(profile, *args)]


# Every option llmgw sets from the placement, restricted to a choice no placement has:
# each finding then names the value findings() rendered, on the rank that rendered it.
PLACED = ["--served-model-name", "--download-dir", "--node-rank", "--master-addr",
          "--master-port", "--host", "--port"]


def _not(name: str, value: str, label: str) -> str:
    return f"llmgw renders {name}, but {name} {value!r} is not one of {label}'s choices: x"


def test_every_rank_of_a_vllm_profile_is_checked_with_its_placement(synthetic: Write) -> None:
    """Rank 0 serves HTTP (--host, --port), the follower is --headless: both are walked."""
    version = synthetic("vllm", "0.33.0", drop=("--headless",),
                        choices={name: ["x"] for name in PLACED})
    label = f"vLLM {version}"
    where = ("engine_version",)
    found = _found(_profile(engine="vllm", engine_version=version, nodes=2, tensor_parallel=2))
    assert found == [
        (where, _not("--served-model-name", "model", label)),
        (where, _not("--download-dir", "/models", label)),
        (where, _not("--node-rank", "0", label)),
        (where, _not("--master-addr", "10.0.0.1", label)),
        (where, _not("--master-port", "18001", label)),
        (where, _not("--host", "0.0.0.0", label)),
        (where, _not("--port", "18000", label)),
        # rank 1: what it renders that rank 0 did not
        (where, _not("--node-rank", "1", label)),
        (where, f"llmgw renders --headless, but {label} has no option --headless; a flag "
                "newer than llmgw's table goes under unchecked_args"),
    ]


def test_a_single_node_profile_is_checked_as_rank_0_only(synthetic: Write) -> None:
    version = synthetic("vllm", "0.33.0", choices={"--port": ["x"], "--host": ["x"]})
    label = f"vLLM {version}"
    found = _found(_profile(engine="vllm", engine_version=version))
    assert found == [(("engine_version",), _not("--host", "0.0.0.0", label)),
                     (("engine_version",), _not("--port", "18000", label))]


def test_an_sglang_follower_is_checked_with_its_health_server_port(synthetic: Write) -> None:
    """Ranks above 0 bind SGLang's placeholder health server on loopback, on their own port."""
    version = synthetic("sglang", "0.5.23", choices={
        name: ["x"] for name in ("--model-path", "--host", "--port", "--dist-init-addr")})
    label = f"SGLang {version}"
    where = ("engine_version",)
    found = _found(_profile(engine="sglang", engine_version=version, nodes=2,
                            tensor_parallel=2), "org/weights")
    assert found == [
        (where, _not("--model-path", "org/weights", label)),
        (where, _not("--dist-init-addr", "10.0.0.1:18001", label)),
        (where, _not("--host", "0.0.0.0", label)),
        (where, _not("--port", "18000", label)),
        (where, _not("--host", "127.0.0.1", label)),
        (where, _not("--port", "18002", label)),
    ]


def test_the_profile_source_is_what_is_checked(synthetic: Write) -> None:
    """problems() renders the profile's own source; without one, a repository id."""
    version = synthetic("sglang", "0.5.23", drop=("--download-dir",),
                        choices={"--model-path": ["x"]})
    label = f"SGLang {version}"
    no_download_dir = (f"llmgw renders --download-dir, but {label} has no option "
                       "--download-dir; a flag newer than llmgw's table goes under "
                       "unchecked_args")
    from_hub = _profile(engine="sglang", engine_version=version)
    assert launches.problems(from_hub) == [_not("--model-path", "org/model", label),
                                           no_download_dir]
    assert [m for _, m in _found(from_hub)] == launches.problems(from_hub)
    # Weights on the node's disk: no --download-dir to render, so nothing to say about it.
    on_disk = _profile(engine="sglang", engine_version=version, source="/weights/qwen")
    assert launches.problems(on_disk) == [_not("--model-path", "/weights/qwen", label)]


def test_a_profile_without_engine_version_is_told_at_engine(synthetic: Write) -> None:
    """With no version to blame, a rendered option the newest table lacks is about `engine`."""
    version = synthetic("vllm", "0.33.0", drop=("--download-dir",))
    found = _found(_profile(engine="vllm"))
    assert found == [(("engine",), f"llmgw renders --download-dir, but vLLM {version} has no "
                      "option --download-dir; a flag newer than llmgw's table goes under "
                      "unchecked_args")]


def test_a_short_user_flag_is_blamed_on_its_key(synthetic: Write) -> None:
    """`fa` renders as llama.cpp's -fa; a bad value for it is the user's key, not llmgw's."""
    version = synthetic("llama.cpp", "11434.0.0", "11500.0.0",
                        choices={"-fa": ["on", "off", "auto"]})
    profile = _profile(engine="llama.cpp", gpu_class="l4-22g", engine_version=version,
                       args={"fa": "maybe"})
    assert _found(profile) == [(("args", "fa"), "args.fa: -fa 'maybe' is not one of llama.cpp "
                                f"{version}'s choices: on, off, auto")]


def _launch(profile: Profile) -> Launch:
    return Launch(model="m", served_name="m", source="org/model", profile=profile, rank=0,
                  bind_host="0.0.0.0", port=18000, gpu_uuids=("GPU-a",), gpu_indices=(0,))


def test_only_a_reserved_name_is_reserved() -> None:
    """Dashes are stripped from a key before it is compared; nothing else is."""
    profile = _profile(engine="vllm", engine_version="0.33.0", args={"Xport": 1},
                       unchecked_args={"Xhost": "a", "--port": False})
    built, found = launches.build(_launch(profile))
    assert [(f.where, f.message) for f in found] == [
        (("unchecked_args", "--port"),
         "unchecked_args.--port is set by llmgw (it allocates ports); remove it"),
        (("args", "Xport"), "args.Xport: vLLM 0.33.0 has no option --Xport; a flag newer "
                            "than llmgw's table goes under unchecked_args"),
    ]
    assert built.argv[-4:] == ("--Xport", "1", "--Xhost", "a")


def test_the_spec_check_addresses_each_profile_and_its_source(synthetic: Write) -> None:
    """profiles.check renders each profile with its own source, else its model's, else a
    repository id; the nodes finding is llmgw.spec.checks' to report, the others still come."""
    version = synthetic("sglang", "0.5.23", choices={"--model-path": ["x"]})
    synthetic("llama.cpp", "11434.0.0", "11500.0.0")
    sglang = {"engine": "sglang", "engine_version": version, "gpu_class": "h100-80g"}
    cluster = Cluster.model_validate({
        "cluster": {"name": "lab"},
        "nodes": {"g1": {"address": "10.0.0.1"}},
        "models": {
            "a": {"source": "org/a", "profiles": [sglang, {**sglang, "source": "org/b"}]},
            "b": {"profiles": [
                {"engine": "llama.cpp", "gpu_class": "l4-22g", "nodes": 2,
                 "tensor_parallel": 2, "dtype": "bfloat16"}, sglang]},
        },
    })
    label = f"SGLang {version}"
    assert [(p.path, p.message) for p in profiles.check(cluster)] == [
        (("models", "a", "profiles", 0, "engine_version"),
         "models.a.profiles[0]: " + _not("--model-path", "org/a", label)),
        (("models", "a", "profiles", 1, "engine_version"),
         "models.a.profiles[1]: " + _not("--model-path", "org/b", label)),
        (("models", "b", "profiles", 0, "dtype"),
         "models.b.profiles[0]: dtype does not apply to llama.cpp (a GGUF file carries its own "
         "quantization); pass llama-server flags under args"),
        (("models", "b", "profiles", 1, "engine_version"),
         "models.b.profiles[1]: " + _not("--model-path", "org/model", label)),
    ]


def test_an_engine_without_any_table_is_named_as_people_write_it(synthetic: Write) -> None:
    with pytest.raises(tables.VersionError, match="^no flag tables for vLLM$"):
        tables.select("vllm", "0.33.0")
