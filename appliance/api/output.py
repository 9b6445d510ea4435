"""What a chat request asks of its output: tools to offer, calls to parse, a grammar to obey.

One place turns `tools` / `tool_choice` / `parallel_tool_calls` / `response_format` (OpenAI
terms; the Anthropic and Responses endpoints translate to them) into:
- the tools the chat template renders (all of them, whatever tool_choice says, as OpenAI
  and Anthropic keep them in the prompt);
- the `ToolFormat` that parses calls out of the text (tool_choice "auto");
- for tool_choice "none", a grammar that keeps the text from starting a call;
- the grammar a constrained row decodes under: the response's JSON schema, a forced call
  (tool_choice "required" or a named function), either of the two (JSON content or a
  call, for "auto" with a response format), or text then calls held to their schemas (for
  "auto" with a `strict: true` tool: OpenAI's promise that its calls match the schema).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from appliance.api import tools as tl
from appliance.api.errors import APIError, invalid, only_known
from appliance.api.grammar import Grammar, compile_grammar, json_rule


@dataclass(frozen=True)
class OutputSpec:
    template_tools: list | None
    tools: tl.ToolFormat | None
    grammar: Grammar | None
    # where the grammar starts with free text (tool_choice none; strict tools under auto):
    # the call markup that ends it. A prefilled reply may precede such a grammar.
    text_until: str | None = None


def annotations(spec: dict, param: str) -> None:
    """A format's `name` and `description` are annotations, as the schema's own are: the
    output is held to the schema, which the model is not shown (LangChain's structured
    output sends a JSON schema's description here). Each must be a string."""
    for key in ("name", "description"):
        if key in spec and not isinstance(spec[key], str):
            raise invalid(f"{param}.{key}", "must be a string")


def response_schema(rf, param: str = "response_format") -> dict | None:
    """The JSON schema `response_format` asks for, or None for free text."""
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise invalid(param, "must be an object")
    only_known(rf, ("type", "json_schema"), param)
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if isinstance(spec, dict):  # (strict: the output is constrained to it either way)
            only_known(spec, ("name", "description", "schema", "strict"), f"{param}.json_schema")
            annotations(spec, f"{param}.json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise invalid(f"{param}.json_schema.schema", "must be a JSON schema object")
        return schema
    raise invalid(f"{param}.type", f"{kind!r} is not one of text, json_object, json_schema")


def output_spec(tokenizer, n_vocab: int, tools, tool_choice, parallel: bool | None,
                schema: dict | None, tools_param: str = "tools",
                schema_param: str = "response_format.json_schema.schema") -> OutputSpec:
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", "must be a boolean")
    mode, offered, fmt = "none", [], None
    if tools:
        tools = tl.check_tools(tools, tools_param)
        mode, offered = tl.chosen(tools, tool_choice)
        if mode != "none":
            fmt = tl.tool_format(tokenizer, tools_param)
            fmt = replace(fmt, tools=tools, max_calls=1 if parallel is False else None,
                          forced=mode == "required",
                          start_token=tl.special_token(tokenizer, n_vocab, fmt.start),
                          end_token=tl.special_token(tokenizer, n_vocab, fmt.end))
    elif tool_choice not in (None, "none", "auto"):
        raise invalid("tool_choice", "needs tools")
    # a strict tool's calls are held to its schema under auto too: text, then calls or nothing
    strict = mode == "auto" and schema is None and any(t["function"].get("strict") is True
                                                       for t in offered)
    rules, start = [], []
    if schema is not None and mode != "required":
        rules.append(f"content: {json_rule(schema)}")
        start.append("content")
    if fmt is not None and (mode == "required" or schema is not None or strict):
        rules.append(tl.calls_lark(fmt, offered, fmt.max_calls,
                                   tools_param if strict else "tool_choice", after_text=strict))
        start.append("calls")
    lark = "\n".join([f"start: {' | '.join(start)}", *rules]) if start else None
    text_until = fmt.start if strict else None
    if lark is None and mode == "none" and tools and getattr(tokenizer, "has_tool_calling",
                                                             False):
        # the tools stay in the prompt; the text may not start a call
        none_fmt = tl.tool_format(tokenizer, tools_param)
        lark, text_until = tl.no_calls_lark(none_fmt), none_fmt.start
    grammar = None
    if lark is not None:
        try:
            grammar = compile_grammar(tokenizer, n_vocab, lark, schema_param,
                                      f"{mode} tools, schema={schema is not None}")
        except APIError:
            _blame(tokenizer, n_vocab, schema, schema_param, tools, offered if fmt else [],
                   tools_param)
            raise
    return OutputSpec(tools or None, fmt, grammar, text_until)


def _blame(tokenizer, n_vocab, schema, schema_param, tools, offered, tools_param) -> None:
    """Compile each schema alone, to name the one llguidance refuses."""
    if schema is not None:
        compile_grammar(tokenizer, n_vocab, f"start: {json_rule(schema)}", schema_param, "")
    for t in offered:
        compile_grammar(tokenizer, n_vocab, f"start: {json_rule(tl.call_schema(t))}",
                        f"{tools_param}[{tools.index(t)}].function.parameters", "")
