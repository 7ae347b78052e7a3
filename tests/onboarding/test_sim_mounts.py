"""Simulated nodes report the lab's models directory on their fixture's filesystem:
an NFS filer on the InfiniBand nodes (one store for ib-a), a local disk elsewhere."""

from __future__ import annotations

from pathlib import Path

from llmgw.agent import reports, settings
from llmgw.discovery.fabrics import Declaration
from llmgw.onboarding.simnodes import SimNode, agent_config


async def test_the_lab_models_directory_is_on_the_fixture_filer(tmp_path: Path) -> None:
    models = tmp_path / "runtime" / "models"
    models.mkdir(parents=True)
    found = {}
    for name, hardware in (("gpu-01", "h100-ib"), ("gpu-02", "l40s-nofabric"),
                           ("cpu-01", "cpu-only")):
        node = SimNode(name, tmp_path / "runtime" / name, 0, tmp_path / "keys", hardware)
        node.root.mkdir()
        config = agent_config(node)
        config["socket"]["path"] = str(tmp_path / f"{name}.sock")
        collector = reports.Collector(settings.Settings.model_validate(config))
        report = await collector.collect(Declaration(name, (), (str(models),)))
        (disk,) = report.disks
        assert disk.mount is not None
        found[name] = (disk.mount.fs_type, disk.mount.source, disk.mount.shared)
    assert found == {"gpu-01": ("nfs4", "filer-a.lab:/export/models", True),
                     "gpu-02": ("xfs", "/dev/md0", False),
                     "cpu-01": ("overlay", "overlay", False)}
