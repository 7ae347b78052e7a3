"""The OpenAI-compatible router: routes, balancing, keys, budgets, usage, metrics.

Public API, for the daemon::

    from llmgw.router import Endpoint, Router, Settings, catalogs
    router = Router(catalogs.from_cluster(cluster), store=store, registry=registry)
    router.update_routes({"llama": [Endpoint("http://10.0.0.11:18000", "gpu-a-01", 0)]})
    demand = router.demand()
"""

from llmgw.router import catalogs
from llmgw.router.apps import Router, Settings
from llmgw.router.routes import Endpoint

__all__ = ["Endpoint", "Router", "Settings", "catalogs"]
