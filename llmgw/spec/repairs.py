"""``cluster.drift``: what the daemon repairs, per class of drift.

The classes and the evidence for each are :mod:`llmgw.planning.drifts`; these
types only say, per class, whether a difference of that class is repaired,
and when an engine's crashes make a crash loop that is held instead.
"""

from __future__ import annotations

from pydantic import Field

from llmgw.spec.bases import Strict
from llmgw.spec.quantities import Duration


class CrashLoop(Strict):
    crashes: int = Field(
        5, ge=1, le=32, description="Crashes of one engine within `window` that make a crash "
        "loop: the engine is stopped and held, not restarted, until the window has fewer.")
    window: Duration = Field(
        600.0, gt=0, le=86400.0, description="How far back crashes count (at most a day).")


class Repair(Strict):
    repair: bool = Field(
        True, description="`false`: drift of this class is shown (plan, status, metrics) and "
        "held, never repaired by the daemon or `llmgw apply`.")


class EngineCrashRepair(Repair):
    crash_loop: CrashLoop | None = Field(
        default_factory=CrashLoop,
        description="When a crashing engine stops being restarted; `null` restarts it always.")


class DriftSettings(Strict):
    """What the daemon repairs, per class of drift (llmgw.planning.drifts).

    Declared changes follow `sync`; a lost node is never repaired (its replicas are
    unknown, not placed twice), so neither has a setting here.
    """

    engine_crash: EngineCrashRepair = Field(
        default_factory=EngineCrashRepair,
        description="An engine that exited with an error or was killed by a signal nobody "
        "stops by.")
    hardware_fault: Repair = Field(
        default_factory=Repair,
        description="A GPU with uncorrected ECC errors, in MIG mode or gone; a fabric that is "
        "down: the replica moves.")
    foreign_process: Repair = Field(
        default_factory=Repair,
        description="A process llmgw did not start holds memory on the replica's GPUs: the "
        "replica moves.")
    stopped_by_hand: Repair = Field(
        default_factory=Repair,
        description="A unit stopped by someone other than llmgw (`systemctl stop`, a signal), "
        "or removed: it is started again.")
    stranger_unit: Repair = Field(
        default_factory=Repair,
        description="A unit named like llmgw's that no llmgw agent wrote: it is removed.")
    agent_restarted: Repair = Field(
        default_factory=Repair,
        description="A unit that is not running because its node rebooted or its engine ended "
        "while the agent was down: it is started again.")
