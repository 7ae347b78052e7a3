"""The agent's settings file (``agent.yaml``), validated with locations.

Every path the agent touches is a setting, so one machine can run many
simulated nodes: each with its own socket, state directory, fake sysfs and
``/proc`` trees, nvidia-smi stand-in, and unit directories. Relative paths
are resolved against the directory of the settings file.

>>> Settings().socket.path
'/run/llmgw/agent.sock'
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from llmgw.discovery.fabrics import Declaration, DeclaredFabric
from llmgw.spec.quantities import Duration, Size


class SettingsError(Exception):
    """A settings file the agent cannot use; the message says where and what."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SocketSettings(_Strict):
    path: str = Field("/run/llmgw/agent.sock", description="The unix socket the agent serves on.")
    mode: str = Field("0660", description="Permission bits of the socket, in octal.")
    group: str | None = Field(
        "llmgw", description="Group owning the socket (who may talk to the agent); null: unchanged."
    )

    @field_validator("mode")
    @classmethod
    def _octal(cls, value: str) -> str:
        try:
            bits = int(str(value), 8)
        except ValueError:
            raise ValueError(f"mode must be octal bits like 0660; got {value!r}") from None
        if not 0 <= bits <= 0o777:
            raise ValueError(f"mode must be between 0000 and 0777; got {value!r}")
        return str(value)

    @property
    def mode_bits(self) -> int:
        return int(self.mode, 8)


class HardwareSettings(_Strict):
    sysfs_root: str = Field("/sys", description="Where `class/infiniband` and CPU lists are read.")
    proc_root: str = Field("/proc", description="Where `meminfo` and `cpuinfo` are read.")
    nvidia_smi: str = Field("nvidia-smi", description="nvidia-smi: a path, or a name on PATH.")
    nvml: Literal["auto", "off"] = Field(
        "auto",
        description="`auto`: read GPUs through NVML (pynvml) when it initialises, for NVLink "
        "peers, else nvidia-smi. `off`: nvidia-smi only (fixture nodes).",
    )
    command_timeout: Duration = Field(10.0, description="Give up on a discovery command then.")
    sudo: str = Field("sudo", description="sudo: a path, or a name on PATH; `sudo -n true` "
                      "tells `llmgw doctor` whether a non-root agent's user may act as root.")


class SystemdSettings(_Strict):
    unit_dir: str = Field("/etc/systemd/system", description="Where unit files are written.")
    env_dir: str = Field("/etc/llmgw/env", description="Where `<unit>.env` files are written.")
    systemctl: str = Field("systemctl", description="The systemctl binary.")
    journalctl: str = Field("journalctl", description="The journalctl binary (unit logs).")


class SuperviseSettings(_Strict):
    restart_backoff: Duration = Field(1.0, description="First wait before restarting a unit.")
    restart_backoff_max: Duration = Field(30.0, description="Longest wait between restarts.")
    restart_limit: int = Field(
        5, ge=0, description="Failures in a row (each up less than `stable_after`) before Failed."
    )
    stable_after: Duration = Field(60.0, description="Up this long, earlier failures are forgiven.")
    stop_timeout: Duration = Field(
        10.0, description="SIGTERM → SIGKILL wait when the unit sets no TimeoutStopSec."
    )
    log_max_bytes: Size = Field(8 * 1024 * 1024, description="Each unit's log is cut to this.")
    inherit_environment: bool = Field(
        True,
        description="Engines start with the agent's environment under the unit's own "
        "(false: only PATH, HOME, LANG and the like, as systemd gives a service).",
    )
    stop_on_exit: bool = Field(
        False,
        description="Stop every unit when the agent exits. Off by default: a restarted agent "
        "re-adopts running engines instead.",
    )


class ReadinessSettings(_Strict):
    poll_interval: Duration = Field(2.0, description="How often unit states are refreshed.")
    probe_timeout: Duration = Field(2.0, description="Timeout of one /health or /v1/models probe.")


class EngineSettings(_Strict):
    dir: str = Field(
        "/opt/llmgw/engines",
        description="Where engine versions are installed, one directory each "
        "(`vllm-0.11.0`, `llama.cpp-11434.0.0`); units of a profile naming a version run its "
        "`bin/`.",
    )
    index_url: str = Field(
        "https://pypi.org/simple",
        description="The package index vLLM and SGLang venvs install from (an offline site "
        "points it at its own mirror); a request may name another.",
    )
    install_timeout: Duration = Field(3600.0, description="Give up on one install then.")


class DeclaredFabricSettings(_Strict):
    """One fabric, as the cluster's `fabrics:` and the node's `fabrics:` would declare it."""

    kind: Literal["infiniband", "roce"] = Field(
        description="The link layer its adapters' ports must have: InfiniBand, or Ethernet.")
    adapters: list[str] = Field(
        default_factory=list, description="RDMA adapters of this node on it, as named under "
        "`/sys/class/infiniband` (`mlx5_0`).")
    gid_index: int | None = Field(
        None, ge=0, le=255, description="RoCE: the GID index NCCL must use; null: the first "
        "RoCE v2 GID with an IPv4 address, as NCCL would pick it.")


class DeclaredSettings(_Strict):
    """What `llmgw agent inventory` compares against when no daemon asks."""

    fabrics: dict[str, DeclaredFabricSettings] = Field(
        default_factory=dict, description="Fabrics to check the adapters against, by name; "
        "the daemon sends the cluster's own with every request instead.")
    weights_dirs: list[str] = Field(
        default_factory=list, description="Directories whose free space and model files the "
        "report shows, and that path sources must resolve into, until the daemon sends the "
        "node's `weights_dirs`.")


class Settings(_Strict):
    node: str | None = Field(None, description="Node name in reports; default: the host name.")
    socket: SocketSettings = Field(
        default_factory=SocketSettings, description="The unix socket, the agent's only way in.")
    backend: Literal["auto", "systemd", "supervise"] = Field(
        "auto", description="`auto`: systemd when it is PID 1, else supervise."
    )
    state_dir: str = Field("/var/lib/llmgw/agent", description="The supervise backend's state.")
    hardware: HardwareSettings = Field(
        default_factory=HardwareSettings, description="Where hardware facts are read.")
    systemd: SystemdSettings = Field(
        default_factory=SystemdSettings, description="The systemd backend's files and tools.")
    supervise: SuperviseSettings = Field(
        default_factory=SuperviseSettings,
        description="The built-in supervise backend's restarts, stops and logs.")
    readiness: ReadinessSettings = Field(
        default_factory=ReadinessSettings, description="How units are watched and probed.")
    declared: DeclaredSettings = Field(
        default_factory=DeclaredSettings,
        description="What the report is checked against before a daemon has asked.")
    engines: EngineSettings = Field(
        default_factory=EngineSettings, description="Where and how engine versions install.")
    log_lines_max: int = Field(1000, ge=1, le=100_000, description="Most lines UnitLogs returns.")

    @property
    def backend_kind(self) -> Literal["systemd", "supervise"]:
        if self.backend != "auto":
            return self.backend
        return "systemd" if os.path.isdir("/run/systemd/system") else "supervise"

    @property
    def nvidia_smi_path(self) -> str | None:
        """The nvidia-smi to run, or None when there is none (a CPU node)."""
        return shutil.which(self.hardware.nvidia_smi)

    def declaration(self) -> Declaration:
        return Declaration(
            node=self.node or "",
            fabrics=tuple(
                DeclaredFabric(name, f.kind, tuple(f.adapters), f.gid_index)
                for name, f in self.declared.fabrics.items()
            ),
            weights_dirs=tuple(self.declared.weights_dirs),
        )


# Settings whose values are paths resolved against the settings file's directory.
_PATHS = {
    ("socket", "path"), ("state_dir",), ("hardware", "sysfs_root"), ("hardware", "proc_root"),
    ("systemd", "unit_dir"), ("systemd", "env_dir"),
}


def _resolve(data: Any, base: Path) -> Any:
    if not isinstance(data, dict):
        return data
    for path in _PATHS:
        node: Any = data
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get(path[-1]), str):
            node[path[-1]] = str(base / node[path[-1]])
    hardware = data.get("hardware")
    # nvidia_smi and sudo are command names unless written as paths ("./nvidia-smi").
    for program in ("nvidia_smi", "sudo"):
        if isinstance(hardware, dict) and isinstance(hardware.get(program), str):
            if "/" in hardware[program]:
                hardware[program] = str(base / hardware[program])
    declared = data.get("declared")
    if isinstance(declared, dict) and isinstance(declared.get("weights_dirs"), list):
        declared["weights_dirs"] = [
            str(base / d) if isinstance(d, str) else d for d in declared["weights_dirs"]
        ]
    return data


def _plain(node: Any) -> Any:
    if isinstance(node, CommentedMap):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, CommentedSeq):
        return [_plain(v) for v in node]
    return node


def _where(document: Any, loc: tuple[int | str, ...]) -> str:
    """``line:col`` of the deepest key of ``loc`` found in the YAML document."""
    node, found = document, ""
    for key in loc:
        if isinstance(node, CommentedMap) and key in node:
            line, col = node.lc.key(key)
            found = f"{line + 1}:{col + 1}"
            node = node[key]
        elif isinstance(node, CommentedSeq) and isinstance(key, int) and key < len(node):
            line, col = node.lc.item(key)
            found = f"{line + 1}:{col + 1}"
            node = node[key]
        else:
            break
    return found


def load(path: str | Path) -> Settings:
    """Settings from a YAML file; raises :class:`SettingsError` listing every problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        document = YAML(typ="rt").load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{mark.line + 1}:{mark.column + 1}: " if mark is not None else ""
        raise SettingsError(f"{path}:{where}{exc.problem}") from None
    if document is None:
        document = CommentedMap()
    if not isinstance(document, CommentedMap):
        raise SettingsError(f"{path}: expected a mapping of settings at the top level")
    data = _resolve(_plain(document), path.resolve().parent)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            loc = tuple(error["loc"])
            where = _where(document, loc)
            dotted = ".".join(str(part) for part in loc) or "(top)"
            prefix = f"{path}:{where}" if where else str(path)
            lines.append(f"{prefix}: {dotted}: {error['msg']}")
        raise SettingsError("\n".join(lines)) from None
