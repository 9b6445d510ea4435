"""Tool calling: checking `tools` / `tool_choice`, the grammar a forced call decodes under,
and the tool calls parsed out of the generated text.

The markup and the parser are mlx-lm's own, chosen from the chat template as
`mlx_lm.server` does (`TokenizerWrapper.tool_call_start/_end/tool_parser`). A forced call
(`tool_choice` required or a named function) is decoded under a grammar, which needs the
JSON call format (mlx-lm's `json_tools` parser, the Hermes style of the embedded model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from appliance.api.errors import invalid, only_known
from appliance.api.grammar import json_rule, lark_string

NL = "\n"


@dataclass(frozen=True)
class ToolFormat:
    """How this model writes tool calls, and what may be parsed out of one request's text."""

    start: str
    end: str
    parser: object  # mlx-lm's parse_tool_call(text, tools) -> dict | list[dict]
    tools: list = field(default_factory=list)
    max_calls: int | None = None  # 1 with parallel_tool_calls=false
    forced: bool = False  # tool_choice required or named: the text is calls only (a grammar)
    # start / end as one special token of the vocabulary, where they are (see calls_lark)
    start_token: int | None = None
    end_token: int | None = None


def check_tools(tools, param: str = "tools") -> list[dict]:
    """OpenAI `tools`: function tools with a name, each its own; returns them unchanged.
    (A name is honored as written, any string: calls are JSON, their names JSON strings.)"""
    if not isinstance(tools, list):
        raise invalid(param, "must be a list of tools")
    seen: dict[str, int] = {}
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            raise invalid(f"{param}[{i}].type", "only 'function' tools are supported")
        only_known(t, ("type", "function"), f"{param}[{i}]")
        fn = t.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise invalid(f"{param}[{i}].function.name", "every function needs a name")
        # (strict: forced calls are constrained either way; under auto, see output.py)
        only_known(fn, ("name", "description", "parameters", "strict"), f"{param}[{i}].function")
        if not isinstance(fn.get("strict", False), bool | None):
            raise invalid(f"{param}[{i}].function.strict", "must be a boolean")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise invalid(f"{param}[{i}].function.parameters", "must be a JSON schema object")
        if seen.setdefault(fn["name"], i) != i:  # (which one would a call of it mean?)
            raise invalid(f"{param}[{i}]", f"{fn['name']!r} is also the name of "
                                           f"{param}[{seen[fn['name']]}]: names are unique")
    return tools


def check_answers(messages: list[dict], sources: list[str]) -> None:
    """Tool calls and results pair up as OpenAI's and Anthropic's APIs require: the calls of
    an assistant turn are each answered by a tool result after it, before the next turn.
    Consecutive messages of one role are one turn, as Anthropic merges them (and Responses
    items are a turn's parts). A result that answers no such call, or a call left
    unanswered, is a 400 naming the message (`sources`: where each message came from in the
    request): a template would render either as written, and the model read a conversation
    that never happened."""
    waiting: dict[str, str] = {}  # a call's id: where the turn that made it came from
    role = None

    def unanswered():
        ids = ", ".join(repr(i) for i in waiting)
        raise invalid(next(iter(waiting.values())), f"tool call {ids} has no result: each "
                      "call is answered by a tool result after the turn that makes it, "
                      "before the next turn")

    for m, src in zip(messages, sources, strict=True):
        if m["role"] == "tool":
            if waiting.pop(m.get("tool_call_id"), None) is None:
                raise invalid(src, f"a tool result for call {m.get('tool_call_id')!r}, which "
                                   "is not an unanswered call of the assistant turn before it")
            role = "tool"
            continue
        if m["role"] != role:  # a new turn
            if waiting:
                unanswered()
            role = m["role"]
        for c in m.get("tool_calls") or ():
            if c["id"] in waiting:  # (its results could not say which call they answer)
                raise invalid(src, f"tool call id {c['id']!r} is used twice in one turn: "
                                   "each call needs an id of its own")
            waiting[c["id"]] = src
    if waiting:
        unanswered()


def tool_format(tokenizer, param: str = "tools") -> ToolFormat:
    """The model's tool-call markup and parser, or a 400: a model whose chat template has no
    tool-call format cannot be asked for tool calls."""
    if not getattr(tokenizer, "has_tool_calling", False):
        raise invalid(param, "this model's chat template has no tool-call format (mlx-lm "
                             "finds no tool parser for it)")
    return ToolFormat(tokenizer.tool_call_start, tokenizer.tool_call_end, tokenizer.tool_parser)


def chosen(tools: list[dict], tool_choice, param: str = "tool_choice") -> tuple[str, list[dict]]:
    """('none' | 'auto' | 'required', the tools a call may use)."""
    if tool_choice is None or tool_choice in ("auto", "none", "required"):
        return tool_choice or "auto", tools
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        only_known(tool_choice, ("type", "function"), param)
        if isinstance(tool_choice.get("function"), dict):
            only_known(tool_choice["function"], ("name",), f"{param}.function")
        name = (tool_choice.get("function") or {}).get("name")
        named = [t for t in tools if t["function"]["name"] == name]
        if not named:
            raise invalid(param, f"names function {name!r}, which is not in tools")
        return "required", named
    raise invalid(param, "must be 'none', 'auto', 'required' or "
                         "{'type': 'function', 'function': {'name': ...}}")


def call_schema(tool: dict) -> dict:
    """The JSON of one call of `tool`: its name, and arguments valid for its parameters. The
    parameters sit under properties.arguments here, so their local references (`$defs`,
    `definitions`: what pydantic and MCP servers write for nested models) point there."""
    fn = tool["function"]
    return {"type": "object", "properties": {"name": {"const": fn["name"]},
                                             "arguments": _rebased(fn.get("parameters") or
                                                                   {"type": "object"})},
            "required": ["name", "arguments"], "additionalProperties": False}


def _rebased(schema, base: str = "#/properties/arguments"):
    """`schema` with each local "$ref" ("#", "#/...") pointing under `base`."""
    if isinstance(schema, list):
        return [_rebased(x, base) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _rebased(v, base) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        out["$ref"] = base + ref[1:]
    return out


def parser_name(fmt: ToolFormat) -> str:
    """mlx-lm's name for the model's tool parser (its module): json_tools, qwen3_coder, ..."""
    return fmt.parser.__module__.rsplit(".", 1)[-1]


def calls_lark(fmt: ToolFormat, tools: list[dict], max_calls: int | None,
               param: str = "tool_choice", after_text: bool = False) -> str:
    """Lark rules for `calls`: one call (or several, newline-separated) of these tools, each
    `start {"name": ..., "arguments": {...}} end` with the arguments valid for its function.
    `after_text` (tool_choice auto, strict tools): `calls` is any text without the start of a
    call, then calls or the end.

    Where the vocabulary holds start / end as one special token (llguidance keeps special
    tokens out of text), the markup is that token or the text: the mask would otherwise
    forbid the token the model was trained to write. Only the JSON call format (mlx-lm's
    json_tools parser: Hermes, Qwen 2.5/3) can be written as a grammar here; another model's
    format (qwen3_coder's XML-like parameters, mistral's, pythonic, ...) is refused with a
    400 rather than held to it approximately."""
    if parser_name(fmt) != "json_tools":
        raise invalid(param, "holding a tool call to its schema (tool_choice required or a "
                             "named function; strict tools) is only supported for models that "
                             "write tool calls as JSON (mlx-lm's json_tools parser, Hermes "
                             f"style); this model's tool-call format is mlx-lm's "
                             f"{parser_name(fmt)!r}. Use tool_choice 'auto' with strict tools "
                             "off (calls are parsed from the text) or 'none'")

    def markup(text: str, token: int | None) -> str:
        return lark_string(text) if token is None else f"({lark_string(text)} | <[{token}]>)"

    alts = " | ".join(f"call_{i}" for i in range(len(tools)))
    more = "" if max_calls == 1 else f" ({lark_string(NL)} call)*"
    body = f"{lark_string(NL)} ({alts}) {lark_string(NL)} {markup(fmt.end, fmt.end_token)}"
    rules = [f"call: {markup(fmt.start, fmt.start_token)} body", f"body: {body}"]
    if not after_text:
        rules.insert(0, f"calls: call{more}")
    else:  # (a lazy lexeme ends at the markup written as text; TEXT alone is greedy)
        lead = [f"lead body{more}"] + ([] if fmt.start_token is None else
                                      [f"TEXT? <[{fmt.start_token}]> body{more}"])
        rules[:0] = [f"calls: TEXT | {' | '.join(lead)}",
                     f"lead[lazy]: /(?s:.*){_regex(fmt.start)}/", _text_without(fmt.start)]
    rules += [f"call_{i}: {json_rule(call_schema(t))}" for i, t in enumerate(tools)]
    return "\n".join(rules)


_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")


def _regex(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def _text_without(marker: str) -> str:
    return f"TEXT: /(?s:.*)/ & ~/(?s:.*){_regex(marker)}(?s:.*)/"


def no_calls_lark(fmt: ToolFormat) -> str:
    """Lark rules for tool_choice "none": any text without the start of a tool call (the
    tools stay in the prompt, as OpenAI keeps them; the model may not call one)."""
    return f"start: TEXT\n{_text_without(fmt.start)}"


def special_token(tokenizer, n_vocab: int, text: str) -> int | None:
    """The id of `text` where the vocabulary holds it as one special token, else None."""
    from appliance.api.grammar import ll_tokenizer

    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    tid = (hf.get_added_vocab() if hasattr(hf, "get_added_vocab") else {}).get(text)
    return tid if tid is not None and ll_tokenizer(tokenizer, n_vocab).is_special_token(tid) \
        else None


def message_tool_calls(calls, param: str) -> list[dict]:
    """An assistant message's tool_calls for the chat template: arguments as objects (as
    mlx-lm's server passes them; templates render them with tojson), or, where they are
    not JSON (a call max_tokens cut, as this server streams it), the string as written:
    OpenAI takes any string back."""
    if not isinstance(calls, list):
        raise invalid(param, "must be a list")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(f"{param}[{j}].function", "needs a name and arguments")
        only_known(c, ("id", "type", "function"), f"{param}[{j}]")
        only_known(fn, ("name", "arguments"), f"{param}[{j}].function")
        if not isinstance(c.get("id"), str) or not c["id"]:
            raise invalid(f"{param}[{j}].id", "is required (the id a tool message answers)")
        if c.get("type", "function") != "function":
            raise invalid(f"{param}[{j}].type", f"{c['type']!r}: only 'function'")
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                pass  # (templates write a string as it is)
        out.append({**c, "function": {**fn, "arguments": args if args is not None else {}}})
    return out


