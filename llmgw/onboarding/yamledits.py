"""Round-trip edits of the cluster's YAML: a node added or removed, comments and order kept.

ruamel's round-trip mode keeps every comment, the key order and the flow
style of what is already there; only the node's own entry is written. The
result is returned with a unified diff for the operator to commit.

>>> new, diff = add_node("# fleet\\nnodes: {}\\n", "gpu-01", {"address": "10.0.0.1"})
>>> print(new, end="")
# fleet
nodes:
  gpu-01:
    address: 10.0.0.1
"""

from __future__ import annotations

import difflib
import io
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq


def _yaml() -> YAML:
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096
    return yaml


def add_node(text: str, name: str, entry: dict[str, Any],
             note: list[str] | None = None) -> tuple[str, str]:
    """``text`` with ``nodes.<name>`` set to ``entry``; and the diff (empty when unchanged).
    ``note``: comment lines put above the node's entry (one printable line each), each once:
    a line the file already holds is not added again."""
    yaml = _yaml()
    data = yaml.load(text) if text.strip() else None
    if data is None:
        data = CommentedMap()
    nodes = data.get("nodes")
    if not isinstance(nodes, dict) or not nodes:
        nodes = CommentedMap()
        data["nodes"] = nodes
    current = nodes.get(name)
    merged = CommentedMap() if not isinstance(current, dict) else current
    for key, value in entry.items():
        if merged.get(key) != value:
            merged[key] = _flow(value)
    nodes[name] = merged
    new = [line for line in note or () if f"# {line}\n" not in text]
    if new:
        nodes.yaml_set_comment_before_after_key(name, before="\n".join(new), indent=2)
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue(), diff(text, out.getvalue())


def set_node_key(text: str, name: str, key: str, value: Any) -> tuple[str, str]:
    """``text`` with ``nodes.<name>.<key>`` set to ``value``; and the diff (empty when unchanged).

    >>> print(set_node_key("nodes:\\n  a:  # first\\n    address: x\\n", "a", "drain", True)[0],
    ...       end="")
    nodes:
      a:  # first
        address: x
        drain: true
    """
    yaml = _yaml()
    data = yaml.load(text)
    nodes = data.get("nodes") if data else None
    if not isinstance(nodes, dict) or not isinstance(nodes.get(name), dict):
        raise KeyError(name)
    if nodes[name].get(key) == value:
        return text, ""
    nodes[name][key] = value
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue(), diff(text, out.getvalue())


def remove_node(text: str, name: str) -> tuple[str, str]:
    """``text`` without ``nodes.<name>``; and the diff."""
    yaml = _yaml()
    data = yaml.load(text)
    nodes = data.get("nodes") if data else None
    if not isinstance(nodes, dict) or name not in nodes:
        return text, ""
    del nodes[name]
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue(), diff(text, out.getvalue())


def _flow(value: Any) -> Any:
    """Short lists and small maps inside lists in flow style, as people write them here."""
    if isinstance(value, list):
        seq = CommentedSeq([_flow(v) for v in value])
        seq.fa.set_flow_style()
        return seq
    if isinstance(value, dict):
        mapping = CommentedMap((k, _flow(v)) for k, v in value.items())
        if all(not isinstance(v, dict | list) for v in value.values()) and len(value) <= 3:
            mapping.fa.set_flow_style()
        return mapping
    return value


def diff(before: str, after: str, path: str = "cluster/nodes.yaml") -> str:
    lines = difflib.unified_diff(before.splitlines(keepends=True),
                                 after.splitlines(keepends=True),
                                 fromfile=f"a/{path}", tofile=f"b/{path}")
    return "".join(lines)


def add_model(text: str, name: str, entry: dict[str, Any]) -> str:
    """``text`` with ``models.<name>`` set to ``entry`` (what ``llmgw init`` declares).

    >>> print(add_model("# ours\\nmodels: {}\\n", "m", {"source": "a/b"}), end="")
    # ours
    models:
      m:
        source: a/b
    """
    yaml = _yaml()
    data = yaml.load(text) if text.strip() else None
    if data is None:
        data = CommentedMap()
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        models = CommentedMap()
        data["models"] = models
    models[name] = CommentedMap((k, _flow(v)) for k, v in entry.items())
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def set_cluster_key(text: str, key: str, value: dict[str, Any]) -> str:
    """``text`` with ``cluster.<key>`` set to ``value``, comments and order kept.

    >>> print(set_cluster_key("cluster:\\n  name: a  # site\\n", "weights",
    ...                       {"endpoint": "http://m:8090"}), end="")
    cluster:
      name: a  # site
      weights:
        endpoint: http://m:8090
    """
    yaml = _yaml()
    data = yaml.load(text)
    cluster = data.get("cluster") if data else None
    if not isinstance(cluster, dict):
        raise KeyError("cluster")
    current = cluster.get(key)
    if isinstance(current, dict):
        for name in [k for k in current if k not in value]:
            del current[name]
        for name, item in value.items():
            current[name] = item
    else:
        cluster[key] = CommentedMap(value.items())
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()
