"""OpenAI-shaped error answers, so every client library shows the message.

Every error the router produces — bad input, auth, budgets, unknown model,
loading, upstream trouble, size limits, unknown paths — is an
:class:`ApiError` turned into ``{"error": {"message", "type", "param",
"code"}}`` with the right status, in one place (the app's middleware).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from aiohttp import web

# OpenAI's error types by status, as its clients expect them.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class ApiError(Exception):
    """An error the router answers with; raised anywhere, rendered by the middleware."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        type: str | None = None,  # noqa: A002 - the field's name in OpenAI's body
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "error")
        self.param = param
        self.headers = dict(headers or {})

    def response(self) -> web.Response:
        body = {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }
        return web.Response(
            status=self.status,
            body=json.dumps(body).encode(),
            content_type="application/json",
            headers=self.headers,
        )


def from_http(exc: web.HTTPException) -> ApiError:
    """aiohttp's own errors (404 path, 405 method, 413 body) in OpenAI's shape."""
    if exc.status == 404:
        return ApiError(404, "no such endpoint; see /v1/models, /v1/chat/completions, "
                        "/v1/completions, /v1/embeddings, /v1/responses", code="not_found")
    if exc.status == 405:
        allowed = exc.headers.get("Allow", "")
        return ApiError(405, f"method not allowed here; allowed: {allowed}",
                        code="method_not_allowed", headers={"Allow": allowed})
    if exc.status == 413:
        return ApiError(413, f"request body too large: {exc.text}", code="request_too_large")
    return ApiError(exc.status, exc.text or exc.reason)
