"""Agent settings (paths relative to the file) and report collection fallbacks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from agent_support import NODES, node_settings

from llmgw.agent import reports, settings
from llmgw.discovery.fabrics import Declaration


def test_paths_resolve_against_the_settings_file(tmp_path: Path) -> None:
    (tmp_path / "agent.yaml").write_text(
        "socket: {path: run/agent.sock}\nstate_dir: state\n"
        "hardware: {sysfs_root: sys, proc_root: /proc, nvidia_smi: ./smi}\n"
        "systemd: {unit_dir: units, env_dir: /etc/llmgw/env}\n"
        "declared: {weights_dirs: [models, /srv/models]}\n"
    )
    loaded = settings.load(tmp_path / "agent.yaml")
    assert loaded.socket.path == str(tmp_path / "run/agent.sock")
    assert loaded.state_dir == str(tmp_path / "state")
    assert loaded.hardware.sysfs_root == str(tmp_path / "sys")
    assert loaded.hardware.proc_root == "/proc"
    assert loaded.hardware.nvidia_smi == str(tmp_path / "smi")
    assert loaded.systemd.unit_dir == str(tmp_path / "units")
    assert loaded.declared.weights_dirs == [str(tmp_path / "models"), "/srv/models"]


def test_defaults_are_production_paths() -> None:
    defaults = settings.Settings()
    assert defaults.socket.path == "/run/llmgw/agent.sock"
    assert (defaults.socket.mode_bits, defaults.socket.group) == (0o660, "llmgw")
    assert defaults.systemd.unit_dir == "/etc/systemd/system"
    assert defaults.systemd.env_dir == "/etc/llmgw/env"
    assert defaults.hardware.nvidia_smi == "nvidia-smi"  # looked up on PATH
    assert defaults.backend_kind == ("systemd" if os.path.isdir("/run/systemd/system")
                                     else "supervise")


def test_every_fixture_node_config_loads() -> None:
    for node in sorted(p.name for p in NODES.iterdir() if p.is_dir()):
        loaded = settings.load(NODES / node / "agent.yaml")
        assert loaded.node == node and loaded.hardware.nvml == "off"


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    (tmp_path / "agent.yaml").write_text("# nothing set\n")
    assert settings.load(tmp_path / "agent.yaml") == settings.Settings()
    with pytest.raises(settings.SettingsError, match="cannot read"):
        settings.load(tmp_path / "absent.yaml")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(settings.SettingsError, match="expected a mapping"):
        settings.load(tmp_path / "list.yaml")


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


async def gpus_with(smi: str | None, tmp_path: Path) -> reports.GpuFacts:
    root = tmp_path
    overrides = {"nvidia_smi": smi or str(tmp_path / "no-such-nvidia-smi")}
    chosen = node_settings("cpu-only", root, hardware=overrides)
    return await reports.Collector(chosen).gpus()


async def test_no_nvidia_smi_is_a_cpu_node_without_warnings(tmp_path: Path) -> None:
    facts = await gpus_with(None, tmp_path)
    assert (facts.records, facts.source, facts.warnings) == ([], "none", [])


async def test_a_broken_driver_is_a_warning_not_an_error(tmp_path: Path) -> None:
    text = (Path(__file__).parents[1] / "fixtures/nvidia-smi/no-driver.txt").read_text()
    smi = script(tmp_path / "nvidia-smi", f"cat <<'EOF'\n{text}EOF\nexit 9\n")
    facts = await gpus_with(smi, tmp_path)
    assert facts.records == []
    assert facts.warnings == [
        "nvidia-smi: " + smi + " exited with status 9: NVIDIA-SMI has failed because it "
        "couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA "
        "driver is installed and running."
    ]


async def test_no_devices_is_quietly_no_gpus(tmp_path: Path) -> None:
    smi = script(tmp_path / "nvidia-smi", "echo 'No devices were found'\nexit 6\n")
    assert (await gpus_with(smi, tmp_path)).warnings == []


async def test_a_hanging_nvidia_smi_times_out(tmp_path: Path) -> None:
    smi = script(tmp_path / "nvidia-smi", "exec sleep 30\n")
    root = tmp_path
    chosen = node_settings("cpu-only", root, hardware={"nvidia_smi": smi,
                                                       "command_timeout": 0.3})
    facts = await reports.Collector(chosen).gpus()
    assert facts.warnings == [f"nvidia-smi: {smi} did not finish within 0.3s"]


async def test_process_query_failing_is_said(tmp_path: Path) -> None:
    rows = (NODES / "l40s-nofabric" / "query-gpu.csv").read_text()
    smi = script(tmp_path / "nvidia-smi", f'case "$1" in --query-gpu=*) cat <<\'EOF\'\n{rows}EOF\n'
                 ";; *) echo 'Unable to determine the device handle' >&2; exit 15;; esac\n")
    facts = await gpus_with(smi, tmp_path)
    assert len(facts.records) == 4 and facts.source == "nvidia-smi"
    assert any("GPU processes unknown" in w for w in facts.warnings), facts.warnings


async def test_nvml_auto_falls_back_to_nvidia_smi_here(tmp_path: Path) -> None:
    root = tmp_path
    chosen = node_settings("h100-ib", root, hardware={"nvml": "auto"})
    facts = await reports.Collector(chosen).gpus()
    if facts.source == "nvml":  # a machine with a real GPU
        pytest.skip("NVML works on this machine; the fallback is not exercised")
    assert facts.source == "nvidia-smi" and len(facts.records) == 8 and facts.warnings == []


async def test_absent_stays_absent_through_the_report(tmp_path: Path) -> None:
    root = tmp_path
    chosen = node_settings("old-driver", root)
    report = await reports.Collector(chosen).collect(Declaration("n"))
    assert [g.utilization_pct for g in report.gpus] == [None] * 4
    assert report.disks == [] and report.fabrics == [] and report.weights == []
    dumped = report.model_dump()
    first = dumped["gpus"][0]
    assert first["utilization_pct"] is None and first["nvlink_peers"] is None


async def test_without_nvml_nvlink_peers_and_mig_come_from_nvidia_smi(tmp_path: Path) -> None:
    """The agent runs the identity query and ``topo -m`` (recorded, ANSI colour and all)."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"
    rows = ("0, GPU-ec845691-fb46-e16d-abfb-b135308cb39f, NVIDIA A100-SXM4-80GB, "
            "00000000:07:00.0, 81920, 0, 8.0, 0, 0\n"
            "1, GPU-91672fbd-4bc1-0434-a653-77a9501c84de, NVIDIA A100-SXM4-80GB, "
            "00000000:0F:00.0, 81920, 0, 8.0, 0, 0\n")
    smi = script(tmp_path / "nvidia-smi",
                 'case "$*" in\n'
                 f"--query-gpu=index*) cat <<'EOF'\n{rows}EOF\n;;\n"
                 f"--query-gpu=uuid*) cat {fixtures / 'mig-mode-one-enabled.csv'};;\n"
                 f"'topo -m') cat {fixtures / 'topo-2x-nv12-tty-colour.txt'};;\n"
                 "*) echo 'No running processes found';;\nesac\n")
    facts = await gpus_with(smi, tmp_path)
    assert [(r.mig_mode, r.nvlink_peers) for r in facts.records] == [
        ("Enabled", (1,)), ("Disabled", (0,))]
    assert facts.warnings == []


async def test_a_gpu_no_driver_answers_for_is_in_the_report_as_a_node_fault(
    tmp_path: Path,
) -> None:
    """The recorded PCI bus holds three H100s, one without a driver; nvidia-smi is absent."""
    sysfs = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs" / "gpu-no-driver" / "sys"
    chosen = node_settings("cpu-only", tmp_path, hardware={
        "sysfs_root": str(sysfs), "nvidia_smi": str(tmp_path / "no-such-nvidia-smi")})
    report = await reports.Collector(chosen).collect(Declaration("n"))
    assert [(c.address, c.driver) for c in report.pci_gpus] == [
        ("0000:41:00.0", "nvidia"), ("0000:81:00.0", "nvidia"), ("0000:c1:00.0", None)]
    assert report.gpus == [] and report.faults == [
        "3 NVIDIA cards on the PCI bus, 0 answer: 0000:c1:00.0 has no driver bound; "
        "check `dmesg | grep -i nvidia`, the driver version and `nvidia-smi -q`"]


async def test_each_weights_directory_reports_the_mount_it_lies_on(tmp_path: Path) -> None:
    """The fixture node's own recorded-format mountinfo (under its proc_root): /models is
    the lab's NFS filer, its fixture models directory the local root filesystem."""
    chosen = node_settings("h100-ib", tmp_path)
    local = str(NODES / "h100-ib" / "models")
    report = await reports.Collector(chosen).collect(Declaration("n", (), ("/models", local)))
    mounts = {d.path: d.mount for d in report.disks}
    nfs, root = mounts["/models"], mounts[local]
    assert nfs is not None and root is not None
    assert (nfs.fs_type, nfs.source, nfs.shared) == ("nfs4", "filer-a.lab:/export/models", True)
    assert (root.fs_type, root.source, root.shared) == ("ext4", "/dev/nvme0n1p2", False)


async def test_an_unreadable_mountinfo_leaves_every_mount_unknown(tmp_path: Path) -> None:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    chosen = node_settings("h100-ib", tmp_path, hardware={"proc_root": str(tmp_path / "proc")})
    report = await reports.Collector(chosen).collect(Declaration("n", (), (str(tmp_path),)))
    assert [d.mount for d in report.disks] == [None]
