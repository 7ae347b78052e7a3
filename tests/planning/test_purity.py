"""plan() is a pure function: no files, no sockets, no clock while it runs."""

from __future__ import annotations

import builtins
import io
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from plan_builders import cluster_from, fleet_from
from test_plan_cases import load_case

from llmgw.planning import outputs, plans

SCENARIO = Path(__file__).parent / "golden" / "scenario.yaml"


def test_plan_touches_no_file_socket_process_or_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    case = load_case(SCENARIO)
    cluster = cluster_from(case["cluster"])
    fleet = fleet_from(cluster, case.get("fleet"), case.get("running"), 1.7e9, case.get("gone"))
    touched: list[str] = []

    def forbidden(name: str) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            touched.append(name)
            raise AssertionError(f"plan() called {name}")
        return refuse

    with monkeypatch.context() as patch:
        for owner, name in ((builtins, "open"), (io, "open"), (os, "stat"), (os, "listdir"),
                            (socket, "socket"), (subprocess, "run"), (subprocess, "Popen"),
                            (time, "time"), (time, "monotonic"), (time, "perf_counter")):
            patch.setattr(owner, name, forbidden(f"{owner.__name__}.{name}"))
        result = plans.plan(cluster, fleet, 1.7e9)
        rendered = outputs.text(result) + outputs.markdown(result) + outputs.json_text(result)
    assert touched == []
    assert result.changes and "Plan:" in rendered
