"""Who may call the API: an API key when the plan has one, no foreign Host on a loopback
bind (DNS rebinding: a web page's script reaching 127.0.0.1 through its own domain), and
JSON bodies only (a browser's cross-origin "simple" POST is text/plain and needs no
preflight). One Litestar guard, run before any handler reads the body."""

from __future__ import annotations

import hmac

from litestar.connection import ASGIConnection

from appliance.api.errors import APIError
from appliance.plan.plan import is_loopback

OPEN = ("/health",)  # answered without a key (supervisors probe it)


def _hostname(header: str) -> str:
    """The Host header without its port (IPv6 literals keep their address)."""
    if header.startswith("["):
        return header[1:header.find("]")]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


async def guard(connection: ASGIConnection, _handler) -> None:  # (async: metrics.before_send)
    server = connection.app.state.plan.server
    if is_loopback(server.host):
        host = _hostname(connection.headers.get("host", "")).lower()  # (names: any case)
        if not is_loopback(host):
            raise APIError(403, f"Host {host!r} is not this server's: on a loopback bind only "
                                "localhost, 127.0.0.1 and ::1 are served (DNS rebinding)",
                           code="foreign_host")
    if connection.url.path in OPEN:
        return
    if server.api_key:
        given = connection.headers.get("x-api-key") or ""
        auth = connection.headers.get("authorization") or ""
        if auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if not hmac.compare_digest(given.encode(), server.api_key.encode()):
            raise APIError(401, "missing or wrong API key: send Authorization: Bearer <key> "
                                "(or x-api-key: <key>)", code="invalid_api_key")
    if connection.scope.get("method") == "POST":
        kind = (connection.headers.get("content-type") or "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise APIError(415, f"the request body must be application/json, not {kind!r}",
                           code="unsupported_media_type")
