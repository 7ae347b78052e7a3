"""Which filesystem a weights directory lies on, read from mountinfo in the kernel's format
(``tests/fixtures/mountinfo/SOURCES.md`` says where each file came from)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.discovery import disks, mounts
from llmgw.fleet.stores import is_shared

FIXTURES = Path(__file__).parents[1] / "fixtures" / "mountinfo"


def lines(name: str) -> list[mounts.MountLine]:
    return mounts.parse((FIXTURES / name).read_text())


@pytest.mark.parametrize(
    ("fixture", "directory", "fs_type", "source", "root", "shared"),
    [
        pytest.param("nfs-gpu-node.txt", "/mnt/models", "nfs4",
                     "filer-a.example.com:/export/models", "/", True, id="nfs4"),
        pytest.param("nfs-gpu-node.txt", "/home/llmgw/models", "nfs", "10.0.0.6:/export/home",
                     "/llmgw/models", True, id="nfs3-below-its-mount-point"),
        pytest.param("nfs-gpu-node.txt", "/scratch/models", "xfs", "/dev/md0", "/models", False,
                     id="xfs-local"),
        pytest.param("nfs-gpu-node.txt", "/var/lib/llmgw/models", "ext4", "/dev/nvme0n1p2",
                     "/var/lib/llmgw/models", False, id="ext4-root"),
        pytest.param("lustre-node.txt", "/lustre/fs01/models", "lustre",
                     "10.10.0.1@o2ib,10.10.0.2@o2ib:/fs01", "/models", True, id="lustre"),
        pytest.param("gpfs-beegfs-node.txt", "/gpfs/fs1/llm", "gpfs", "fs1", "/llm", True,
                     id="gpfs"),
        pytest.param("gpfs-beegfs-node.txt", "/mnt/beegfs", "beegfs", "beegfs_nodev", "/", True,
                     id="beegfs"),
        pytest.param("cephfs-node.txt", "/mnt/cephfs", "ceph",
                     "10.0.0.11:6789,10.0.0.12:6789,10.0.0.13:6789:/volumes/_nogroup/models",
                     "/", True, id="cephfs-old-syntax"),
        pytest.param("cephfs-node.txt", "/mnt/ceph2/llm", "ceph",
                     "llmgw@8d6e4c0e-2b1f-11ef-9c3a-525400a1b2c3.cephfs=/volumes/models", "/llm",
                     True, id="cephfs-new-syntax"),
        pytest.param("cephfs-node.txt", "/mnt/ceph-fuse", "fuse.ceph-fuse", "ceph-fuse", "/",
                     True, id="ceph-fuse"),
        pytest.param("container-overlay.txt", "/models/org", "nfs4",
                     "filer-a.example.com:/export/models", "/llm/org", True,
                     id="container-bind-of-an-export-subdirectory"),
        pytest.param("container-overlay.txt", "/root/.cache/huggingface", "xfs", "/dev/md0",
                     "/cache/huggingface", False, id="container-bind-of-local-xfs"),
        pytest.param("container-overlay.txt", "/opt/models", "overlay", "overlay", "/opt/models",
                     False, id="container-overlay-root"),
        pytest.param("container-overlay.txt", "/mnt/my models", "nfs4",
                     "filer-a.example.com:/export/models", "/", True, id="escaped-space"),
        pytest.param("vm-ext4-recorded.txt", "/work/models", "ext4", "/dev/vda", "/work/models",
                     False, id="recorded-ext4"),
        pytest.param("vm-ext4-recorded.txt", "/dev/shm/models", "tmpfs", "tmpfs", "/models",
                     False, id="recorded-tmpfs-mounted-over"),
    ],
)
def test_a_directory_is_on_the_mount_the_kernel_resolves_it_to(
    fixture: str, directory: str, fs_type: str, source: str, root: str, shared: bool,
) -> None:
    mount = mounts.find(directory, lines(fixture))
    assert mount is not None
    assert (mount.fs_type, mount.source, mount.root, mount.shared) == (fs_type, source, root,
                                                                       shared)


def test_the_options_are_never_kept_they_may_hold_credentials() -> None:
    found = lines("cephfs-node.txt")
    assert all("secret" not in repr(line) for line in found)


def test_nfs3_and_nfs4_of_one_export_are_one_store() -> None:
    four = mounts.find("/mnt/models", lines("nfs-gpu-node.txt"))
    three = mounts.find("/x", mounts.parse(
        "40 1 0:50 / /x rw - nfs filer-a.example.com:/export/models/ rw,vers=3\n"))
    assert four is not None and three is not None
    assert four.store == three.store


def test_garbled_lines_are_skipped_and_nothing_covers_an_empty_table() -> None:
    text = "garbage\n12 1 0:1 / /a rw\n31 1 259:2 / / rw,relatime shared:1 - ext4 /dev/x rw\n"
    assert [line.mount_point for line in mounts.parse(text)] == ["/"]
    assert mounts.find("/models", []) is None


def test_the_cluster_may_say_otherwise_of_a_type() -> None:
    assert is_shared("nfs4") and not is_shared("fuse.mystore")
    assert is_shared("fuse.mystore", {"fuse.mystore": True})
    assert not is_shared("nfs4", {"nfs4": False})


def test_disks_carry_their_mount_symlinks_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    table = (f"31 1 259:2 / / rw - ext4 /dev/nvme0n1p2 rw\n"
             f"312 31 0:52 / {real} rw - nfs4 filer-a:/export/models rw,vers=4.2\n")
    found, warnings = disks.read([str(tmp_path / "link"), "/nonexistent"], table)
    assert [d.mount.fs_type if d.mount else None for d in found] == ["nfs4", "ext4"]
    assert found[0].free_bytes is not None and found[1].free_bytes is None
    assert len(warnings) == 1
    unknown, _ = disks.read([str(tmp_path)], None)
    assert unknown[0].mount is None


def test_a_point_mounted_over_is_the_last_mount() -> None:
    """``mount filer:/x /models`` over a local /models: the kernel resolves the later."""
    text = ("29 1 259:2 / / rw - ext4 /dev/nvme0n1p2 rw\n"
            "98 29 259:5 / /models rw - xfs /dev/md0 rw\n"
            "312 98 0:52 / /models rw - nfs4 filer-a:/export/models rw,vers=4.2\n")
    mount = mounts.find("/models/org/name", mounts.parse(text))
    assert mount is not None and (mount.fs_type, mount.root) == ("nfs4", "/org/name")
