"""Weights URLs reach public addresses only (issue 23): real HTTP servers on loopback.

Each server records every request it gets. A URL the cluster may not fetch must
leave it empty: ``llmgw plan`` (its HEAD on the control host) and the node's
download alike, names and redirects included, and the address a name resolved
to once is the one dialled (DNS rebinding).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent import fetchers
from llmgw.agent.units import UnitChange
from llmgw.cli.main import main
from llmgw.hub import catalogs, fetches
from llmgw.planning import shards
from llmgw.spec import sources

BODY = b"GGUF" + bytes(range(256)) * 16
NAME = "weights.example.test"  # resolved by the test's resolver, never by DNS


class Recorder:
    """A file server on 127.0.0.1 that records (method, path) of every request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.redirect: str | None = None
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: bool) -> None:
                recorder.requests.append((self.command, self.path))
                if recorder.redirect and self.path == "/moved.gguf":
                    self.send_response(302)
                    self.send_header("Location", recorder.redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(BODY)))
                self.end_headers()
                if body:
                    self.wfile.write(BODY)

            def do_HEAD(self) -> None:  # noqa: N802 (http.server's names)
                self._answer(body=False)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(body=True)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, host: str = "127.0.0.1", path: str = "/m.gguf") -> str:
        return f"http://{host}:{self.port}{path}"


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    server.thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()
        server.thread.join()


@contextmanager
def resolving(monkeypatch: pytest.MonkeyPatch,
              answer: Callable[[str, int], list[str]]) -> Iterator[list[str]]:
    """The process's resolver answers ``NAME`` with ``answer``; yields the names asked."""
    real = socket.getaddrinfo
    asked: list[str] = []

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != NAME:
            return real(host, port, *args, **kwargs)
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, int(port)))
                for ip in answer(host, int(port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield asked


def cluster_dir(tmp_path: Path, url: str, allowed: list[str]) -> Path:
    directory = tmp_path / "cluster"
    directory.mkdir()
    (directory / "cluster.yaml").write_text(
        f"cluster:\n  name: lab\n  weights: {{allowed_hosts: {allowed}}}\n"
        "nodes: {}\n"
        f"models:\n  m:\n    source: {url}\n"
        "    profiles: [{engine: llama.cpp, cpu: true}]\n"
    )
    return directory


@pytest.mark.parametrize(("host", "allowed", "asked"), [
    pytest.param("127.0.0.1", [], False, id="loopback-refused-by-validate"),
    pytest.param("2130706433", [], False, id="decimal-refused-by-validate"),
    pytest.param(NAME, [], False, id="name-resolving-to-loopback"),
    pytest.param("127.0.0.1", ["127.0.0.1"], True, id="loopback-listed"),
    pytest.param("2130706433", ["127.0.0.1"], True, id="decimal-listed-as-dotted"),
    pytest.param(NAME, [NAME], True, id="name-listed"),
])
def test_plan_asks_no_host_it_would_refuse(
    tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], host: str, allowed: list[str], asked: bool,
) -> None:
    directory = cluster_dir(tmp_path, recorder.url(host), allowed)
    with resolving(monkeypatch, lambda _h, _p: ["127.0.0.1"]):
        code = main(["plan", "--cluster", str(directory)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if asked:
        assert code == 0, err
        assert recorder.requests == [("HEAD", "/m.gguf")]
        return
    assert recorder.requests == []
    if host == NAME:  # a name is only known to be loopback once resolved: at fetch time
        assert code == 0, err
        with resolving(monkeypatch, lambda _h, _p: ["127.0.0.1"]):
            facts = catalogs.Catalog().lookup([recorder.url(host)], None, allowed)
        assert f"refused: {NAME} resolves to 127.0.0.1, a loopback address" in \
            str(facts[recorder.url(host)].error)
        assert recorder.requests == []
    else:
        assert code == 1
        assert "cluster.yaml:7:13: models.m.source:" in err
        assert "under cluster.weights.allowed_hosts" in err


@pytest.mark.parametrize(("url", "why"), [
    pytest.param("http://127.0.0.1:{port}/m.gguf", "127.0.0.1 is a loopback address",
                 id="loopback"),
    pytest.param("http://[::ffff:127.0.0.1]:{port}/m.gguf", "(that is 127.0.0.1) is a loopback",
                 id="ipv4-mapped"),
    pytest.param("http://0x7f.1:{port}/m.gguf", "0x7f.1 (that is 127.0.0.1)", id="hex-short"),
    pytest.param("http://0177.0.0.1:{port}/m.gguf", "0177.0.0.1 (that is 127.0.0.1)",
                 id="octal"),
    pytest.param("http://127.1:{port}/m.gguf", "127.1 (that is 127.0.0.1)", id="short"),
    pytest.param("http://localhost:{port}/m.gguf", "localhost is this machine", id="localhost"),
    pytest.param(f"http://{NAME}:{{port}}/m.gguf", f"{NAME} resolves to 127.0.0.1, a loopback",
                 id="name"),
])
def test_the_node_downloads_from_no_host_it_would_refuse(
    tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch, url: str, why: str,
) -> None:
    source = sources.parse(url.format(port=recorder.port))
    with resolving(monkeypatch, lambda _h, _p: ["127.0.0.1"]), \
            pytest.raises(fetches.FetchError, match="refused") as refused:
        fetches.fetch(source, tmp_path / "node")
    assert why in str(refused.value)
    assert "cluster.weights.allowed_hosts" in str(refused.value)
    assert not refused.value.retry
    assert recorder.requests == []


def test_a_listed_host_is_fetched_and_a_redirect_is_checked_again(
    tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with resolving(monkeypatch, lambda _h, _p: ["127.0.0.1"]):
        done = fetches.fetch(sources.parse(recorder.url(NAME)), tmp_path / "a",
                             allowed_hosts=(NAME,))
        assert Path(done.path).read_bytes() == BODY
        assert recorder.requests == [("HEAD", "/m.gguf"), ("GET", "/m.gguf")]
        # A listed host that redirects to one that is not: the second hop is refused.
        recorder.requests.clear()
        recorder.redirect = recorder.url("127.0.0.1", "/secret.gguf")
        with pytest.raises(fetches.FetchError, match="refused: 127.0.0.1 is a loopback"):
            fetches.fetch(sources.parse(recorder.url(NAME, "/moved.gguf")), tmp_path / "b",
                          allowed_hosts=(NAME,))
    assert recorder.requests == [("HEAD", "/moved.gguf")]


def test_the_address_checked_is_the_address_dialled(
    tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DNS rebinding: the first answer is public, every later one loopback."""
    answers = iter([["93.184.215.14"]])
    dialled: list[str] = []
    real = socket.create_connection

    def create_connection(address: tuple[str, int], *args: Any, **kwargs: Any) -> Any:
        dialled.append(address[0])
        if address[0] != "127.0.0.1":  # no test reaches the internet
            raise ConnectionRefusedError(111, "refused by the test")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)
    with resolving(monkeypatch, lambda _h, _p: next(answers, ["127.0.0.1"])) as asked, \
            pytest.raises(fetches.FetchError, match="cannot reach it"):
        fetches.fetch(sources.parse(recorder.url(NAME)), tmp_path / "node")
    assert asked == [NAME] and dialled == ["93.184.215.14"]
    assert recorder.requests == []


def test_the_agent_fetches_with_the_clusters_allowed_hosts() -> None:
    """The node's fetch gets the list from the unit's spec ("fetch" is undigested: a
    new list restarts no engine)."""
    assert "fetch" in shards.UNDIGESTED
    spec = {"weights": {"source": "https://files.lab/m.gguf", "dir": "/models"},
            "fetch": {"endpoint": None, "allowed_hosts": ["files.lab", 7]}}
    text = ("[Unit]\nX-Llmgw-Model=m\nX-Llmgw-Replica=0\nX-Llmgw-Rank=0\n"
            f"X-Llmgw-Digest=d\nX-Llmgw-Spec={json.dumps(spec)}\n\n[Service]\n"
            "ExecStart=/usr/bin/env llama-server --model ${LLMGW_WEIGHTS}\n")
    need = fetchers.need(UnitChange(name="llmgw-m-r0-s0.service", unit_text=text,
                                    env_text=""))
    assert need is not None and need.allowed_hosts == ("files.lab",)
