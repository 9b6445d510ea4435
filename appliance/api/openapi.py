"""The OpenAPI schema (/schema/openapi.json) made to tell the truth.

Litestar documents a handler returning `Response | Stream` as an empty 200, a 400 as its own
`{status_code, detail}`, and drops some of msgspec's ranges. Here, once per app:
- request and response bodies are msgspec's own JSON schemas (every range it enforces, and
  `additionalProperties: false`: a field not listed is refused with a 400 naming it);
- every operation lists each status it can answer, with OpenAI's `{error}` body (Anthropic's
  `{type: "error", error}` under /v1/messages);
- an operation whose body has a `stream` field also answers `text/event-stream`;
- what depends on the plan is filled in: the one model id, top_k below the vocabulary.
Any endpoint added later gets the error statuses too; its 200 body is its own handler's.
"""

from __future__ import annotations

import msgspec
from litestar import Litestar

from appliance.api import schemas
from appliance.plan import ExecutionPlan
from appliance.plan.plan import is_loopback

REF = "#/components/schemas/{name}"

def _bodies() -> tuple:
    """Every request body (each refuses fields it does not declare: the schema lists every
    field a request may carry) and the documented response bodies."""
    from appliance.api.anthropic_request import CountTokensRequest, MessagesRequest
    from appliance.api.responses import ResponsesRequest

    return (schemas.ChatCompletionRequest, schemas.CompletionRequest, ResponsesRequest,
            MessagesRequest, CountTokensRequest, schemas.ChatCompletion, schemas.Completion,
            schemas.ErrorResponse, schemas.AnthropicError, schemas.ModelList, schemas.Health)


ANTHROPIC = "/v1/messages"  # paths under it answer errors in Anthropic's shape
SUCCESS = {  # path -> the 200 body's component
    "/v1/chat/completions": "ChatCompletion",
    "/v1/completions": "Completion",
    "/v1/models": "ModelList",
    "/v1/models/{model_id}": "Model",
    "/health": "Health",
}
WHY = {
    400: "Invalid request: the body is not valid JSON, or a field is wrong (`error.param` "
         "names it; `code` context_length_exceeded when the prompt, or it and max_tokens, "
         "do not fit)",
    401: "Missing or wrong API key (server.api_key is set)",
    403: "A foreign Host header on a loopback bind (DNS rebinding)",
    404: "No such model (`error.param`: model)",
    415: "The body is not application/json",
    429: "The queue is full (batch.max_queue); see Retry-After",
    500: "Unexpected server error, or a generation that failed",
    503: "The engine has failed, or the server is shutting down",
}
SSE = ("Server-sent events when the request says `\"stream\": true`: `data: <chunk JSON>` "
       "events (an error chunk `{\"error\": ...}` if generation fails after the first), then "
       "`data: [DONE]`")


def _json(ref: str, description: str) -> dict:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": REF.format(name=ref)}}}}


def _statuses(path: str, method: str, plan: ExecutionPlan) -> list[int]:
    codes = [500]
    if is_loopback(plan.server.host):
        codes.append(403)
    if plan.server.api_key and path != "/health":
        codes.append(401)
    if method == "post":
        codes += [400, 404, 415, 429, 503]
    elif path.startswith("/v1/models/"):
        codes.append(404)
    return codes


def _streams(op, components: dict) -> bool:
    body = getattr(op, "request_body", None)
    content = getattr(body, "content", None) or {}
    media = content.get("application/json")
    ref = getattr(getattr(media, "schema", None), "ref", None) or ""
    component = components.get(ref.rsplit("/", 1)[-1])
    props = component.get("properties", {}) if isinstance(component, dict) else \
        getattr(component, "properties", None) or {}
    return "stream" in props


def document(app: Litestar, plan: ExecutionPlan) -> None:
    """Rewrite `app`'s OpenAPI schema in place (before it is first served)."""
    openapi = app.openapi_schema
    _, bodies = msgspec.json.schema_components(_bodies(), ref_template=REF)
    for name in ("ChatCompletionRequest", "CompletionRequest", "ResponsesRequest",
                 "MessagesRequest", "CountTokensRequest"):
        props = bodies[name]["properties"]
        if "top_k" in props:
            props["top_k"]["anyOf"][0]["maximum"] = plan.model.vocab_size - 1
        props["model"]["enum"] = [plan.model.id]  # else 404
    components = openapi.components.schemas
    components.update(bodies)
    for path, item in (openapi.paths or {}).items():
        for method in ("get", "post"):
            op = getattr(item, method, None)
            if op is None:
                continue
            responses = dict(op.responses or {})
            if path in SUCCESS:
                responses["200"] = _json(SUCCESS[path], "OK")
            if _streams(op, components):
                sse = {"schema": {  # one event, as OpenAPI 3.2's itemSchema reads it
                    "type": "object", "required": ["data"], "description": SSE,
                    "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}}
                ok = responses.get("200")
                if isinstance(ok, dict):
                    ok["content"]["text/event-stream"] = sse
                elif ok is not None:  # Litestar's own OpenAPIResponse
                    ok.content = {**(ok.content or {}), "text/event-stream": sse}
            error = "AnthropicError" if path.startswith(ANTHROPIC) else "ErrorResponse"
            for code in _statuses(path, method, plan):
                responses[str(code)] = _json(error, WHY[code])
            if path == "/health":
                responses["503"] = _json("Health", "The engine has failed: `error` says why")
            op.responses = responses
