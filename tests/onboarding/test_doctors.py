"""``llmgw doctor``: one failing check per fixture fault, a table per check, the CLI over sshd."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from typing import Any

import pytest
from support import nodes
from support.plugin import SimClusterFactory

from llmgw import __version__
from llmgw.agent import reports, settings
from llmgw.fleet.types import (
    Disk,
    EngineBinary,
    Gpu,
    HostFacts,
    InstalledEngine,
    NodeReport,
    Unit,
)
from llmgw.onboarding import doctors
from llmgw.spec.models import Node

NOW = 1_800_000_000.0

# Every fault the fixture nodes carry, as the one check that must fail for it.
FIXTURE_FAULTS = {
    "h100-ib": [],
    "l40s-nofabric": [],
    "cpu-only": [],
    "a100-roce": [],
    "faulty": ["gpu-ecc", "gpu-processes", "fabric-ports"],  # GPU 3 ECC, GPU 6 held, mlx5_2 INIT
    "old-driver": ["fabric-adapters", "memlock"],  # mlx5_0 absent, memlock 64 KiB
    "a100-mig": ["sudo", "gpu-mig"],  # agent uid 1000 without sudo, GPU 0 in MIG mode
}
# And every fixture condition that is worth a warning, not a failure.
FIXTURE_WARNINGS = {
    "old-driver": ["nvidia-driver"],  # before R450: no MIG, persistence, device id query
    "a100-mig": ["gpu-persistence"],  # persistence mode off on every GPU
}


def fixture_report(hardware: str) -> tuple[Node, NodeReport, doctors.Context]:
    chosen = settings.load(nodes.FIXTURES / hardware / "agent.yaml")
    report = asyncio.run(reports.Collector(chosen).collect(chosen.declaration()))
    declared = nodes.fixture_settings(hardware)["declared"]
    # The report reads this machine's listening ports: check engine ports nobody holds.
    spec = Node(address="127.0.0.1", engine_ports_from=nodes.free_ports(doctors.PORTS_CHECKED),
                fabrics={n: f["adapters"] for n, f in declared.get("fabrics", {}).items()})
    fabrics = {n: (f["kind"], f.get("gid_index")) for n, f in declared.get("fabrics", {}).items()}
    ctx = doctors.Context(version=__version__, now=report.collected_at or NOW, fabrics=fabrics)
    return spec, report, ctx


def failing(findings: list[doctors.Finding]) -> list[str]:
    return [f.check for f in findings if f.status == "fail"]


@pytest.mark.parametrize("hardware", sorted(FIXTURE_FAULTS))
def test_each_fixture_fault_is_exactly_one_failing_check(hardware: str) -> None:
    spec, report, ctx = fixture_report(hardware)
    findings = doctors.examine(hardware, spec, report, ctx)
    assert [f.check for f in findings] == ["ssh", *(name for name, _ in doctors.CHECKS)]
    assert failing(findings) == FIXTURE_FAULTS[hardware], findings
    assert [f.check for f in findings if f.status == "warning"] == FIXTURE_WARNINGS.get(
        hardware, []), findings
    assert all(f.fix for f in findings if f.status != "ok")


def report(**fields: Any) -> NodeReport:
    base: dict[str, Any] = {"node": "n", "agent_version": __version__, "collected_at": NOW,
                            "host": HostFacts(python_version="3.11.7", listening_ports=[],
                                              agent_uid=0)}
    return NodeReport(**{**base, **fields})


H100 = Gpu(index=0, uuid="GPU-1", name="NVIDIA H100 80GB HBM3", gpu_class="h100-80g")


@pytest.mark.parametrize(("check", "node", "observed", "engines", "status", "detail"), [
    pytest.param("agent-version", {}, {"agent_version": "0.0.9"}, (), "warning",
                 f"agent 0.0.9, this llmgw {__version__}", id="older-agent"),
    pytest.param("python", {}, {"host": HostFacts(python_version="3.10.12")}, (), "fail",
                 "Python 3.10.12", id="old-python"),
    pytest.param("nvidia-driver", {"gpus": [{"class": "h100-80g", "count": 8}]},
                 {"warnings": ["nvidia-smi: not found"]}, (), "fail",
                 "8 GPUs declared, none reported (nvidia-smi: not found)", id="no-driver"),
    pytest.param("engines", {}, {"host": HostFacts(engines=[])}, ("llama.cpp",), "fail",
                 "not on the agent's PATH: llama-server (llama.cpp)", id="engine-missing"),
    pytest.param("engines", {}, {"host": HostFacts(engines=[EngineBinary(
                 name="llama-server", path="/opt/llama/llama-server", executable=True)])},
                 ("llama.cpp",), "ok", "llama-server at /opt/llama/llama-server",
                 id="engine-present"),
    pytest.param("engines", {}, {"host": HostFacts(engines=[], installed_engines=[InstalledEngine(
                 engine="llama.cpp", version="11434.0.0",
                 path="/opt/llmgw/engines/llama.cpp-11434.0.0")])},
                 ("llama.cpp",), "ok", "llama.cpp installed by llmgw", id="engine-installed"),
    pytest.param("disk", {"weights_dirs": ["/models"]}, {}, (), "fail",
                 "weights directory missing: /models", id="weights-dir-missing"),
    pytest.param("disk", {"weights_dirs": ["/models"]},
                 {"disks": [Disk(path="/models", free_bytes=3 << 30)]}, (), "fail",
                 "/models: 3.0 GiB free", id="disk-nearly-full"),
    pytest.param("disk", {"weights_dirs": ["/models"]},
                 {"disks": [Disk(path="/models", free_bytes=12 << 30)]}, (), "warning",
                 "/models: 12.0 GiB free", id="disk-low"),
    pytest.param("clock", {}, {"collected_at": NOW + 45}, (), "fail",
                 "node clock 45.0s ahead of this host's", id="clock-skew"),
    pytest.param("clock", {}, {"collected_at": NOW - 5}, (), "warning",
                 "node clock 5.0s behind this host's", id="clock-drift"),
    pytest.param("engine-ports", {"engine_ports_from": 18000},
                 {"host": HostFacts(listening_ports=[22, 18000, 18003]),
                  "units": [Unit(name="u", model="m", replica=0, digest="d", state="ready",
                                 port=18000)]},
                 (), "fail", "ports taken by programs llmgw did not start: 18003",
                 id="port-taken"),
    pytest.param("gpu-ecc", {}, {"gpus": [H100.model_copy(update={"ecc_uncorrected": 2})]},
                 (), "fail", "uncorrected ECC errors: GPU 0 (2 errors); placement skips it",
                 id="ecc"),
    pytest.param("sudo", {}, {"host": HostFacts(agent_uid=0, listening_ports=[])}, (), "ok",
                 "the agent runs as root", id="root"),
    pytest.param("sudo", {}, {"host": HostFacts(agent_uid=998, sudo=True, listening_ports=[])},
                 (), "ok", "the agent runs as uid 998, with password-less sudo", id="sudo"),
    pytest.param("sudo", {}, {"host": HostFacts(agent_uid=998, sudo=False, listening_ports=[])},
                 (), "fail", "the agent runs as uid 998, which may not sudo without a password",
                 id="no-sudo"),
    pytest.param("sudo", {}, {"host": HostFacts(listening_ports=[])}, (), "warning",
                 "the agent did not report its uid", id="uid-unknown"),
    pytest.param("gpu-mig", {}, {"gpus": [H100.model_copy(update={"mig_mode": "Enabled"})]},
                 (), "fail", "MIG mode on GPU 0 (split into instances); engines take whole "
                 "GPUs, so placement skips it", id="mig"),
    pytest.param("gpu-mig", {}, {"gpus": [H100.model_copy(update={"mig_mode": "Disabled"})]},
                 (), "ok", "MIG off on every GPU that has it", id="mig-off"),
    pytest.param("gpu-persistence", {},
                 {"gpus": [H100.model_copy(update={"persistence_mode": "Disabled"})]}, (),
                 "warning", "persistence mode off on GPU 0: the driver lets go of an idle GPU, "
                 "and the next engine start waits for it to be set up again",
                 id="persistence-off"),
    pytest.param("gpu-persistence", {},
                 {"gpus": [H100.model_copy(update={"persistence_mode": "Enabled"})]}, (),
                 "ok", "persistence mode on every GPU", id="persistence-on"),
])
def test_check_table(check: str, node: dict[str, Any], observed: dict[str, Any],
                     engines: tuple[str, ...], status: str, detail: str) -> None:
    spec = Node(address="10.0.0.1", **node)
    ctx = doctors.Context(version=__version__, now=NOW, engines=engines)
    found = {f.check: f for f in doctors.examine("n", spec, report(**observed), ctx)}
    assert (found[check].status, found[check].detail) == (status, detail)
    others = [f.check for f in found.values() if f.status == "fail" and f.check != check]
    assert others == []


def test_unreachable_node_gets_only_the_ssh_check() -> None:
    down = NodeReport(node="n", reachable=False, error="host key: … not pinned")
    findings = doctors.examine("n", Node(address="10.0.0.1"), down,
                               doctors.Context(version=__version__, now=NOW))
    assert [(f.check, f.status, f.detail) for f in findings] == [
        ("ssh", "fail", "host key: … not pinned")]


@pytest.mark.skipif(not shutil.which(nodes.SSHD), reason="sshd not installed")
def test_doctor_over_sshd_names_each_fault_and_exits_1(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(4, hardware=["h100-ib", "faulty", "old-driver", "a100-mig"])
    directory = sim.write_cluster()

    def doctor(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "llmgw", "doctor", "--cluster",
                               str(directory), *args], capture_output=True, text=True,
                              timeout=120)

    result = doctor("--json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    got = {n: [f["check"] for f in fs if f["status"] == "fail"] for n, fs in data["nodes"].items()}
    assert got == {"node-01": [], "node-02": FIXTURE_FAULTS["faulty"],
                   "node-03": FIXTURE_FAULTS["old-driver"], "node-04": FIXTURE_FAULTS["a100-mig"]}
    ssh = {n: fs[0]["detail"] for n, fs in data["nodes"].items()}
    assert set(ssh.values()) == {"agent reached through SSH, host key pinned"}

    healthy = doctor("node-01")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "FAIL" not in healthy.stdout and "1 node checked: 0 failed" in healthy.stdout

    text = doctor("node-02")
    assert text.returncode == 1
    assert "FAIL  gpu-ecc" in text.stdout and "fix: drain the GPU" in text.stdout

    unknown = doctor("node-09")
    assert unknown.returncode == 1 and "no node named node-09" in unknown.stderr
    assert "Traceback" not in unknown.stderr

    sim.nodes["node-01"].stop_sshd()
    down = doctor("node-01", "--json")
    assert down.returncode == 1
    assert [f["check"] for f in json.loads(down.stdout)["nodes"]["node-01"]] == ["ssh"]


ENGINE_INSTALLS = {
    # fixture node: (status, the words its detail or fix holds)
    "h100-ib": ("ok", "vllm 0.11.0: can be installed: 8 GPUs, driver 550.54.15 (CUDA 12.8 "
                "needs 525.60.13), compute capability 9.0"),
    "cpu-only": ("ok", "vllm 0.11.0: skipped: no GPU: vLLM runs on GPUs only"),
    "old-driver": ("fail", "fix: vllm 0.11.0: upgrade the NVIDIA driver to 525.60.13 or newer"),
}


@pytest.mark.parametrize("hardware", sorted(ENGINE_INSTALLS))
def test_engine_install_says_per_node_whether_vllm_can_be_installed(hardware: str) -> None:
    spec, found, ctx = fixture_report(hardware)
    assert found.host is not None
    # What the agent's server adds to the collector's report: where engines go, its space.
    found = found.model_copy(update={"host": found.host.model_copy(update={
        "engines_dir": "/var/lib/llmgw/engines", "engines_free_bytes": 100 << 30,
        "c_compiler": "/usr/bin/gcc"})})
    ctx = doctors.Context(version=ctx.version, now=ctx.now, fabrics=ctx.fabrics,
                          installs=(("vllm", "0.11.0", "auto"),))
    finding, = [f for f in doctors.examine(hardware, spec, found, ctx)
                if f.check == "engine-install"]
    status, words = ENGINE_INSTALLS[hardware]
    assert finding.status == status, finding
    assert words in f"{finding.detail} fix: {finding.fix}", finding


def test_the_cluster_names_the_versions_doctor_checks() -> None:
    from llmgw.spec.models import Cluster
    cluster = Cluster.model_validate({
        "cluster": {"name": "c"},
        "engines": {"vllm": {"version": "0.11.0", "install": "auto"},
                    "sglang": {"version": "0.5.3", "install": "never"}},
        "models": {"m": {"source": "org/m", "profiles": [
            {"engine": "vllm", "engine_version": "0.10.2", "gpu_class": "h100-80g"},
            {"engine": "llama.cpp", "engine_version": "11434.0.0", "cpu": True}]}}})
    ctx = doctors.context_for(cluster, "n", report(), version=__version__, now=NOW)
    assert ctx.installs == (("sglang", "0.5.3", "never"), ("vllm", "0.10.2", "profiles"),
                            ("vllm", "0.11.0", "auto"))
