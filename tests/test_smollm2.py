"""The real SmolLM2-135M-Instruct target: answers, tokenizer, chat template."""
import pytest

from ssd_jax.models.tokenizer import chat_template

pytestmark = pytest.mark.slow


def test_capital_of_france_greedy(smollm2):
  g = smollm2.generate("What is the capital of France?", mode="ar", max_new_tokens=24)[0]
  assert "Paris" in g.text
  assert g.token_ids[-1] == smollm2.tokenizer.eos_id  # stopped at <|im_end|>
  assert g.stats["new_tokens"] == len(g.token_ids) < 24


@pytest.mark.parametrize("text", [
    "Hello, world! The quick brown fox.",
    "def f(x):\n    return x ** 2  # square\n",
    "Order 66 costs $1,234.50 in 2024-03-07.",
    "Ünïcödé: 日本語のテキスト, Ελληνικά, русский, emoji 🚀",
])
def test_tokenizer_round_trip(smollm2, text):
  tok = smollm2.tokenizer
  ids = tok.encode(text)
  assert tok.decode(ids) == text


def test_digits_are_split_one_by_one(smollm2):
  tok = smollm2.tokenizer
  ids = tok.encode("12345")
  assert len(ids) == 5 and [tok.decode([i]) for i in ids] == list("12345")


def test_chat_template_ids(smollm2):
  tok = smollm2.tokenizer
  text = chat_template([("user", "Hi")])
  assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                  "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
  ids = tok.encode(text)
  assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2  # <|im_start|> = 1, <|im_end|> = 2
  assert ids[-4:] == [1, 520, 9531, 198]  # <|im_start|> ass istant \n
  assert tok.decode(ids[-4:], skip_special=False) == "<|im_start|>assistant\n"
  assert tok.eos_id == 2


def test_batch_ragged_prompts_match_single(smollm2):
  prompts = ["What is 2+2?", "Name three colors of the rainbow, please, in a short list."]
  batch = smollm2.generate(prompts, max_new_tokens=12, batch_size=2)
  for p, g in zip(prompts, batch):
    single = smollm2.generate(p, max_new_tokens=12)[0]
    assert g.token_ids == single.token_ids


@pytest.fixture(scope="module")
def real_pair(smollm2):
  """The real target with the shipped draft."""
  from ssd_jax.models import checkpoints
  cfg, params, _ = checkpoints.load_model("default-draft")
  return smollm2, cfg, params


def test_greedy_sd_equals_ar_on_real_target(real_pair):
  from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions
  pipe, dcfg, dparams = real_pair
  prompts = [pipe.encode_prompt("What is the capital of France?"),
             pipe.encode_prompt("Write a Python function that reverses a string.")]
  opts = DecodeOptions(max_new_tokens=20, eos_id=pipe.tokenizer.eos_id)
  tcfg, tparams = pipe.target.cfg, pipe.target.params
  want = [r.token_ids for r in ARDecoder(tcfg, tparams).generate(prompts, opts)]
  for k in (1, 4, 8):
    got = SDDecoder(tcfg, tparams, dcfg, dparams, SpecOptions(k=k)).generate(prompts, opts)
    assert [r.token_ids for r in got] == want, k


def test_greedy_ssd_equals_ar_on_real_target(real_pair):
  from ssd_jax.decode import ARDecoder, DecodeOptions, SpecOptions, SSDDecoder
  pipe, dcfg, dparams = real_pair
  prompts = [pipe.encode_prompt("What is the capital of France?"),
             pipe.encode_prompt("List three prime numbers.")]
  opts = DecodeOptions(max_new_tokens=20, eos_id=pipe.tokenizer.eos_id)
  tcfg, tparams = pipe.target.cfg, pipe.target.params
  want = [r.token_ids for r in ARDecoder(tcfg, tparams).generate(prompts, opts)]
  got = SSDDecoder(tcfg, tparams, dcfg, dparams, SpecOptions(k=4, fan_out=3)).generate(prompts, opts)
  assert [r.token_ids for r in got] == want
  assert all(r.stats.extra["cache_hit_rate"] >= 0 for r in got)
