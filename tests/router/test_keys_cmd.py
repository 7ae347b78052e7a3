"""`llmgw keys create/list/revoke` against a real cluster directory and store."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest

from llmgw.cli import keys_cmd
from llmgw.cli.errors import UserError
from llmgw.spec.models import StoreSettings
from llmgw.store import keys, stores

CLUSTER = """\
cluster:
  name: lab
  store: {path: state/llmgw.db}
models:
  qwen-coder:
    scaling: {min: 0, max: 1}
    pricing: {input_per_mtok: 0.5, output_per_mtok: 1.5}
    profiles: [{engine: llama.cpp, cpu: true, source: /models/qwen.gguf}]
projects:
  research: {budget_usd: 500}
  ci: {}
  daily: {budget: {usd: 10, period: day, timezone: Europe/Paris}}
"""


def llmgw_keys(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="llmgw")
    keys_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["keys", *argv])
    return int(args.handler(args))


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "cluster"
    directory.mkdir()
    (directory / "cluster.yaml").write_text(CLUSTER)
    return directory


def test_create_list_revoke(cluster_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(cluster_dir)
    assert llmgw_keys("create", "--cluster", d, "--project", "research", "--name", "alice") == 0
    out, err = capsys.readouterr()
    secret = out.strip()
    assert secret.startswith("llmgw_") and "shown only this once" in err
    key_id = keys.key_id_of(secret)
    assert key_id and key_id in err

    # Stored where the cluster says, hashed: the secret is nowhere in the file.
    db = cluster_dir / "state" / "llmgw.db"
    store = asyncio.run(stores.open_store(StoreSettings(path=str(db))))
    verify = lambda: asyncio.run(keys.verify(store, secret))  # noqa: E731
    assert verify() is not None
    assert not [p for p in db.parent.iterdir() if secret.encode() in p.read_bytes()]

    assert llmgw_keys("list", "--cluster", d) == 0
    out, _ = capsys.readouterr()
    header, row = out.splitlines()
    assert header.split()[:3] == ["ID", "PROJECT", "NAME"]
    assert row.split()[:3] == [key_id, "research", "alice"] and row.endswith("active")
    assert secret not in out

    assert llmgw_keys("revoke", "--cluster", d, key_id) == 0
    assert "revoked key" in capsys.readouterr().out
    assert verify() is None  # the router's check refuses it now
    assert llmgw_keys("revoke", "--cluster", d, secret) == 0  # the whole key works too
    assert "already revoked" in capsys.readouterr().out

    assert llmgw_keys("list", "--cluster", d, "--json") == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["id"] == key_id and listed["revoked_at"] is not None
    asyncio.run(store.close())


@pytest.mark.parametrize("argv, message", [
    (["create", "--project", "marketing"], "project 'marketing' is not defined"),
    (["revoke", "0123456789ab"], "no key with id '0123456789ab'"),
])
def test_mistakes_are_explained(cluster_dir: Path, argv: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        llmgw_keys(argv[0], "--cluster", str(cluster_dir), *argv[1:])


def test_a_broken_cluster_is_reported_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "c.yaml").write_text("cluster:\n  name: lab\n  bogus: 1\n")
    with pytest.raises(UserError, match="1 error"):
        llmgw_keys("list", "--cluster", str(tmp_path))
    assert "c.yaml:3:" in capsys.readouterr().err


def test_reservations_list_and_release(cluster_dir: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from llmgw.store.reservations import Owner, Progress
    d = str(cluster_dir)
    assert llmgw_keys("reservations", "--cluster", d) == 0
    assert "no reservations" in capsys.readouterr().err
    db = cluster_dir / "state" / "llmgw.db"

    async def take() -> list[str]:
        store = await stores.open_store(StoreSettings(path=str(db)))
        try:
            owner = Owner("host:99:ab12", "k1", "qwen-coder", "/v1/chat/completions")
            await store.beat("host:99:ab12", 600)
            ids = [(await store.reserve("research", 500, 3.18, 86400, owner)).id or ""
                   for _ in range(3)]
            await store.beat("host:99:ab12", 600, [Progress(ids[0], 10, 20, 0.02)])
            return ids
        finally:
            await store.close()

    first, second, third = asyncio.run(take())
    assert llmgw_keys("reservations", "--cluster", d) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["ID", "PROJECT", "KEY", "MODEL", "HOLDS",
                                           "RECORDED", "SINCE", "ROUTER"]
    assert f"{first}  research" in out and "$3.18  $0.02" in out and "(alive)" in out
    assert llmgw_keys("reservations", "--cluster", d, "--release", first) == 0
    assert f"released {first} (research, held $3.18); billed the $0.02" in capsys.readouterr().out
    with pytest.raises(UserError, match=f"no reservation {first}"):
        llmgw_keys("reservations", "--cluster", d, "--release", first)
    with pytest.raises(UserError, match="16 hex digits"):
        llmgw_keys("reservations", "--cluster", d, "--release", "../../etc\n")
    assert llmgw_keys("reservations", "--cluster", d, "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert {h["id"] for h in listed} == {second, third}
    assert llmgw_keys("reservations", "--cluster", d, "--all") == 0
    assert capsys.readouterr().out.count("released ") == 2
    assert llmgw_keys("reservations", "--cluster", d) == 0
    assert "no reservations" in capsys.readouterr().err


def test_a_keys_own_rate_limits(cluster_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(cluster_dir)
    assert llmgw_keys("create", "--cluster", d, "--project", "ci", "--rpm", "60",
                      "--tpm", "100000") == 0
    out, err = capsys.readouterr()
    assert "(rpm 60, tpm 100000)" in err
    assert llmgw_keys("create", "--cluster", d, "--project", "ci") == 0
    capsys.readouterr()
    assert llmgw_keys("list", "--cluster", d) == 0
    header, limited, plain = capsys.readouterr().out.splitlines()
    assert "LIMITS" in header.split()
    assert "rpm 60, tpm 100000" in limited and "  -  " in plain
    assert llmgw_keys("list", "--cluster", d, "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(k["rpm"], k["tpm"]) for k in listed] == [(60, 100000), (None, None)]


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "ten", "²", "99999999999999"])
def test_a_rate_limit_must_be_a_whole_number_from_one(
        cluster_dir: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(SystemExit) as caught:
        llmgw_keys("create", "--cluster", str(cluster_dir), "--project", "ci", "--rpm", value)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "--rpm" in err and "whole number" in err and "Traceback" not in err


def test_budgets_show_spend_this_period_and_the_reset(
        cluster_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`keys budgets`: a daily budget counts today's rows only (in its time zone); a
    lifetime one counts them all. Rows now and two days ago: whatever the hour, the first
    is today's and the second is not."""
    import time

    from llmgw.spec.budgets import Period
    from llmgw.store.usages import UsageRow
    now = time.time()

    def row(ts: float, project: str, cost: float) -> UsageRow:
        return UsageRow(ts=ts, project=project, key_id=None, model="qwen-coder",
                        endpoint="/v1/chat/completions", status=200, prompt_tokens=1,
                        completion_tokens=1, latency_ms=1.0, cost_usd=cost)

    async def spend() -> None:
        store = await stores.open_store(StoreSettings(path=str(cluster_dir / "state" /
                                                               "llmgw.db")))
        try:
            await store.insert_usage([row(now, "daily", 1.25), row(now - 2 * 86400, "daily", 4.0),
                                      row(now - 2 * 86400, "research", 7.0)])
        finally:
            await store.close()

    asyncio.run(spend())
    d = str(cluster_dir)
    assert llmgw_keys("budgets", "--cluster", d) == 0
    lines = capsys.readouterr().out.splitlines()
    resets = Period("day", "Europe/Paris").resets(now)
    assert resets is not None
    assert lines[0].startswith("PROJECT") and "SPENT THIS PERIOD" in lines[0]
    table = [line.split() for line in lines[1:]]
    assert table[0] == ["ci", "$0.00", "unlimited", "-", "lifetime", "never"]
    assert table[1][:7] == ["daily", "$1.25", "$10.00", "12", "%", "day", "(Europe/Paris)"]
    assert " ".join(table[1][7:]) == Period("day", "Europe/Paris").instant(resets)
    assert table[2] == ["research", "$7.00", "$500.00", "1", "%", "lifetime", "never"]
    assert llmgw_keys("budgets", "--cluster", d, "--json") == 0
    listed = {b["project"]: b for b in json.loads(capsys.readouterr().out)}
    assert listed["daily"]["spent_usd"] == 1.25 and listed["daily"]["resets_at"] == resets
    assert listed["research"]["period"] == "none" and listed["research"]["since"] is None


def test_keys_limits_show_change_and_remove_a_keys_own_limits_on_both_stores(
        tmp_path: Path, store_settings: dict[str, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "cluster"
    directory.mkdir()
    (directory / "cluster.yaml").write_text(CLUSTER.replace(
        "  store: {path: state/llmgw.db}", f"  store: {json.dumps(store_settings)}"))
    d = str(directory)
    assert llmgw_keys("create", "--cluster", d, "--project", "ci", "--rpm", "60") == 0
    secret = capsys.readouterr().out.strip()
    key_id = keys.key_id_of(secret)
    assert key_id

    assert llmgw_keys("limits", "--cluster", d, key_id) == 0
    assert capsys.readouterr().out == f"key {key_id} (ci): rpm 60\n"
    assert llmgw_keys("limits", "--cluster", d, secret, "--tpm", "5000") == 0  # the key works too
    assert capsys.readouterr().out.startswith(
        f"key {key_id} (ci): rpm 60, tpm 5000 (was rpm 60); routers apply it within 3 s")
    assert llmgw_keys("limits", "--cluster", d, key_id, "--tpm", "5000") == 0
    assert "(unchanged)" in capsys.readouterr().out
    assert llmgw_keys("limits", "--cluster", d, key_id, "--rpm", "none") == 0
    assert f"key {key_id} (ci): tpm 5000 (was rpm 60, tpm 5000)" in \
        capsys.readouterr().out
    assert llmgw_keys("limits", "--cluster", d, key_id, "--tpm", "none") == 0
    assert "no limits of its own (was tpm 5000)" in capsys.readouterr().out

    assert llmgw_keys("list", "--cluster", d, "--json") == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["rpm"], listed["tpm"], listed["owner"]) == (None, None, None)

    async def audited() -> list[str]:
        store = await stores.open_store(StoreSettings.model_validate(store_settings))
        try:
            return [e.line() for e in await store.audit_entries()
                    if e.action == "key.limits"]
        finally:
            await store.close()
    assert asyncio.run(audited()) == [  # newest first; the unchanged call recorded nothing
        f"key.limits key={key_id} project=ci rpm=none tpm=none",
        f"key.limits key={key_id} project=ci rpm=none tpm=5000",
        f"key.limits key={key_id} project=ci rpm=60 tpm=5000",
    ]

    assert llmgw_keys("revoke", "--cluster", d, key_id) == 0
    capsys.readouterr()
    with pytest.raises(UserError, match="was revoked at .*: its limits no longer matter"):
        llmgw_keys("limits", "--cluster", d, key_id, "--rpm", "10")
    with pytest.raises(UserError, match="no key with id '0123456789ab'"):
        llmgw_keys("limits", "--cluster", d, "0123456789ab", "--rpm", "10")


@pytest.mark.parametrize("value", ["0", "None", "-1", "1e3"])
def test_keys_limits_takes_a_whole_number_from_one_or_none(
        cluster_dir: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(SystemExit) as caught:
        llmgw_keys("limits", "--cluster", str(cluster_dir), "0123456789ab", "--rpm", value)
    assert caught.value.code == 2
    assert "whole number" in capsys.readouterr().err


def test_keys_list_shows_who_made_a_key_on_its_page(
        cluster_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(cluster_dir)
    db = cluster_dir / "state" / "llmgw.db"
    assert llmgw_keys("create", "--cluster", d, "--project", "ci", "--name", "nightly") == 0
    capsys.readouterr()

    async def on_a_page() -> str:
        store = await stores.open_store(StoreSettings(path=str(db)))
        try:
            return (await keys.create(store, "research", "laptop", owner="alice")).info.id
        finally:
            await store.close()
    assert llmgw_keys("list", "--cluster", d) == 0
    assert "OWNER" not in capsys.readouterr().out  # no key made on a page: no column
    page_key = asyncio.run(on_a_page())
    assert llmgw_keys("list", "--cluster", d) == 0
    header, cli_row, page_row = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["ID", "PROJECT", "NAME", "OWNER"]
    assert cli_row.split()[2:4] == ["nightly", "-"]
    assert page_row.split()[:4] == [page_key, "research", "laptop", "alice"]
