"""Request validation and response assembly for the OpenAI-compatible endpoints.

Requests are validated with pydantic in strict mode (a string where a number belongs is an error,
not a conversion); unknown fields are ignored, as OpenAI clients send many. Every problem becomes
an `ApiError`, which the app renders as `{"error": {"message", "type", "code"}}`.

`ChatAssembler` turns the generated text into OpenAI message fields: reasoning into
`reasoning_content`, tool calls into `tool_calls` (tightfit.tokenizer.parse), both as stream deltas
and as the final message.
"""
from __future__ import annotations

import json
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from tightfit.runtime.sampler import SamplingParams


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str | None = None,
                 headers: dict | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or _TYPES.get(status, "server_error")
        self.headers = headers or {}
        self.extra = extra or {}

    def body(self) -> dict:
        err = {"message": self.message, "type": self.type, "code": self.status}
        err.update(self.extra)
        return {"error": err}


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
          500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    model: Optional[str] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    n_predict: Optional[int] = None          # llama-server's name; -1 = until the context is full
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repeat_penalty: Optional[float] = None
    repeat_last_n: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    n: Optional[int] = None
    logprobs: Union[bool, int, None] = None


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]]
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    reasoning_format: Optional[str] = None
    reasoning_effort: Optional[str] = None
    parse_tool_calls: Optional[bool] = None
    response_format: Optional[dict[str, Any]] = None
    top_logprobs: Optional[int] = None


class CompletionRequest(_Sampling):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    echo: Optional[bool] = None
    suffix: Optional[str] = None
    best_of: Optional[int] = None


class TokenizeRequest(_Strict):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Strict):
    tokens: list[int]


class ApplyTemplateRequest(_Strict):
    messages: list[dict[str, Any]]
    tools: Optional[list[dict[str, Any]]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    add_generation_prompt: bool = True


def parse_json(raw: bytes) -> Any:
    if not raw:
        raise ApiError(400, "the request body is empty; expected a JSON object")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply") from None


def validate(model: type[BaseModel], raw: bytes) -> Any:
    obj = parse_json(raw)
    if not isinstance(obj, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(obj).__name__}")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        msg = err.get("msg", "invalid value")
        more = f" (and {e.error_count() - 1} more problems)" if e.error_count() > 1 else ""
        raise ApiError(400, f"invalid request: {where}: {msg}{more}") from None


# ---- request -> engine arguments ----------------------------------------------------------------

def sampling_params(r: _Sampling) -> SamplingParams:
    d = SamplingParams()
    kw = {}
    for name, field in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                        ("min_p", "min_p"), ("repeat_penalty", "repeat_penalty"),
                        ("repeat_last_n", "repeat_last_n"), ("presence_penalty", "presence_penalty"),
                        ("frequency_penalty", "frequency_penalty"), ("seed", "seed")):
        v = getattr(r, name)
        if v is not None:
            kw[field] = v
    if r.seed is not None and r.seed < 0:
        if r.seed != -1:
            raise ApiError(400, f"seed must be >= 0 (or -1 for a random seed), got {r.seed}")
        kw.pop("seed")
    if r.temperature is not None and r.temperature > 2.0:
        raise ApiError(400, f"temperature must be in [0, 2], got {r.temperature}")
    p = SamplingParams(**{**{k: getattr(d, k) for k in d.__dataclass_fields__}, **kw})
    return p.validate()


def max_tokens(r: _Sampling) -> int | None:
    """The requested token limit: max_completion_tokens, max_tokens or n_predict (None = no
    limit but the context). Negative values other than n_predict's -1 are errors."""
    for name in ("max_completion_tokens", "max_tokens"):
        v = getattr(r, name)
        if v is not None:
            if v < 0:
                raise ApiError(400, f"{name} must be >= 0, got {v}")
            return v
    if r.n_predict is not None:
        if r.n_predict < -1:
            raise ApiError(400, f"n_predict must be >= -1, got {r.n_predict}")
        return None if r.n_predict == -1 else r.n_predict
    return None


def stop_list(r: _Sampling) -> list[str]:
    if r.stop is None:
        return []
    stops = [r.stop] if isinstance(r.stop, str) else list(r.stop)
    return [s for s in stops if s]


def check_unsupported(r: _Sampling) -> None:
    if r.n not in (None, 1):
        raise ApiError(400, f"only n=1 is supported, got n={r.n}")
    if r.logprobs not in (None, False, 0):
        raise ApiError(400, "logprobs are not supported by this server")
    if isinstance(r, ChatRequest):
        rf = r.response_format
        if rf is not None and rf.get("type", "text") != "text":
            raise ApiError(400, f"response_format type {rf.get('type')!r} is not supported")
        for i, m in enumerate(r.messages):
            if not isinstance(m.get("role"), str):
                raise ApiError(400, f"messages[{i}] has no 'role' string")
            content = m.get("content")
            if isinstance(content, list):
                for part in content:
                    if not isinstance(part, dict) or part.get("type") != "text":
                        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                        raise ApiError(400, f"messages[{i}]: content part of type {kind!r} is not "
                                       f"supported (text only)")
            elif content is not None and not isinstance(content, str):
                raise ApiError(400, f"messages[{i}].content must be a string or a list of parts")
    if isinstance(r, CompletionRequest):
        if r.suffix:
            raise ApiError(400, "suffix (infill) is not supported")
        if r.echo:
            raise ApiError(400, "echo is not supported")
        if r.best_of not in (None, 1):
            raise ApiError(400, "best_of is not supported")


def completion_prompt(r: CompletionRequest) -> str | list[int]:
    p = r.prompt
    if isinstance(p, str):
        return p
    if not p:
        raise ApiError(400, "the prompt is empty")
    if all(isinstance(x, int) for x in p):
        return list(p)
    if len(p) != 1:
        raise ApiError(400, f"batched prompts are not supported ({len(p)} prompts given)")
    return p[0]


def template_kwargs(r: ChatRequest) -> dict:
    kw = dict(r.chat_template_kwargs or {})
    if r.reasoning_effort is not None and r.reasoning_effort.lower() == "none":
        kw.setdefault("enable_thinking", False)
    return kw


def usage(n_prompt: int, timings) -> dict:
    n_gen = timings.predicted_n if timings else 0
    return {"prompt_tokens": n_prompt, "completion_tokens": n_gen,
            "total_tokens": n_prompt + n_gen,
            "prompt_tokens_details": {"cached_tokens": timings.cache_n if timings else 0}}


# ---- chat output ----------------------------------------------------------------------------------

class ChatAssembler:
    """Generated text in, OpenAI chat fields out (stream deltas and the final message)."""

    def __init__(self, thinking_started: bool, tools: list | None):
        from tightfit.tokenizer.parse import StreamingOutputParser
        self._parser = StreamingOutputParser(thinking_started=thinking_started, tools=tools)
        self.calls: list[dict] = []

    def feed(self, text: str) -> list[dict]:
        return self._deltas(self._parser.feed(text)) if text else []

    def finish(self) -> list[dict]:
        return self._deltas(self._parser.finish())

    def _deltas(self, events) -> list[dict]:
        out = []
        for ev in events:
            if ev.kind == "reasoning":
                out.append({"reasoning_content": ev.text})
            elif ev.kind == "content":
                out.append({"content": ev.text})
            else:
                self.calls.append(ev.tool_call)
                out.append({"tool_calls": [{"index": ev.index, **ev.tool_call}]})
        return out

    def message(self) -> dict:
        """The whole assistant message (call after finish())."""
        r = self._parser.result()
        msg: dict[str, Any] = {"role": "assistant",
                               "content": r.content or (None if r.tool_calls else "")}
        if r.reasoning_content is not None:
            msg["reasoning_content"] = r.reasoning_content
        if r.tool_calls:
            msg["tool_calls"] = r.tool_calls
        return msg

    def finish_reason(self, engine_reason: str | None) -> str:
        if engine_reason == "length" and not self.calls:
            return "length"
        return "tool_calls" if self.calls else "stop"
