"""``llmgw audit`` and ``llmgw usage export`` on a real store (SQLite and PostgreSQL):
what the key and user commands wrote, read back as a table and as JSON; usage summed as
CSV and JSON; bad flags refused with a clear message, non-zero, and no traceback.
"""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from llmgw.cli.main import main
from llmgw.spec.models import StoreSettings
from llmgw.store import stores
from llmgw.store.usages import UsageRow


@pytest.fixture
def directory(tmp_path: Path, store_settings: dict[str, str]) -> Path:
    made = tmp_path / "cluster"
    made.mkdir()
    with (made / "cluster.yaml").open("w") as out:
        YAML().dump({"cluster": {"name": "lab", "store": dict(store_settings)},
                     "projects": {"research": {}, "ops": {}}}, out)
    return made


def llmgw(directory: Path, *args: str, stdin: str = "") -> tuple[int, str, str]:
    """Run the command in-process, as a shell would (stdin not a terminal)."""
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
    try:
        code = main([*args, "--cluster", str(directory)])
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return code, out.getvalue(), err.getvalue()


def test_audit_shows_what_the_key_and_user_commands_changed(directory: Path) -> None:
    code, secret, _ = llmgw(directory, "keys", "create", "--project", "research",
                            "--name", "ci <b>")
    assert code == 0
    key_id = secret.split("_")[1]
    assert llmgw(directory, "keys", "revoke", key_id)[0] == 0
    assert llmgw(directory, "users", "create", "bob", "--project", "ops",
                 stdin="bob-user-pass\n")[0] == 0
    assert llmgw(directory, "users", "passwd", "bob", stdin="bob-new-pass-1\n")[0] == 0
    assert llmgw(directory, "users", "delete", "bob")[0] == 0

    code, text, _ = llmgw(directory, "audit")
    assert code == 0
    lines = text.splitlines()
    assert lines[0].split() == ["WHEN", "(UTC)", "WHO", "FROM", "WHAT"]
    whats = [line.split("  cli  ")[1].strip() for line in lines[1:]]
    assert whats == [f"key.create key={key_id} project=research",
                     f"key.revoke key={key_id} project=research",
                     "user.create user=bob role=user projects=ops",
                     "user.password user=bob", "user.delete user=bob"]
    assert all(" cli:" in line for line in lines[1:])

    code, text, _ = llmgw(directory, "audit", "--json", "--since", "1h", "--limit", "2")
    entries = json.loads(text)
    assert [e["action"] for e in entries] == ["user.delete", "user.password"]  # newest first
    assert entries[0]["source"] == "cli" and entries[0]["actor"].startswith("cli:")
    everything = json.dumps(json.loads(llmgw(directory, "audit", "--json")[1]))
    for secret_text in (secret.strip(), "bob-user-pass", "bob-new-pass-1", "ci <b>"):
        assert secret_text not in everything
    tomorrow = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).date().isoformat()
    assert llmgw(directory, "audit", "--since", tomorrow)[1] == \
        "No audit entries in this period.\n"


def insert_usage(directory: Path) -> None:
    settings = YAML(typ="safe").load((directory / "cluster.yaml").read_text())["cluster"]

    async def insert() -> None:
        store = await stores.open_store(StoreSettings.model_validate(settings["store"]))
        try:
            base = dt.datetime(2026, 12, 1, 9, tzinfo=dt.UTC).timestamp()
            await store.insert_usage([
                UsageRow(base, "research", "aaaaaaaaaaaa", "chat", "/v1/chat/completions",
                         200, 100, 20, 5.0, 0.25),
                UsageRow(base + 86400, "research", "aaaaaaaaaaaa", "chat",
                         "/v1/chat/completions", 429, None, None, 1.0, 0.0),
                UsageRow(base + 3600, "ops", "bbbbbbbbbbbb", "coder", "/v1/completions",
                         200, 7, 3, 5.0, 0.125)])
        finally:
            await store.close()
    asyncio.run(insert())


def test_usage_export_as_csv_and_json(directory: Path) -> None:
    insert_usage(directory)
    code, text, err = llmgw(directory, "usage", "export", "--from", "2026-12-01", "--to",
                            "2026-12-03", "--group-by", "day,project")
    assert code == 0, err
    assert list(csv.reader(io.StringIO(text))) == [
        ["day", "project", "requests", "prompt_tokens", "completion_tokens", "cost_usd",
         "errors"],
        ["2026-12-01", "ops", "1", "7", "3", "0.125000", "0"],
        ["2026-12-01", "research", "1", "100", "20", "0.250000", "0"],
        ["2026-12-02", "research", "1", "0", "0", "0.000000", "1"],
    ]
    code, text, err = llmgw(directory, "usage", "export", "--from", "2026-12-01", "--to",
                            "2026-12-02", "--group-by", "model,key", "--format", "json")
    assert code == 0, err
    doc = json.loads(text)
    assert doc["rows"] == [
        {"model": "chat", "key": "aaaaaaaaaaaa", "requests": 1, "prompt_tokens": 100,
         "completion_tokens": 20, "cost_usd": 0.25, "errors": 0},
        {"model": "coder", "key": "bbbbbbbbbbbb", "requests": 1, "prompt_tokens": 7,
         "completion_tokens": 3, "cost_usd": 0.125, "errors": 0}]
    assert doc["totals"]["cost_usd"] == 0.375 and doc["tz"] == "UTC"
    assert doc["from"] == "2026-12-01T00:00:00+00:00"


@pytest.mark.parametrize(("args", "message"), [
    (["usage", "export", "--from", "2026-12-01", "--to", "soon"], "--to 'soon' is not a date"),
    (["usage", "export", "--from", "2026-12-02", "--to", "2026-12-01"],
     "--to must be after --from"),
    (["usage", "export", "--from", "2026-12-01", "--to", "2026-12-02", "--group-by", "user"],
     "--group-by: 'user' is not one of project, key, model, day"),
    (["usage", "export", "--from", "2026-12-01", "--to", "2026-12-02", "--format", "xlsx"],
     "--format 'xlsx' is not one of csv, json"),
    (["usage", "export", "--from", "2026-12-01", "--to", "2026-12-02", "--tz", "Nowhere/X"],
     "--tz 'Nowhere/X' is not a time zone"),
    (["audit", "--since", "last week"], "--since 'last week' is neither a duration"),
    (["audit", "--limit", "0"], "--limit must be between 1 and 10000"),
])
def test_bad_flags_are_refused_without_a_traceback(tmp_path: Path, args: list[str],
                                                   message: str) -> None:
    absent = tmp_path / "absent"
    done = subprocess.run([sys.executable, "-m", "llmgw", *args, "--cluster", str(absent)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not absent.exists()
