"""What one shard needs to start, and the command that starts it.

A :class:`Launch` is everything the planner decided for one shard (one
node's part of one replica): the profile, the GPUs by UUID, the ports, the
fabric. :func:`command` turns it into a :class:`Command` — the engine's argv,
commands to run before it in the same unit (a Ray head), and the environment
llmgw derives from the placement (GPU pinning, NCCL). The profile's own
``env`` is not part of it: it travels in the unit's env file, untouched.

This is a purely computational module with no side effects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from llmgw.engines import llama_cpp, nccl, sglang, vllm
from llmgw.engines.nccl import FabricUse
from llmgw.spec.models import Profile

__all__ = ["Command", "EngineError", "FabricUse", "Launch", "command", "problems"]

# Variables llmgw sets from the placement; a profile that sets them too would
# make the unit lie about where it runs.
RESERVED_ENV = frozenset({
    "CUDA_VISIBLE_DEVICES", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
    "NCCL_IB_GID_INDEX", "RAY_ADDRESS",
})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EngineError(ValueError):
    """A profile asks for something the engine adapter cannot express."""


@dataclass(frozen=True)
class Launch:
    """One shard, as placed."""

    model: str
    served_name: str
    source: str
    profile: Profile
    rank: int
    bind_host: str
    port: int | None = None  # HTTP port; only rank 0 serves HTTP
    head_address: str | None = None  # rank 0's address, for multi-node rendezvous
    dist_port: int | None = None  # rendezvous port on rank 0 (multi-node only)
    gpu_uuids: tuple[str, ...] = ()
    mgmt_interface: str | None = None
    fabric: FabricUse | None = None
    download_dir: str | None = None

    @property
    def multi_node(self) -> bool:
        return self.profile.nodes > 1

    @property
    def engine(self) -> Literal["vllm", "sglang", "llama.cpp"]:
        return self.profile.engine


@dataclass(frozen=True)
class Command:
    """How a shard's unit starts its engine."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    # Commands that must succeed, in order, before argv runs in the same unit.
    prelude: tuple[tuple[str, ...], ...] = field(default=())

    @property
    def serves_http(self) -> bool:
        return "--port" in self.argv


def problems(profile: Profile) -> list[str]:
    """Why this profile cannot be turned into a command line; empty when it can."""
    found = [
        f"env.{name} is set by llmgw from the placement (GPUs, fabric); remove it"
        for name in sorted(profile.env)
        if name in RESERVED_ENV
    ]
    found += [
        f"env.{name} is not a valid environment variable name"
        for name in sorted({*profile.env, *profile.secret_env})
        if not _ENV_NAME.match(name)
    ]
    found += [
        f"env.{name} spans lines; a unit's environment holds one line per variable"
        for name, value in sorted(profile.env.items())
        if "\n" in value
    ]
    adapter = _ADAPTERS[profile.engine]
    for key in sorted(profile.args):
        flag = key.lstrip("-")
        if flag in adapter.RESERVED_FLAGS:
            found.append(
                f"args.{key} is set by llmgw ({adapter.RESERVED_FLAGS[flag]}); remove it"
            )
    if profile.engine == "llama.cpp":
        if profile.nodes > 1:
            found.append("llama.cpp runs on one node; set nodes: 1")
        for name in ("dtype", "quantization", "kv_cache_dtype"):
            if getattr(profile, name):
                found.append(
                    f"{name} does not apply to llama.cpp (a GGUF file carries its own "
                    "quantization); pass llama-server flags under args"
                )
    return found


def command(launch: Launch) -> Command:
    """The argv and placement environment of one shard.

    Raises :class:`EngineError` when :func:`problems` has anything to say.
    """
    found = problems(launch.profile)
    if found:
        raise EngineError("; ".join(found))
    adapter = _ADAPTERS[launch.engine]
    argv, prelude, extra_env = adapter.command(launch)
    env = dict(extra_env)
    # Pin by UUID: indices change order across reboots and driver updates,
    # UUIDs do not. A CPU profile gets an empty list so it never grabs a GPU.
    env["CUDA_VISIBLE_DEVICES"] = ",".join(launch.gpu_uuids)
    env.update(nccl.environment(launch.fabric, launch.mgmt_interface, launch.multi_node))
    return Command(
        argv=tuple(argv),
        env=tuple(sorted(env.items())),
        prelude=tuple(tuple(step) for step in prelude),
    )


_ADAPTERS = {"vllm": vllm, "sglang": sglang, "llama.cpp": llama_cpp}
