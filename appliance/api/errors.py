"""OpenAI-style errors: every failure answers {"error": {message, type, param, code}}."""

from __future__ import annotations

import logging
import re

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, SerializationException, ValidationException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from appliance.engine.memory import OUT_OF_MEMORY

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


class ClientGone(APIError):
    """The client went away before its answer: the engine request is cancelled and this
    response (nginx's 499, "client closed request") reaches nobody; /metrics counts it."""

    def __init__(self):
        super().__init__(499, "the client closed the request", code="client_closed_request")


# How the engine ends the requests a graceful stop could not finish (serve.py's drain).
SHUTTING_DOWN = "the server is shutting down (server.drain_seconds ran out); retry elsewhere"


def generation_failed(error: str) -> APIError:
    """A request the engine ended with `error` (logged): 503 when the server is stopping (a
    client may retry elsewhere) or could not find memory for it (retry shortly), each a
    warning in the log, else 500, an error."""
    if error == SHUTTING_DOWN:
        log.warning("a request ended: %s", error)
        return APIError(503, error, code="shutting_down")
    if error.startswith(OUT_OF_MEMORY):
        log.warning("a request ended: %s", error)
        return APIError(503, error, code="out_of_memory", headers={"Retry-After": "2"})
    log.error("generation failed: %s", error)
    return APIError(500, f"generation failed: {error}", code="generation_error")


def invalid(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code="invalid_value")


_AT = re.compile(r"^(.*) - at `\$\.?([^`]*)`$")


async def typed(request: Request, kind: type) -> None:
    """A 400 naming the field whose JSON type is wrong. Litestar converts a body leniently
    ("5" for an integer, "true" for a boolean pass as 5 and true); OpenAI's API refuses
    them, and a client sending them has a bug that a silent coercion would hide."""
    try:
        msgspec.convert(await request.json(), kind, strict=True, str_keys=True)
    except msgspec.ValidationError as e:
        m = _AT.match(str(e))
        message, param = (m.group(1), m.group(2) or None) if m else (str(e), None)
        raise APIError(400, f"{param}: {message}" if param else f"invalid request body: "
                       f"{message}", param=param, code="invalid_type") from None


def only_known(obj: dict, known: tuple[str, ...], param: str,
               inert: dict[str, tuple] | None = None) -> None:
    """A 400 naming the first key of the request object `obj` (at `param`) that this server
    does not read: nested fields are never accepted and ignored either. `inert`: keys taken
    only with the values that ask for nothing (the null an SDK writes for a field it knows)."""
    for key in obj:
        if key not in known and obj[key] not in (inert or {}).get(key, ()):
            raise invalid(f"{param}.{key}", f"is not supported (supported: {', '.join(known)}"
                          + (f"; {', '.join(inert)} where they ask for nothing" if inert
                             else "") + ")")


def _respond(err: APIError) -> Response:
    return Response(err.body(), status_code=err.status, headers=err.headers)


def handle_api_error(_: Request, exc: APIError) -> Response:
    return _respond(exc)


def handle_validation(_: Request, exc: ValidationException) -> Response:
    """Litestar's body validation (msgspec), reworded to name the field."""
    extra = exc.extra if isinstance(exc.extra, list) else []
    detail = extra[0] if extra and isinstance(extra[0], dict) else {}
    param = (detail.get("key") or "").removesuffix("[...]") or None  # a dict's value
    message = detail.get("message") or exc.detail
    if param == "data":  # the body as a whole: name the field it lacks, not Litestar's "data"
        param, message = body_problem(message)
    elif m := UNKNOWN.search(message):  # a field of an object in the body
        param, message = f"{param}.{m.group(1)}" if param else m.group(1), NOT_A_FIELD
    text = f"{param}: {message}" if param else f"invalid request body: {message}"
    return _respond(APIError(400, text, param=param, code="invalid_value"))


UNKNOWN = re.compile(r"unknown field `([^`]+)`")
NOT_A_FIELD = ("is not a field this server knows; it is refused rather than ignored "
               "(the OpenAPI schema at /schema lists every field)")


def body_problem(message: str) -> tuple[str | None, str]:
    """(param, message) for a problem with the body as a whole: the required field it
    lacks, a field it should not have, or no param where there is no JSON object at all."""
    if m := re.search(r"missing required field `([^`]+)`", message):
        return m.group(1), "is required"
    if m := UNKNOWN.search(message):
        return m.group(1), NOT_A_FIELD
    if message.strip("'\"") == "data":  # Litestar found no body at all
        return None, "the request body is missing or empty; send a JSON object"
    return None, message


def handle_http(_: Request, exc: HTTPException) -> Response:
    if isinstance(exc.__cause__, SerializationException):  # msgspec could not decode it
        return _respond(APIError(400, f"invalid request body: not valid JSON ({exc.detail})",
                                 code="invalid_json"))  # (a lone \ud800 escape is not either)
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
