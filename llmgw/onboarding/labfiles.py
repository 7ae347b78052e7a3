"""The cluster files ``llmgw lab up`` writes: text with comments, as a person would write them.

Pure functions of the lab's nodes. Every value that does not come from this
module (the user name, paths) is written as a JSON string, which YAML reads
back as exactly that string, whatever it holds.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from llmgw.discovery import gpus
from llmgw.onboarding.simnodes import HARDWARE, fixture_settings
from llmgw.spec.quantities import count

if TYPE_CHECKING:
    from llmgw.onboarding.labs import LabNode


def declared_gpus(hardware: str) -> list[tuple[str, int]]:
    """``[(class, count)]`` from the fixture's recorded nvidia-smi output."""
    recorded = HARDWARE / hardware / "query-gpu.csv"
    if not recorded.exists():
        return []
    counts: dict[str, int] = {}
    for record in gpus.parse_query(recorded.read_text()).gpus:
        name = gpus.class_of(record)
        counts[name] = counts.get(name, 0) + 1
    return list(counts.items())


def declared_fabrics(hardware: str) -> dict[str, dict[str, Any]]:
    """The fabrics the fixture's own agent.yaml declares: name → {kind, adapters}."""
    fabrics: dict[str, dict[str, Any]] = fixture_settings(hardware)["declared"].get(
        "fabrics", {})
    return fabrics


def describe(hardware: str) -> str:
    """``8× h100-80g, ib-a (4 adapters)`` for a fixture kind."""
    parts = [", ".join(f"{n}× {c}" for c, n in declared_gpus(hardware)) or "CPU only"]
    parts += [f"{name} ({count(len(f.get('adapters') or []), 'adapter')})"
              for name, f in declared_fabrics(hardware).items()]
    return ", ".join(parts)


# The lab's listeners unless another program holds one (labs.choose_ports).
LISTENERS = (("router", 8000), ("admin", 8001), ("metrics", 9400))


def cluster_yaml(user: str, identity_file: str, nodes: list[LabNode],
                 listeners: tuple[tuple[str, int], ...] = LISTENERS) -> str:
    fabrics: dict[str, str] = {}
    for node in nodes:
        for name, fabric in declared_fabrics(node.hardware).items():
            fabrics.setdefault(name, str(fabric["kind"]))
    fabric_lines = "".join(f"  {name}: {{kind: {kind}}}\n" for name, kind in fabrics.items())
    listener_lines = "".join(f"    {name}: 127.0.0.1:{port}\n" for name, port in listeners)
    return f"""\
# A lab: simulated nodes on this machine, started by `llmgw lab up` and
# stopped by `llmgw lab down`. Each is a real sshd on 127.0.0.1 with an llmgw
# agent behind it that reports fixture hardware (no real GPU is used).
cluster:
  name: lab
  ssh:
    user: {json.dumps(user)}   # the lab's sshd runs as you; on real nodes: see docs/install.md
    known_hosts: known_hosts   # every node's host key, pinned by `llmgw lab up`
    identity_file: {json.dumps(identity_file)}   # the lab's own client key
    connect_timeout: 5s
  sync: manual                 # the daemon plans; people run `llmgw apply`
  drift_interval: 15s
  listeners:
{listener_lines}  store:
    path: state/llmgw.db       # API keys (hashed) and usage rows; kept out of git
  state_dir: ../.llmgw-lab     # the daemon's admin.token: outside the cluster directory
  auth: keys                   # every request needs a key from `llmgw keys create`
{chr(10) + "fabrics:" + chr(10) + fabric_lines if fabric_lines else ""}
projects:
  research: {{budget_usd: 500}}
  product: {{budget_usd: 5000}}
  interns: {{budget_usd: 50}}
"""


def nodes_yaml(nodes: list[LabNode], runtime: str) -> str:
    lines = [
        "# The lab's nodes. On real machines `address` is the host, and ssh_port,",
        "# agent_socket and engine_ports_from need no mention: the simulated nodes",
        "# share one machine's ports and each has its own agent socket.",
        "nodes:",
    ]
    for node in nodes:
        lines += [
            f"  {node.name}:",
            "    address: 127.0.0.1",
            f"    ssh_port: {node.port}",
            f"    agent_socket: {json.dumps(f'{runtime}/{node.name}/agent.sock')}",
            f"    engine_ports_from: {node.engine_ports_from}",
            f"    weights_dirs: [{json.dumps(f'{runtime}/models')}]   # path sources come "
            "from here only",
        ]
        declared = declared_gpus(node.hardware)
        if declared:
            items = ", ".join(f"{{class: {c}, count: {n}}}" for c, n in declared)
            lines.append(f"    gpus: [{items}]")
        fabrics = declared_fabrics(node.hardware)
        if fabrics:
            lines.append("    fabrics:")
            for name, fabric in fabrics.items():
                adapters = ", ".join(str(a) for a in fabric.get("adapters") or [])
                lines.append(f"      {name}: [{adapters}]")
    return "\n".join(lines) + "\n"


def enrolled_nodes_yaml() -> str:
    """nodes.yaml before ``node add`` enrolls the lab's nodes (``lab up --account``)."""
    return ("# The lab's nodes, as `llmgw node add` wrote them. On real machines `address`\n"
            "# is the host, and ssh_port and engine_ports_from need no mention: the\n"
            "# simulated nodes share one machine's ports.\n"
            "nodes: {}\n")


def models_yaml(source: str | None) -> str:
    if source is None:
        return ("# No model yet: `llmgw lab up` found no llama-server and Gemma 3 270M GGUF\n"
                "# (`make engine model` in an llmgw checkout builds both).\n"
                "models: {}\n")
    return f"""\
# Gemma 3 270M (Q4_K_M, 253 MB) on the CPU node, served by llama.cpp's
# llama-server. The source is a path on the node; `../` is relative to this
# directory.
models:
  gemma3-270m:
    source: {json.dumps(source)}
    scaling: {{min: 1, max: 1}}
    pricing: {{input_per_mtok: 0.10, output_per_mtok: 0.40}}
    profiles:
      - engine: llama.cpp
        cpu: true
        min_memory_gb: 1
        args: {{ctx-size: 2048, threads: 1, parallel: 1, no-jinja: true, chat-template: gemma}}
"""
