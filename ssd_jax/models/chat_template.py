"""A model's own chat template, read from its files and rendered as Hugging Face transformers renders it.

The template is Jinja source from `chat_template.jinja` or `tokenizer_config.json`'s `chat_template` (a string, or a
list of {"name", "template"} of which "default" is the chat one). Rendering follows transformers'
`apply_chat_template`: a sandboxed environment with trim_blocks and lstrip_blocks, loop controls, a `tojson` that
does not escape HTML, the `raise_exception` and `strftime_now` globals, `tools` and `documents` set to None, the
special tokens (bos_token, eos_token, ...) as variables, and extra keyword arguments (Qwen3's `enable_thinking`)
passed through. The same source therefore gives the same text, BOS included where the template writes it.
"""
from __future__ import annotations

import datetime
import functools
import json
import os

JINJA_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"


class TemplateError(ValueError):
  """A chat template is missing, does not parse, or refused to render a conversation."""


def read_template(directory: str, tokenizer_config: dict) -> str | None:
  """Returns the Jinja source of a model directory's chat template, or None when it ships none.

  A separate chat_template.jinja wins over the config's key, as in transformers (it is the newer way to save one).
  """
  path = os.path.join(directory, JINJA_FILE)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return f.read()
  source = tokenizer_config.get("chat_template")
  if source is None or isinstance(source, str):
    return source
  if isinstance(source, list):
    named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
    if isinstance(named.get("default"), str):
      return named["default"]
    raise TemplateError(f"{os.path.join(directory, TOKENIZER_CONFIG)}: chat templates {sorted(map(str, named))} "
                        "have none named 'default'")
  raise TemplateError(f"{os.path.join(directory, TOKENIZER_CONFIG)}: chat_template must be a string or a list of "
                      f"named templates, got {type(source).__name__}")


def _raise_exception(message):
  raise TemplateError(f"the chat template refused the conversation: {message}")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  # Jinja's own tojson escapes <, >, & and ' for HTML; a prompt must carry them as they are.
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
  return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=None)
def _environment():
  from jinja2.ext import Extension, loopcontrols
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  class GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` marks the assistant's tokens for training masks in transformers;
    for a prompt it renders its body."""
    tags = {"generation"}

    def parse(self, parser):
      next(parser.stream)
      return parser.parse_statements(("name:endgeneration",), drop_needle=True)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols])
  env.filters["tojson"] = _tojson
  env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
  return env


@functools.lru_cache(maxsize=16)
def compile_template(source: str):
  """Returns the compiled template; raises TemplateError (one line: what, on which line) when it does not parse."""
  import jinja2

  try:
    return _environment().from_string(source)
  except jinja2.TemplateSyntaxError as e:
    raise TemplateError(f"the chat template does not parse: {e.message} (template line {e.lineno})") from None


def render(source: str, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
  """Returns the text of `messages` ([{"role", "content"}, ...]) under the template, with an open assistant turn
  when add_generation_prompt. variables: the special tokens and template switches such as enable_thinking."""
  import jinja2

  template = compile_template(source)
  try:
    return template.render(messages=messages, tools=None, documents=None,
                           add_generation_prompt=add_generation_prompt, **variables)
  except TemplateError:
    raise
  except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
    # A template that fails on a conversation (a None content, a role it does not know) says so in one line.
    raise TemplateError(f"the chat template failed to render: {type(e).__name__}: {e}") from None
