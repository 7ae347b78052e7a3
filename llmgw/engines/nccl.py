"""The environment NCCL and Gloo need for a replica that spans nodes.

Why each variable (NCCL 2.23 user guide, "Environment Variables"):

* ``NCCL_IB_HCA`` lists exactly the chosen fabric's adapters, with the ``=``
  prefix for exact names. Left open, NCCL may pick an adapter on a fabric the
  peer cannot reach and the job hangs instead of failing.
* ``NCCL_SOCKET_IFNAME`` (``=`` again: ``eno1`` alone is a prefix and would
  also match ``eno1.100``) and ``GLOO_SOCKET_IFNAME`` (takes one exact name)
  put bootstrap traffic on the management interface, never on a fabric.
* RoCE: ``NCCL_IB_GID_INDEX`` only when it is known (the fabric's
  ``gid_index``, else what the agent found on the node). Left unset, NCCL
  (2.21 and later) selects the GID itself, preferring RoCE v2 over IPv4
  (``NCCL_IB_ROCE_VERSION_NUM``, ``NCCL_IB_ADDR_FAMILY``); a guessed fixed index
  is wrong on any card whose GID table is laid out differently.

A single-node replica gets none of these: NVLink/PCIe need no fabric.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class FabricUse:
    """The fabric a multi-node replica runs on, as seen from one of its nodes."""

    name: str
    kind: Literal["infiniband", "roce"]
    adapters: tuple[str, ...]  # this node's adapters on the fabric that are ACTIVE
    gid_index: int | None = None


def environment(
    fabric: FabricUse | None, mgmt_interface: str | None, multi_node: bool
) -> dict[str, str]:
    """NCCL/Gloo variables for one shard; empty for single-node replicas."""
    if not multi_node:
        return {}
    env: dict[str, str] = {}
    if mgmt_interface:
        env["NCCL_SOCKET_IFNAME"] = f"={mgmt_interface}"
        env["GLOO_SOCKET_IFNAME"] = mgmt_interface
    if fabric is not None:
        env["NCCL_IB_HCA"] = "=" + ",".join(fabric.adapters)
        if fabric.kind == "roce" and fabric.gid_index is not None:
            env["NCCL_IB_GID_INDEX"] = str(fabric.gid_index)
    return env
