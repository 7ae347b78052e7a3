"""The shipped reverse-proxy configs: nginx run for real in front of llmgw, Caddy validated.

nginx (Debian's) runs ``deploy/nginx/llmgw.conf`` as shipped, with only the
site's addresses and a self-signed certificate (made with openssl here)
substituted, in front of a router with the pages. Streaming: a stream whose
upstream paces its chunks must reach the client spread out as it was sent
(compared as a ratio of spreads, not as absolute times) — buffering collapses
it. TLS: the login cookie is Secure through the proxy, and not over plain
HTTP straight to llmgw.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import nodes
from support.stacks import Stack, cluster

from llmgw.router import Settings
from llmgw.spec.models import Cluster
from llmgw.store import users

ROOT = Path(__file__).parents[2]
NGINX_CONF = ROOT / "deploy" / "nginx" / "llmgw.conf"
CADDYFILE = ROOT / "deploy" / "caddy" / "Caddyfile"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
DELAYS = [0.0, 0.4, 0.4, 0.4, 0.4, 0.4]


def certificate(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def nginx_config(tmp: Path, router_port: int, https_port: int, http_port: int) -> Path:
    """The shipped site, with this test's ports, certificate and a minimal main config."""
    cert, key = certificate(tmp)
    site = NGINX_CONF.read_text()
    site = site.replace("127.0.0.1:8000", f"127.0.0.1:{router_port}")
    site = re.sub(r"listen \[::\]:\d+[^;]*;\n", "", site)  # the namespace has no IPv6
    site = site.replace("listen 443 ssl http2", f"listen 127.0.0.1:{https_port} ssl http2")
    site = site.replace("listen 80", f"listen 127.0.0.1:{http_port}")
    site = site.replace("/etc/llmgw/tls/fullchain.pem", str(cert))
    site = site.replace("/etc/llmgw/tls/privkey.pem", str(key))
    (tmp / "llmgw.conf").write_text(site)
    main = tmp / "nginx.conf"
    main.write_text(f"""
pid {tmp}/nginx.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {tmp}/llmgw.conf;
}}
""")
    return main


def spec() -> Cluster:
    data = cluster().model_dump(mode="json", exclude_defaults=False)
    data["cluster"]["web"] = {"trusted_proxies": ["127.0.0.1"]}
    return Cluster.model_validate(data)


@pytest.fixture
def behind_nginx(tmp_path: Path) -> Iterator[tuple[Stack, str]]:
    if not Path(NGINX).exists():
        pytest.skip("nginx is not installed (make sysdeps)")
    stack = Stack(tmp_path, spec(), Settings(), 1, pages=True)
    stack.upstreams[0].chunk_delays = DELAYS
    stack.route({"chat": stack.upstreams})
    users.create(stack.sqlite, "bob", "bob-user-pass", projects=["research"])
    router_port = int(stack.url.rsplit(":", 1)[1])
    https_port, http_port = nodes.free_port(), nodes.free_port()
    conf = nginx_config(tmp_path, router_port, https_port, http_port)
    process = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(tmp_path), "-g",
                                "daemon off;"], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", https_port), timeout=1):
                break
            assert time.monotonic() < deadline, "nginx did not start"
            time.sleep(0.05)
        yield stack, f"https://127.0.0.1:{https_port}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()
        stack.close()


def test_nginx_streams_chunks_as_they_come_and_marks_the_login_cookie_secure(
    behind_nginx: tuple[Stack, str], tmp_path: Path
) -> None:
    stack, base = behind_nginx
    verify = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
    key = stack.key()
    arrivals: list[float] = []
    with httpx.Client(verify=verify, timeout=30) as client, client.stream(
        "POST", f"{base}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
        json={"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    ) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic())
    sent = stack.upstreams[0].sent_at
    assert len(arrivals) >= len(DELAYS) and len(sent) >= len(DELAYS)
    arrival_spread = arrivals[len(DELAYS) - 1] - arrivals[0]
    sent_spread = sent[len(DELAYS) - 1] - sent[0]
    # Buffered, the chunks would arrive together: a spread near zero.
    assert arrival_spread > 0.5 * sent_spread, (arrival_spread, sent_spread)

    # The login cookie is Secure over TLS through the proxy...
    with httpx.Client(verify=verify, timeout=30) as client:
        assert _login_cookie(client, base).lower().count("secure") == 1
    # ...and not when llmgw is reached over plain HTTP, without a proxy's word.
    with httpx.Client(timeout=30) as client:
        assert "secure" not in _login_cookie(client, stack.url).lower()


def _login_cookie(client: httpx.Client, base: str) -> str:
    form = client.get(f"{base}/login").text
    token = re.search(r'name="csrf" value="([^"]+)"', form)
    assert token, form[:2000]
    answer = client.post(f"{base}/login", data={"name": "bob", "password": "bob-user-pass",
                                                "csrf": token.group(1)})
    assert answer.status_code == 303, answer.text
    cookie = next(v for k, v in answer.headers.multi_items()
                  if k.lower() == "set-cookie" and v.startswith("llmgw_session="))
    return cookie


def test_the_caddyfile_is_valid() -> None:
    caddy = shutil.which("caddy")
    if caddy is None:
        pytest.skip("caddy is not installed (make sysdeps installs Debian's)")
    done = subprocess.run([caddy, "validate", "--config", str(CADDYFILE), "--adapter",
                           "caddyfile"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Valid configuration" in done.stderr + done.stdout
