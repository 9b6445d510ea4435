"""The OpenAPI schema tells the truth (issue 15, F7): every status with OpenAI's `{error}`
body, the SSE content type and the ranges; schemathesis then checks a live server against it
(bounded examples): any 5xx, undocumented status, content type or body fails."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from conftest import app_for
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance, negative_data_rejection]
MAX_EXAMPLES = 40  # per operation and generation mode: the run stays well under a minute


@pytest.fixture(scope="module")
def small_server():
    """A server whose context is short, so that a generated request generates little."""
    with app_for(["server.max_context=48", "server.default_max_tokens=4"]) as (plan, _, url):
        yield plan, url


@pytest.fixture(scope="module")
def spec(small_server):
    return httpx.get(f"{small_server[1]}/schema/openapi.json").json()


def _responses(spec, path, method="post"):
    return spec["paths"][path][method]["responses"]


def test_every_status_is_documented_with_the_openai_error_body(spec):
    for path in ("/v1/chat/completions", "/v1/completions"):
        responses = _responses(spec, path)
        assert {"200", "400", "403", "404", "415", "429", "500", "503"} <= set(responses)
        for code in ("400", "404", "415", "429", "500", "503"):
            ref = responses[code]["content"]["application/json"]["schema"]["$ref"]
            assert ref == "#/components/schemas/ErrorResponse"
    error = spec["components"]["schemas"]["ErrorResponse"]
    assert error["required"] == ["error"]
    assert spec["components"]["schemas"]["ErrorDetail"]["required"] == \
        ["message", "type", "param", "code"]
    assert "401" not in _responses(spec, "/v1/completions")  # no key: no 401
    assert set(_responses(spec, "/health", "get")) == {"200", "403", "500", "503"}


def test_streaming_and_ranges_are_documented(spec, small_server):
    plan = small_server[0]
    ok = _responses(spec, "/v1/chat/completions")["200"]["content"]
    assert set(ok) == {"application/json", "text/event-stream"}
    props = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    number = {k: props[k]["anyOf"][0] for k in ("temperature", "top_p", "top_k", "seed")}
    assert number["temperature"]["minimum"] == 0 and number["temperature"]["maximum"] == 2
    assert number["top_p"]["minimum"] == 0 and number["top_p"]["maximum"] == 1
    assert number["top_k"]["maximum"] == plan.model.vocab_size - 1
    assert number["seed"]["maximum"] == 2**64 - 1
    assert props["messages"]["minItems"] == 1
    # every endpoint's body states its ranges and the one model it serves (schemathesis
    # found a Responses temperature of 4.5e16, or no messages to Anthropic, allowed here)
    bodies = spec["components"]["schemas"]
    for name, t_max in (("ResponsesRequest", 2), ("MessagesRequest", 1)):
        props = bodies[name]["properties"]
        assert props["temperature"]["anyOf"][0]["maximum"] == t_max
        assert props["top_p"]["anyOf"][0]["minimum"] == 0
    claude = bodies["MessagesRequest"]["properties"]
    assert claude["top_k"]["anyOf"][0]["maximum"] == plan.model.vocab_size - 1
    assert claude["max_tokens"]["minimum"] == 1
    for name in ("MessagesRequest", "CountTokensRequest"):
        messages = bodies[name]["properties"]["messages"]
        assert messages["minItems"] == 1 and messages["items"]["required"] == ["role", "content"]
    for name in ("ChatCompletionRequest", "CompletionRequest", "ResponsesRequest",
                 "MessagesRequest", "CountTokensRequest"):
        assert bodies[name]["properties"]["model"]["enum"] == [plan.model.id]


def _client_fields() -> dict[str, set[str]]:
    """The request fields the installed official clients can send, per endpoint."""
    import typing

    from anthropic.types import message_count_tokens_params, message_create_params
    from openai.types import completion_create_params
    from openai.types.chat import completion_create_params as chat_params
    from openai.types.responses import response_create_params

    params = {"/v1/chat/completions": chat_params.CompletionCreateParamsBase,
              "/v1/completions": completion_create_params.CompletionCreateParamsBase,
              "/v1/responses": response_create_params.ResponseCreateParamsBase,
              "/v1/messages": message_create_params.MessageCreateParamsBase,
              "/v1/messages/count_tokens": message_count_tokens_params.MessageCountTokensParams}
    return {path: set(typing.get_type_hints(td)) for path, td in params.items()}


def test_every_field_a_client_sends_is_in_the_schema_and_no_other_is_accepted(spec,
                                                                              small_server):
    """What the routes read is what the schema lists: each field of the official clients'
    requests is declared (honored, or refused by name), and any other field is a 400
    naming it, on every endpoint."""
    plan, url = small_server
    bodies = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "x"}]},
              "/v1/completions": {"prompt": "x"}, "/v1/responses": {"input": "x"},
              "/v1/messages": {"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]},
              "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "x"}]}}
    for path, fields in _client_fields().items():
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        component = spec["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[-1]]
        assert component["additionalProperties"] is False, path
        assert fields - {"stream"} <= set(component["properties"]), \
            (path, fields - set(component["properties"]))
        r = httpx.post(f"{url}{path}", json={"model": plan.model.id, **bodies[path],
                                             "not_a_field": 1})
        assert r.status_code == 400, (path, r.text)
        message = r.json()["error"]["message"]
        assert message.startswith("not_a_field: "), message
        if not path.startswith("/v1/messages"):
            assert r.json()["error"]["param"] == "not_a_field"


def test_a_key_adds_401_everywhere_but_health():
    from conftest import resolve_overrides

    from appliance.api import create_app

    class NoEngine:
        tokenizer = None

    plan = resolve_overrides(["server.api_key=k"])
    doc = create_app(plan, NoEngine()).openapi_schema.to_schema()
    assert "401" in doc["paths"]["/v1/models"]["get"]["responses"]
    assert "401" not in doc["paths"]["/health"]["get"]["responses"]


def _run(operation, mode: GenerationMode) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def one(case):
        case.call_and_validate(checks=CHECKS, timeout=60)

    one()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_live_server_keeps_to_its_schema(small_server, mode):
    """(schemathesis's pytest plugin does not load under pytest 9: the operations are driven
    through Hypothesis here.)"""
    live = schemathesis.openapi.from_url(f"{small_server[1]}/schema/openapi.json")
    operations = [result.ok() for result in live.get_all_operations()]
    assert len(operations) >= 6
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and operation.method.upper() != "POST":
            continue  # nothing to negate: no parameters, no body
        _run(operation, mode)
