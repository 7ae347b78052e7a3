"""The agent API's own types, and conversion between messages and fleet types.

Both ends of the API use this module: the agent (``llmgw.agent``) and its
client (``llmgw.transport.agent_client``), which may not import each other.

The proto's field names are the fleet types' field names, so one walk over a
message descriptor converts either way, with two conventions:

* an ``optional`` scalar left unset is ``None`` (absent is not zero);
* an ``IndexList`` message field stands for ``list[int] | None`` (unset:
  unknown), which a repeated field cannot express.

Going to a message, a proto field the fleet type lacks is an error (the two
drifted; a test checks they match). Coming from a message, a field the fleet
type lacks is dropped: an agent newer than its daemon may report more than
the daemon knows.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from google.protobuf.message import Message
from pydantic import BaseModel

from llmgw.fleet import types as fleet
from llmgw.fleet.deltas import Delta
from llmgw.proto import agent_pb2 as pb

M = TypeVar("M", bound=BaseModel)
P = TypeVar("P", bound=Message)

Action = Literal["start", "stop", "remove"]


@dataclass(frozen=True)
class UnitChange:
    """One unit as the daemon wants it on a node (see ``UnitChange`` in agent.proto)."""

    name: str
    unit_text: str
    env_text: str = ""
    secret_env: Mapping[str, str] = field(default_factory=dict)
    action: Action = "start"


@dataclass(frozen=True)
class UnitResult:
    name: str
    ok: bool
    changed: bool = False
    error: str = ""


FLEET_TYPES: dict[str, type[BaseModel]] = {
    "NodeReport": fleet.NodeReport, "Gpu": fleet.Gpu, "GpuProcess": fleet.GpuProcess,
    "Adapter": fleet.Adapter, "Port": fleet.Port, "FabricStatus": fleet.FabricStatus,
    "Disk": fleet.Disk, "Mount": fleet.Mount, "Weights": fleet.Weights, "Unit": fleet.Unit,
    "Fetch": fleet.Fetch, "CachedWeights": fleet.CachedWeights,
    "HostFacts": fleet.HostFacts, "EngineBinary": fleet.EngineBinary,
    "InstalledEngine": fleet.InstalledEngine, "EngineLimits": fleet.EngineLimits,
    "EngineLoad": fleet.EngineLoad, "PciCard": fleet.PciCard,
}
_INDEX_LIST = "IndexList"
ACTIONS: dict[pb.Action.ValueType, Action] = {
    pb.ACTION_START: "start", pb.ACTION_STOP: "stop", pb.ACTION_REMOVE: "remove",
}


def _is_map(descriptor: Any) -> bool:
    return descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry


def to_message(model: BaseModel, message: P) -> P:
    """Fill ``message`` from ``model``; returns ``message``."""
    for descriptor in message.DESCRIPTOR.fields:
        value = getattr(model, descriptor.name)
        if value is None:
            continue
        target = getattr(message, descriptor.name)
        kind = descriptor.message_type
        if _is_map(descriptor):
            target.update(value)
        elif kind is not None and kind.name == _INDEX_LIST:
            target.SetInParent()  # present, even when the list is empty
            target.values.extend(value)
        elif descriptor.is_repeated:
            if kind is not None:
                for item in value:
                    to_message(item, target.add())
            else:
                target.extend(value)
        elif kind is not None:
            target.SetInParent()
            to_message(value, target)
        else:
            setattr(message, descriptor.name, value)
    return message


def from_message(message: Message, cls: type[M]) -> M:
    """The fleet object ``message`` describes (validated by pydantic)."""
    data: dict[str, Any] = {}
    for descriptor in message.DESCRIPTOR.fields:
        name, kind = descriptor.name, descriptor.message_type
        if name not in cls.model_fields:
            continue
        value = getattr(message, name)
        if _is_map(descriptor):
            data[name] = {sys.intern(k): sys.intern(v) if isinstance(v, str) else v
                          for k, v in value.items()}
        elif kind is not None and kind.name == _INDEX_LIST:
            data[name] = list(value.values) if message.HasField(name) else None
        elif descriptor.is_repeated:
            if kind is not None:
                data[name] = [from_message(item, FLEET_TYPES[kind.name]) for item in value]
            else:
                # Interned: thousands of nodes report the same CPU flags, GIDs, paths.
                data[name] = [sys.intern(v) if isinstance(v, str) else v for v in value]
        elif kind is not None:
            if message.HasField(name):
                data[name] = from_message(value, FLEET_TYPES[kind.name])
        elif descriptor.has_presence and not message.HasField(name):
            continue
        else:
            data[name] = sys.intern(value) if isinstance(value, str) else value
    return _sharing_fields(cls.model_validate(data))


_FIELD_SETS: dict[frozenset[str], set[str]] = {}
_MAX_FIELD_SETS = 4096  # distinct sets kept (a type's fields present or not): a few dozen


def _sharing_fields(model: M) -> M:
    """``model`` holding the one set of its field names that equal ones share.

    pydantic gives every instance a set of the fields it was given
    (``__pydantic_fields_set__``): over half of a decoded report's memory (15 of
    29 KiB for an 8-GPU node, measured), and the same few sets for thousands of
    nodes. Only frozen models share one, which nothing changes in place (a copy,
    ``model_copy`` with an update included, copies the set first)."""
    if not model.model_config.get("frozen"):
        return model
    mine = model.__pydantic_fields_set__
    key = frozenset(mine)
    shared = _FIELD_SETS.get(key)
    if shared is None:
        if len(_FIELD_SETS) >= _MAX_FIELD_SETS:
            return model
        shared = _FIELD_SETS[key] = mine
    object.__setattr__(model, "__pydantic_fields_set__", shared)
    return model


def report_to_message(report: fleet.NodeReport) -> pb.NodeReport:
    return to_message(report, pb.NodeReport())


def report_from_message(message: pb.NodeReport) -> fleet.NodeReport:
    return from_message(message, fleet.NodeReport)


def delta_to_message(delta: Delta) -> pb.UnitEvent:
    """One push of the node's observations (``WatchRequest.push``) as its stream event."""
    event = pb.UnitEvent()
    if delta.report is not None:
        to_message(delta.report, event.report)
        return event
    for unit in delta.units:
        to_message(unit, event.units.add())
    event.removed_units.extend(delta.removed)
    if delta.fetches is not None:
        event.fetches_changed = True
        for item in delta.fetches:
            to_message(item, event.fetches.add())
    return event


def delta_from_message(event: pb.UnitEvent) -> Delta:
    if event.HasField("report"):
        return Delta(report=report_from_message(event.report))
    fetches = tuple(from_message(f, fleet.Fetch) for f in event.fetches) \
        if event.fetches_changed else None
    return Delta(units=tuple(unit_from_message(u) for u in event.units),
                 removed=tuple(event.removed_units), fetches=fetches)


def unit_to_message(unit: fleet.Unit) -> pb.Unit:
    return to_message(unit, pb.Unit())


def unit_from_message(message: pb.Unit) -> fleet.Unit:
    return from_message(message, fleet.Unit)


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
