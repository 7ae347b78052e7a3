"""The metrics listener: ``GET /metrics`` on its own address, apart from clients' traffic.

Usage::

    runner = await servers.start(registry, "127.0.0.1", 9400)
    ...
    await runner.cleanup()
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def create_app(registry: CollectorRegistry) -> web.Application:
    async def scrape(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    return app


async def start(registry: CollectorRegistry, host: str, port: int) -> web.AppRunner:
    """Serve ``registry`` on ``host:port`` (port 0: any free one; see ``bound_port``)."""
    runner = web.AppRunner(create_app(registry), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port the first site of ``runner`` listens on."""
    for address in runner.addresses:
        return int(address[1])
    raise RuntimeError("the metrics listener is not started")
