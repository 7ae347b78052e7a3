"""What one shard needs to start, and the command that starts it.

A :class:`Launch` is everything the planner decided for one shard (one
node's part of one replica): the profile, the GPUs, the ports, the fabric.
:func:`command` turns it into a :class:`Command` — the engine's argv,
commands to run before it in the same unit (a Ray head), and the environment
llmgw derives from the placement (GPU pinning, host address, NCCL). The
profile's own ``env`` is not part of it: it travels in the unit's env file.

Every argv is checked against the flag table of the profile's engine version
(:mod:`.tables`) before it is returned: an option the engine does not define,
one it removed, a missing value or a value outside its choices is a
:class:`Finding`, and :func:`command` refuses to build a command that has any.
``unchecked_args`` are appended after that check: the escape hatch for flags
newer than the tables.

This is a purely computational module with no side effects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from llmgw.engines import checks, flags, llama_cpp, nccl, sglang, tables, vllm
from llmgw.engines.nccl import FabricUse
from llmgw.engines.parts import Parts
from llmgw.spec.loras import LoraAdapter
from llmgw.spec.models import Profile

__all__ = ["Command", "EngineError", "FabricUse", "Finding", "Launch", "command", "findings",
           "problems"]

# Variables llmgw sets from the placement; a profile that sets them too would
# make the unit lie about where it runs.
RESERVED_ENV = frozenset({
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME", "NCCL_IB_GID_INDEX", "RAY_ADDRESS", "VLLM_HOST_IP", "SGLANG_HOST_IP",
})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EngineError(ValueError):
    """A profile asks for something the engine adapter cannot express."""


@dataclass(frozen=True)
class Finding:
    """A reason a profile cannot become a command line.

    ``where`` is the profile field it is about, as a dotted path below the
    profile (``args.task``, ``engine_version``); the spec loader turns it into
    ``file:line:col``.
    """

    where: tuple[str, ...]
    message: str


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
    gpu_indices: tuple[int, ...] = ()  # nvidia-smi (PCI bus) order, same GPUs as gpu_uuids
    mgmt_interface: str | None = None
    host_ip: str | None = None  # this node's address on the management network
    aux_port: int | None = None  # SGLang ranks > 0: their placeholder health server
    fabric: FabricUse | None = None
    download_dir: str | None = None
    adapters: tuple[LoraAdapter, ...] = ()  # the model's LoRA adapters, sources resolved

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


def _profile_findings(profile: Profile) -> list[Finding]:
    found = [
        Finding(("env", name),
                f"env.{name} is set by llmgw from the placement (GPUs, fabric); remove it")
        for name in sorted(profile.env)
        if name in RESERVED_ENV
    ]
    found += [
        Finding(("env", name), f"env.{name} is not a valid environment variable name")
        for name in sorted({*profile.env, *profile.secret_env})
        if not _ENV_NAME.match(name)
    ]
    found += [
        Finding(("env", name),
                f"env.{name} spans lines; a unit's environment holds one line per variable")
        for name, value in sorted(profile.env.items())
        if "\n" in value
    ]
    adapter = _ADAPTERS[profile.engine]
    for section in ("args", "unchecked_args"):
        for key in sorted(getattr(profile, section)):
            flag = key.lstrip("-")
            if flag in adapter.RESERVED_FLAGS:
                found.append(Finding((section, key), f"{section}.{key} is set by llmgw "
                                     f"({adapter.RESERVED_FLAGS[flag]}); remove it"))
    for key in sorted(set(profile.args) & set(profile.unchecked_args)):
        found.append(Finding(("unchecked_args", key),
                             f"unchecked_args.{key} is also under args; keep one"))
    if profile.engine == "vllm" and profile.cpu:
        found += _vllm_cpu_findings(profile)
    if profile.engine == "llama.cpp":
        if profile.nodes > 1:
            found.append(Finding(("nodes",), "llama.cpp runs on one node; set nodes: 1"))
        for name in ("dtype", "quantization", "kv_cache_dtype"):
            if getattr(profile, name):
                found.append(Finding((name,),
                    f"{name} does not apply to llama.cpp (a GGUF file carries its own "
                    "quantization); pass llama-server flags under args"))
    return found


def _vllm_cpu_findings(profile: Profile) -> list[Finding]:
    """What a ``cpu: true`` vLLM profile must not say, and the one thing it must."""
    found = []
    for section in ("args", "unchecked_args"):
        for key in sorted(getattr(profile, section)):
            reason = vllm.GPU_ONLY_FLAGS.get(key.lstrip("-"))
            if reason is not None:
                found.append(Finding((section, key), f"{section}.{key} needs a GPU: {reason}; "
                                     "remove it from this cpu: true profile"))
    sized = {k.lstrip("-") for k in (*profile.args, *profile.unchecked_args)}
    if vllm.CPU_KV_CACHE_FLAG not in sized and vllm.CPU_KV_CACHE_ENV not in profile.env:
        found.append(Finding(("cpu",), (
            f"vLLM on CPU needs its KV cache size: set args.{vllm.CPU_KV_CACHE_FLAG} (bytes) or "
            f"env.{vllm.CPU_KV_CACHE_ENV} (GiB); without one vLLM reserves "
            "gpu-memory-utilization (0.92 by default) of the node's whole memory and refuses "
            "to start when less is free")))
    return found


def build(launch: Launch) -> tuple[Command, list[Finding]]:
    """The command of one shard, and everything wrong with it (empty when nothing is)."""
    profile = launch.profile
    found = _profile_findings(profile)
    try:
        selection = tables.select(profile.engine, profile.engine_version)
    except tables.VersionError as exc:
        return Command(()), [*found, Finding(("engine_version",), str(exc))]
    adapter = _ADAPTERS[launch.engine]
    parts: Parts = adapter.command(launch, selection)
    argv = list(parts.argv)
    multi = [token for group in parts.multi for token in group]
    if parts.takes_args:
        found += _adapter_findings(launch, adapter.ADAPTER_FLAGS)
        # A reserved key already has its finding; the table need not add another.
        args = {k: v for k, v in profile.args.items()
                if k.lstrip("-") not in adapter.RESERVED_FLAGS}
        user = flags.render(args, selection.table)
        found += [Finding(tuple(where.split(".", 1)), message) for where, message in user.problems]
        origins = {flags.spelling(key, selection.table): key for key in args}
        checked = [*argv[parts.options_from:], *user.argv,
                   *(token for group in parts.multi for token in group[:2])]
        for token, message in checks.problems(checked, selection.table):
            key = origins.get(token)
            if key is not None:
                found.append(Finding(("args", key), f"args.{key}: {message}"))
            else:
                where = ("engine_version",) if profile.engine_version else ("engine",)
                found.append(Finding(where, f"llmgw renders {token}, but {message}"))
        unchecked = flags.render(
            {k: v for k, v in profile.unchecked_args.items()
             if k.lstrip("-") not in adapter.RESERVED_FLAGS}, None, section="unchecked_args")
        found += [Finding(tuple(where.split(".", 1)), message)
                  for where, message in unchecked.problems]
        argv += [*multi, *user.argv, *unchecked.argv]
    env = dict(parts.env)
    env.update(_devices(launch, selection))
    if profile.engine == "vllm" and profile.cpu:
        env[vllm.CPU_THREADS_BIND_ENV] = vllm.CPU_THREADS_BIND_DEFAULT  # env.* overrides it
    if launch.multi_node and launch.host_ip and adapter.HOST_IP_ENV:
        # Engines otherwise guess their own address from the default route, which on
        # a multi-homed GPU node is rarely the management network peers can reach.
        env[adapter.HOST_IP_ENV] = launch.host_ip
    env.update(nccl.environment(launch.fabric, launch.mgmt_interface, launch.multi_node))
    return Command(
        argv=tuple(argv),
        env=tuple(sorted(env.items())),
        prelude=tuple(tuple(step) for step in parts.prelude),
    ), found


def _adapter_findings(launch: Launch, owned: tuple[str, ...]) -> list[Finding]:
    """A flag the model's adapters set, set again under args: one of the two would lose."""
    if not launch.adapters:
        return []
    profile = launch.profile
    return [Finding((section, key), f"{section}.{key} is set by llmgw from the model's "
                    "adapters; remove it, or declare the adapter under adapters:")
            for section in ("args", "unchecked_args")
            for key in sorted(getattr(profile, section)) if key.lstrip("-") in owned]


def _devices(launch: Launch, selection: tables.Selection) -> dict[str, str]:
    """GPU pinning: by UUID where the engine accepts it, else by PCI-ordered index.

    UUIDs survive reboots and driver updates that reorder GPUs. But vLLM before
    0.24 calls ``int()`` on each entry of CUDA_VISIBLE_DEVICES at start-up and
    crashes on a UUID, and SGLang's custom all-reduce does the same and silently
    turns itself off; those get indices, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
    so that CUDA numbers GPUs as nvidia-smi (and so the agent's report) does.
    A CPU profile gets an empty list so it never grabs a GPU.
    """
    if launch.profile.cpu or not launch.gpu_uuids:
        return {"CUDA_VISIBLE_DEVICES": ""}
    by_uuid = launch.engine == "llama.cpp" or (
        launch.engine == "vllm" and tables.at_least(selection.version, vllm.UUID_DEVICES_SINCE))
    if by_uuid or not launch.gpu_indices:
        return {"CUDA_VISIBLE_DEVICES": ",".join(launch.gpu_uuids)}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in launch.gpu_indices),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def command(launch: Launch) -> Command:
    """The argv and placement environment of one shard.

    Raises :class:`EngineError` when :func:`build` finds anything wrong.
    """
    built, found = build(launch)
    if found:
        raise EngineError("; ".join(f.message for f in found))
    return built


def findings(profile: Profile, source: str = "org/model",
             adapters: tuple[LoraAdapter, ...] = ()) -> list[Finding]:
    """Everything wrong with a profile's command lines, on a representative placement.

    Every rank's argv is rendered (rank 0 and, across nodes, a follower) with
    placeholder addresses and ports, so that what is checked is exactly what
    :func:`command` would produce, whatever the placement.
    """
    ranks = [0, 1] if profile.nodes > 1 else [0]
    seen: dict[tuple[tuple[str, ...], str], Finding] = {}
    for rank in ranks:
        launch = Launch(
            model="model", served_name="model", source=source, profile=profile, rank=rank,
            bind_host="0.0.0.0", port=18000 if rank == 0 else None,
            head_address="10.0.0.1" if profile.nodes > 1 else None,
            dist_port=18001 if profile.nodes > 1 else None,
            gpu_uuids=() if profile.cpu else ("GPU-00000000-0000-0000-0000-000000000000",),
            gpu_indices=() if profile.cpu else (0,),
            host_ip="10.0.0.1" if profile.nodes > 1 else None,
            aux_port=18002 if rank > 0 else None, download_dir="/models", adapters=adapters,
        )
        for finding in build(launch)[1]:
            seen.setdefault((finding.where, finding.message), finding)
    return list(seen.values())


def problems(profile: Profile) -> list[str]:
    """Why this profile cannot be turned into a command line; empty when it can."""
    return [f.message for f in findings(profile, profile.source or "org/model")]


_ADAPTERS = {"vllm": vllm, "sglang": sglang, "llama.cpp": llama_cpp}
