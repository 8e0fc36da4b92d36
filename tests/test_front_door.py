"""One front door (issue 46 item 2): api.load() and scripts/decode.py (ssd_jax/cli/decode.py) make the same checks
before any weight is read, through the same code (ssd_jax/preflight.py, settings.py, memory_check.py), so a bad input
gets the same line from both; and a first run of decode.py with the default target in its GGUF blocks converts
nothing."""
import os
import subprocess
import sys

import pytest

from ssd_jax import api, memory_check
from ssd_jax.models import checkpoints
from ssd_jax.models.families import CheckpointError
from ssd_jax.models.named_configs import named_config, write_random_hf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EAGLE = os.path.join(ROOT, "checkpoints", "eagle-smollm2")


@pytest.fixture(scope="module")
def decode():
  from ssd_jax.cli import decode
  return decode


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
  """A 2-layer model of another vocabulary (512 tokens) in a Hugging Face directory."""
  d = tmp_path_factory.mktemp("tiny_hf")
  write_random_hf(str(d), named_config("llama-3.2-1b", n_layers=2, d_model=64, ffn_dim=128, n_heads=4, n_kv_heads=2,
                                       head_dim=16, vocab_size=512))
  return str(d)


def _refusals(decode, argv, load_kwargs):
  """Returns (decode.py's error line, load()'s) for the same bad input; neither may read a weight."""
  errors = (ValueError, CheckpointError)
  with pytest.raises(errors) as cli:
    decode.main(argv)
  with pytest.raises(errors) as lib:
    api.load(**load_kwargs)
  return str(cli.value), str(lib.value)


CASES = [
    (["--attention", "flash"], dict(attn_impl="flash"), "unknown attention implementation 'flash'"),
    (["--dtype", "float8"], dict(dtype="float8"), "unknown dtype 'float8'"),
    (["--kv-dtype", "int4"], dict(kv_dtype="int4"), "unknown KV cache dtype 'int4'"),
    (["--quantize", "int4"], dict(weights="int4"), "unknown weights 'int4'"),
    (["--draft-weights", "int4"], dict(draft_weights="int4"), "unknown draft weights 'int4'"),
    (["--ssd-placement", "cloud"], dict(ssd_placement="cloud"), "unknown SSD placement 'cloud'"),
    (["--target-devices", "0"], dict(target_devices=0), "need at least one target device"),
    (["--draft-devices", "2"], dict(draft_devices=2), "draft data parallelism is not implemented"),
    (["--quantize", "gguf", "--target-devices", "2"], dict(weights="gguf", target_devices=2), "target_devices=1"),
    (["--draft", "none", "--draft-head-vocab", "5"], dict(draft=None, draft_head_vocab=5), "no draft is loaded"),
    (["--draft", "/nonexistent/draft"], dict(draft="/nonexistent/draft"), "/nonexistent/draft"),
    (["--draft", EAGLE, "--draft-head-vocab", "100"], dict(draft=EAGLE, draft_head_vocab=100),
     "an EAGLE draft comes with its own"),
]


@pytest.mark.parametrize("argv,load_kwargs,says", CASES, ids=[c[2].split("'")[0][:30] for c in CASES])
def test_load_and_decode_refuse_alike(decode, monkeypatch, argv, load_kwargs, says):
  def no_read(*args, **kwargs):
    raise AssertionError("a weight was read")
  monkeypatch.setattr(checkpoints, "load_model", no_read)
  cli, lib = _refusals(decode, argv, load_kwargs)
  assert cli == lib and says in lib


def test_a_draft_of_another_vocabulary_is_refused_alike_and_decode_prints_the_line(decode, tiny_hf):
  cli, lib = _refusals(decode, ["--draft", tiny_hf], dict(draft=tiny_hf))
  assert cli == lib and "has a vocabulary of 512 tokens" in lib
  r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "decode.py"), "--draft", tiny_hf],
                     capture_output=True, text=True, timeout=300, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
  assert r.returncode == 2 and r.stderr == f"decode.py: error: {lib}\n"


def test_blocks_of_what_is_not_a_gguf_and_a_mode_without_a_draft_are_refused_alike(decode, tiny_hf):
  cli, lib = _refusals(decode, ["--target", tiny_hf, "--quantize", "gguf", "--draft", "none"],
                       dict(target=tiny_hf, weights="gguf", draft=None))
  assert cli == lib and "GGUF block weights need a GGUF file" in lib
  with pytest.raises(ValueError) as cli:
    decode.main(["--mode", "sd", "--draft", "none"])
  pipe = api.load_tiny()
  pipe.draft = None
  with pytest.raises(ValueError) as lib:
    pipe.generate("Hi", mode="sd", k=2)
  assert str(cli.value) == str(lib.value) and "mode 'sd' needs a draft" in str(lib.value)


def test_a_model_that_cannot_fit_is_refused_alike(decode, tiny_hf, monkeypatch):
  """The memory check is the library's: load() refuses params that cannot fit with decode.py's line."""
  monkeypatch.setattr(memory_check, "available_memory", lambda device=None: 2**16)
  cli, lib = _refusals(decode, ["--target", tiny_hf, "--draft", "none"], dict(target=tiny_hf, draft=None))
  assert cli == lib and "on the host (target params" in lib and "more than the 0.1 MiB available" in lib
  monkeypatch.setattr(memory_check, "available_memory", lambda device=None: None)  # unknown: no check
  with pytest.raises(CheckpointError, match="has no tokenizer"):  # past the check: read (a tokenizer it lacks)
    api.load(tiny_hf, draft=None)


def test_the_default_blocks_target_is_sized_and_run_without_its_float32_conversion(decode, monkeypatch):
  """decode.py with the default target in its GGUF blocks (the CPU default): the memory check sizes the target from
  the GGUF's tensor headers (its blocks' bytes) and the run loads it from the file; nothing asks for the converted
  float32 checkpoint."""
  try:
    gguf = checkpoints.locate_smollm2_gguf(fetch=False)
  except CheckpointError:
    pytest.skip("the SmolLM2 GGUF is not here")
  from gguf import GGUFReader

  from ssd_jax.models import blocks
  blocks_bytes = sum(int(t.n_bytes) for t in GGUFReader(gguf).tensors if t.tensor_type.name in blocks.KINDS)

  def no_conversion(*args, **kwargs):
    raise AssertionError("the float32 conversion was asked for")
  monkeypatch.setattr(checkpoints, "ensure_target", no_conversion)
  seen = {}
  monkeypatch.setattr(memory_check, "available_memory", lambda device=None: 2**20)
  with pytest.raises(ValueError, match=r"\(target params (\d+\.\d) MiB") as e:
    decode.main(["--quantize", "gguf", "--mode", "ar", "--max-new-tokens", "4"])
  target_mib = float(str(e.value).split("(target params ")[1].split(" MiB")[0])
  assert blocks_bytes / 2**20 < target_mib < 538e6 / 2**20  # the blocks and the float32 norms, not 538 MB of float32

  class Loaded(Exception):
    pass

  def stop(pipe, *args, **kwargs):
    seen["pipe"] = pipe
    raise Loaded
  monkeypatch.setattr(memory_check, "available_memory", lambda device=None: None)
  monkeypatch.setattr(api.Pipeline, "generate", stop)
  with pytest.raises(Loaded):
    decode.main(["--max-new-tokens", "4"])  # the defaults: weights 'auto' are the blocks on a CPU, the shipped draft
  pipe = seen["pipe"]
  assert pipe.weights == "gguf" and pipe.draft is not None
  assert blocks.nbytes(pipe.target.params) / 2**20 == pytest.approx(target_mib, abs=0.05)
