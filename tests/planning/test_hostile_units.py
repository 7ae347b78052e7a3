"""No cluster string can change a unit's shape.

Arbitrary strings — CR, LF, every control character, DEL, C1 controls, the
Unicode line separators, ``%``, ``$``, quotes, backslashes, semicolons — go
into every cluster field that reaches a unit. Either the cluster is refused
by validation, or every rendered unit, read back with systemd's own rules
(``tests/support/systemd_syntax.py``, written independently of llmgw's
reader), holds exactly the keys the template writes and exactly the planned
argv, environment, env file and labels. The agent's reader (what the
supervise backend runs) must agree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pydantic
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from plan_builders import cluster_from, fleet_from
from support import systemd_syntax

from llmgw.agent import unitfiles
from llmgw.agent import units as agent_units
from llmgw.planning import plans
from llmgw.planning.types import Shard
from llmgw.proto.conversions import UnitChange
from llmgw.spec import identifiers

NOW = 1_700_000_000.0
NASTY = ["\r", "\n", "\r\n", "\x1b", "\x7f", "\x85", "\u2028", "\u2029", "\t", "\v",
         "%", "%n", "$", "${HOME}", "$$", '"', "'", "\\", "\\n", ";", " ", "=", "[Service]",
         "#", "ExecStartPre=/usr/bin/touch /tmp/p", "é"]

# Free text: anything (st.text() brings the rest of Unicode, NUL now and then).
hostile = st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=4)),
                   max_size=6).map("".join)


ATTACKS = ["interface", "adapter", "address", "served_name", "label_key", "flag", "variable",
           "path"]


@st.composite
def hostile_clusters(draw: st.DrawFn) -> dict[str, Any]:
    # Free text is always hostile; in half the examples one identifier field is too
    # (the others valid), so that both refusals and renders are common.
    attack = draw(st.one_of(st.none(), st.sampled_from(ATTACKS)))

    def field(kind: str, example: str) -> str:
        if kind == attack:
            return draw(hostile)
        if kind in identifiers.PATTERNS:
            return draw(st.one_of(st.just(example), st.from_regex(
                identifiers.PATTERNS[kind][0], fullmatch=True)))
        return example

    node = {
        "mgmt_interface": field("interface", "eth0"),
        "gpus": [{"class": "h100-80g", "count": 8}],
        "fabrics": {"ib-a": [field("adapter", "mlx5_0"), "mlx5_1"]},
        # The first is where fetches go; "/" lets every drawn path source be served.
        "weights_dirs": ["/" + draw(hostile), "/"],
        "labels": {field("label_key", "rack"): draw(hostile)},
    }
    profile: dict[str, Any] = {
        "engine": "vllm", "gpu_class": "h100-80g", "nodes": 2, "tensor_parallel": 8,
        "pipeline_parallel": 2, "multi_node": draw(st.sampled_from(["native", "ray"])),
        "dtype": draw(hostile) or None,
        "args": {field("flag", "max-model-len"): draw(hostile),
                 "chat-template": draw(hostile)},
        "env": {field("variable", "VLLM_LOG"): draw(hostile)},
        "secret_env": {"HF_TOKEN": field("path", "/") + draw(hostile)},
    }
    return {
        "fabrics": {"ib-a": {"kind": "infiniband"}},
        "nodes": {
            "gpu-01": {**node, "address": field("address", "10.0.0.1")},
            "gpu-02": {**node, "address": "gpu-02.lab.internal"},
            # "/": every path source the attacks draw may be served here.
            "cpu-01": {"address": field("address", "fd00::3"), "memory": "64GiB",
                       "weights_dirs": ["/"]},
        },
        "models": {
            "big": {"source": draw(hostile) or "org/big",
                    "served_name": field("served_name", "org/big:latest"),
                    "profiles": [profile]},
            "small": {"source": "/models/small.gguf",
                      "profiles": [{"engine": "llama.cpp", "cpu": True,
                                    "source": draw(hostile) or "/x",
                                    "args": {"ctx-size": draw(hostile)},
                                    "env": {"LLAMA_ARG": draw(hostile)}}]},
        },
    }


def rendered(data: dict[str, Any]) -> list[Shard] | None:
    """The rendered shards, or None when validation refuses the cluster."""
    try:
        cluster = cluster_from(data)
    except pydantic.ValidationError:
        return None
    plan = plans.plan(cluster, fleet_from(cluster, {}, [], NOW), NOW)
    return [s for change in plan.changes for s in change.shards]


def planned_argv(shard: Shard) -> list[str]:
    prelude = shard.spec.get("prelude")
    if not prelude:
        return list(shard.spec["argv"])
    from llmgw.rendering import quoting
    return quoting.shell_script([tuple(p) for p in prelude], tuple(shard.spec["argv"]))


def assert_faithful(shard: Shard) -> None:
    assert shard.files is not None
    unit = systemd_syntax.parse_unit(shard.files.unit_text)
    # Exactly the template's keys, each as often as the template writes it.
    assert set(unit.sections) == {"Unit", "Service"}
    assert unitfiles.shape_problems(unit.keys()) == []
    labels = dict(unit.sections["Unit"])
    expected_labels = {
        "X-Llmgw-Model": shard.model, "X-Llmgw-Replica": str(shard.replica),
        "X-Llmgw-Rank": str(shard.rank), "X-Llmgw-Digest": shard.digest,
    }
    if shard.port is not None:
        expected_labels["X-Llmgw-Port"] = str(shard.port)
        expected_labels["X-Llmgw-Served-Name"] = shard.spec["served_name"]
    assert {k: v for k, v in labels.items() if k.startswith("X-Llmgw-")
            and k != "X-Llmgw-Spec"} == expected_labels
    assert json.loads(labels["X-Llmgw-Spec"]) == dict(shard.spec)
    (exec_start,) = unit.values("Service", "ExecStart")
    assert systemd_syntax.exec_argv(exec_start) == planned_argv(shard)
    env = systemd_syntax.environment(unit.values("Service", "Environment"))
    assert env == shard.spec["env"]
    assert systemd_syntax.parse_env_file(shard.files.env_text) == shard.spec["user_env"]
    # The agent reads it the same way (the supervise backend runs what it reads).
    mine = unitfiles.parse(shard.unit, shard.files.unit_text)
    weights = {"LLMGW_WEIGHTS": systemd_syntax.WEIGHTS}  # the agent's one variable, unset
    assert unitfiles.expand(mine.value("Service", "ExecStart") or "", weights, shard.unit) \
        == planned_argv(shard)
    assert unitfiles.environment(mine) == shard.spec["env"]
    assert unitfiles.parse_env_file(shard.files.env_text) == shard.spec["user_env"]
    agent_units.check(UnitChange(name=shard.unit, unit_text=shard.files.unit_text,
                                 env_text=shard.files.env_text, action="start"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_clusters())
def test_no_cluster_string_changes_a_units_shape(data: dict[str, Any]) -> None:
    shards = rendered(data)
    event("refused by validation" if shards is None else f"{len(shards)} shards rendered")
    for shard in shards or []:
        assert_faithful(shard)


HOSTILE: dict[str, Any] = {
    "fabrics": {"ib-a": {"kind": "infiniband"}},
    "nodes": {
        "gpu-01": {"address": "10.0.0.1", "mgmt_interface": "eth0",
                   "gpus": [{"class": "h100-80g", "count": 8}], "fabrics": {"ib-a": ["mlx5_0"]},
                   "weights_dirs": ["/models/100% \"real\"\r\nExecStartPre=/bin/x"]},
        "gpu-02": {"address": "10.0.0.2", "mgmt_interface": "eth0",
                   "gpus": [{"class": "h100-80g", "count": 8}], "fabrics": {"ib-a": ["mlx5_0"]}},
        "cpu-01": {"address": "10.0.0.3", "memory": "64GiB", "weights_dirs": ["/models"]},
    },
    "models": {
        # A source holds no control characters (llmgw/spec/sources.py refuses them).
        "big": {"source": "org/big",
                "profiles": [{"engine": "vllm", "gpu_class": "h100-80g", "nodes": 2,
                              "tensor_parallel": 8, "pipeline_parallel": 2,
                              "multi_node": "ray",
                              "args": {"chat-template": "a\rExecStartPre=/bin/x %n $HOME ;"},
                              "env": {"NOTE": "one\rtwo\u2028three \"$x\" `y` \\"}}]},
        "small": {"source": "/models/small 100% $x \"q\";.gguf",
                  "profiles": [{"engine": "llama.cpp", "cpu": True,
                                "args": {"ctx-size": "\x1b[31m\x7f;\\"}}]},
    },
}


def test_hostile_strings_render_faithfully() -> None:
    shards = rendered(HOSTILE)
    assert shards is not None and len(shards) == 3
    for shard in shards:
        assert_faithful(shard)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed (make sysdeps)")
def test_systemd_analyze_verify_accepts_hostile_renders(tmp_path: Path) -> None:
    shards = rendered(HOSTILE)
    assert shards
    paths = []
    for shard in shards:
        assert shard.files is not None
        path = tmp_path / shard.unit
        path.write_text(shard.files.unit_text)
        paths.append(str(path))
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", *paths],
                            capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout == "", result.stderr + result.stdout
