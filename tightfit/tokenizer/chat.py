"""Render a GGUF's `tokenizer.chat_template` (Jinja) into the prompt text.

The template is untrusted text that came with a model file, so it runs in Jinja's
`ImmutableSandboxedEnvironment`. The environment is set up the way Hugging Face transformers sets up
`apply_chat_template`, because model authors write and test their templates against that renderer:

* `trim_blocks` and `lstrip_blocks` on, the `loopcontrols` extension (`{% break %}`), and a no-op
  `{% generation %}` block (transformers uses it to mark assistant tokens; templates contain it);
* `tojson` is plain `json.dumps` (non-ASCII kept, no HTML escaping, `indent`, `separators`,
  `sort_keys` accepted), not Jinja's HTML-safe version;
* globals `raise_exception(msg)`, `strftime_now(fmt)`, a `dict` constructor and a `namespace` that
  refuses underscore names;
* message keys whose value is None are dropped (OpenAI clients send `content: null` beside
  `tool_calls`, and templates test for a missing key, not for None), and `thinking`/`reasoning` are
  accepted as names for `reasoning_content`.

One thing goes beyond transformers, as llama-server does: OpenAI clients send a tool call's
`arguments` as a JSON *string*, while templates iterate it as a mapping (`arguments|items`), so a
string that holds a JSON object is decoded before rendering.

Every failure (syntax error, `raise_exception`, undefined variable, type error inside the template,
bad input shape) becomes a `TemplateError` carrying the template's own message on one line.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tightfit.errors import UserError

__all__ = ["TemplateError", "ChatTemplate", "render_chat"]


class TemplateError(UserError):
    """The chat template could not be compiled or rendered for these messages."""


# Names a message's reasoning may arrive under; the first is the one templates read.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class _RaisedByTemplate(jinja2.exceptions.TemplateError):
    """What `raise_exception()` throws, so that its message is reported unchanged."""


def _raise_exception(message: Any) -> None:
    raise _RaisedByTemplate(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own filter escapes <, >, & and ' for HTML; chat prompts must carry the JSON verbatim.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _DictConstructor:
    """`dict(...)` for templates without handing them the `dict` type itself (whose attributes,
    such as `mro`, are a path out of the sandbox)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Any, value: Any = None) -> dict:
        return dict.fromkeys(keys, value)


class _Namespace(jinja2.utils.Namespace):
    """`namespace()` whose attribute names may not start with an underscore, so a template cannot
    reach interpreter internals through `ns.__class__` style names it has stored itself."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - mirrors Namespace's signature
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"namespace attribute {name!r} starts with an underscore")


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}` renders its body unchanged. Templates written for
    transformers' assistant-mask feature use it; without the tag they would not even compile."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictConstructor()
    env.globals["namespace"] = _Namespace
    return env


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _compile(source: str) -> jinja2.Template:
    if not isinstance(source, str):
        raise TemplateError(f"chat template must be a string, got {type(source).__name__}")
    try:
        return _environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise TemplateError(
            f"chat template syntax error at line {exc.lineno}: {_one_line(exc.message or '')}") from None
    except jinja2.exceptions.TemplateError as exc:
        raise TemplateError(f"chat template error: {_one_line(exc)}") from None


@lru_cache(maxsize=16)
def _compile_cached(source: str) -> jinja2.Template:
    # A server renders the same template for every request; compiling takes milliseconds.
    return _compile(source)


def _plain(value: Any, where: str) -> Any:
    """A fresh copy of JSON-like input, so the template never sees (or mutates) caller objects."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    raise TemplateError(f"{where} holds a {type(value).__name__}, which is not JSON-like data")


def _decode_arguments(call: dict, where: str) -> None:
    """Turn a tool call's `arguments` JSON string into the mapping templates iterate over."""
    holder = call.get("function") if isinstance(call.get("function"), dict) else call
    args = holder.get("arguments")
    if not isinstance(args, str):
        return
    name = holder.get("name", "?")
    try:
        decoded = json.loads(args) if args.strip() else {}
    except ValueError:
        raise TemplateError(f"{where}: arguments of tool call {name!r} are not valid JSON") from None
    if not isinstance(decoded, dict):
        raise TemplateError(f"{where}: arguments of tool call {name!r} must be a JSON object")
    holder["arguments"] = decoded


def _prepare_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, (list, tuple)):
        raise TemplateError("messages must be a list of message objects")
    prepared = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise TemplateError(f"{where} must be an object with a 'role', got {type(message).__name__}")
        message = {k: v for k, v in _plain(message, where).items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_KEYS if k in message), None)
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, dict):
                    _decode_arguments(call, where)
        prepared.append(message)
    return prepared


def _prepare_tools(tools: Any) -> list | None:
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, dict) for t in tools):
        raise TemplateError("tools must be a list of tool objects")
    return _plain(list(tools), "tools")


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may refer to.

    `render()` returns the prompt text; with `add_generation_prompt` (the default) it ends with the
    opening of the assistant turn the model is to write."""

    def __init__(self, source: str, bos_token: str | None = None, eos_token: str | None = None):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = _compile_cached(source)

    def render(self, messages: list[dict], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = True, **template_kwargs: Any) -> str:
        context: dict[str, Any] = {}
        # Only tokens the model has are defined; a Qwen3.5 file has no BOS, and a template that
        # needs one should fail on an undefined name rather than print "None".
        if self.bos_token is not None:
            context["bos_token"] = self.bos_token
        if self.eos_token is not None:
            context["eos_token"] = self.eos_token
        context.update(_plain(template_kwargs, "chat_template_kwargs"))
        context["messages"] = _prepare_messages(messages)
        context["tools"] = _prepare_tools(tools)
        context["add_generation_prompt"] = bool(add_generation_prompt)
        try:
            return self._template.render(**context)
        except _RaisedByTemplate as exc:
            raise TemplateError(f"chat template error: {_one_line(exc.message or '')}") from None
        except jinja2.exceptions.TemplateError as exc:
            raise TemplateError(f"chat template error: {_one_line(exc)}") from None
        except (TypeError, ValueError, AttributeError, KeyError, IndexError, ArithmeticError,
                RecursionError) as exc:
            # Python errors raised while evaluating template expressions (e.g. `'str' + none`).
            raise TemplateError(
                f"chat template failed: {type(exc).__name__}: {_one_line(exc)}") from None


def render_chat(template: str, messages: list[dict], *, tools: list[dict] | None = None,
                add_generation_prompt: bool = True, **template_kwargs: Any) -> str:
    """Render `template` for `messages`; `template_kwargs` are the request's
    `chat_template_kwargs` (e.g. `enable_thinking=False`) and may set `bos_token`/`eos_token`."""
    return ChatTemplate(template).render(messages, tools=tools,
                                         add_generation_prompt=add_generation_prompt,
                                         **template_kwargs)
