"""Tokenizers from a model's own files: tokenizer.json, the Jinja chat template of tokenizer_config.json (Llama 3.1's
and Qwen3's, kept in tests/fixtures/templates/), the EOS set of generation_config.json and config.json; SmolLM2's
built-in behaviour unchanged; one-line errors for broken directories."""
import datetime
import json
import os

import pytest
from tokenizers import Tokenizer, pre_tokenizers

from ssd_jax.models.chat_template import TemplateError, render
from ssd_jax.models.tokenizer import TextTokenizer, TokenizerError, byte_level_tokenizer, chat_template

from tokenizer_writers import byte_tokenizer

TEMPLATES = os.path.join(os.path.dirname(__file__), "fixtures", "templates")
LLAMA3 = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
          "<|eot_id|>", "<|python_tag|>"]
QWEN3 = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN3_PLAIN = ["<think>", "</think>"]  # added tokens that are not special: decoding keeps them
CONVERSATION = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"},
                {"role": "user", "content": "What is 2+2?"}]


def fixture_template(name: str) -> str:
  with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
    return f.read()


def model_dir(path, tok: Tokenizer, tokenizer_config=None, generation_config=None, config=None, jinja=None):
  """Writes a model directory's tokenizer files (only those given) and returns its path."""
  os.makedirs(path, exist_ok=True)
  tok.save(os.path.join(path, "tokenizer.json"))
  for name, d in (("tokenizer_config.json", tokenizer_config), ("generation_config.json", generation_config),
                  ("config.json", config)):
    if d is not None:
      with open(os.path.join(path, name), "w") as f:
        json.dump(d, f)
  if jinja is not None:
    with open(os.path.join(path, "chat_template.jinja"), "w") as f:
      f.write(jinja)
  return str(path)


def llama3_dir(path):
  tok = byte_tokenizer(LLAMA3, bos="<|begin_of_text|>")
  ids = {t: tok.token_to_id(t) for t in LLAMA3}
  eos = [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]
  return model_dir(path, tok, generation_config={"eos_token_id": eos}, config={"eos_token_id": eos[0]},
                   tokenizer_config={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                     "chat_template": fixture_template("llama3.1.jinja")}), ids


def qwen3_dir(path, **overrides):
  tok = byte_tokenizer(QWEN3, QWEN3_PLAIN)
  ids = {t: tok.token_to_id(t) for t in QWEN3 + QWEN3_PLAIN}
  files = dict(generation_config={"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]},
               config={"eos_token_id": ids["<|im_end|>"]},
               tokenizer_config={"bos_token": None, "pad_token": "<|endoftext|>",
                                 "eos_token": {"content": "<|im_end|>", "special": True, "__type": "AddedToken"},
                                 "chat_template": fixture_template("qwen3.jinja")})
  files.update(overrides)
  return model_dir(path, tok, **files), ids


LLAMA3_SYSTEM = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                 "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n")
LLAMA3_TURNS = ("<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n")
QWEN3_TURNS = ("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
               "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_llama31_template_eos_set_and_bos(tmp_path):
  path, ids = llama3_dir(tmp_path / "llama")
  tok = TextTokenizer.from_dir(path)
  assert tok.render_chat(CONVERSATION) == LLAMA3_SYSTEM + "<|eot_id|>" + LLAMA3_TURNS
  system = [{"role": "system", "content": "  Be brief.\n"}]  # the template trims it
  assert tok.render_chat(system + CONVERSATION) == LLAMA3_SYSTEM + "Be brief.<|eot_id|>" + LLAMA3_TURNS
  assert tok.render_chat(CONVERSATION[:1], add_generation_prompt=False).endswith("Hi there<|eot_id|>")
  # Generation stops on <|end_of_text|>, <|eom_id|> and <|eot_id|>; the tokenizer's own is the end of a turn.
  assert tok.eos_ids == tuple(sorted(ids[t] for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")))
  assert tok.eos_id == ids["<|eot_id|>"]
  bos = ids["<|begin_of_text|>"]
  chat = tok.encode_prompt("Hi")
  assert chat[0] == bos and chat.count(bos) == 1  # the template writes BOS; encoding adds none
  assert tok.decode(chat) == "system\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nuser\n\nHi" \
                             "assistant\n\n"
  assert tok.encode_prompt("Hi", chat=False) == [bos] + tok.encode("Hi")  # raw: tokenizer.json's post-processor
  assert tok.encode_prompt("<|begin_of_text|>Hi", chat=False) == [bos] + tok.encode("Hi")  # never two
  with pytest.raises(TemplateError, match="no enable_thinking switch"):
    tok.encode_prompt("Hi", enable_thinking=False)


def test_qwen3_template_thinking_switch_and_eos_set(tmp_path):
  path, ids = qwen3_dir(tmp_path / "qwen")
  tok = TextTokenizer.from_dir(path)
  assert tok.render_chat(CONVERSATION) == QWEN3_TURNS
  assert tok.render_chat(CONVERSATION, enable_thinking=True) == QWEN3_TURNS
  assert tok.render_chat(CONVERSATION, enable_thinking=False) == QWEN3_TURNS + "<think>\n\n</think>\n\n"
  # A past answer's reasoning is dropped from the history (the template splits it off at </think>).
  thought = [dict(CONVERSATION[1], content="<think>\nAdd.\n</think>\n\nHello! How can I help?")]
  assert tok.render_chat(CONVERSATION[:1] + thought + CONVERSATION[2:]) == QWEN3_TURNS
  system = [{"role": "system", "content": "Be brief."}]
  assert tok.render_chat(system + CONVERSATION[:1]) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                                                        "Hi there<|im_end|>\n<|im_start|>assistant\n")
  assert tok.eos_ids == tuple(sorted((ids["<|im_end|>"], ids["<|endoftext|>"]))) and tok.eos_id == ids["<|im_end|>"]
  assert tok.encode_prompt("Hi", chat=False) == tok.encode("Hi")  # no BOS in Qwen3
  ids_off = tok.encode_prompt("Hi", enable_thinking=False)
  assert ids_off[-6:] == [ids["<think>"]] + tok.encode("\n\n") + [ids["</think>"]] + tok.encode("\n\n")
  assert tok.decode(ids_off).endswith("assistant\n<think>\n\n</think>\n\n")  # <think> is not special: kept


@pytest.mark.parametrize("make_dir", [llama3_dir, qwen3_dir])
def test_save_then_from_dir_gives_the_same_tokenizer(tmp_path, make_dir):
  """A checkpoint saved with a model's tokenizer (a draft trained for it) keeps its template and stop ids."""
  tok = TextTokenizer.from_dir(make_dir(tmp_path / "model")[0])
  os.makedirs(tmp_path / "saved")
  tok.save(str(tmp_path / "saved" / "tokenizer.json"))
  back = TextTokenizer.from_dir(str(tmp_path / "saved"))
  assert (back.eos_ids, back.eos_id, back.template, back.special_tokens) == (
      tok.eos_ids, tok.eos_id, tok.template, tok.special_tokens)
  assert back.encode_prompt("Hi") == tok.encode_prompt("Hi")
  assert back.encode_prompt("Hi", chat=False) == tok.encode_prompt("Hi", chat=False)
  smol = TextTokenizer(byte_level_tokenizer())  # the built-in case writes tokenizer.json alone, as before
  smol.save(str(tmp_path / "smol.json"))
  assert sorted(os.listdir(tmp_path)) == ["model", "saved", "smol.json"]


def test_draft_training_text_refuses_a_template_it_does_not_write(tmp_path):
  from ssd_jax.models.tokenizer import text_tokenizer_from_gguf
  from ssd_jax.training.draft_data import tokenize_conversations

  conv = [[("user", "Hi"), ("assistant", "Hello")]]
  smol_gguf = text_tokenizer_from_gguf(gguf_meta(QWEN3, "smollm", eos_token_id=2,
                                                 chat_template=fixture_template("smollm2.jinja")))
  for tok in (TextTokenizer(byte_level_tokenizer()), smol_gguf):
    assert tok.writes_chatml() and len(tokenize_conversations(tok, conv, progress=False)[0]) > 0
  for make_dir in (llama3_dir, qwen3_dir):
    tok = TextTokenizer.from_dir(make_dir(tmp_path / make_dir.__name__)[0])
    assert not tok.writes_chatml()
    with pytest.raises(ValueError, match="ChatML"):
      tokenize_conversations(tok, conv, progress=False)


def test_template_from_named_list_and_jinja_file(tmp_path):
  qwen = fixture_template("qwen3.jinja")
  named = [{"name": "tool_use", "template": "{{ raise_exception('tools') }}"}, {"name": "default", "template": qwen}]
  path, _ = qwen3_dir(tmp_path / "named", tokenizer_config={"eos_token": "<|im_end|>", "chat_template": named})
  assert TextTokenizer.from_dir(path).render_chat(CONVERSATION) == QWEN3_TURNS
  # chat_template.jinja wins over the config's key, as in transformers.
  path, _ = qwen3_dir(tmp_path / "file", jinja=qwen,
                      tokenizer_config={"eos_token": "<|im_end|>", "chat_template": "{{ 'old' }}"})
  assert TextTokenizer.from_dir(path).render_chat(CONVERSATION) == QWEN3_TURNS
  path, _ = qwen3_dir(tmp_path / "nodefault", tokenizer_config={"chat_template": named[:1]})
  with pytest.raises(TemplateError, match="none named 'default'"):
    TextTokenizer.from_dir(path)


def test_each_eos_and_template_source_alone_and_together(tmp_path):
  """A model directory's EOS set comes from three files: generation_config.json's eos_token_id, config.json's and
  tokenizer_config.json's eos_token. Each alone gives its id (and names it the end of a turn); together, all three,
  the tokenizer's own the end of a turn. Its template from chat_template.jinja or tokenizer_config.json's key: each
  alone is read, the file wins over the key."""
  tok = byte_tokenizer(["<gen>", "<cfg>", "<tok>"])
  ids = {t: tok.token_to_id(t) for t in ("<gen>", "<cfg>", "<tok>")}
  sources = {"<gen>": dict(generation_config={"eos_token_id": [ids["<gen>"]]}),
             "<cfg>": dict(config={"eos_token_id": ids["<cfg>"]}),
             "<tok>": dict(tokenizer_config={"eos_token": "<tok>"})}
  for token, files in sources.items():
    got = TextTokenizer.from_dir(model_dir(tmp_path / token[1:-1], tok, **files))
    assert (got.eos_ids, got.eos_id) == ((ids[token],), ids[token]), token
  every = {name: d for files in sources.values() for name, d in files.items()}
  got = TextTokenizer.from_dir(model_dir(tmp_path / "all", tok, **every))
  assert (got.eos_ids, got.eos_id) == (tuple(sorted(ids.values())), ids["<tok>"])
  eos, file, key = ({"eos_token_id": ids["<gen>"]}, "{{ 'file' }}", {"chat_template": "{{ 'key' }}"})
  for i, (want, files) in enumerate((("file", dict(jinja=file)), ("key", dict(tokenizer_config=key)),
                                     ("file", dict(jinja=file, tokenizer_config=key)))):
    path = model_dir(tmp_path / f"template{i}", tok, generation_config=eos, **files)
    assert TextTokenizer.from_dir(path).render_chat(CONVERSATION) == want, files


def test_transformers_environment():
  """What transformers gives a template besides the messages: strftime_now, raise_exception, a tojson that keeps
  <, > and & (Jinja's own escapes them for HTML), loop controls, bos/eos variables, tools None."""
  today = datetime.datetime.now().strftime("%d %b %Y")
  assert render("{{ strftime_now('%d %b %Y') }}", []) in (today, datetime.datetime.now().strftime("%d %b %Y"))
  assert render("{{ {'a': '<b> & c'} | tojson }}", []) == '{"a": "<b> & c"}'
  assert render("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m }}{% endfor %}",
                [1, 2, 3]) == "1"
  assert render("{{ bos_token }}|{{ tools is none }}|{{ add_generation_prompt }}", [], bos_token="<s>") == \
      "<s>|True|True"
  assert render("{% generation %}x{% endgeneration %}", []) == "x"
  with pytest.raises(TemplateError, match="refused the conversation: only user turns"):
    render("{{ raise_exception('only user turns') }}", [])


def test_smollm2_builtin_template_unchanged(tmp_path):
  """A tokenizer without template files (the GGUF-built SmolLM2, our checkpoints) keeps the ChatML template and
  stops on <|im_end|> alone; raw prompts get no BOS."""
  tok = TextTokenizer(byte_level_tokenizer())
  assert tok.chat_prompt("Hi") == chat_template([("user", "Hi")]) == (
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
  assert tok.chat_prompt("Hi", system="S") == chat_template([("user", "Hi")], system="S")
  assert tok.eos_ids == (2,) and tok.eos_id == 2
  assert tok.encode_prompt("Hi") == tok.encode(tok.chat_prompt("Hi"))
  assert tok.encode_prompt("Hi", chat=False) == tok.encode("Hi")
  saved = TextTokenizer.from_dir(model_dir(tmp_path, tok.tok, config={"vocab_size": 259}))  # an ssd-jax config
  assert saved.chat_prompt("Hi") == tok.chat_prompt("Hi") and saved.eos_ids == (2,)
  with pytest.raises(TemplateError, match="no enable_thinking switch"):
    tok.chat_prompt("Hi", enable_thinking=True)


def one_line(excinfo) -> str:
  msg = str(excinfo.value)
  assert "\n" not in msg
  return msg


def test_broken_directories_fail_in_one_line(tmp_path):
  with pytest.raises(TokenizerError, match="has no tokenizer.json") as e:
    TextTokenizer.from_dir(str(tmp_path))
  one_line(e)
  path, _ = qwen3_dir(tmp_path / "syntax", tokenizer_config={"chat_template": "{% for m in messages %}{{ m }"})
  with pytest.raises(TemplateError, match="does not parse") as e:
    TextTokenizer.from_dir(path)
  assert path in one_line(e)
  path, _ = qwen3_dir(tmp_path / "eos", tokenizer_config={"eos_token": "</s>"})
  with pytest.raises(TokenizerError, match="'</s>' of tokenizer_config.json is not in tokenizer.json") as e:
    TextTokenizer.from_dir(path)
  path, _ = qwen3_dir(tmp_path / "gen", generation_config={"eos_token_id": "2"})
  with pytest.raises(TokenizerError, match="eos_token_id must be a token id"):
    TextTokenizer.from_dir(path)
  path, _ = qwen3_dir(tmp_path / "range", generation_config={"eos_token_id": [151645]})
  with pytest.raises(TokenizerError, match="reach past the tokenizer"):
    TextTokenizer.from_dir(path)
  path = model_dir(tmp_path / "bare", byte_tokenizer(["<s>", "</s>"]))
  with pytest.raises(TokenizerError, match="no end-of-sequence token"):
    TextTokenizer.from_dir(path)
  path = model_dir(tmp_path / "base", byte_tokenizer(["<s>", "</s>"]), tokenizer_config={"eos_token": "</s>"})
  with pytest.raises(TemplateError, match="ships no chat template.*--raw") as e:
    TextTokenizer.from_dir(path).encode_prompt("Hi")
  one_line(e)
  assert TextTokenizer.from_dir(path).encode_prompt("Hi", chat=False) == TextTokenizer.from_dir(path).encode("Hi")
  with open(os.path.join(path, "tokenizer.json"), "w") as f:
    f.write("{not json")
  with pytest.raises(TokenizerError, match="cannot read") as e:
    TextTokenizer.from_dir(path)
  one_line(e)
  path, _ = llama3_dir(tmp_path / "tools")
  with pytest.raises(TemplateError, match="failed to render") as e:  # a role None: str + None
    TextTokenizer.from_dir(path).render_chat([{"role": None, "content": "Hi"}])
  one_line(e)


def hf_model_dir(path, make_dir, seed=0):
  """A tiny random Llama in a Hugging Face directory with these tokenizer files (ssd_jax.load reads it)."""
  import jax

  from ssd_jax.bench import hf_export
  from ssd_jax.models.config import tiny_config
  from ssd_jax.models.model import init_params

  path, ids = make_dir(path)
  tok = TextTokenizer.from_dir(path)
  with open(os.path.join(path, "config.json")) as f:
    eos = json.load(f)["eos_token_id"]
  cfg = tiny_config(vocab_size=tok.vocab_size)
  hf_export.export_llama(init_params(jax.random.key(seed), cfg, scale=0.3), cfg, path, eos_id=eos)
  return path, ids


def test_pipeline_takes_the_directorys_template_and_stops_on_its_eos_set(tmp_path):
  import ssd_jax

  path, ids = hf_model_dir(tmp_path / "qwen", qwen3_dir)
  pipe = ssd_jax.load(path, draft=None)
  tok = pipe.tokenizer
  assert tok.eos_ids == tuple(sorted((ids["<|im_end|>"], ids["<|endoftext|>"])))
  assert pipe.encode_prompt("Hi", enable_thinking=False) == tok.encode(
      tok.render_chat([{"role": "user", "content": "Hi"}], enable_thinking=False))
  full = pipe.generate("Hi", mode="ar", max_new_tokens=12, ignore_eos=True, enable_thinking=False)[0].token_ids
  # generation_config.json's ids reach the decoder: make a token the model produces mid-answer one of them.
  stop = full[5]
  with open(os.path.join(path, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [ids["<|im_end|>"], stop]}, f)
  pipe = ssd_jax.load(path, draft=None)
  got = pipe.generate("Hi", mode="ar", max_new_tokens=12, enable_thinking=False)[0]
  assert got.token_ids == full[: full.index(stop) + 1]
  assert got.text == tok.decode(full[: full.index(stop)])  # the stop token is not text (as <|im_end|>)


def run_decode(*args):
  """Runs scripts/decode.py on this checkout's package (whatever ssd_jax is installed)."""
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([root] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
  return subprocess.run([sys.executable, os.path.join(root, "scripts", "decode.py"), *args], capture_output=True,
                        text=True, timeout=600, cwd=root, env=env)


def test_decode_cli_thinking_switch_and_raw(tmp_path):
  qwen, _ = hf_model_dir(tmp_path / "qwen", qwen3_dir)
  out = tmp_path / "out.jsonl"
  r = run_decode("--target", qwen, "--draft", "none", "--mode", "ar", "--thinking", "off", "--prompt", "Hi",
          "--max-new-tokens", "3", "--ignore-eos", "--json-out", str(out))
  assert r.returncode == 0, r.stderr
  assert len(json.loads(out.read_text())["token_ids"]) == 3
  llama, _ = hf_model_dir(tmp_path / "llama", llama3_dir)
  for args, msg in ((["--thinking", "on"], "chat template has no enable_thinking switch"),
                    (["--thinking", "off", "--raw"], "--thinking is a chat template switch")):
    r = run_decode("--target", llama, "--draft", "none", "--mode", "ar", "--prompt", "Hi", *args)
    assert r.returncode == 2 and msg in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1  # before any weights are read


def gguf_meta(specials, pre, user_defined=(), **fields):
  """GGUF tokenizer metadata over the 256 bytes (no merges) with these control tokens first."""
  toks = list(specials) + list(user_defined) + sorted(pre_tokenizers.ByteLevel.alphabet())
  types = [3] * len(specials) + [4] * len(user_defined) + [1] * (len(toks) - len(specials) - len(user_defined))
  meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": toks,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": []}
  meta.update({f"tokenizer.{k}" if k == "chat_template" else f"tokenizer.ggml.{k}": v for k, v in fields.items()})
  return meta


def test_gguf_tokenizers_templates_and_eos_sets():
  from ssd_jax.models.tokenizer import text_tokenizer_from_gguf

  pieces = lambda tok, text: [p for p, _ in tok.tok.pre_tokenizer.pre_tokenize_str(text)]
  # SmolLM2's GGUF: its own template renders exactly the built-in ChatML; EOS <|im_end|>; no BOS (add_bos false).
  smol = text_tokenizer_from_gguf(gguf_meta(QWEN3, "smollm", bos_token_id=1, eos_token_id=2, padding_token_id=2,
                                            add_bos_token=False, chat_template=fixture_template("smollm2.jinja")))
  assert smol.chat_prompt("Hi") == TextTokenizer(byte_level_tokenizer()).chat_prompt("Hi")
  assert smol.eos_ids == (2,) and smol.encode_prompt("Hi", chat=False) == smol.encode("Hi")
  assert pieces(smol, "x 12") == ["x", "Ġ", "1", "2"]
  # Llama 3: digits in threes, BOS before raw text, EOS = eos + eot + eom, the template writes BOS once.
  ids = {t: i for i, t in enumerate(LLAMA3)}
  llama = text_tokenizer_from_gguf(gguf_meta(
      LLAMA3, "llama-bpe", bos_token_id=ids["<|begin_of_text|>"], eos_token_id=ids["<|end_of_text|>"],
      eot_token_id=ids["<|eot_id|>"], eom_token_id=ids["<|eom_id|>"], add_bos_token=True,
      chat_template=fixture_template("llama3.1.jinja")))
  assert pieces(llama, "x 12345") == ["x", "Ġ", "123", "45"]
  assert llama.eos_ids == tuple(sorted(ids[t] for t in ("<|end_of_text|>", "<|eot_id|>", "<|eom_id|>")))
  assert llama.encode_prompt("Hi", chat=False)[0] == ids["<|begin_of_text|>"]
  assert llama.encode_prompt("Hi").count(ids["<|begin_of_text|>"]) == 1
  assert llama.render_chat(CONVERSATION) == LLAMA3_SYSTEM + "<|eot_id|>" + LLAMA3_TURNS
  # Qwen3: digits one by one, <think> a user-defined token (one id, kept when decoding).
  qwen = text_tokenizer_from_gguf(gguf_meta(QWEN3, "qwen2", QWEN3_PLAIN, eos_token_id=2, eot_token_id=2,
                                            chat_template=fixture_template("qwen3.jinja")))
  assert pieces(qwen, "x 12") == ["x", "Ġ", "1", "2"] and qwen.eos_ids == (2,)
  assert qwen.encode("<think>") == [3] and qwen.decode([3]) == "<think>"
  assert qwen.render_chat(CONVERSATION, enable_thinking=False) == QWEN3_TURNS + "<think>\n\n</think>\n\n"
  for meta, msg in ((gguf_meta(QWEN3, "deepseek-llm"), "pre-tokenizer 'deepseek-llm' is not supported"),
                    (dict(gguf_meta(QWEN3, "smollm"), **{"tokenizer.ggml.model": "llama"}), "model 'llama'"),
                    (gguf_meta(QWEN3, "smollm", eos_token_id=10**6), "reach past"),
                    (gguf_meta(QWEN3, "smollm", chat_template="{% if %}"), "GGUF tokenizer.chat_template: ")):
    with pytest.raises(ValueError, match=msg) as e:
      text_tokenizer_from_gguf(meta)
    one_line(e)


def test_each_gguf_end_of_sequence_key_alone_and_together():
  """A GGUF's EOS set: its eos, eot and eom ids (llama.cpp stops on all three). Each alone gives its id; together, all
  three, the eos the end of a turn."""
  from ssd_jax.models.tokenizer import text_tokenizer_from_gguf

  ids = {t: i for i, t in enumerate(LLAMA3)}
  keys = {"eos_token_id": ids["<|end_of_text|>"], "eot_token_id": ids["<|eot_id|>"], "eom_token_id": ids["<|eom_id|>"]}
  for key, i in keys.items():
    tok = text_tokenizer_from_gguf(gguf_meta(LLAMA3, "llama-bpe", **{key: i}))
    assert tok.eos_ids == (i,) and tok.eos_id == i, key
  tok = text_tokenizer_from_gguf(gguf_meta(LLAMA3, "llama-bpe", **keys))
  assert tok.eos_ids == tuple(sorted(keys.values())) and tok.eos_id == keys["eos_token_id"]
