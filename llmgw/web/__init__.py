"""Pages for people: login, /chat, /account, /admin (server-rendered, no build step).

Public API, for the daemon::

    from llmgw.web import AdminView, Pages, Progress
    pages = Pages(store, router, cluster=lambda: daemon.cluster, admin=view)
    runner = await router.start(host, port, extend=pages.install)
"""

from llmgw.web.pages import NOT_OBSERVED, PAGE_PREFIXES, AdminView, Pages, Progress

__all__ = ["NOT_OBSERVED", "PAGE_PREFIXES", "AdminView", "Pages", "Progress"]
