"""What each fabric holds, as `llmgw status` prints it: shared stores once, local copies
per node (:mod:`llmgw.fleet.stores`, :mod:`llmgw.planning.holdings`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from plan_builders import cluster_from, fleet_from

from llmgw.cli import inventories
from llmgw.fleet import stores
from llmgw.fleet.types import CachedWeights, Disk, Fleet, Mount, NodeReport, Weights
from llmgw.planning import holdings

NFS = Mount(mount_point="/models", fs_type="nfs4", source="filer-a:/export/models", shared=True)
EXT4 = Mount(mount_point="/", fs_type="ext4", source="/dev/nvme0n1p2", root="/models")
CLUSTER = cluster_from({
    "fabrics": {"ib-a": {"kind": "infiniband"}},
    "nodes": {
        "gpu-a-01": {"address": "10.0.0.1", "weights_dirs": ["/models"],
                     "fabrics": {"ib-a": ["mlx5_0"]}},
        "gpu-a-02": {"address": "10.0.0.2", "weights_dirs": ["/models"],
                     "fabrics": {"ib-a": ["mlx5_0"]}},
        "gpu-b-01": {"address": "10.0.0.3", "weights_dirs": ["/models"]},
        "cpu-01": {"address": "10.0.0.4", "weights_dirs": ["/models"]},
    },
    "models": {
        "llama-8b": {"source": "meta-llama/Llama-3.1-8B-Instruct",
                     "profiles": [{"engine": "vllm", "gpu_class": "l40s-45g"}]},
        "qwen": {"source": "Qwen/Qwen2.5-7B-Instruct",
                 "profiles": [{"engine": "vllm", "gpu_class": "l40s-45g"}]},
    },
})
SNAPSHOT = "/models/hub/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/0e9e39f"


def report(name: str, mount: Mount | None, fetched: bool = False,
           placed: bool = False) -> NodeReport:
    cached = [CachedWeights(source="meta-llama/Llama-3.1-8B-Instruct", path=SNAPSHOT,
                            size_bytes=16_060_000_000)] if fetched else []
    weights = [Weights(path=SNAPSHOT, format="safetensors", size_bytes=16_060_000_000)
               ] if fetched else []
    if placed:
        weights.append(Weights(path="/models/Qwen/Qwen2.5-7B-Instruct", format="safetensors",
                               size_bytes=15_230_000_000))
    return NodeReport(node=name, disks=[Disk(path="/models", mount=mount)],
                      cached_weights=cached, weights=weights)


def fleet() -> Fleet:
    return Fleet(nodes={
        # Both agents see the one copy on the filer; it is one copy, not two.
        "gpu-a-01": report("gpu-a-01", NFS, fetched=True),
        "gpu-a-02": report("gpu-a-02", NFS, fetched=True, placed=True),
        "gpu-b-01": report("gpu-b-01", EXT4, fetched=True),
        "cpu-01": report("cpu-01", NFS),
    })


def test_status_shows_each_fabric_store_once_and_each_node_its_own() -> None:
    text = "\n".join(inventories.render_holdings(holdings.holdings(CLUSTER, fleet())))
    assert text == "\n".join([
        "",
        "Weights",
        "  ib-a: shared nfs4 filer-a:/export/models at /models, mounted by gpu-a-01, gpu-a-02",
        "    llama-8b  meta-llama/Llama-3.1-8B-Instruct  15.0 GiB",
        "    qwen      Qwen/Qwen2.5-7B-Instruct          14.2 GiB",
        "  gpu-b-01: local",
        "    llama-8b  meta-llama/Llama-3.1-8B-Instruct  15.0 GiB",
        "  cpu-01: /models: nfs4 filer-a:/export/models is shared, but the node is on no "
        "fabric: its copies count for this node only",
    ])


def test_a_copy_names_every_node_that_reported_it() -> None:
    found = stores.survey(fleet(), {n: list(s.fabrics) for n, s in CLUSTER.nodes.items()})
    (store,) = found.stores
    by_name = {c.name: c.nodes for c in store.copies}
    assert by_name == {"meta-llama/Llama-3.1-8B-Instruct": ("gpu-a-01", "gpu-a-02"),
                       "Qwen/Qwen2.5-7B-Instruct": ("gpu-a-02",)}
    assert found.of("gpu-a-02", "/models") is store and found.of("gpu-b-01", "/models") is None


def test_an_agent_without_mounts_keeps_its_copies_local() -> None:
    older = Fleet(nodes={"gpu-a-01": report("gpu-a-01", None, fetched=True)})
    found = holdings.holdings(CLUSTER, older)
    assert found.stores == () and [n for n, _ in found.local] == ["gpu-a-01"]


def test_the_plan_fetches_once_per_shared_store() -> None:
    """Two replicas on two nodes of one NFS filer: one fetch, the other waits for it."""
    from llmgw.planning import plans

    cluster = cluster_from({
        "fabrics": {"ib-a": {"kind": "infiniband"}},
        "nodes": {n: {"address": f"10.0.0.{i}", "gpus": [{"class": "l40s-45g", "count": 1}],
                      "weights_dirs": ["/models"], "fabrics": {"ib-a": ["mlx5_0"]}}
                  for i, n in enumerate(["gpu-01", "gpu-02", "gpu-03"], 1)},
        "models": {"llama-8b": {"source": "meta-llama/Llama-3.1-8B-Instruct",
                                "scaling": {"min": 3, "max": 3},
                                "profiles": [{"engine": "vllm", "gpu_class": "l40s-45g"}]}},
    })
    observed = fleet_from(cluster, {"gpu-01": {"mount": "nfs4 filer-a:/export/models"},
                                    "gpu-02": {"mount": "nfs4 filer-a:/export/models"},
                                    "gpu-03": {"mount": "ext4 /dev/sda1"}},
                          None, 0.0, None, {"meta-llama/Llama-3.1-8B-Instruct": "16GB"})
    plan = plans.plan(cluster, observed, 0.0)
    notes = {s.node: s.weights for c in plan.changes for s in c.shards}
    shared = " (shared: nfs4 filer-a:/export/models on ib-a)"
    assert notes == {
        "gpu-01": f"will fetch 16 GB into /models{shared}",
        "gpu-02": f"fetched once into /models{shared}, by gpu-01",
        "gpu-03": "will fetch 16 GB into /models",
    }


def test_a_declared_filesystem_type_is_checked_where_it_is_written(tmp_path: Path) -> None:
    from llmgw.spec import loading

    (tmp_path / "cluster.yaml").write_text(
        "cluster:\n  name: lab\n  weights:\n    filesystems:\n"
        "      fuse.juicefs: shared\n      'NFS 4!': shared\n      nfs4: sometimes\n")
    with pytest.raises(loading.SpecErrors) as caught:
        loading.load(tmp_path)
    text = str(caught.value)
    assert "cluster.yaml:6:7: cluster.weights.filesystems['NFS 4!']" in text, text
    assert ("cluster.yaml:7:13: cluster.weights.filesystems.nfs4: input should be 'shared' "
            "or 'local'") in text
