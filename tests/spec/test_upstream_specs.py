"""``upstreams:`` in cluster files: shapes, references and key files, each error located."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.spec import loading

HEAD = """cluster: {name: lab}
models:
  chat:
    served_name: Chat-1
    source: org/chat
    profiles: [{engine: llama.cpp, cpu: true}]
    adapters: [{name: chat-sql, source: /w/sql}]
"""


def load(tmp_path: Path, upstreams: str, key: str | None = "sk-1\n") -> loading.SpecErrors | None:
    (tmp_path / "cluster.yaml").write_text(HEAD + upstreams)
    if key is not None:
        (tmp_path / "up.key").write_text(key)
    try:
        loading.load(tmp_path)
    except loading.SpecErrors as exc:
        return exc
    return None


def entry(url: str = "https://api.example.com", models: str = "{Chat-1: {}}",
          name: str = "burst", extra: str = "") -> str:
    return (f"upstreams:\n  {name}:\n    url: {url}\n    api_key_file: up.key\n"
            f"    models: {models}\n{extra}")


def test_a_good_upstream_loads_with_its_key_file_made_absolute(tmp_path: Path) -> None:
    (tmp_path / "up.key").write_text("sk-1\n")
    (tmp_path / "cluster.yaml").write_text(HEAD + entry(
        models="{Chat-1: {model: gpt-4o-mini, use: fallback}, gpt-4o: {use: always}}"))
    cluster = loading.load(tmp_path)
    upstream = cluster.upstreams["burst"]
    assert upstream.api_key_file == str((tmp_path / "up.key").resolve())
    assert upstream.models["Chat-1"].model == "gpt-4o-mini"
    assert upstream.models["gpt-4o"].use == "always"


@pytest.mark.parametrize(("url", "message"), [
    pytest.param("ftp://api.example.com", "invalid upstream url 'ftp://api.example.com'",
                 id="scheme"),
    pytest.param("https://user:pw@api.example.com", "no user, query or fragment", id="userinfo"),
    pytest.param("https://api.example.com/v1?key=x", "no user, query or fragment", id="query"),
    pytest.param("https://api.example.com:0", "no valid host", id="port-zero"),
    pytest.param("https://api.example.com:70000", "the port is not a number", id="port-big"),
    pytest.param("https://-bad-.example.com", "no valid host", id="host"),
    pytest.param("'https://a.example.com/\\nX-Evil: 1'", "invalid upstream url", id="newline"),
    pytest.param("http://local", "no valid host", id="local"),
])
def test_bad_urls(tmp_path: Path, url: str, message: str) -> None:
    found = load(tmp_path, entry(url=url))
    assert found is not None and len(found.errors) == 1
    (error,) = found.errors
    assert error.location is not None and error.location.line == 10  # the url's line
    assert message in error.message and error.message.startswith("upstreams.burst.url: ")


@pytest.mark.parametrize(("name", "message"), [
    pytest.param("'Burst'", "invalid name 'Burst'", id="upper"),
    pytest.param("'a b'", "invalid name 'a b'", id="space"),
    pytest.param("'x\\u0000y'", "invalid name", id="nul"),
    pytest.param("'../etc'", "invalid name '../etc'", id="path"),
])
def test_hostile_names(tmp_path: Path, name: str, message: str) -> None:
    found = load(tmp_path, entry(name=name))
    assert found is not None
    assert any(message in e.message and e.location is not None and e.location.line == 9
               for e in found.errors), found


@pytest.mark.parametrize(("models", "message"), [
    pytest.param("{nothere: {use: fallback}}", "`fallback` to what? No model serves "
                 "'nothere' (known: Chat-1)", id="fallback-to-nothing"),
    pytest.param("{nothere: {}}", "`fallback` to what?", id="fallback-is-the-default"),
    pytest.param("{chat: {use: always}}", "is the key of a model with another served name",
                 id="model-key"),
    pytest.param("{chat-sql: {use: always}}", "is a LoRA adapter", id="adapter"),
    pytest.param("{Chat-1: {pricing: {input_per_mtok: 1}}}",
                 "a declared model's requests pay its own `pricing`", id="pricing"),
    pytest.param("{}", "must not be empty", id="no-models"),
    pytest.param("{Chat-1: {use: sometimes}}", "input should be 'always' or 'fallback'",
                 id="use"),
    pytest.param("{'bad name': {}}", "invalid served name 'bad name'", id="served-name"),
])
def test_references(tmp_path: Path, models: str, message: str) -> None:
    found = load(tmp_path, entry(models=models))
    assert found is not None
    assert any(message in e.message.replace('"', "'") and e.location is not None
               for e in found.errors), found


@pytest.mark.parametrize(("key", "message"), [
    pytest.param(None, "up.key does not exist", id="missing"),
    pytest.param("", "up.key is empty", id="empty"),
    pytest.param("  \n", "up.key is empty", id="blank"),
    pytest.param("sk-1\nsk-2\n", "holds a space, line break or control character",
                 id="two-lines"),
    pytest.param("x" * 9000, "longer than 8192 bytes", id="too-long"),
])
def test_key_files(tmp_path: Path, key: str | None, message: str) -> None:
    found = load(tmp_path, entry(), key=key)
    assert found is not None
    (error,) = found.errors
    assert message in error.message and error.message.startswith(
        "upstreams.burst.api_key_file: ")
    assert error.location is not None and error.location.line == 11
    assert "sk-" not in error.message  # never the key


def test_a_directory_is_no_key_file(tmp_path: Path) -> None:
    (tmp_path / "up.key").mkdir()
    found = load(tmp_path, entry(), key=None)
    assert found is not None and "is not a regular file" in str(found)


def test_two_files_cannot_both_declare_one_upstream(tmp_path: Path) -> None:
    (tmp_path / "more.yaml").write_text(entry())
    found = load(tmp_path, entry())
    assert found is not None and "duplicate upstream 'burst'" in str(found)


def test_a_project_may_allow_a_name_only_upstreams_serve(tmp_path: Path) -> None:
    assert load(tmp_path, entry(models="{gpt-4o: {use: always}}")
                + "projects:\n  research: {models: [gpt-4o]}\n") is None


def test_validate_lists_upstreams_without_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from llmgw.cli.main import main

    (tmp_path / "up.key").write_text("sk-KEYMARK-9\n")
    (tmp_path / "cluster.yaml").write_text(HEAD + entry(
        models="{Chat-1: {model: gpt-4o-mini}}", extra="    max_in_flight: 8\n"))
    assert main(["validate", "--cluster", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.endswith("Upstreams\n  burst: https://api.example.com (with a key, at most 8 in "
                        "flight): Chat-1 → gpt-4o-mini (fallback)\n")
    assert "KEYMARK" not in out and "up.key" not in out


def test_two_upstreams_cannot_share_a_url(tmp_path: Path) -> None:
    found = load(tmp_path, entry() + entry(name="again").removeprefix("upstreams:\n"))
    assert found is not None
    (error,) = found.errors
    assert error.message == ("upstreams.burst.url: https://api.example.com is upstream "
                             "again's too; one upstream per URL (list every model it serves "
                             "under one name)")


def test_a_relative_key_file_is_read_from_the_state_directory(
        tmp_path: Path, state_dir: Path) -> None:
    (state_dir / "up.key").write_text("sk-state\n")
    (tmp_path / "up.key").write_text("sk-old-place\n")  # an older site's: not read
    (tmp_path / "cluster.yaml").write_text(HEAD + entry())
    cluster = loading.load(tmp_path)
    assert cluster.upstreams["burst"].api_key_file == str(state_dir / "up.key")


def test_validate_warns_about_a_key_in_the_cluster_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from llmgw.cli.main import main

    (tmp_path / "up.key").write_text("sk-KEYMARK-3\n")
    (tmp_path / "cluster.yaml").write_text(HEAD + entry())
    assert main(["validate", "--cluster", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert (f"cluster.yaml:11:5: warning: upstreams.burst.api_key_file {tmp_path}/up.key lies "
            "inside the cluster directory") in text
    assert "KEYMARK" not in text
