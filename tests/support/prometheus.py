"""A real Prometheus server (Debian's ``prometheus``) for a test: scrape, wait, query.

It listens on a free loopback port, keeps its TSDB under the test's
directory and scrapes the given targets every second as job ``llmgw``. The
process is stopped when the ``with`` block ends, pass or fail.

Usage::

    with prometheus.Prometheus(tmp_path, ["127.0.0.1:9400"]) as server:
        server.wait_up()
        result = server.query('sum(llmgw_node_reachable)')
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from support import nodes

BINARY = shutil.which("prometheus")


class QueryError(Exception):
    """Prometheus refused the query (a parse error, a bad regex): its own words."""


class Prometheus:
    def __init__(self, directory: Path, targets: list[str], interval: str = "1s") -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / "prometheus.yml"
        self.log = directory / "prometheus.log"
        self.config.write_text(
            f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
            "scrape_configs:\n  - job_name: llmgw\n    static_configs:\n"
            f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
        self.port = nodes.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        assert BINARY is not None, "prometheus is not installed (make sysdeps)"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [BINARY, f"--config.file={self.config}",
                 f"--storage.tsdb.path={self.directory / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}",
                 "--storage.tsdb.retention.time=1h"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def wait_up(self, timeout: float = 60) -> None:
        """Until every target has been scraped successfully at least once."""
        deadline = time.monotonic() + timeout
        last = "nothing yet"
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, (
                f"prometheus exited\n{self.tail()}")
            try:
                reply = httpx.get(f"{self.url}/api/v1/targets", timeout=5)
                targets = reply.json()["data"]["activeTargets"]
                if targets and all(t["health"] == "up" for t in targets):
                    return
                last = repr([(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets])
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                last = repr(exc)
            time.sleep(0.2)
        raise AssertionError(f"prometheus targets not up; last {last}\n{self.tail()}")

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) ``expr`` evaluates to now."""
        reply = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=30)
        body = reply.json()
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType')}: {body.get('error')}")
        data = body["data"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, metric: str | None) -> list[str]:
        params = {"match[]": metric} if metric else {}
        reply = httpx.get(f"{self.url}/api/v1/label/{label}/values", params=params, timeout=30)
        values: list[str] = reply.json()["data"]
        return values
