"""OpenAI-style errors: every failure answers {"error": {message, type, param, code}}."""

from __future__ import annotations

import logging

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

log = logging.getLogger("appliance.api")

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 415: "invalid_request_error", 429: "rate_limit_error",
         500: "server_error", 503: "server_error"}


class APIError(Exception):
    """An error the client should see, with the OpenAI body fields."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": TYPES.get(self.status, "api_error"),
                          "param": self.param, "code": self.code}}


def invalid(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code="invalid_value")


def _respond(err: APIError) -> Response:
    return Response(err.body(), status_code=err.status, headers=err.headers)


def handle_api_error(_: Request, exc: APIError) -> Response:
    return _respond(exc)


def handle_validation(_: Request, exc: ValidationException) -> Response:
    """Litestar's body validation (msgspec), reworded to name the field."""
    extra = exc.extra if isinstance(exc.extra, list) else []
    detail = extra[0] if extra and isinstance(extra[0], dict) else {}
    param = detail.get("key") or None
    message = detail.get("message") or exc.detail
    text = f"{param}: {message}" if param else f"invalid request body: {message}"
    return _respond(APIError(400, text, param=param, code="invalid_value"))


def handle_http(_: Request, exc: HTTPException) -> Response:
    return _respond(APIError(exc.status_code, str(exc.detail), headers=exc.headers))


def handle_too_deep(_: Request, exc: RecursionError) -> Response:
    """msgspec refuses a body nested deeper than it recurses (10,000 brackets did it)."""
    return _respond(APIError(400, "invalid request body: the JSON is nested too deeply",
                             code="invalid_json"))


def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.error("500 on %s %s", request.method, request.url.path, exc_info=exc)
    return _respond(APIError(HTTP_500_INTERNAL_SERVER_ERROR, f"internal error: {exc}"))


HANDLERS = {
    APIError: handle_api_error,
    ValidationException: handle_validation,
    HTTPException: handle_http,
    RecursionError: handle_too_deep,
    Exception: handle_unexpected,
}
