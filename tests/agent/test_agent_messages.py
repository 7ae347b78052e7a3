"""The gRPC messages and the fleet types describe the same things, field by field."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from llmgw.agent import messages as agent_messages
from llmgw.discovery.fabrics import Declaration, DeclaredFabric
from llmgw.fleet import types as fleet
from llmgw.proto import agent_pb2 as pb
from llmgw.proto import conversions as messages
from llmgw.proto.conversions import UnitChange
from llmgw.transport.agent_client import declaration_to_message


def full_report() -> fleet.NodeReport:
    """A report with every field set to something other than its default."""
    return fleet.NodeReport(
        node="gpu-a-01", reachable=False, error="boom", hostname="gpu-a-01.lab",
        agent_version="0.1.0", cpu_model="Intel(R) Xeon(R) Platinum 8480+", cpu_count=224,
        cpu_flags=["avx2", "amx_tile"], memory_total_bytes=2**41, memory_available_bytes=2**40,
        gpus=[fleet.Gpu(
            index=3, uuid="GPU-1", name="NVIDIA H100 80GB HBM3", gpu_class="h100-80g",
            pci_bus_id="00000000:5D:00.0", memory_total_mib=81559, memory_used_mib=18436,
            compute_capability="9.0", ecc_uncorrected=2, utilization_pct=37,
            nvlink_peers=[0, 1, 2],
            processes=[fleet.GpuProcess(pid=48213, name="python3", used_memory_mib=18434,
                                        owned_by_llmgw=True)],
        )],
        adapters=[fleet.Adapter(name="mlx5_0", ports=[fleet.Port(
            number=1, state="ACTIVE", phys_state="LinkUp", rate="400 Gb/sec (4X NDR)",
            rate_gbps=400.0, link_layer="InfiniBand", gids=["fe80::1"], gid_types=["RoCE v2"],
            lid="0xb0", sm_lid="0x1",
        )])],
        pci_gpus=[fleet.PciCard(address="0000:41:00.0", device_id="2330", driver="nvidia"),
                  fleet.PciCard(address="0000:c1:00.0")],
        fabrics=[fleet.FabricStatus(name="roce-a", kind="roce", adapters=["mlx5_0"],
                                    advertised=True, reasons=["x"], gid_index=3)],
        disks=[fleet.Disk(path="/models", free_bytes=5 * 2**40, total_bytes=7 * 2**40,
                          mount=fleet.Mount(mount_point="/mnt/models", fs_type="nfs4",
                                            source="filer-a:/export/models", root="/llm",
                                            shared=True))],
        weights=[fleet.Weights(path="/models/x", format="gguf", size_bytes=123)],
        units=[fleet.Unit(
            name="llmgw-m-r1-s2.service", model="m", replica=1, rank=2, digest="abc",
            state="failed", port=18000, pid=99, since=1.5, last_used=2.5, log_tail=["l1"],
            detail="exited", labels={"X-Llmgw-Model": "m", "X-Llmgw-Spec": "{}"},
        )],
        collected_at=1700000000.25, warnings=["w"],
    )


def fields_of(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


@pytest.mark.parametrize("name", sorted(messages.FLEET_TYPES))
def test_every_fleet_field_has_a_proto_field_and_back(name: str) -> None:
    proto_fields = {f.name for f in getattr(pb, name).DESCRIPTOR.fields}
    assert proto_fields == fields_of(messages.FLEET_TYPES[name]), (
        "llmgw/proto/agent.proto and llmgw/fleet/types.py drifted; add the field to both"
    )


def test_a_full_report_survives_the_wire() -> None:
    report = full_report()
    wire = messages.report_to_message(report).SerializeToString()
    assert messages.report_from_message(pb.NodeReport.FromString(wire)) == report


def test_decoded_reports_share_their_field_sets_and_a_copy_changes_only_its_own() -> None:
    wire = messages.report_to_message(full_report()).SerializeToString()
    one, two = (messages.report_from_message(pb.NodeReport.FromString(wire)) for _ in "12")
    assert one == two and one is not two
    # One set of field names for both (it is over half of a decoded report's memory)…
    assert one.__pydantic_fields_set__ is two.__pydantic_fields_set__
    assert one.gpus[0].__pydantic_fields_set__ is two.gpus[0].__pydantic_fields_set__
    given = set(one.model_fields_set)
    # …which a copy with an update does not change for the other.
    renamed = one.model_copy(update={"node": "gpu-b-07", "cpu_count": 8})
    assert renamed.model_fields_set == given | {"node", "cpu_count"}
    assert two.model_fields_set == given and one.model_fields_set == given
    assert two.node == "gpu-a-01" and two.model_dump(exclude_unset=True) == \
        one.model_dump(exclude_unset=True)


def test_absent_stays_absent_and_empty_stays_empty() -> None:
    gpu = fleet.Gpu(index=0, uuid="GPU-0", name="NVIDIA L40S", gpu_class="l40s-45g",
                    utilization_pct=0, nvlink_peers=[])
    unknown = gpu.model_copy(update={"nvlink_peers": None, "utilization_pct": None})
    report = fleet.NodeReport(node="n", gpus=[gpu, unknown])
    back = messages.report_from_message(
        pb.NodeReport.FromString(messages.report_to_message(report).SerializeToString())
    )
    assert back.gpus[0].utilization_pct == 0 and back.gpus[0].nvlink_peers == []
    assert back.gpus[1].utilization_pct is None and back.gpus[1].nvlink_peers is None
    assert back.gpus[0].memory_total_mib is None and back.memory_total_bytes is None


def test_a_disk_from_an_agent_without_mounts_has_its_mount_unknown() -> None:
    # What an agent before field 4 sends: path and sizes only.
    older = pb.Disk(path="/models", free_bytes=10, total_bytes=20).SerializeToString()
    disk = messages.from_message(pb.Disk.FromString(older), fleet.Disk)
    assert disk == fleet.Disk(path="/models", free_bytes=10, total_bytes=20)
    assert disk.mount is None


def test_fields_a_newer_agent_sends_are_dropped_by_an_older_reader() -> None:
    message = messages.unit_to_message(full_report().units[0])

    class OlderUnit(BaseModel):
        name: str
        state: str

    assert messages.from_message(message, OlderUnit) == OlderUnit(
        name="llmgw-m-r1-s2.service", state="failed"
    )


def test_declaration_and_changes_round_trip() -> None:
    declared = Declaration(
        "n1", (DeclaredFabric("ib-a", "infiniband", ("mlx5_0",)),
               DeclaredFabric("roce-a", "roce", ("mlx5_1",), 0)), ("/models",),
    )
    assert agent_messages.declaration_from_message(declaration_to_message(declared)) == declared
    for action in ("start", "stop", "remove"):
        change = UnitChange("u", "text", "A=1\n", {"HF_TOKEN": "/etc/t"}, action)  # type: ignore[arg-type]
        assert messages.change_from_message(messages.change_to_message(change)) == change


def test_a_change_without_action_is_refused() -> None:
    with pytest.raises(ValueError, match="no action given"):
        messages.change_from_message(pb.UnitChange(name="u"))
