"""Conversations: kept only where a project says so, and purged past retention."""

from __future__ import annotations

import contextlib
from pathlib import Path

from llmgw.daemon import housekeeping
from llmgw.spec.models import Cluster
from llmgw.store import conversations, databases

DAY = 86400.0
NOW = 1_800_000_000.0


def spec(retention: str | None) -> Cluster:
    notes = {"conversations": {"retention": retention}} if retention else {}
    return Cluster.model_validate({"cluster": {"name": "lab"},
                                   "projects": {"notes": notes, "research": {}}})


def test_the_daemon_purges_conversations_past_retention_and_their_text(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.db"
    with contextlib.closing(databases.connect(path)) as db:
        old = conversations.create(db, "cy", "notes", "old", now=NOW - 31 * DAY)
        conversations.append(db, old, "cy", [("user", "old-secret-text")], now=NOW - 31 * DAY)
        new = conversations.create(db, "cy", "notes", "new", now=NOW - DAY)
        conversations.append(db, new, "cy", [("user", "new-text")], now=NOW - DAY)
        assert housekeeping.purge_once(db, spec("30d"), NOW) == 1
        assert [c.id for c in conversations.list_for(db, "cy")] == [new]
        assert conversations.messages(db, old) == []
        # Turning conversations off for the project deletes what it kept.
        assert housekeeping.purge_once(db, spec(None), NOW) == 1
        assert conversations.list_for(db, "cy") == []
    data = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert b"old-secret-text" not in data and b"new-text" not in data


def test_a_conversation_is_visible_only_to_its_owner(tmp_path: Path) -> None:
    with contextlib.closing(databases.connect(tmp_path / "llmgw.db")) as db:
        cid = conversations.create(db, "cy", "notes", "mine", now=NOW)
        assert conversations.get(db, cid, "bob") is None
        assert not conversations.append(db, cid, "bob", [("user", "intruder")], now=NOW)
        assert not conversations.delete(db, cid, "bob")
        assert conversations.get(db, cid, "cy") is not None


def test_retention_must_be_given_and_positive() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="retention"):
        Cluster.model_validate({"cluster": {"name": "lab"},
                                "projects": {"p": {"conversations": {}}}})
    with pytest.raises(ValidationError, match="longer than zero"):
        spec("0s")


def test_admin_shows_fetches_in_progress_from_the_fleet() -> None:
    from llmgw.daemon import admin
    from llmgw.fleet.types import Fetch, Fleet, NodeReport

    fleet = Fleet(nodes={"gpu-01": NodeReport(node="gpu-01", fetches=[
        Fetch(target="org/big", state="running", bytes_done=250, bytes_total=1000),
        Fetch(target="org/small", state="done", bytes_done=10, bytes_total=10),
        Fetch(target="org/gone", state="failed", error="404 from the hub"),
    ])})
    shown = admin.progress(fleet)
    assert [(p.name, p.percent, p.state) for p in shown] == [
        ("org/big", 25, "running"), ("org/gone", None, "failed: 404 from the hub")]
