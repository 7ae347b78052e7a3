"""Why a shard's digest changed, in words: "args changed: max-model-len 8192 → 16384".

Compares the spec a unit was started from (its ``X-Llmgw-Spec`` label) with
the spec the plan wants. Placement fields (node, GPUs, ports, fabric) are
named as such; the engine's own flags are compared flag by flag.

A purely computational module with no side effects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# Flags that follow from the placement; their changes are explained by the
# placement lines ("port 18000 → 18001"), not repeated as args.
_PLACEMENT_FLAGS = frozenset({
    "host", "port", "master-addr", "master-port", "node-rank", "dist-init-addr", "headless",
    "download-dir", "address", "node-ip-address",
})
# Environment derived from the placement: explained by GPUs/fabric lines.
_PLACEMENT_ENV = frozenset({
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "RAY_ADDRESS", "VLLM_HOST_IP", "SGLANG_HOST_IP",
})
_FABRIC_ENV = frozenset({
    "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_GID_INDEX",
})
# Who a shard is, not how it runs: a replaced replica may get a new index.
_IDENTITY = frozenset({"replica", "rank", "profile"})
_NOT_SET = object()


def parse_argv(argv: list[str]) -> tuple[list[str], dict[str, str | None]]:
    """Positional words and ``{flag: value}`` (None for a bare flag)."""
    positional: list[str] = []
    options: dict[str, str | None] = {}
    index = 0
    while index < len(argv):
        word = argv[index]
        if word.startswith("-") and not _is_number(word):
            name, eq, value = word.lstrip("-").partition("=")
            if eq:
                options[name] = value
            elif index + 1 < len(argv) and not (
                argv[index + 1].startswith("-") and not _is_number(argv[index + 1])
            ):
                values = [argv[index + 1]]
                index += 1
                # An option of several values (vLLM's --lora-modules a=x b=y): one value.
                while index + 1 < len(argv) and not argv[index + 1].startswith("-"):
                    values.append(argv[index + 1])
                    index += 1
                options[name] = " ".join(values)
            else:
                options[name] = None
        else:
            positional.append(word)
        index += 1
    return positional, options


def explain(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    placement: bool = True,
    gpu_names: Callable[[str, list[str]], str] | None = None,
) -> list[str]:
    """Every difference between two shard specs that a person should know about.

    With ``placement=False`` the lines that only say where the shard runs
    (nodes, GPUs, ports, fabric variables) are left out: for a replica that
    moves, the plan shows the new place anyway. ``gpu_names(node, uuids)``
    turns UUIDs into something readable (indices); by default UUIDs are shown.
    """
    reasons: list[str] = []
    name_gpus = gpu_names or (lambda _node, uuids: ",".join(uuids))
    if old.get("engine") != new.get("engine"):
        reasons.append(f"engine changed: {old.get('engine')} → {new.get('engine')}")
    if old.get("engine_version") != new.get("engine_version"):
        reasons.append(f"engine version changed: {_text(old.get('engine_version'))} → "
                       f"{_text(new.get('engine_version'))}")
    if old.get("source") != new.get("source"):
        reasons.append(f"source changed: {old.get('source')} → {new.get('source')}")
    if old.get("gpu_class") != new.get("gpu_class"):
        reasons.append(
            f"GPU class changed: {_text(old.get('gpu_class'))} → {_text(new.get('gpu_class'))}"
        )
    if placement:
        reasons += _placement(old, new, name_gpus)
    if old.get("memory") != new.get("memory"):
        reasons.append(f"memory changed: {_gib(old.get('memory'))} → {_gib(new.get('memory'))}")
    reasons += _args(list(old.get("argv") or []), list(new.get("argv") or []))
    old_env = {**(old.get("env") or {}), **(old.get("user_env") or {})}
    new_env = {**(new.get("env") or {}), **(new.get("user_env") or {})}
    skip = _PLACEMENT_ENV if placement else _PLACEMENT_ENV | _FABRIC_ENV
    reasons += _maps("env", old_env, new_env, skip=skip)
    reasons += _maps("secret_env", old.get("secret_env") or {}, new.get("secret_env") or {},
                     describe=lambda name, path: f"{name} read from {path}")
    if not reasons and old.get("prelude") != new.get("prelude"):
        reasons.append("the commands run before the engine changed")
    if not reasons and placement:
        changed = sorted(
            k for k in {*old, *new} - _IDENTITY if old.get(k, _NOT_SET) != new.get(k, _NOT_SET)
        )
        if changed:
            reasons.append(f"spec changed: {', '.join(changed)}")
    return reasons


def _placement(
    old: Mapping[str, Any], new: Mapping[str, Any], name_gpus: Callable[[str, list[str]], str],
) -> list[str]:
    reasons = []
    old_nodes, new_nodes = old.get("nodes"), new.get("nodes")
    if old_nodes != new_nodes:
        reasons.append(f"nodes changed: {_list(old_nodes)} → {_list(new_nodes)}")
    elif old.get("gpus") != new.get("gpus"):
        node = str((new.get("nodes") or ["?"])[int(new.get("rank", 0))])
        reasons.append(
            f"GPUs changed on {node}: {name_gpus(node, list(old.get('gpus') or []))} → "
            f"{name_gpus(node, list(new.get('gpus') or []))}"
        )
    for key, words in (("port", "port"), ("dist_port", "rendezvous port"),
                       ("aux_port", "health port"), ("fabric", "fabric")):
        if old.get(key) != new.get(key):
            reasons.append(f"{words} changed: {_text(old.get(key))} → {_text(new.get(key))}")
    return reasons


def _args(old_argv: list[str], new_argv: list[str]) -> list[str]:
    old_pos, old_opts = parse_argv(old_argv)
    new_pos, new_opts = parse_argv(new_argv)
    reasons = []
    if old_pos != new_pos:
        reasons.append(f"command changed: {' '.join(old_pos)} → {' '.join(new_pos)}")
    for flag in sorted({*old_opts, *new_opts} - _PLACEMENT_FLAGS):
        before, after = old_opts.get(flag, _NOT_SET), new_opts.get(flag, _NOT_SET)
        if before == after:
            continue
        if before is _NOT_SET:
            reasons.append(f"args added: --{flag}" + (f" {after}" if after is not None else ""))
        elif after is _NOT_SET:
            reasons.append(f"args removed: --{flag}" + (f" {before}" if before is not None
                                                         else ""))
        else:
            reasons.append(f"args changed: {flag} {_text(before)} → {_text(after)}")
    return reasons


def _maps(
    what: str,
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    skip: frozenset[str] = frozenset(),
    describe: Callable[[str, Any], str] | None = None,
) -> list[str]:
    show = describe or (lambda name, value: f"{name}={value}")
    reasons = []
    for name in sorted({*old, *new} - skip):
        if name not in old:
            reasons.append(f"{what} added: {show(name, new[name])}")
        elif name not in new:
            reasons.append(f"{what} removed: {name}")
        elif old[name] != new[name]:
            if describe:
                reasons.append(f"{what} changed: {show(name, new[name])} (was {old[name]})")
            else:
                reasons.append(f"{what} changed: {name} {old[name]} → {new[name]}")
    return reasons


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _text(value: object) -> str:
    return "none" if value is None or value is _NOT_SET else str(value)


def _gib(value: object) -> str:
    if not isinstance(value, int):
        return _text(value)
    return f"{value / 1024**3:g} GiB"


def _list(value: object) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, list) else _text(value)
