"""deploy/monitoring/prometheus.yml: a configuration Prometheus loads, with the shipped alerts.

``promtool check config`` runs for real on the file as it is (its ``llmgw-alerts.yml`` is a
link to docs/alerts.yml) and in the layout its header tells an operator to install
(the two files copied side by side). Then Debian's Prometheus itself runs on it, the
scrape target pointed at a metrics listener serving llmgw's real instruments: the target
must come up as job ``llmgw`` (what the rules' ``up{job="llmgw"}`` reads) and every
shipped rule must be loaded. Skipped only where promtool or prometheus are not installed
(``make sysdeps`` installs both).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from ruamel.yaml import YAML
from support import prometheus

from llmgw.metrics.instruments import RouterMetrics
from llmgw.spec.models import Listeners

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "monitoring" / "prometheus.yml"
RULES = ROOT / "docs" / "alerts.yml"
RULES_NAME = "llmgw-alerts.yml"

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool is not installed (make sysdeps)")
needs_prometheus = pytest.mark.skipif(prometheus.BINARY is None,
                                      reason="prometheus is not installed (make sysdeps)")


def config() -> dict[str, Any]:
    data: dict[str, Any] = YAML(typ="safe").load(CONFIG.read_text())
    return data


def rule_count() -> int:
    data = YAML(typ="safe").load(RULES.read_text())
    return sum(len(group["rules"]) for group in data["groups"])


def check_config(path: Path) -> str:
    result = subprocess.run(["promtool", "check", "config", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_it_scrapes_the_default_metrics_listener_as_job_llmgw() -> None:
    [job] = config()["scrape_configs"]
    assert job["job_name"] == "llmgw"
    assert 'up{job="llmgw"}' in RULES.read_text()
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert targets == [Listeners().metrics]
    assert config()["rule_files"] == [RULES_NAME]


def test_the_rules_it_loads_are_the_shipped_ones() -> None:
    link = CONFIG.with_name(RULES_NAME)
    assert link.is_symlink() and link.resolve() == RULES.resolve()


@needs_promtool
def test_promtool_accepts_it_with_the_rules_as_shipped() -> None:
    out = check_config(CONFIG)
    assert "SUCCESS: 1 rule files found" in out
    assert f"SUCCESS: {rule_count()} rules found" in out


@needs_promtool
def test_promtool_accepts_it_as_installed(tmp_path: Path) -> None:
    shutil.copy(CONFIG, tmp_path / "prometheus.yml")
    shutil.copy(RULES, tmp_path / RULES_NAME)
    out = check_config(tmp_path / "prometheus.yml")
    assert f"SUCCESS: {rule_count()} rules found" in out


@pytest.fixture
def metrics_listener() -> Iterator[str]:
    """llmgw's router instruments on a free loopback port, as the metrics listener serves."""
    registry = CollectorRegistry()
    RouterMetrics(registry)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = generate_latest(registry)
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@needs_prometheus
def test_prometheus_runs_it_scrapes_llmgw_and_loads_every_rule(
    tmp_path: Path, metrics_listener: str
) -> None:
    server = prometheus.Prometheus(tmp_path, [metrics_listener])
    shipped = CONFIG.read_text()
    assert shipped.count(f'"{Listeners().metrics}"') == 1
    # The same file, with the test's listener and a one-second interval (a first scrape
    # within 15 s would only make the test slow).
    server.config.write_text(shipped.replace(f'"{Listeners().metrics}"', f'"{metrics_listener}"')
                             .replace("15s", "1s"))
    shutil.copy(RULES, tmp_path / RULES_NAME)
    with server:
        server.wait_up()
        [up] = server.query('up{job="llmgw"}')
        assert up["value"][1] == "1" and up["metric"]["role"] == "all"
        rules = httpx.get(f"{server.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        loaded = [rule["name"] for group in rules for rule in group["rules"]]
        assert len(loaded) == rule_count() and "LlmgwDaemonDown" in loaded
