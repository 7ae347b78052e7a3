"""The systemd backend's drift evidence, kept on disk: one JSON file per unit.

systemd forgets a unit as soon as it stops and nothing references it (llmgw
does not enable its units): the next ``systemctl show`` says
``ExecMainCode=0``, as if the unit had never run. And ``NRestarts`` and the
last exit are only there while the unit stays loaded. So what tells drift
classes apart is written down here, when it is seen:

* ``wanted`` — what llmgw last asked of the unit ("running" or "stopped");
  a unit llmgw wants running that is found stopped, under the same PID 1,
  was stopped by someone else;
* ``boot`` — which PID 1 llmgw started it under (:func:`boot_identity`); under
  a new one (a reboot) a stopped unit is just not started yet;
* ``crashes`` — unix times of abnormal ends, oldest first (a crash-loop hold
  counts them), with ``restarts_seen``, the ``NRestarts`` already counted, so
  restarts that happened while no agent looked still count as crashes;
* ``last_exit`` / ``last_exit_at`` / ``last_exit_mono`` — the last end seen.

The files outlive the agent, so a hold or a crash history holds across an
agent restart. A file that is not one this module wrote is moved aside
(``<name>.json.corrupt-<time>``) and the unit starts a fresh record.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TypedDict

from llmgw.agent import units

log = logging.getLogger(__name__)
WANTED = ("", "running", "stopped")


class Record(TypedDict):
    wanted: str
    boot: str
    crashes: list[float]
    restarts_seen: int
    last_exit: str
    last_exit_at: float | None
    last_exit_mono: int


def fresh() -> Record:
    return Record(wanted="", boot="", crashes=[], restarts_seen=0, last_exit="",
                  last_exit_at=None, last_exit_mono=0)


def _valid(data: object) -> Record | None:
    if not isinstance(data, dict):
        return None
    try:
        at = data["last_exit_at"]
        record = Record(
            wanted=str(data["wanted"]), boot=str(data["boot"]),
            crashes=[float(t) for t in data["crashes"]],
            restarts_seen=int(data["restarts_seen"]), last_exit=str(data["last_exit"]),
            last_exit_at=float(at) if at is not None else None,
            last_exit_mono=int(data["last_exit_mono"]),
        )
    except (KeyError, TypeError, ValueError):
        return None
    return record if record["wanted"] in WANTED else None


class Store:
    """The evidence files of one node, in ``directory``."""

    def __init__(self, directory: Path, readonly: bool = False) -> None:
        self.directory = directory
        self.readonly = readonly

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    def load(self, name: str) -> Record:
        path = self._path(name)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return fresh()
        except OSError as exc:
            log.warning("%s: cannot read %s: %s", name, path, exc.strerror or exc)
            return fresh()
        try:
            record = _valid(json.loads(raw.decode()))
        except ValueError:  # not UTF-8, not JSON
            record = None
        if record is None:
            if self.readonly:
                log.warning("%s: %s is not an evidence file llmgw wrote", name, path)
                return fresh()
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            path.rename(aside)
            log.warning("%s: %s is not an evidence file llmgw wrote; moved aside to %s",
                        name, path, aside.name)
            return fresh()
        record["crashes"] = record["crashes"][-units.CRASHES_KEPT:]
        return record

    def save(self, name: str, record: Record) -> None:
        if self.readonly:
            return
        units.write(self._path(name), json.dumps(record, sort_keys=True) + "\n", mode=0o600)

    def forget(self, name: str) -> None:
        if not self.readonly:
            units.remove(self._path(name))


def boot_identity(proc: Path) -> str:
    """This PID 1's identity: the kernel's boot id and PID 1's start time.

    A reboot changes both; a container restarted on a running kernel keeps
    the boot id but not PID 1's start time. "" when neither can be read.
    """
    parts = []
    try:
        parts.append((proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip())
    except OSError:
        parts.append("")
    try:
        stat = (proc / "1" / "stat").read_text()
        parts.append(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError):
        parts.append("")
    return ":".join(parts) if any(parts) else ""
