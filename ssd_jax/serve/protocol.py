"""OpenAI's request and response shapes for /v1/completions and /v1/chat/completions.

`parse` reads a request's JSON body into a checked `Parsed` request (no model needed; the engine then encodes it and
checks it against the context), `APIError` is a refusal as OpenAI writes one, and `response` / `chunk` write the
answer objects. The fields served, and those accepted only at their default, are docs/serving.md's.
"""
from __future__ import annotations

import dataclasses
import math

from ..settings import MODES

MAX_STOPS = 4  # OpenAI's limit on stop strings
COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n", "user",
          "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "mode", "k", "fan_out"}
FIELDS = {"completion": COMMON | {"prompt", "echo", "suffix", "best_of"},
          "chat": COMMON | {"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
                            "tool_choice", "parallel_tool_calls", "metadata", "store", "service_tier"}}
# OpenAI fields served only at their default value: what the default is (a field at null is always its default).
AT_DEFAULT = {"best_of": lambda v: v == 1, "echo": lambda v: v is False, "suffix": lambda v: v == "",
              "presence_penalty": lambda v: v == 0, "frequency_penalty": lambda v: v == 0,
              "logit_bias": lambda v: v == {}, "logprobs": lambda v: v is False or v == 0,
              "top_logprobs": lambda v: v == 0, "response_format": lambda v: v == {"type": "text"},
              "tools": lambda v: v == [], "tool_choice": lambda v: v in ("none", "auto")}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class APIError(Exception):
  """A request the server refuses: HTTP `status` with OpenAI's error object; `headers` go with the response
  (Retry-After on a full queue)."""

  def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None, headers: dict | None = None):
    super().__init__(message)
    self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
    self.headers = dict(headers or {})

  def body(self) -> dict:
    """Returns OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
  """Returns a 400 refusal of a bad request."""
  return APIError(400, message, "invalid_request_error", param, code)


@dataclasses.dataclass
class Parsed:
  """A request read from its body and checked; what needs the model (encoding, the context) the engine checks."""
  kind: str                       # "completion" or "chat"
  model: str
  prompt: str | list[int] | None  # completions: the text (fed raw, without the chat template), or token ids
  messages: list[dict] | None     # chat: [{"role", "content"}], text only, roles as the template knows them
  max_tokens: int | None          # None: the server's default, within the context
  temperature: float
  top_p: float
  seed: int | None
  stop: tuple[str, ...]
  stream: bool
  include_usage: bool             # stream_options.include_usage: a last chunk with the usage
  mode: str | None                # ssd-jax's own fields; None: the server's default mode
  k: int | str
  fan_out: int | str | list


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _integer(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
  """Returns body[name] checked as an integer in [lo, hi], or None when absent or null."""
  v = body.get(name)
  if v is None:
    return None
  if not _is_int(v):
    raise invalid(f"{name} must be an integer, got {v!r}", name)
  if v < lo or (hi is not None and v > hi):
    raise invalid(f"{name} must be in [{lo}, {hi}], got {v}" if hi is not None else f"{name} must be >= {lo}, got {v}",
                  name)
  return v


def _number(body: dict, name: str, default: float, ok, what: str) -> float:
  """Returns body[name] checked as a finite number for which ok(value) holds (`what` says which), or default."""
  v = body.get(name)
  if v is None:
    return default
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
    raise invalid(f"{name} must be a number, got {v!r}", name)
  if not ok(v):
    raise invalid(f"{name} must be {what}, got {v}", name)
  return float(v)


def _boolean(body: dict, name: str, where: str | None = None) -> bool:
  v = body.get(name)
  if v is None:
    return False
  if not isinstance(v, bool):
    raise invalid(f"{where or name} must be true or false, got {v!r}", where or name)
  return v


def _stop(v) -> tuple[str, ...]:
  """Returns the stop strings of `stop` (a string, a list of them, or null)."""
  stops = [] if v is None else [v] if isinstance(v, str) else v
  if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
    raise invalid("stop must be a non-empty string or a list of them", "stop")
  if len(stops) > MAX_STOPS:
    raise invalid(f"stop takes at most {MAX_STOPS} strings, got {len(stops)}", "stop")
  return tuple(stops)


def _prompt(v) -> str | list[int]:
  """Returns a completion's prompt: a string or a list of token ids (either alone in a list)."""
  if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
    v = v[0]
  if isinstance(v, str) and v:
    return v
  if isinstance(v, list) and v and all(_is_int(t) for t in v):
    return list(v)
  if isinstance(v, list) and len(v) > 1 and all(isinstance(p, (str, list)) for p in v):
    raise invalid("one prompt per request (send several requests: the server batches them itself)", "prompt")
  raise invalid("prompt must be a non-empty string or a non-empty list of token ids", "prompt")


def _content(v, where: str) -> str:
  """Returns a message's text: a string, or a list of {"type": "text", "text": ...} parts joined."""
  if isinstance(v, str):
    return v
  if isinstance(v, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                 for p in v):
    return "".join(p["text"] for p in v)
  raise invalid(f"{where}.content must be a string or a list of text parts (only text is served)", where + ".content")


def _messages(v) -> list[dict]:
  """Returns chat messages as the chat template takes them: [{"role", "content"}], developer read as system."""
  if not isinstance(v, list) or not v:
    raise invalid("messages must be a non-empty list of {role, content} objects", "messages")
  out = []
  for i, m in enumerate(v):
    where = f"messages[{i}]"
    if not isinstance(m, dict):
      raise invalid(f"{where} must be an object with role and content", where)
    if m.get("role") not in ROLES:
      raise invalid(f"{where}.role must be one of {', '.join(ROLES)} (tools are not served), got "
                    f"{m.get('role')!r}", where + ".role")
    unread = sorted(set(m) - {"role", "content", "name"})
    if unread:
      raise invalid(f"{where} has fields this server does not serve: {', '.join(unread)}", where)
    out.append({"role": ROLES[m["role"]], "content": _content(m.get("content"), where)})
  return out


def _check_fields(kind: str, body: dict) -> None:
  """Refuses fields OpenAI does not have for this endpoint, and those served only at their default set otherwise."""
  for name in body:
    if name not in FIELDS[kind]:
      raise invalid(f"unknown field {name!r} (docs/serving.md lists the fields served)", name, "unknown_field")
  n = _integer(body, "n", 1)
  if n is not None and n != 1:
    raise invalid(f"n={n}: only n=1 is supported (one choice per request)", "n", "unsupported_value")
  for name, is_default in AT_DEFAULT.items():
    if body.get(name) is not None and not is_default(body[name]):
      raise invalid(f"{name}={body[name]!r} is not supported by this server (only its default)", name,
                    "unsupported_value")


def _ours(body: dict) -> tuple[str | None, int | str, int | str | list]:
  """Returns ssd-jax's own fields (mode, k, fan_out) with their types checked; their values the engine checks."""
  mode, k, fan_out = body.get("mode"), body.get("k", "auto"), body.get("fan_out", 3)
  if mode is not None and mode not in MODES:
    raise invalid(f"mode must be one of {', '.join(MODES)} (or absent: the server's default), got {mode!r}", "mode")
  if not (_is_int(k) or k == "auto"):
    raise invalid(f"k must be an integer >= 1 or 'auto', got {k!r}", "k")
  if not (_is_int(fan_out) or isinstance(fan_out, str) or
          isinstance(fan_out, list) and fan_out and all(_is_int(f) for f in fan_out)):
    raise invalid(f"fan_out must be an integer, 'F0,...,FK' or a list of K+1 integers, got {fan_out!r}", "fan_out")
  return mode, k, fan_out


def parse(kind: str, body) -> Parsed:
  """Returns the checked request of a JSON body for `kind` ("completion" or "chat"); raises APIError (400)."""
  if not isinstance(body, dict):
    raise invalid("the request body must be a JSON object")
  _check_fields(kind, body)
  model = body.get("model")
  if not isinstance(model, str) or not model:
    raise invalid("model is required: a string (GET /v1/models lists the one served)", "model")
  if kind == "chat":
    prompt, messages = None, _messages(body.get("messages"))
    newer, max_tokens = _integer(body, "max_completion_tokens", 1), _integer(body, "max_tokens", 1)
    max_tokens = max_tokens if newer is None else newer  # OpenAI's newer name wins
  else:
    prompt, messages = _prompt(body.get("prompt")), None
    max_tokens = _integer(body, "max_tokens", 1)
  stream = _boolean(body, "stream")
  options = body.get("stream_options")
  if options is not None and (not stream or not isinstance(options, dict) or set(options) - {"include_usage"}):
    raise invalid("stream_options must be {\"include_usage\": true|false}, with stream: true", "stream_options")
  seed = _integer(body, "seed", -2**63, 2**63 - 1)
  return Parsed(kind, model, prompt, messages, max_tokens,
                _number(body, "temperature", 1.0, lambda t: t >= 0, ">= 0 (0: greedy)"),
                _number(body, "top_p", 1.0, lambda p: 0 < p <= 1, "in (0, 1]"), seed, _stop(body.get("stop")),
                stream, _boolean(options or {}, "include_usage", "stream_options.include_usage"), *_ours(body))


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
  """Returns OpenAI's usage object."""
  return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
          "total_tokens": prompt_tokens + completion_tokens}


def _head(kind: str, rid: str, created: int, model: str, streamed: bool) -> dict:
  objects = {("chat", False): "chat.completion", ("chat", True): "chat.completion.chunk"}
  return {"id": rid, "object": objects.get((kind, streamed), "text_completion"), "created": created, "model": model}


def response(kind: str, rid: str, created: int, model: str, text: str, finish: str, used: dict, info: dict) -> dict:
  """Returns a whole answer: a text_completion or chat.completion object, with ssd-jax's `info` as "ssd_jax"."""
  choice = {"index": 0, "logprobs": None, "finish_reason": finish}
  choice.update({"message": {"role": "assistant", "content": text}} if kind == "chat" else {"text": text})
  return {**_head(kind, rid, created, model, False), "choices": [choice], "usage": used, "ssd_jax": info}


def chunk(kind: str, rid: str, created: int, model: str, text: str = "", finish: str | None = None,
          info: dict | None = None, role: bool = False, used: dict | None = None) -> dict:
  """Returns one streamed chunk: a piece of text (a chat's first chunk: role=True, its role), the last one with
  `finish` and ssd-jax's `info`, or (`used` given) the usage chunk that stream_options.include_usage asks for."""
  out = _head(kind, rid, created, model, True)
  if used is not None:
    return {**out, "choices": [], "usage": used}
  c = {"index": 0, "logprobs": None, "finish_reason": finish}
  if kind == "chat":
    c["delta"] = {"role": "assistant", "content": ""} if role else {"content": text} if text else {}
  else:
    c["text"] = text
  out["choices"] = [c]
  if info is not None:
    out["ssd_jax"] = info
  return out
