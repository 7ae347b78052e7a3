"""Between gRPC messages and llmgw's own types, by field name.

The proto's field names are the fleet types' field names, so one walk over
the message descriptor converts either way, with two conventions:

* an ``optional`` scalar left unset is ``None`` (absent is not zero);
* an ``IndexList`` message field stands for ``list[int] | None`` (unset:
  unknown), which a repeated field cannot express.

Going to a message, a proto field the fleet type lacks is an error (the two
drifted). Coming from a message, a field the fleet type lacks is dropped: an
agent newer than its daemon may report more than the daemon knows.
"""

from __future__ import annotations

from typing import Any, TypeVar

from google.protobuf.message import Message
from pydantic import BaseModel

from llmgw.agent.units import Action, UnitChange, UnitResult
from llmgw.discovery.fabrics import Declaration, DeclaredFabric
from llmgw.fleet import types as fleet
from llmgw.proto import agent_pb2 as pb

M = TypeVar("M", bound=BaseModel)
P = TypeVar("P", bound=Message)

FLEET_TYPES: dict[str, type[BaseModel]] = {
    "NodeReport": fleet.NodeReport, "Gpu": fleet.Gpu, "GpuProcess": fleet.GpuProcess,
    "Adapter": fleet.Adapter, "Port": fleet.Port, "FabricStatus": fleet.FabricStatus,
    "Disk": fleet.Disk, "Weights": fleet.Weights, "Unit": fleet.Unit,
}
_INDEX_LIST = "IndexList"
ACTIONS: dict[pb.Action.ValueType, Action] = {
    pb.ACTION_START: "start", pb.ACTION_STOP: "stop", pb.ACTION_REMOVE: "remove",
}


def _is_map(field: Any) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def to_message(model: BaseModel, message: P) -> P:
    """Fill ``message`` from ``model``; returns ``message``."""
    for field in message.DESCRIPTOR.fields:
        value = getattr(model, field.name)
        if value is None:
            continue
        target = getattr(message, field.name)
        if _is_map(field):
            target.update(value)
        elif field.message_type is not None and field.message_type.name == _INDEX_LIST:
            target.SetInParent()  # present, even when the list is empty
            target.values.extend(value)
        elif field.is_repeated:
            if field.message_type is not None:
                for item in value:
                    to_message(item, target.add())
            else:
                target.extend(value)
        elif field.message_type is not None:
            target.SetInParent()
            to_message(value, target)
        else:
            setattr(message, field.name, value)
    return message


def from_message(message: Message, cls: type[M]) -> M:
    """The fleet object ``message`` describes (validated by pydantic)."""
    data: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        name = field.name
        if name not in cls.model_fields:
            continue
        value = getattr(message, name)
        if _is_map(field):
            data[name] = dict(value)
        elif field.message_type is not None and field.message_type.name == _INDEX_LIST:
            data[name] = list(value.values) if message.HasField(name) else None
        elif field.is_repeated:
            if field.message_type is not None:
                item_cls = FLEET_TYPES[field.message_type.name]
                data[name] = [from_message(item, item_cls) for item in value]
            else:
                data[name] = list(value)
        elif field.message_type is not None:
            if message.HasField(name):
                data[name] = from_message(value, FLEET_TYPES[field.message_type.name])
        elif field.has_presence and not message.HasField(name):
            continue
        else:
            data[name] = value
    return cls.model_validate(data)


def report_to_message(report: fleet.NodeReport) -> pb.NodeReport:
    return to_message(report, pb.NodeReport())


def report_from_message(message: pb.NodeReport) -> fleet.NodeReport:
    return from_message(message, fleet.NodeReport)


def unit_to_message(unit: fleet.Unit) -> pb.Unit:
    return to_message(unit, pb.Unit())


def unit_from_message(message: pb.Unit) -> fleet.Unit:
    return from_message(message, fleet.Unit)


def declaration_to_message(declaration: Declaration) -> pb.ReportRequest:
    request = pb.ReportRequest(node=declaration.node, weights_dirs=declaration.weights_dirs)
    for fabric in declaration.fabrics:
        item = request.fabrics.add(name=fabric.name, kind=fabric.kind, adapters=fabric.adapters)
        if fabric.gid_index is not None:
            item.gid_index = fabric.gid_index
    return request


def declaration_from_message(request: pb.ReportRequest) -> Declaration:
    """What the daemon declared; raises ValueError on a fabric kind llmgw does not know."""
    fabrics = []
    for item in request.fabrics:
        if item.kind not in ("infiniband", "roce"):
            raise ValueError(f"fabric {item.name}: unknown kind {item.kind!r}")
        fabrics.append(
            DeclaredFabric(
                item.name, item.kind, tuple(item.adapters),  # type: ignore[arg-type]
                item.gid_index if item.HasField("gid_index") else None,
            )
        )
    return Declaration(request.node, tuple(fabrics), tuple(request.weights_dirs))


def change_to_message(change: UnitChange) -> pb.UnitChange:
    codes = {action: code for code, action in ACTIONS.items()}
    return pb.UnitChange(
        name=change.name, unit_text=change.unit_text, env_text=change.env_text,
        secret_env=dict(change.secret_env), action=codes[change.action],
    )


def change_from_message(message: pb.UnitChange) -> UnitChange:
    """The change asked for; raises ValueError when no action is given."""
    action = ACTIONS.get(message.action)
    if action is None:
        raise ValueError(f"{message.name}: no action given (start, stop or remove)")
    return UnitChange(
        message.name, message.unit_text, message.env_text, dict(message.secret_env), action
    )


def result_to_message(result: UnitResult) -> pb.UnitResult:
    return pb.UnitResult(name=result.name, ok=result.ok, changed=result.changed, error=result.error)


def result_from_message(message: pb.UnitResult) -> UnitResult:
    return UnitResult(message.name, message.ok, message.changed, message.error)
