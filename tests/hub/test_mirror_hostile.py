"""`llmgw mirror serve` under hostile requests: escapes from its tree, half-sent requests,
clients without the token. Real servers on real sockets; the hub client itself where it
is the client."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest
from mirror_support import serving

from llmgw.hub import caches


def enc(text: str) -> str:
    return quote(text, safe="")


class Site:
    """A mirror tree with one repo, and a directory outside it holding things to find."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "mirror" / "hub"
        (tmp_path / "files").mkdir()
        config = tmp_path / "files" / "config.json"
        config.write_text('{"model_type": "tiny"}')
        self.commit = caches.add(self.root, "acme/tiny", {"config.json": config})
        self.repo = caches.repo_dir(self.root, "acme/tiny")
        self.outside = tmp_path / "outside"
        self.outside.mkdir()
        # A file outside the tree that a ref would accept: it holds the repo's commit.
        (self.outside / "secret").write_text(self.commit)


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path)


def get(url: str, path: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    """GET ``path`` exactly as written (no client re-encoding), read in full."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("GET", path, headers=headers or {})
    response = connection.getresponse()
    response.body = response.read()  # type: ignore[attr-defined]
    connection.close()
    return response


# How a request may name a file outside the tree: each spelling, with NAME the file.
SPELLINGS = {
    "absolute, encoded": lambda site: enc(str(site.outside / "NAME")),
    "absolute, double-encoded": lambda site: enc(enc(str(site.outside / "NAME"))),
    "relative, encoded": lambda site: enc("../../../../outside/NAME"),
    "relative, backslashes": lambda site: enc("..\\..\\..\\..\\outside\\NAME"),
    "relative, mixed": lambda site: "..%2F..%2F..%2F..%2Foutside%2FNAME",
}
ENDPOINTS = {
    "info": "/api/models/acme/tiny/revision/{rev}",
    "tree": "/api/models/acme/tiny/tree/{rev}",
    "resolve": "/acme/tiny/resolve/{rev}/config.json",
}


@pytest.mark.parametrize("spelling", SPELLINGS.values(), ids=SPELLINGS.keys())
@pytest.mark.parametrize("endpoint", ENDPOINTS.values(), ids=ENDPOINTS.keys())
def test_a_revision_naming_a_path_is_refused_alike_whether_it_exists_or_not(
    site: Site, spelling: Callable[[Site], str], endpoint: str,
) -> None:
    with serving(site.root) as mirror:
        answers = [get(mirror.url, endpoint.format(rev=spelling(site).replace("NAME", name)))
                   for name in ("secret", "absent")]
    # Not an oracle: the file that exists and the one that does not get the same answer,
    # and it is a refusal of the name, not a lookup.
    assert [a.status for a in answers] == [400, 400]
    assert answers[0].body == answers[1].body  # type: ignore[attr-defined]
    assert answers[0].getheader("X-Error-Code") == "BadRequest"
    assert site.commit not in answers[0].body.decode()  # type: ignore[attr-defined]
    assert str(site.outside) not in answers[0].body.decode()  # type: ignore[attr-defined]


def _linked_file(site: Site) -> str:
    (site.outside / "leak.txt").write_text("SECRET")
    os.symlink(site.outside / "leak.txt", site.repo / "snapshots" / site.commit / "leak.txt")
    return "/acme/tiny/resolve/main/leak.txt"


def _linked_ref(site: Site) -> str:
    os.symlink(site.outside / "secret", site.repo / "refs" / "evil")
    return "/api/models/acme/tiny/revision/evil"


def _linked_snapshot(site: Site) -> str:
    (site.outside / "snapshot").mkdir()
    (site.outside / "snapshot" / "leak.txt").write_text("SECRET")
    commit = "f" * 40
    os.symlink(site.outside / "snapshot", site.repo / "snapshots" / commit)
    return f"/acme/tiny/resolve/{commit}/leak.txt"


def _linked_repo(site: Site) -> str:
    other = site.outside / "hub"
    caches.add(other, "acme/evil", {"leak.txt": site.outside / "secret"})
    os.symlink(caches.repo_dir(other, "acme/evil"), caches.repo_dir(site.root, "acme/evil"))
    return "/acme/evil/resolve/main/leak.txt"


LINKS = {
    "a snapshot's file": (_linked_file, "EntryNotFound"),
    "a ref": (_linked_ref, "RevisionNotFound"),
    "a snapshot": (_linked_snapshot, "RevisionNotFound"),
    "a repository": (_linked_repo, "RepoNotFound"),
}


@pytest.mark.parametrize(("plant", "code"), LINKS.values(), ids=LINKS.keys())
def test_a_link_inside_the_tree_to_outside_is_not_followed(
    site: Site, plant: Callable[[Site], str], code: str,
) -> None:
    path = plant(site)
    with serving(site.root) as mirror:
        answer = get(mirror.url, path)
        listing = get(mirror.url, "/api/models/acme/tiny")
    assert (answer.status, answer.getheader("X-Error-Code")) == (404, code)
    assert b"SECRET" not in answer.body  # type: ignore[attr-defined]
    siblings = [s["rfilename"] for s in json.loads(listing.body)["siblings"]]  # type: ignore[attr-defined]
    assert siblings == ["config.json"]


@pytest.mark.parametrize(("path", "status", "code"), [
    ("..%2F..%2F..%2Frefs%2Fmain", 400, "BadRequest"),
    ("%2Fetc%2Fhostname", 400, "BadRequest"),
    ("..%5Cconfig.json", 400, "BadRequest"),
    ("config.json%00", 400, "BadRequest"),
    ("./config.json", 400, "BadRequest"),
    ("a//config.json", 400, "BadRequest"),
    ("config.json%09", 400, "BadRequest"),
    # A line break matches no route at all (aiohttp's own 404): nothing is injected.
    ("config.json%0d%0aX-Injected:%201", 404, None),
])
def test_a_file_path_that_is_not_a_plain_relative_path_is_refused(
    site: Site, path: str, status: int, code: str | None,
) -> None:
    with serving(site.root) as mirror:
        answer = get(mirror.url, f"/acme/tiny/resolve/main/{path}")
        plain = get(mirror.url, "/acme/tiny/resolve/main/config.json")
    assert (answer.status, answer.getheader("X-Error-Code")) == (status, code)
    assert answer.getheader("X-Injected") is None
    assert plain.status == 200 and plain.body == b'{"model_type": "tiny"}'  # type: ignore[attr-defined]


@pytest.mark.parametrize("revision", ["main", "refs%2Fpr%2F1", "v1.0"])
def test_ordinary_revision_names_still_resolve(site: Site, revision: str) -> None:
    caches.set_ref(site.root, "acme/tiny", "refs/pr/1", site.commit)
    caches.set_ref(site.root, "acme/tiny", "v1.0", site.commit)
    with serving(site.root) as mirror:
        answer = get(mirror.url, f"/api/models/acme/tiny/revision/{revision}")
    assert answer.status == 200 and json.loads(answer.body)["sha"] == site.commit  # type: ignore[attr-defined]


def test_a_client_that_stops_reading_a_file_is_dropped(site: Site, tmp_path: Path) -> None:
    big = tmp_path / "files" / "model.safetensors"
    with big.open("wb") as handle:
        handle.truncate(32 * 2**20)  # far more than the socket buffers on both sides hold
    caches.add(site.root, "acme/big", {"model.safetensors": big})
    with serving(site.root, send_stall=0.5) as mirror:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.settimeout(30)
        client.connect(("127.0.0.1", int(mirror.url.rsplit(":", 1)[1])))
        client.sendall(b"GET /acme/big/resolve/main/model.safetensors HTTP/1.1\r\n"
                       b"Host: mirror\r\n\r\n")
        assert client.recv(12) == b"HTTP/1.1 200"
        # Then it reads nothing. (A bound on the test, not a timing assertion: without
        # the stall bound the mirror holds the connection until the bound runs out.)
        for _ in range(6000):
            if mirror.connections == 0:
                break
            time.sleep(0.01)
        assert mirror.connections == 0, "the mirror still holds the stalled connection"
        assert mirror.sent < 32 * 2**20
        client.close()


# -- `llmgw mirror serve` itself: connections and the token ---------------------------

HALF = b"GET /api/models/acme/tiny HTTP/1.1\r\nHost: mirror\r\nAuthoriz"
SECRET_HEADER = "hf_" + "Q" * 34
_REQUEST = b"GET /api/models/acme/tiny HTTP/1.1\r\nHost: m\r\n"
MALFORMED = [
    # a space before a header's colon
    _REQUEST + f"Authorization : Bearer {SECRET_HEADER}\r\n\r\n".encode(),
    # a header line past aiohttp's 8,190 bytes
    _REQUEST + f"X-Big: {SECRET_HEADER}{'a' * 10000}\r\n\r\n".encode(),
    # more than 128 headers
    _REQUEST + f"Authorization: Bearer {SECRET_HEADER}\r\n".encode()
    + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
]


@contextmanager
def mirror_process(site: Site, *args: str, env: dict[str, str] | None = None
                   ) -> Iterator[tuple[str, list[str]]]:
    """`llmgw mirror serve` in its own process on a free port: its address, and once it
    is stopped (when the block ends), what it wrote to stdout and stderr."""
    output: list[str] = []
    process = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "mirror", "serve", str(site.root.parent),
         "--listen", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # bounded: the process prints it or exits
        assert "llmgw mirror serving" in line, process.stderr.read() if process.stderr else ""
        found = re.search(r"http://([0-9.]+:[0-9]+)", line)
        assert found, line
        yield found.group(1), output
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            output.extend(process.communicate(timeout=30))
        except subprocess.TimeoutExpired:
            process.kill()
            output.extend(process.communicate(timeout=30))


def _address(address: str) -> tuple[str, int]:
    host, port = address.split(":")
    return host, int(port)


async def test_half_sent_requests_are_closed_and_extra_connections_answered(
    site: Site,
) -> None:
    with mirror_process(site, "--header-timeout", "1", "--max-connections", "20") as (
            address, output):
        host, port = _address(address)
        sockets = []
        for _ in range(30):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(HALF)
            sockets.append((reader, writer))
        # A bound on the test, not a timing assertion: without the header timeout these
        # reads wait until the test's bound and fail.
        answers = [await asyncio.wait_for(reader.read(), 60) for reader, _ in sockets]
        for _, writer in sockets:
            writer.close()
        busy = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert busy and b"the mirror has too many open connections" in busy[0]
        assert answers.count(b"") >= 20 and len(busy) + answers.count(b"") == 30
        # Requests the parser refuses, each carrying a secret: 400, the connection closed,
        # and no byte of them in the answer or the mirror's output.
        for refused in MALFORMED:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(refused)
            answer = await asyncio.wait_for(reader.read(), 60)
            writer.close()
            assert answer.startswith(b"HTTP/1.0 400") and SECRET_HEADER.encode() not in answer
        # Still serving.
        answer = await asyncio.to_thread(get, f"http://{address}", "/api/models/acme/tiny")
        assert answer.status == 200
    logged = "".join(output)
    assert SECRET_HEADER not in logged and "acme/tiny" not in logged


def hf_download(url: str, cache: Path, token: str | None) -> str:
    """``hf_hub_download`` against the mirror, in a fresh interpreter: its outcome."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"HF_ENDPOINT": url, "HF_HOME": str(cache), "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    if token is not None:
        env["HF_TOKEN"] = token
    script = ("from huggingface_hub import hf_hub_download\n"
              "try:\n"
              "    print(open(hf_hub_download('acme/tiny', 'config.json')).read())\n"
              "except Exception as exc:\n"
              "    print(type(exc).__name__, getattr(exc.response, 'status_code', None))\n")
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120, check=True).stdout.strip()


@pytest.mark.parametrize("how", ["token file", "environment"])
def test_the_hub_client_needs_the_token_the_mirror_requires(
    site: Site, tmp_path: Path, how: str,
) -> None:
    token = "hf_mirror_" + "k" * 24
    (tmp_path / "token").write_text(token + "\n")
    args = ("--token-file", str(tmp_path / "token")) if how == "token file" else ()
    env = {"LLMGW_MIRROR_TOKEN": token} if how == "environment" else {}
    with mirror_process(site, *args, env=env) as (address, _):
        url = f"http://{address}"
        without = hf_download(url, tmp_path / "c1", None)
        wrong = hf_download(url, tmp_path / "c2", token[:-1])
        right = hf_download(url, tmp_path / "c3", token)
    assert without == "GatedRepoError 401"
    assert wrong == "GatedRepoError 401"
    assert right == '{"model_type": "tiny"}'


def test_without_a_token_the_mirror_stays_open(site: Site, tmp_path: Path) -> None:
    with mirror_process(site) as (address, _):
        assert hf_download(f"http://{address}", tmp_path / "c", None) == '{"model_type": "tiny"}'


def test_an_empty_token_file_is_refused_not_served_open(site: Site, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n")
    done = subprocess.run(
        [sys.executable, "-m", "llmgw", "mirror", "serve", str(site.root.parent),
         "--listen", "127.0.0.1:0", "--token-file", str(tmp_path / "token")],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1 and "is empty" in done.stderr and not done.stdout
