"""Each doctor check's exact verdict — status, what it saw, the fix — at each of its branches.

test_doctors.py shows that each fixture fault fails exactly one check; these
rows pin what the operator reads for every outcome of every check, the
thresholds at their edges (a value at a limit is on the lenient side), and
what ``context_for`` asks of a node.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmgw import __version__ as V
from llmgw.fleet.types import (
    Adapter,
    Disk,
    EngineBinary,
    EngineLimits,
    Gpu,
    GpuProcess,
    HostFacts,
    InstalledEngine,
    NodeReport,
    Port,
    Unit,
)
from llmgw.onboarding import doctors
from llmgw.spec.models import Cluster, Node

NOW = 1_800_000_000.0
GiB = 1 << 30
HOST = HostFacts(python_version="3.11.7", listening_ports=[])
UPGRADE = "upgrade the agent"
NTP = "run an NTP client (chrony, systemd-timesyncd) on both"
ZEROS = ":".join(["0000"] * 8)
INSTALL = ("llmgw engine install ENGINE==VERSION NODE (docs/install.md), or put it on the "
           "agent's PATH")
LINK = "fe80:0000:0000:0000:0a00:27ff:fe00:0001"
CLAMPED = EngineLimits(memlock_bytes=65536, nofile=20000,
                       source="llmgw-m-r0-s0.service (pid 812)")
UNLIMITED = EngineLimits(memlock_unlimited=True, nofile=1048576,
                         source="llmgw-m-r0-s0.service (pid 812)")
MEMLOCK_FIX = ("systemd grants LimitMEMLOCK=infinity only up to its own hard limit unless it "
               "has CAP_SYS_RESOURCE, and says nothing: raise the hard limit it starts with "
               "(the container's or VM's rlimit, DefaultLimitMEMLOCK=); with the supervise "
               "backend, run the agent with LimitMEMLOCK=infinity (engines inherit it)")
NOFILE_FIX = ("raise the hard open-files limit the engines start under (DefaultLimitNOFILE= "
              "for systemd, the agent's own for supervise); llmgw's units ask for 1048576")


def gpu(index: int, ecc: int | None = None, *held: GpuProcess) -> Gpu:
    return Gpu(index=index, uuid=f"GPU-{index}", name="NVIDIA H100 80GB HBM3",
               gpu_class="h100-80g", ecc_uncorrected=ecc, processes=list(held))


def mode(one: Gpu, *, mig: str | None = None, persistence: str | None = None) -> Gpu:
    return one.model_copy(update={"mig_mode": mig, "persistence_mode": persistence})


def disk(path: str, free: int | None = None) -> Disk:
    return Disk(path=path, free_bytes=free)


def port(number: int = 1, state: str = "ACTIVE", gids: list[str] | None = None,
         types: list[str] | None = None) -> Port:
    return Port(number=number, state=state, gids=gids or [], gid_types=types or [])


def verdict(check: str, node: dict[str, Any] | None = None, engines: tuple[str, ...] = (),
            fabrics: dict[str, tuple[str, int | None]] | None = None,
            **observed: Any) -> tuple[str, str, str]:
    spec = Node(address="10.0.0.1", **(node or {}))
    base: dict[str, Any] = {"node": "n", "agent_version": V, "collected_at": NOW, "host": HOST}
    ctx = doctors.Context(version=V, now=NOW, engines=engines, fabrics=fabrics or {})
    found = {f.check: f for f in doctors.examine("n", spec, NodeReport(**{**base, **observed}),
                                                 ctx)}
    return found[check].status, found[check].detail, found[check].fix


IB = {"fabrics": {"ib-a": ["mlx5_0", "mlx5_1"], "ib-b": ["mlx5_4"]}}
UP = [Adapter(name=n, ports=[port()]) for n in ("mlx5_0", "mlx5_1", "mlx5_4")]
ROCE_NODE = {"fabrics": {"roce-a": ["mlx5_2"]}}


def roce(gid_index: int | None) -> dict[str, tuple[str, int | None]]:
    return {"roce-a": ("roce", gid_index), "ib-a": ("infiniband", None)}


ROCE_FIX = ("give the interface its IPv4 address, or set the fabric's gid_index to the RoCE v2 "
            "entry (`show_gids`)")


@pytest.mark.parametrize(("check", "kwargs", "expected"), [
    # agent-version
    ("agent-version", {"agent_version": None},
     ("warning", "the agent did not say its version", f"upgrade the agent to {V}")),
    ("agent-version", {"agent_version": "0.0.9"},
     ("warning", f"agent 0.0.9, this llmgw {V}",
      f"install llmgw {V} on the node and restart llmgw-agent (engines keep running)")),
    ("agent-version", {}, ("ok", f"agent {V}, same as this llmgw", "")),
    # sudo: root, or a user that may sudo without a password
    ("sudo", {"host": None}, ("warning", "the agent did not report its uid", UPGRADE)),
    ("sudo", {"host": HostFacts()}, ("warning", "the agent did not report its uid", UPGRADE)),
    ("sudo", {"host": HostFacts(agent_uid=0)}, ("ok", "the agent runs as root", "")),
    ("sudo", {"host": HostFacts(agent_uid=1000, sudo=True)},
     ("ok", "the agent runs as uid 1000, with password-less sudo", "")),
    ("sudo", {"host": HostFacts(agent_uid=1000, sudo=False)},
     ("fail", "the agent runs as uid 1000, which may not sudo without a password",
      "run the agent as root (llmgw-agent.service does), or give its user password-less "
      "sudo: `llmgw node add` needs it to upgrade llmgw there, the systemd backend to "
      "write units")),
    ("sudo", {"host": HostFacts(agent_uid=1)},
     ("fail", "the agent runs as uid 1, which may not sudo without a password",
      "run the agent as root (llmgw-agent.service does), or give its user password-less "
      "sudo: `llmgw node add` needs it to upgrade llmgw there, the systemd backend to "
      "write units")),
    # python
    ("python", {"host": None}, ("warning", "the agent did not report its Python", UPGRADE)),
    ("python", {"host": HostFacts()}, ("warning", "the agent did not report its Python",
                                       UPGRADE)),
    ("python", {"host": HostFacts(python_version="3.10.12")},
     ("fail", "Python 3.10.12", "install Python 3.11 or newer for the agent")),
    ("python", {"host": HostFacts(python_version="3.11.0")}, ("ok", "Python 3.11.0", "")),
    ("python", {"host": HostFacts(python_version="3.9")}, ("fail", "Python 3.9",
                                                           "install Python 3.11 or newer for "
                                                           "the agent")),
    # nvidia-driver
    ("nvidia-driver", {"node": {"gpus": [{"class": "h100-80g", "count": 2},
                                         {"class": "l40s-48g", "count": 3}]}},
     ("fail", "5 GPUs declared, none reported",
      "install the NVIDIA driver (nvidia-smi must list the GPUs), or remove `gpus` from the "
      "node")),
    ("nvidia-driver", {"gpus": [gpu(0)], "warnings": [
        "NVML: version mismatch", "disk: slow", "nvml: retry", "nvidia-smi: timeout"]},
     ("warning", "NVML: version mismatch; nvml: retry; nvidia-smi: timeout",
      "check the driver with `nvidia-smi` on the node")),
    ("nvidia-driver", {}, ("ok", "no GPUs declared or found (CPU node)", "")),
    ("nvidia-driver", {"gpus": [gpu(0), gpu(1)]}, ("ok", "2 GPUs reported by the driver", "")),
    # gpu-ecc
    ("gpu-ecc", {"gpus": [gpu(0, 2), gpu(1, 0), gpu(2, 1)]},
     ("fail", "uncorrected ECC errors: GPU 0 (2 errors), GPU 2 (1 errors); placement skips "
      "them", "drain the GPU, then reset it (`nvidia-smi -r -i N`) or have it replaced")),
    ("gpu-ecc", {"gpus": [gpu(0, 0)]}, ("ok", "no uncorrected ECC errors", "")),
    ("gpu-ecc", {}, ("ok", "no GPUs", "")),
    # gpu-processes
    ("gpu-processes", {"gpus": [
        gpu(0, None, GpuProcess(pid=42, name="python3"), GpuProcess(pid=7, owned_by_llmgw=True)),
        gpu(1, None, GpuProcess(pid=43))]},
     ("fail", "memory held by processes llmgw did not start: GPU 0: pid 42 (python3), "
      "GPU 1: pid 43", "stop those processes (llmgw never kills what it did not start)")),
    ("gpu-processes", {"gpus": [gpu(0, None, GpuProcess(pid=7, owned_by_llmgw=True))]},
     ("ok", "no GPU held by other processes", "")),
    ("gpu-processes", {}, ("ok", "no GPUs", "")),
    # gpu-mig: engines take whole GPUs
    ("gpu-mig", {"gpus": [mode(gpu(0), mig="Enabled"), mode(gpu(1), mig="Disabled")]},
     ("fail", "MIG mode on GPU 0 (split into instances); engines take whole GPUs, so "
      "placement skips it", "if llmgw is to use it: `nvidia-smi -i 0 -mig 0` for each, then "
      "reset the GPU (`nvidia-smi -r -i N`)")),
    ("gpu-mig", {"gpus": [mode(gpu(0)), mode(gpu(1), mig="Enabled"), mode(gpu(2), mig="Enabled")]},
     ("fail", "MIG mode on GPU 1, 2 (split into instances); engines take whole GPUs, so "
      "placement skips them", "if llmgw is to use them: `nvidia-smi -i 1 -mig 0` for each, "
      "then reset the GPU (`nvidia-smi -r -i N`)")),
    ("gpu-mig", {}, ("ok", "no GPUs", "")),
    ("gpu-mig", {"gpus": [gpu(0), gpu(1)]},
     ("ok", "no GPU with MIG, or a driver that does not say", "")),
    ("gpu-mig", {"gpus": [gpu(0), mode(gpu(1), mig="Disabled")]},
     ("ok", "MIG off on every GPU that has it", "")),
    # gpu-persistence
    ("gpu-persistence", {"gpus": [mode(gpu(0), persistence="Disabled"),
                                  mode(gpu(1), persistence="Enabled"),
                                  mode(gpu(2), persistence="Disabled")]},
     ("warning", "persistence mode off on GPU 0, 2: the driver lets go of an idle GPU, and the "
      "next engine start waits for it to be set up again",
      "enable nvidia-persistenced (`systemctl enable --now nvidia-persistenced`)")),
    ("gpu-persistence", {}, ("ok", "no GPUs", "")),
    ("gpu-persistence", {"gpus": [gpu(0)]},
     ("ok", "persistence mode not reported by this driver", "")),
    ("gpu-persistence", {"gpus": [gpu(0), mode(gpu(1), persistence="Enabled")]},
     ("ok", "persistence mode on every GPU", "")),
    # fabric-adapters
    ("fabric-adapters", {}, ("ok", "no fabric declared", "")),
    ("fabric-adapters", {"node": IB, "adapters": [UP[2], UP[0], Adapter(name="mlx5_9")]},
     ("fail", "declared adapters not present: ib-a: mlx5_1 (found: mlx5_0, mlx5_4, mlx5_9)",
      "fix the node's `fabrics` in nodes.yaml, or the adapter (driver, firmware)")),
    ("fabric-adapters", {"node": IB},
     ("fail", "declared adapters not present: ib-a: mlx5_0; ib-a: mlx5_1; ib-b: mlx5_4 "
      "(found: none)", "fix the node's `fabrics` in nodes.yaml, or the adapter (driver, "
      "firmware)")),
    ("fabric-adapters", {"node": IB, "adapters": UP},
     ("ok", "every declared adapter present (3)", "")),
    # fabric-ports: an absent adapter is fabric-adapters' to report, not a port down
    ("fabric-ports", {"node": IB, "adapters": [UP[0], Adapter(name="mlx5_4", ports=[
        port(1, "INIT")])]},
     ("fail", "no ACTIVE port on ib-b: mlx5_4; NCCL leaves it out",
      "check the cable and the subnet manager (`ibstat`), or the switch port")),
    ("fabric-ports", {"node": IB, "adapters": [Adapter(name=n, ports=[port(1, "DOWN")])
                                               for n in ("mlx5_0", "mlx5_1", "mlx5_4")]},
     ("fail", "no ACTIVE port on ib-a: mlx5_0; ib-a: mlx5_1; ib-b: mlx5_4; NCCL leaves them "
      "out", "check the cable and the subnet manager (`ibstat`), or the switch port")),
    ("fabric-ports", {"node": IB, "adapters": UP},
     ("ok", "every declared adapter has an ACTIVE port", "")),
    ("fabric-ports", {}, ("ok", "no fabric declared", "")),
    # roce-gids: GID index 3 unless the fabric names one
    ("roce-gids", {"node": IB, "fabrics": roce(None)}, ("ok", "no RoCE fabric declared", "")),
    ("roce-gids", {"node": ROCE_NODE, "fabrics": roce(None), "adapters": [Adapter(
        name="mlx5_2", ports=[port(1, gids=["a", "b", "c", LINK],
                                   types=["", "", "", "RoCE v2"])])]},
     ("ok", "GID index holds a RoCE v2 address on every declared port", "")),
    ("roce-gids", {"node": ROCE_NODE, "fabrics": roce(None), "adapters": [Adapter(
        name="mlx5_2", ports=[port(1, gids=["a", "b", "c", LINK]),
                              port(2, gids=["a", "b", "c", ZEROS], types=["", "", "", "RoCE v2"]),
                              port(3, gids=["a", "b", "c", LINK],
                                   types=["", "", "", "IB/RoCE v1"])])]},
     ("fail", f"mlx5_2 port 2 GID 3: {ZEROS} (RoCE v2); mlx5_2 port 3 GID 3: {LINK} "
      "(IB/RoCE v1)", ROCE_FIX)),
    ("roce-gids", {"node": ROCE_NODE, "fabrics": roce(1), "adapters": [Adapter(
        name="mlx5_2", ports=[port(1, gids=[LINK], types=["RoCE v2"])])]},
     ("fail", "mlx5_2 port 1 GID 1: none", ROCE_FIX)),
    # An absent adapter is fabric-adapters' to report: no port of it to look at here.
    ("roce-gids", {"node": ROCE_NODE, "fabrics": roce(None)},
     ("ok", "GID index holds a RoCE v2 address on every declared port", "")),
    ("roce-gids", {"node": ROCE_NODE, "fabrics": roce(0), "adapters": [Adapter(
        name="mlx5_2", ports=[port(1, gids=[LINK], types=["RoCE v2"])])]},
     ("ok", "GID index holds a RoCE v2 address on every declared port", "")),
    # memlock
    ("memlock", {}, ("ok", "no RDMA fabric declared; the limit does not matter", "")),
    ("memlock", {"node": IB, "host": None}, ("warning", "the memlock limit is unknown", UPGRADE)),
    ("memlock", {"node": IB}, ("warning", "the memlock limit is unknown", UPGRADE)),
    ("memlock", {"node": IB, "host": HostFacts(memlock_unlimited=True)},
     ("ok", "memlock unlimited", "")),
    ("memlock", {"node": IB, "host": HostFacts(memlock_bytes=65536)},
     ("fail", "memlock limited to 65536 bytes; RDMA pins memory",
      "set LimitMEMLOCK=infinity in llmgw-agent.service (engines inherit it)")),
    # The limits engines really get win over the agent's own: a systemd that lacks
    # CAP_SYS_RESOURCE grants LimitMEMLOCK=infinity only up to its own hard limit.
    ("memlock", {"node": IB, "host": HostFacts(memlock_unlimited=True, engine_limits=CLAMPED)},
     ("fail", "engines get memlock 65536 bytes (llmgw-m-r0-s0.service (pid 812)); NCCL over "
      "InfiniBand pins memory and needs it unlimited", MEMLOCK_FIX)),
    ("memlock", {"node": IB, "host": HostFacts(memlock_bytes=8388608, engine_limits=UNLIMITED)},
     ("ok", "memlock unlimited for engines (llmgw-m-r0-s0.service (pid 812))", "")),
    # nofile
    ("nofile", {}, ("ok", "the agent reports no engine limits; not checked", "")),
    ("nofile", {"host": HostFacts(engine_limits=EngineLimits(memlock_unlimited=True,
                                                             source="a probe unit"))},
     ("warning", "the open-files limit engines get is unknown (a probe unit)", UPGRADE)),
    ("nofile", {"host": HostFacts(engine_limits=CLAMPED.model_copy(update={"nofile": 1024}))},
     ("warning", "engines may open 1024 files (llmgw-m-r0-s0.service (pid 812)); one "
      "connection or weight file each", NOFILE_FIX)),
    ("nofile", {"host": HostFacts(engine_limits=CLAMPED.model_copy(update={"nofile": 4096}))},
     ("ok", "engines may open 4096 files (llmgw-m-r0-s0.service (pid 812))", "")),
    # engines
    ("engines", {}, ("ok", "no model needs an engine here", "")),
    ("engines", {"engines": ("llama.cpp", "vllm"), "host": None},
     ("fail", "not on the agent's PATH: llama-server (llama.cpp), vllm (vllm)",
      INSTALL)),
    ("engines", {"engines": ("llama.cpp", "sglang", "vllm"), "host": HostFacts(engines=[
        EngineBinary(name="llama-server", path="/usr/bin/llama-server", executable=True),
        EngineBinary(name="vllm", path="/opt/vllm/bin/vllm")])},
     ("fail", "not on the agent's PATH: vllm (vllm)",
      INSTALL)),
    ("engines", {"engines": ("sglang",)}, ("warning", "not checked: sglang", "")),
    # A version llmgw installed counts, whatever is on PATH: its units put it first.
    ("engines", {"engines": ("llama.cpp", "vllm"), "host": HostFacts(installed_engines=[
        InstalledEngine(engine="llama.cpp", version="11434.0.0", path="/e/l")])},
     ("fail", "not on the agent's PATH: vllm (vllm)", INSTALL)),
    ("engines", {"engines": ("llama.cpp", "sglang", "vllm"), "host": HostFacts(
        installed_engines=[InstalledEngine(engine="vllm", version="0.33.0", path="/e/v"),
                           InstalledEngine(engine="sglang", version="0.5.23", path="/e/s")],
        engines=[EngineBinary(name="llama-server", path="/usr/bin/llama-server",
                              executable=True)])},
     ("ok", "llama-server at /usr/bin/llama-server, sglang installed by llmgw, vllm installed "
      "by llmgw", "")),
    ("engines", {"engines": ("llama.cpp", "vllm"), "host": HostFacts(engines=[
        EngineBinary(name="vllm", path="/opt/vllm/bin/vllm", executable=True),
        EngineBinary(name="llama-server", path="/usr/bin/llama-server", executable=True)])},
     ("ok", "llama-server at /usr/bin/llama-server, vllm at /opt/vllm/bin/vllm", "")),
    # disk: the worst weights directory decides; a limit itself is on the lenient side
    ("disk", {}, ("ok", "no weights_dirs declared", "")),
    ("disk", {"node": {"weights_dirs": ["/a", "/b", "/c"]}, "disks": [disk("/b")]},
     ("fail", "weights directory missing: /a, /c",
      "create it on the node, or fix the node's weights_dirs")),
    ("disk", {"node": {"weights_dirs": ["/a", "/b"]},
              "disks": [disk("/a", 30 * GiB), disk("/b", None)]},
     ("ok", "/a: 30.0 GiB free", "")),
    ("disk", {"node": {"weights_dirs": ["/a"]}, "disks": [disk("/a")]},
     ("ok", "unknown", "")),
    ("disk", {"node": {"weights_dirs": ["/a", "/b"]},
              "disks": [disk("/a", 20 * GiB), disk("/b", 40 * GiB)]},
     ("ok", "/a: 20.0 GiB free; /b: 40.0 GiB free", "")),
    ("disk", {"node": {"weights_dirs": ["/a", "/b"]},
              "disks": [disk("/a", 40 * GiB), disk("/b", 5 * GiB)]},
     ("warning", "/b: 5.0 GiB free", "free space there, or add another weights_dir")),
    ("disk", {"node": {"weights_dirs": ["/a"]}, "disks": [disk("/a", 5 * GiB - 1)]},
     ("fail", "/a: 5.0 GiB free", "free space there, or add another weights_dir")),
    # clock: the node's time against this host's
    ("clock", {"collected_at": None}, ("warning", "the report carries no time", UPGRADE)),
    ("clock", {"collected_at": NOW - 0.25}, ("ok", "node clock within 0.5s of this host's", "")),
    ("clock", {"collected_at": NOW + 0.5}, ("ok", "node clock 0.5s ahead of this host's", "")),
    ("clock", {"collected_at": NOW - 2}, ("ok", "node clock 2.0s behind this host's", "")),
    ("clock", {"collected_at": NOW + 2.25},
     ("warning", "node clock 2.2s ahead of this host's", NTP)),
    ("clock", {"collected_at": NOW - 30}, ("warning", "node clock 30.0s behind this host's", NTP)),
    ("clock", {"collected_at": NOW - 30.25}, ("fail", "node clock 30.2s behind this host's", NTP)),
    # engine-ports: the 16 ports from engine_ports_from, less llmgw's own units'
    ("engine-ports", {"host": None}, ("warning", "listening ports unknown", UPGRADE)),
    ("engine-ports", {"host": HostFacts()}, ("warning", "listening ports unknown", UPGRADE)),
    ("engine-ports", {"node": {"engine_ports_from": 18000},
                      "host": HostFacts(listening_ports=[17999, 18000, 18001, 18015, 18016]),
                      "units": [Unit(name="u", model="m", replica=0, digest="d", state="ready",
                                     port=18001),
                                Unit(name="v", model="m", replica=1, digest="d",
                                     state="stopped")]},
     ("fail", "ports taken by programs llmgw did not start: 18000, 18015",
      "stop them, or move the node's engine_ports_from past them")),
    ("engine-ports", {"node": {"engine_ports_from": 19000},
                      "host": HostFacts(listening_ports=[18999, 19016])},
     ("ok", "19000-19015 free or llmgw's", "")),
])
def test_verdict(check: str, kwargs: dict[str, Any], expected: tuple[str, str, str]) -> None:
    assert verdict(check, **kwargs) == expected


def test_the_ssh_check_says_how_the_agent_was_reached() -> None:
    ctx = doctors.Context(version=V, now=NOW)
    up = NodeReport(node="n", agent_version=V, collected_at=NOW, host=HOST)
    assert {f.node for f in doctors.examine("g7", Node(address="10.0.0.1"), up, ctx)} == {"g7"}
    assert doctors.examine("n", Node(address="10.0.0.1"), up, ctx)[0] == doctors.Finding(
        "n", "ssh", "ok", "agent reached through SSH, host key pinned")
    assert doctors.examine("n", Node(address="local"), up, ctx)[0] == doctors.Finding(
        "n", "ssh", "ok", "agent reached through its local socket")
    down = NodeReport(node="n", reachable=False)
    assert doctors.examine("n", Node(address="10.0.0.1"), down, ctx) == [doctors.Finding(
        "n", "ssh", "fail", "unreachable", "see the message: it names what to check")]


def test_failed_means_any_check_failed() -> None:
    def finding(status: doctors.Status) -> doctors.Finding:
        return doctors.Finding("n", "c", status, "")
    assert not doctors.failed([])
    assert not doctors.failed([finding("ok"), finding("warning")])
    assert doctors.failed([finding("ok"), finding("fail")])


CLUSTER = Cluster.model_validate({
    "cluster": {"name": "lab"},
    "fabrics": {"ib-a": {"kind": "infiniband"}, "roce-a": {"kind": "roce", "gid_index": 1}},
    "nodes": {"g1": {"address": "10.0.0.1"}},
    "models": {
        "small": {"profiles": [{"engine": "llama.cpp", "cpu": True}]},
        "chat": {"profiles": [{"engine": "vllm", "gpu_class": "h100-80g"},
                              {"engine": "sglang", "gpu_class": ["a100-80g", "l40s-48g"]}]},
    },
})


@pytest.mark.parametrize(("classes", "engines"), [
    ((), ("llama.cpp",)),  # a CPU node runs CPU profiles only
    (("h100-80g",), ("vllm",)),
    (("l40s-48g",), ("sglang",)),  # a profile's list of classes: any of them
    (("h100-80g", "a100-80g"), ("sglang", "vllm")),
    (("t4-16g",), ()),
])
def test_context_asks_for_the_engines_a_node_may_run(
        classes: tuple[str, ...], engines: tuple[str, ...]) -> None:
    report = NodeReport(node="g1", gpus=[
        Gpu(index=i, uuid=f"GPU-{i}", name="x", gpu_class=c) for i, c in enumerate(classes)])
    ctx = doctors.context_for(CLUSTER, "g1", report, version="1.2.3", now=NOW)
    assert ctx == doctors.Context(version="1.2.3", now=NOW, engines=engines, fabrics={
        "ib-a": ("infiniband", None), "roce-a": ("roce", 1)})
