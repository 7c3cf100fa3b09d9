"""Split a Qwen3.5 completion into reasoning, content and tool calls (OpenAI message fields).

Output format (from the chat template, spec/qwen35.md §5.2):

* Reasoning sits in `<think>…</think>`. The generation prompt already opened `<think>\\n`, so the
  completion normally starts *inside* the reasoning (`thinking_started=True`); with thinking
  disabled the prompt closed it and the completion is content (`thinking_started=False`), unless
  the model opens a `<think>` itself at the very start.
* Tool calls follow the content:
  `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`.
  The older Qwen form `<tool_call>{"name": …, "arguments": {…}}</tool_call>` is accepted too.

Decisions, each chosen so that rendering the parsed message with the template gives back the text:

* Reasoning and content are stripped of surrounding whitespace (the template `|trim`s both and
  writes `\\n</think>\\n\\n` and `\\n\\n<tool_call>` around them).
* A parameter value loses exactly the one newline the template puts on each side of it, not all
  whitespace: an edit tool's `old_string` with leading indentation must survive.
* A value becomes a JSON value when it parses as JSON, else it stays a string, like llama.cpp's
  Qwen3-Coder XML parser. When the request's `tools` declare the parameter as `"type": "string"`
  the raw text is kept even if it looks like JSON (a zip code `01234`, the word `null`), which is
  what llama.cpp's schema-aware parser does.
* A `<tool_call>` that never closes, or whose inside is not a well-formed call, is returned as
  content text, never dropped: the user sees what the model wrote.
* Tags are recognised only where they mean something: `<think>` at the start, `</think>` inside
  reasoning, `<tool_call>` inside content. Tool-call markup inside reasoning stays reasoning.

`StreamingOutputParser` gives the same result incrementally and never emits part of a tag.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["ParsedOutput", "StreamEvent", "StreamingOutputParser", "parse_assistant_output",
           "prompt_opens_thinking", "THINK_OPEN", "THINK_CLOSE", "TOOL_CALL_OPEN", "TOOL_CALL_CLOSE"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_FUNCTION_OPEN = "<function="
_FUNCTION_CLOSE = "</function>"
_PARAM_OPEN = "<parameter="
_PARAM_CLOSE = "</parameter>"

IdFactory = Callable[[], str]


@dataclass
class ParsedOutput:
    reasoning_content: str | None
    content: str
    tool_calls: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class StreamEvent:
    """kind is "reasoning" or "content" (text is the delta) or "tool_call" (tool_call is the whole
    call, index its position among this message's calls)."""
    kind: str
    text: str = ""
    tool_call: dict | None = None
    index: int = -1


_ID_ALPHABET = string.ascii_letters + string.digits


def random_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def prompt_opens_thinking(prompt: str) -> bool:
    """True when the rendered prompt ends inside an open `<think>` (Qwen3.5's default generation
    prompt), i.e. the value to pass as `thinking_started`. With `enable_thinking=False` the prompt
    ends with `<think>\n\n</think>\n\n` and the completion starts as content."""
    return prompt.rstrip().endswith(THINK_OPEN)


# ---------------------------------------------------------------------------------------------
# Tool-call block parsing (shared by the one-shot and streaming parsers)


def _parameter_schemas(tools: list[dict] | None) -> dict[str, dict]:
    """function name -> its `parameters.properties` mapping, from an OpenAI `tools` list."""
    found: dict[str, dict] = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        found[fn["name"]] = props if isinstance(props, dict) else {}
    return found


def _declared_string(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "string":
        return True
    # ["string", "null"]: still text; a union with numbers or objects is left to JSON detection.
    return isinstance(kind, list) and "string" in kind and all(k in ("string", "null") for k in kind)


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN/Infinity; they are not JSON, so such a value stays a string.
    raise ValueError(name)


def _convert_value(raw: str, schema: Any) -> Any:
    value = raw
    if value.startswith("\r\n"):
        value = value[2:]
    elif value.startswith("\n"):
        value = value[1:]
    if value.endswith("\r\n"):
        value = value[:-2]
    elif value.endswith("\n"):
        value = value[:-1]
    if _declared_string(schema):
        return value
    try:
        return json.loads(value, parse_constant=_reject_constant)
    except ValueError:
        return value


def _parse_xml_call(body: str, schemas: dict[str, dict]) -> tuple[str, dict] | None:
    head_end = body.find(">")
    if head_end < 0 or not body.endswith(_FUNCTION_CLOSE):
        return None
    name = body[len(_FUNCTION_OPEN):head_end].strip()
    if not name or any(c.isspace() or c in "<>" for c in name):
        return None
    props = schemas.get(name, {})
    params = body[head_end + 1:len(body) - len(_FUNCTION_CLOSE)]
    args: dict[str, Any] = {}
    pos = 0
    while True:
        while pos < len(params) and params[pos].isspace():
            pos += 1
        if pos == len(params):
            return name, args
        if not params.startswith(_PARAM_OPEN, pos):
            return None
        name_end = params.find(">", pos)
        if name_end < 0:
            return None
        pname = params[pos + len(_PARAM_OPEN):name_end].strip()
        value_end = params.find(_PARAM_CLOSE, name_end + 1)
        if not pname or value_end < 0:
            return None
        args[pname] = _convert_value(params[name_end + 1:value_end], props.get(pname))
        pos = value_end + len(_PARAM_CLOSE)


def _parse_json_call(body: str) -> tuple[str, dict] | None:
    try:
        obj = json.loads(body, parse_constant=_reject_constant)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args, parse_constant=_reject_constant) if args.strip() else {}
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], args


def _parse_tool_block(inner: str, schemas: dict[str, dict]) -> tuple[str, dict] | None:
    """The text between `<tool_call>` and `</tool_call>` -> (name, arguments), or None when it is
    not one well-formed call."""
    body = inner.strip()
    if body.startswith(_FUNCTION_OPEN):
        return _parse_xml_call(body, schemas)
    if body.startswith("{"):
        return _parse_json_call(body)
    return None


def _tool_call(name: str, args: dict, make_id: IdFactory) -> dict:
    return {"id": make_id(), "type": "function",
            "function": {"name": name,
                         "arguments": json.dumps(args, ensure_ascii=False, separators=(",", ":"))}}


# ---------------------------------------------------------------------------------------------
# One-shot parser


def _split_reasoning(text: str, thinking_started: bool) -> tuple[str | None, str]:
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        body = stripped[len(THINK_OPEN):]
    elif thinking_started:
        body = text
    else:
        return None, text
    end = body.find(THINK_CLOSE)
    # No </think>: the completion stopped while still thinking, so all of it is reasoning.
    reasoning, rest = (body, "") if end < 0 else (body[:end], body[end + len(THINK_CLOSE):])
    return reasoning.strip() or None, rest


def parse_assistant_output(text: str, *, thinking_started: bool = True,
                           tools: list[dict] | None = None,
                           id_factory: IdFactory | None = None) -> ParsedOutput:
    """Parse a whole completion (without the end-of-turn token)."""
    make_id = id_factory or random_call_id
    schemas = _parameter_schemas(tools)
    reasoning, rest = _split_reasoning(text, thinking_started)
    pieces: list[str] = []
    calls: list[dict] = []
    pos = 0
    while True:
        start = rest.find(TOOL_CALL_OPEN, pos)
        if start < 0:
            pieces.append(rest[pos:])
            break
        pieces.append(rest[pos:start])
        end = rest.find(TOOL_CALL_CLOSE, start + len(TOOL_CALL_OPEN))
        if end < 0:
            pieces.append(rest[start:])  # unclosed: keep as text
            break
        block_end = end + len(TOOL_CALL_CLOSE)
        parsed = _parse_tool_block(rest[start + len(TOOL_CALL_OPEN):end], schemas)
        if parsed is None:
            pieces.append(rest[start:block_end])
        else:
            calls.append(_tool_call(*parsed, make_id))
        pos = block_end
    return ParsedOutput(reasoning, "".join(pieces).strip(), calls)


# ---------------------------------------------------------------------------------------------
# Streaming parser


def _partial_tag_len(buf: str, tag: str) -> int:
    """Length of the longest end of `buf` that is a proper beginning of `tag`."""
    for n in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:n]):
            return n
    return 0


class _TrimmedStream:
    """Emits text with its leading whitespace dropped and trailing whitespace held back until
    more non-space text follows; what is held when the stream ends is dropped. The concatenated
    output is therefore exactly `whole_text.strip()`."""

    def __init__(self, kind: str):
        self.kind = kind
        self.started = False
        self.held = ""

    def push(self, text: str, events: list[StreamEvent]) -> None:
        if not self.started:
            text = text.lstrip()
        combined = self.held + text
        body = combined.rstrip()
        self.held = combined[len(body):]
        if body:
            self.started = True
            events.append(StreamEvent(self.kind, text=body))


_START, _REASONING, _CONTENT, _TOOL = "start", "reasoning", "content", "tool"


class StreamingOutputParser:
    """Feed completion text as it is generated; each `feed` returns the events it completes.
    Call `finish()` once at the end (it flushes held text, e.g. an unclosed tool call becomes
    content). `result()` then equals `parse_assistant_output` of the whole text."""

    def __init__(self, *, thinking_started: bool = True, tools: list[dict] | None = None,
                 id_factory: IdFactory | None = None):
        self._thinking_started = thinking_started
        self._schemas = _parameter_schemas(tools)
        self._make_id = id_factory or random_call_id
        self._state = _START
        self._buf = ""
        self._reasoning = _TrimmedStream("reasoning")
        self._content = _TrimmedStream("content")
        self._finished = False
        self._reasoning_parts: list[str] = []
        self._content_parts: list[str] = []
        self._calls: list[dict] = []

    def feed(self, delta: str) -> list[StreamEvent]:
        if self._finished:
            raise RuntimeError("StreamingOutputParser.feed() after finish()")
        self._buf += delta
        return self._run(final=False)

    def finish(self) -> list[StreamEvent]:
        if self._finished:
            return []
        events = self._run(final=True)
        self._finished = True
        return events

    def result(self) -> ParsedOutput:
        return ParsedOutput("".join(self._reasoning_parts) or None, "".join(self._content_parts),
                            list(self._calls))

    def _run(self, final: bool) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        while self._step(events, final):
            pass
        for ev in events:
            if ev.kind == "reasoning":
                self._reasoning_parts.append(ev.text)
            elif ev.kind == "content":
                self._content_parts.append(ev.text)
            else:
                self._calls.append(ev.tool_call)
        return events

    def _step(self, events: list[StreamEvent], final: bool) -> bool:
        """Advance over the buffer once; True when the state changed and another step may help."""
        buf = self._buf
        if self._state == _START:
            head = buf.lstrip()
            if head.startswith(THINK_OPEN):
                self._buf = head[len(THINK_OPEN):]
                self._state = _REASONING
                return True
            if not final and THINK_OPEN.startswith(head):
                return False  # only whitespace or part of "<think>" so far
            self._state = _REASONING if self._thinking_started else _CONTENT
            return True

        if self._state == _REASONING:
            end = buf.find(THINK_CLOSE)
            if end >= 0:
                self._reasoning.push(buf[:end], events)
                self._buf = buf[end + len(THINK_CLOSE):]
                self._state = _CONTENT
                return True
            keep = 0 if final else _partial_tag_len(buf, THINK_CLOSE)
            self._reasoning.push(buf[:len(buf) - keep], events)
            self._buf = buf[len(buf) - keep:]
            return False

        if self._state == _CONTENT:
            start = buf.find(TOOL_CALL_OPEN)
            if start >= 0:
                self._content.push(buf[:start], events)
                self._buf = buf[start:]
                self._state = _TOOL
                return True
            keep = 0 if final else _partial_tag_len(buf, TOOL_CALL_OPEN)
            self._content.push(buf[:len(buf) - keep], events)
            self._buf = buf[len(buf) - keep:]
            return False

        # _TOOL: the buffer starts with "<tool_call>"; wait for its end.
        end = buf.find(TOOL_CALL_CLOSE, len(TOOL_CALL_OPEN))
        if end < 0:
            if final:  # never closed: the text is content
                self._content.push(buf, events)
                self._buf = ""
            return False
        block_end = end + len(TOOL_CALL_CLOSE)
        parsed = _parse_tool_block(buf[len(TOOL_CALL_OPEN):end], self._schemas)
        if parsed is None:
            self._content.push(buf[:block_end], events)
        else:
            events.append(StreamEvent("tool_call", tool_call=_tool_call(*parsed, self._make_id),
                                      index=len(self._calls) + sum(e.kind == "tool_call" for e in events)))
        self._buf = buf[block_end:]
        self._state = _CONTENT
        return True
