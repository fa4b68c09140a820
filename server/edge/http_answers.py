"""How every answer of the HTTP side reads: its security headers, and its errors as statuses.

Every response (the page, its assets, the API, errors) carries the headers that keep a
foreign page from framing, sniffing or caching it; the API's answers and every error are
`Cache-Control: no-store` (they hold session content or say who may do what). Under
`/api/` an error aiohttp raises (no such path, ...) is a `google.rpc.Status` body like
every refusal of the API.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from google.protobuf import json_format

# googleapis-common-protos ships .pyi files but no py.typed marker.
from google.rpc import status_pb2  # type: ignore[import-untyped]

from server.edge.status import rich_status

ANSWER_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
"""On every response: the console's CSP (no framing), no MIME sniffing, no referrer."""

API_PREFIX = "/api/"

HTTP_CODES = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
"""gRPC status -> HTTP status, as gRPC-gateway maps them."""

HTTP_ERRORS = {
    404: (grpc.StatusCode.NOT_FOUND, "NO_SUCH_PATH"),
    405: (grpc.StatusCode.UNIMPLEMENTED, "METHOD_NOT_ALLOWED"),
    413: (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED"),
}
"""The status of an HTTP error aiohttp raises under `/api/`; other 4xx are
INVALID_ARGUMENT and 5xx INTERNAL."""


def code_of(number: int) -> grpc.StatusCode:
    """The `grpc.StatusCode` of a numeric code (UNKNOWN for one gRPC does not define)."""
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN


def status_json(status: status_pb2.Status) -> dict[str, Any]:
    """A status as the HTTP side writes it: the JSON mapping plus the code's name."""
    body: dict[str, Any] = {"status": code_of(status.code).name}
    body.update(json_format.MessageToDict(status, always_print_fields_with_no_presence=True))
    return body


def status_response(status: status_pb2.Status, http_status: int = 0) -> web.Response:
    """The HTTP answer of a refusal (under the mapped HTTP code unless one is given)."""
    return web.json_response(
        status_json(status), status=http_status or HTTP_CODES.get(code_of(status.code), 500)
    )


def api_error(request: web.Request, error: web.HTTPException) -> web.Response:
    """An HTTP error under `/api/` as a status, under the same HTTP code."""
    code, reason = HTTP_ERRORS.get(
        error.status,
        (grpc.StatusCode.INTERNAL, "INTERNAL")
        if error.status >= 500
        else (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST"),
    )
    if error.status == 404:
        message = "no such API path: the API is POST /api/<package.Service>/<Method>"
    else:
        message = f"{request.method} {request.path[:200]}: {error.reason}"
    answer = status_response(rich_status(code, message, reason), error.status)
    for name in ("Allow", "Retry-After"):
        if name in error.headers:
            answer.headers[name] = error.headers[name]
    return answer


@web.middleware
async def api_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Under `/api/`, an HTTP error raised by aiohttp (or a handler) becomes a status."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400 or not (request.path + "/").startswith(API_PREFIX):
            raise
        return api_error(request, error)


async def answer_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: the headers of every answer, and what may be cached."""
    for name, value in ANSWER_HEADERS.items():
        response.headers.setdefault(name, value)
    if response.status >= 400 or (request.path + "/").startswith(API_PREFIX):
        response.headers["Cache-Control"] = "no-store"
    else:  # the page and its assets: cached, but checked (ETag) before each use
        response.headers.setdefault("Cache-Control", "no-cache")


class AnsweringHandler(RequestHandler):
    """The HTTP protocol, whose own answers carry the headers of every answer too.

    Those answers (to a request it cannot parse: a bad request line, headers over its
    sizes) are made before any route, where `on_response_prepare` does not reach.
    """

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The error answer aiohttp makes, with the headers."""
        response = super().handle_error(request, status, exc, message)
        response.headers.update(ANSWER_HEADERS)
        response.headers["Cache-Control"] = "no-store"
        return response
