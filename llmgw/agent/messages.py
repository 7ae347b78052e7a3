"""The agent's side of its requests: what the daemon declared for this node.

Everything both ends convert lives in :mod:`llmgw.proto.conversions`; only
the parsing of requests the agent alone receives is here.
"""

from __future__ import annotations

from llmgw.discovery.fabrics import Declaration, DeclaredFabric
from llmgw.proto import agent_pb2 as pb


def declaration_from_message(request: pb.ReportRequest) -> Declaration:
    """What the daemon declared; raises ValueError on a fabric kind llmgw does not know."""
    fabrics = []
    for item in request.fabrics:
        if item.kind not in ("infiniband", "roce"):
            raise ValueError(f"fabric {item.name}: unknown kind {item.kind!r}")
        fabrics.append(
            DeclaredFabric(
                item.name, item.kind, tuple(item.adapters),  # type: ignore[arg-type]
                item.gid_index if item.HasField("gid_index") else None,
            )
        )
    return Declaration(request.node, tuple(fabrics), tuple(request.weights_dirs))
