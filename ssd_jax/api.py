"""The Python API: load a target (and draft) once, then generate.

    import ssd_jax
    pipe = ssd_jax.load()                       # SmolLM2-135M-Instruct target (+ the shipped draft when present)
    outs = pipe.generate(["What is the capital of France?"], mode="ar", max_new_tokens=64)
    print(outs[0].text, outs[0].stats)

Attention: `load(..., attn_impl=...)` picks how every attention (prefill, verify, glue, tree) runs
(ssd_jax/kernels/masked_attention/): "auto" (the default) is the C++ CPU kernel on a CPU and the pure-jnp reference
elsewhere; "ref" the reference everywhere; "cpu" the CPU kernel; "pallas" the Pallas kernels (Triton on GPU, Mosaic
on TPU, interpret mode on CPU: slow, same tokens).
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Callable, Sequence

import numpy as np
from jax.sharding import Mesh

from . import defaults
from .models import checkpoints, draft_weights, drafts, quant
from .models.config import ModelConfig, check_same_vocabulary
from .models.kv_cache import cache_dtype
from .decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions, SSDDecoder, auto_k
from .decode import speculator
from .theory.fan_out import CALIBRATION_FILE, read_calibration
from .preflight import LoadPlan, Run, draft_dir, prepare, resolve_weights
from .settings import MODES, SSD_PLACEMENTS, WEIGHTS, LoadSettings, check_batch_size, check_mode
from .sharding import Placement, make_placement
from .models.tokenizer import TextTokenizer
from .models.config import is_eagle


DraftLostWarning = speculator.DraftLostWarning  # a run went on without its lost draft side


class SlowerThanAR(UserWarning):
  """A speculative mode asked for by name with k='auto' is expected slower than AR at this batch; it runs."""

__all__ = ["Generation", "LoadPlan", "LoadSettings", "LoadedModel", "MODES", "Pipeline", "Run", "SSD_PLACEMENTS",
           "WEIGHTS", "draft_dir", "load", "load_prepared", "load_tiny", "prepare", "resolve_weights"]


@dataclasses.dataclass
class Generation:
  prompt: str
  token_ids: list[int]
  text: str
  stats: dict

  def to_dict(self) -> dict:
    return {"prompt": self.prompt, "token_ids": self.token_ids, "text": self.text, "stats": self.stats}


@dataclasses.dataclass
class LoadedModel:
  cfg: ModelConfig
  params: dict
  path: str


class Pipeline:
  """A target model (and optional draft) with its tokenizer, ready to decode."""

  def __init__(self, target: LoadedModel, tokenizer: TextTokenizer, draft: LoadedModel | None = None,
               attn_impl: str = "auto", placement: Placement | None = None, ssd_placement: str = "auto",
               kv_dtype: str = "auto", weights: str = "full", draft_weights: str = "full"):
    """kv_dtype: the target KV cache's dtype ('auto': the target params', kv_cache.KV_DTYPES); weights and
    draft_weights: the target's and the draft's weight formats as loaded (load's, resolved). The measured step costs
    are kept under the params' own format (step_costs_path), whichever setting made it."""
    s = LoadSettings(attn_impl, ssd_placement, kv_dtype, weights, draft_weights=draft_weights)
    self.weights, self.kv_dtype, self.ssd_placement = s.weights, s.kv_dtype, s.ssd_placement
    self.draft_weights = s.draft_weights
    if draft is not None:
      check_same_vocabulary(draft.cfg, target.cfg, draft.path)
    self.target, self.draft, self.tokenizer, self.attn_impl = target, draft, tokenizer, attn_impl
    # Default: the target on the first device and the draft (SSD) on the next one, when the platform has two.
    self.placement = placement or make_placement(1, 1)
    self._decoders = {}
    # Where `bench.py --calibrate` keeps each mode's speed under the key of the load that made this pipeline, for
    # decode.py's plan to read before loading (preflight.LoadPlan.measured_modes_path); None: not made by a load.
    self.measured_modes_path = None

  def encode_prompt(self, prompt: str, chat: bool = True, **template_kwargs) -> list[int]:
    """Returns the prompt's ids: under the model's chat template (template_kwargs: its switches, such as Qwen3's
    enable_thinking), or raw (chat=False) with only what the tokenizer adds (Llama 3: BOS)."""
    ids = self.tokenizer.encode_prompt(prompt, chat, **template_kwargs)
    if not ids:
      raise ValueError("empty prompt")
    return ids

  def decoder(self, mode: str, spec: SpecOptions | None = None):
    """Returns the decoder for `mode` with these speculation settings (default: `spec_options()`), built on first
    use and kept with its compiled programs."""
    spec = spec or self.spec_options()
    if mode != "ar" and spec.auto:
      raise ValueError("k='auto' is chosen per batch: pass spec.with_k(pipe.choose_k(rows, temperature))")
    # SD reads only K; SSD's placement is part of its settings (the bench switches it between calls).
    key = (mode, None if mode == "ar" else spec.k if mode == "sd" else spec)
    if key in self._decoders:
      return self._decoders[key]
    check_mode(mode, self.draft is not None)
    t, d = self.target, self.draft
    if mode == "ar":
      dec = ARDecoder(t.cfg, t.params, self.attn_impl, placement=self.placement, kv_dtype=self.kv_dtype)
    elif mode == "sd":
      dec = SDDecoder(t.cfg, t.params, d.cfg, d.params, spec, self.attn_impl, placement=self.placement,
                      kv_dtype=self.kv_dtype)
    else:
      geometric = spec.fan_out_strategy == "geometric"
      calibration = read_calibration(os.path.join(d.path, CALIBRATION_FILE)) if geometric else None
      dec = SSDDecoder(t.cfg, t.params, d.cfg, d.params, spec, self.attn_impl, placement=self.placement,
                       calibration=calibration, kv_dtype=self.kv_dtype)
    self._decoders[key] = dec
    return dec

  def _text_streamer(self, stream: Callable[[str], None]) -> Callable[[list[int]], None]:
    """Returns a token-id callback that passes each new piece of decoded text to `stream`."""
    produced: list[int] = []
    shown = [""]

    def on_ids(new_ids):
      produced.extend(new_ids)
      text = self.tokenizer.reply_text(produced)
      if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
        return
      stream(text[len(shown[0]):])
      shown[0] = text

    return on_ids

  def mode_and_placement(self) -> tuple[str, str]:
    """Returns (default mode, SSD placement in use): `ssd_placement` with 'auto' resolved (defaults.resolve); the
    default mode is the fastest this machine measured for this pair (`bench.py --calibrate`) where it was."""
    costs = auto_k.load_costs(self.step_costs_path()) if self.draft is not None else None
    return defaults.resolve(self.draft is not None, self.placement, self.ssd_placement,
                            costs.modes_tok_s if costs is not None else None)

  def ssd_placement_in_use(self) -> str:
    """Returns the SSD placement in use (`ssd_placement`, 'auto' resolved), without reading this machine's measured
    speeds, which only the default mode needs."""
    return defaults.resolve(self.draft is not None, self.placement, self.ssd_placement)[1]

  @property
  def default_mode(self) -> str:
    """What generate() runs when no mode is given: the fastest mode this machine measured (`bench.py --calibrate`),
    else the fastest measured on this backend, AR where none was and without a draft (defaults.default_mode). With
    the shipped draft and no calibration that is SD on a CPU."""
    return self.mode_and_placement()[0]

  def spec_options(self, spec: SpecOptions | None = None, **settings) -> SpecOptions:
    """Returns `spec`, or SpecOptions built from loose settings (k, fan_out, ...; the SSD placement: this pipeline's
    ssd_placement, 'auto' resolved); raises ValueError when given both."""
    if spec is None:
      return SpecOptions(**{"placement": self.ssd_placement_in_use(), **settings})
    defaults = {f.name: f.default for f in dataclasses.fields(SpecOptions)}  # generate()'s defaults too
    if any(value != defaults[name] for name, value in settings.items()):
      raise ValueError("give either spec=SpecOptions(...) or its settings (k, fan_out, ...), not both")
    return spec

  def choose_k(self, rows: int, temperature: float = 0.0, prefix: float | None = None, at_least: int = 0) -> int:
    """Returns the K that k='auto' runs for a batch of `rows` prompts (0: plain AR) whose steps see `prefix` cached
    tokens on average (auto_k.run_prefix; None: auto_k.DEFAULT_PREFIX), from this machine's measured step costs
    (`bench.py --calibrate`; a conservative built-in choice without them) and the draft's acceptance at
    `temperature` (its fan-out calibration); decode/auto_k.py. at_least=1 for a mode asked for by name: the best
    K >= 1 (AR is the default mode's choice only)."""
    if self.draft is None:
      return 0
    costs, a = self.auto_k_inputs(temperature)
    return auto_k.choose_k(costs, rows, a, builtin=self._builtin_k, prefix=prefix, at_least=at_least)

  @property
  def _builtin_k(self) -> dict:
    """k='auto''s choice by batch where nothing was measured, for this target's weight format."""
    return auto_k.BUILTIN_K_BLOCKS if self.weights == "gguf" else auto_k.BUILTIN_K

  def slower_than_ar(self, mode: str, k: int, rows: int, temperature: float = 0.0,
                     prefix: float | None = None) -> str | None:
    """Returns one line saying that `mode` at K `k` is expected slower than AR for a batch of `rows` (SD by the cost
    model; SSD by its bound with every draft hidden, auto_k.ssd_speedup), or None where it is not (or AR)."""
    if mode == "ar" or k == 0 or self.draft is None:
      return None
    costs, a = self.auto_k_inputs(temperature)
    if costs is None:
      if self._builtin_k.get(rows, 0):
        return None
      why = "is not expected to beat AR here (no measured step costs: `bench.py --calibrate` measures them)"
    else:
      s = (auto_k.sd_speedup if mode == "sd" else auto_k.ssd_speedup)(costs, rows, k, a, prefix)
      if s >= 1.0:
        return None
      why = f"is expected at {s:.2f}x AR on this machine"
    return (f"{mode} at K={k} with {rows} row{'s' if rows > 1 else ''} {why}; running it as asked "
            "(--mode ar, or no --mode, would be faster)")

  def auto_k_inputs(self, temperature: float = 0.0):
    """Returns (the cached step costs or None, the draft's acceptance at `temperature`) that choose_k weighs."""
    costs = auto_k.load_costs(self.step_costs_path())
    cal_file = os.path.join(self.draft.path, CALIBRATION_FILE)
    try:
      calibration = read_calibration(cal_file) if os.path.exists(cal_file) else None
    except ValueError:
      calibration = None
    return costs, auto_k.acceptance(calibration, temperature)

  def step_costs_path(self) -> str:
    """Returns where this machine's step costs for this target and draft are cached (auto_k.measure writes them):
    keyed by each model's config and its parameters' format (auto_k.params_format: float32, int8, GGUF blocks, a
    draft's own weights choice), the attention and the target KV cache's dtype."""
    ident = lambda m: (f"{m.cfg.name}:{getattr(m.cfg, 'n_layers', 1)}x{m.cfg.d_model}:{m.cfg.vocab_size}:"  # noqa: E731
                       f"{auto_k.params_format(m.params)}")
    return auto_k.costs_path(ident(self.target), ident(self.draft) if self.draft else "", self.attn_impl,
                             self.weights, str(cache_dtype(self.target.params, self.kv_dtype)))

  def batch_decoder(self, prompt_lens: Sequence[int], mode: str, spec: SpecOptions, opts: DecodeOptions,
                    asked: bool = True):
    """Returns the decoder for one batch of prompts of these lengths, checked against the context (ValueError). With
    k='auto', K is chosen for the batch's rows and context: the default mode (asked False) runs AR (K = 0) where
    speculation would not pay, a mode asked for by name its best K >= 1 (SlowerThanAR where AR is faster)."""
    m, s, rows = mode, spec, len(prompt_lens)
    if mode != "ar" and spec.auto:
      prefix = auto_k.run_prefix(list(prompt_lens), opts.max_new_tokens)
      chosen = self.choose_k(rows, opts.temperature, prefix, at_least=int(asked))
      m, s = ("ar", spec) if chosen == 0 else (mode, spec.with_k(chosen))
      note = self.slower_than_ar(mode, chosen, rows, opts.temperature, prefix) if asked else None
      if note is not None:
        warnings.warn(note, SlowerThanAR, stacklevel=3)
    dec = self.decoder(m, s)
    dec.check(list(prompt_lens), opts.max_new_tokens)
    return dec

  def generate_ids(self, prompts: Sequence[Sequence[int]], mode: str | None = None, batch_size: int = 8,
                   stream: Callable[[list[int]], None] | None = None, k: int | str = "auto", fan_out=3,
                   fan_out_miss=None, fan_out_strategy: str = "uniform", backup: str = "neural",
                   saguaro_c: float = 1.0, spec: SpecOptions | None = None,
                   on_batch: Callable[[int, list], None] | None = None, **options):
    """Returns DecodeResult objects for token-id prompts, decoded `batch_size` at a time (mode, speculation
    settings and options: as in generate). Every prompt is checked against the context before any is decoded.
    on_batch(first, results), if given, is called as each batch finishes: its results, the first one's index."""
    check_batch_size(batch_size)
    opts = DecodeOptions(eos_id=self.tokenizer.eos_ids if self.tokenizer else None, **options)
    spec = self.spec_options(spec, k=k, fan_out=fan_out, fan_out_miss=fan_out_miss,
                             fan_out_strategy=fan_out_strategy, backup=backup, saguaro_c=saguaro_c)
    asked, mode = mode is not None, mode or self.default_mode
    batches = []
    for i in range(0, len(prompts), batch_size):  # a loop, not a comprehension: the warning's stacklevel
      chunk = prompts[i:i + batch_size]
      batches.append((self.batch_decoder([len(p) for p in chunk], mode, spec, opts, asked), chunk))
    results = []
    for i, (dec, chunk) in enumerate(batches):
      cb = (lambda row, ids: stream(ids)) if (stream is not None and i == 0) else None
      done = dec.generate(chunk, opts, stream=cb)
      if on_batch is not None:
        on_batch(len(results), done)
      results += done
    return results

  def generate(self, prompts: Sequence[str] | str, mode: str | None = None, max_new_tokens: int = 128,
               temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, batch_size: int = 8,
               ignore_eos: bool = False, chat: bool = True, stream: Callable[[str], None] | None = None,
               k: int | str = "auto", fan_out=3, fan_out_miss=None, fan_out_strategy: str = "uniform",
               backup: str = "neural", saguaro_c: float = 1.0, spec: SpecOptions | None = None,
               enable_thinking: bool | None = None, ar_chunk: int = DecodeOptions.ar_chunk,
               sd_chunk: int = DecodeOptions.sd_chunk,
               on_result: Callable[[int, Generation], None] | None = None) -> list[Generation]:
    """Returns one Generation per prompt, in input order.

    mode: 'ar', 'sd' (K draft tokens per round, `k`: 'auto' by default, chosen per batch from this machine's step
    costs, `choose_k`: the best K >= 1, with a SlowerThanAR warning where AR is expected faster; or an integer) or
    'ssd' (also `fan_out` bonus guesses per acceptance length: an int, or K+1 counts; `fan_out_miss` after a miss;
    `fan_out_strategy` 'geometric' spreads F*(K+1) guesses by Theorem 12 from the draft's calibration
    (scripts/calibrate_fan_out.py); `backup` 'neural', 'fast', 'ngram' or 'auto'; `saguaro_c` < 1 down-weights the
    draft's top tokens (Saguaro sampling); the draft runs where `ssd_placement` puts it); None: `default_mode` (the
    fastest measured here; SD on a CPU with the shipped draft; with k='auto' it runs AR for a batch where no K is
    expected to pay). spec: a SpecOptions instead of those loose settings.
    temperature 0 is greedy; chat=False feeds the text without the chat template; stream, if given, is called with
    each new piece of text of the first prompt. A row stops at any of the model's end-of-sequence ids
    (generation_config.json, config.json, the tokenizer's eos_token). enable_thinking: Qwen3's template switch (None:
    the template's default; a template without it refuses True/False). ar_chunk: AR's target steps a call (the
    host's work per call paid once per chunk; the same tokens; stream then gets a chunk's text at a time);
    sd_chunk: SD's rounds a call, with a draft that reads tokens (the same tokens; streamed a chunk at a time).
    on_result(index, generation), if given, gets each prompt's Generation as soon as its batch finishes (the
    results so far survive an interrupted call; decode.py writes them out this way).
    """
    if isinstance(prompts, str):
      prompts = [prompts]
    if not prompts:
      raise ValueError("no prompts given")
    switches = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
    ids = [self.encode_prompt(p, chat, **switches) for p in prompts]
    text_cb = self._text_streamer(stream) if stream is not None else None
    gen = lambda i, r: Generation(prompts[i], r.token_ids, self.tokenizer.reply_text(r.token_ids),  # noqa: E731
                                  r.stats.to_dict())

    def batch_done(first: int, results) -> None:
      for j, r in enumerate(results, first):
        on_result(j, gen(j, r))

    res = self.generate_ids(ids, mode=mode, batch_size=batch_size, stream=text_cb, k=k, fan_out=fan_out,
                            fan_out_miss=fan_out_miss, fan_out_strategy=fan_out_strategy, backup=backup,
                            saguaro_c=saguaro_c, spec=spec, max_new_tokens=max_new_tokens, temperature=temperature,
                            top_p=top_p, seed=seed, ignore_eos=ignore_eos, ar_chunk=ar_chunk,
                            sd_chunk=sd_chunk, on_batch=None if on_result is None else batch_done)
    return [gen(i, r) for i, r in enumerate(res)]


def load(target: str = checkpoints.TARGET_NAME, draft: str | None = "default", attn_impl: str = "auto",
         target_devices: int = 1, draft_devices: int = 1, ssd_placement: str = "auto", dtype: str = "auto",
         weights: str = "auto", draft_head_vocab: int | None = None, draft_head_counts=None,
         kv_dtype: str = "auto", draft_weights: str = "auto") -> Pipeline:
  """Returns a Pipeline for a target (name, ssd-jax checkpoint, GGUF file or HF safetensors directory) and a draft.

  draft='default' loads the shipped draft when it exists (and skips it otherwise); None loads no draft; a path: our
  checkpoint (a trained standalone or EAGLE draft) or any model of the supported families (a GGUF file or a Hugging
  Face directory) that shares the target's tokenizer, checked before any weight is read (ssd_jax/models/drafts.py).
  draft_head_vocab: N cuts a full-vocabulary standalone draft's head to N tokens at load, the special and
  end-of-sequence ones and then the most frequent by draft_head_counts (one count per token id; None: the
  tokenizer's id order, drafts.choose_head); exactness is unchanged.
  attn_impl: 'auto' (the CPU attention kernel on a CPU, else the reference), 'ref' (pure jnp), 'cpu' (the C++ CPU
  kernel) or 'pallas' (the Pallas kernels; interpret mode on CPU, slow but the same tokens).
  target_devices: the tensor-parallel mesh of the target (the first devices); draft_devices: 1 puts the draft on
  the next device (SSD), 0 on the target's first device. Errors say what to do when there are too few devices.
  ssd_placement: 'devices' (SSD's draft on its own JAX device of this process), 'processes' (the draft in a
  child process pinned to its own CPU cores, the target pinned to the others while decoding: on a CPU, in-process
  devices share one thread pool, so this is the placement that gives the draft hardware of its own) or 'auto' (the
  default: 'processes' on a CPU with at least two usable cores, else 'devices'; `defaults.auto_ssd_placement`).
  dtype: the floating params' dtype on device, for target and draft: 'auto' (the checkpoint's on accelerators,
  float32 on a CPU: `checkpoints.param_dtype`), 'float32', 'bfloat16' or 'float16'.
  kv_dtype: the target's KV cache dtype: 'auto' (the default) follows the params (int8 weights: the embedding's
  dtype), or 'float32', 'bfloat16', 'float16' (a 16-bit cache halves its bytes; float32 params with a 16-bit cache
  run the reference attention, the CPU kernel taking float32 only). The draft's cache is float32 whatever is set.
  weights: 'auto' (the default: 'gguf' for a GGUF target, the SmolLM2 one included, on one CPU device, else 'full'),
  'full' (as loaded), 'int8' (the target's layer matrices weight-only int8 per output channel:
  ssd_jax/models/quant.py) or 'gguf' (a GGUF target's Q8_0/Q4_1 matrices kept in the file's blocks, read straight from
  the file: ssd_jax/models/blocks.py; the SmolLM2 target from its GGUF).
  draft_weights: the draft's: 'auto' (the default: 'q8_0' on a CPU, else 'full'), 'full' (as loaded) or 'q8_0' (its
  matrices and head in Q8_0 blocks quantized at load: ssd_jax/models/draft_weights.py; a different draft, so its
  acceptance may change, never the output's law).
  Before it reads a weight, load() checks what scripts/decode.py checks, with the same line: the settings, the
  devices, the draft and its tokenizer (`prepare`), and that the params fit in memory (`LoadPlan.check_memory`).
  """
  plan = prepare(target, draft, attn_impl, target_devices, draft_devices, ssd_placement, dtype, weights,
                 draft_head_vocab, kv_dtype, draft_weights)  # every check that needs no weight, before any is read
  plan.check_memory()
  return load_prepared(plan, draft_head_counts)


def load_prepared(plan: LoadPlan, draft_head_counts=None) -> Pipeline:
  """Returns the Pipeline of a LoadPlan (`prepare`): reads the target's and the draft's weights."""
  s, target, path, dtype, placement = plan.settings, plan.target, plan.draft, plan.settings.dtype, plan.placement
  weights, dcfg = s.weights, plan.draft_cfg
  if weights == "gguf":
    tcfg, tparams, tok = checkpoints.load_model(target, dtype, keep_blocks=True)
  else:
    tcfg, tparams, tok = checkpoints.load_model(target, dtype, mesh=placement.target_mesh)
    tparams = quant.quantize_params(tparams, weights)
  if tok is None:
    raise checkpoints.CheckpointError(f"target {target!r} has no tokenizer (tokenizer.json)")
  d = None
  if path is not None:
    mesh = Mesh(np.asarray([placement.draft_device]), ("tp",))
    if is_eagle(dcfg):  # an EAGLE draft reads with the target's embedding and head
      from .models.eagle import attach_target, check_target
      dcfg, dparams, _ = checkpoints.load_model(path, dtype, mesh=mesh)
      check_target(dcfg, tcfg)
      dparams = attach_target(dparams, tparams)
    else:
      dcfg, dparams = drafts.load_draft(path, tcfg, tok, plan.draft_head_vocab, draft_head_counts, dtype, mesh)
    d = LoadedModel(dcfg, draft_weights.quantize_draft(dcfg, dparams, s.draft_weights), path)
  pipe = Pipeline(LoadedModel(tcfg, tparams, target), tok, d, s.attn_impl, placement, s.ssd_placement, s.kv_dtype,
                  weights, s.draft_weights)
  pipe.measured_modes_path = plan.measured_modes_path()
  return pipe


def load_tiny(seed: int = 0, target_devices: int = 1, draft_devices: int = 1, eagle: bool = False,
              dtype: str = "float32", kv_dtype: str = "auto") -> Pipeline:
  """Returns a Pipeline over a tiny random target and draft with a byte-level tokenizer (tests and smoke runs).

  The target is a 2-layer d32 Llama over the 259-token vocabulary of `byte_level_tokenizer`. The draft is the same
  network with a reduced vocabulary that leaves out the Latin-1 bytes (as the shipped draft leaves out rare tokens),
  so it agrees with the target wherever the text avoids them: drafts get accepted, SSD's cache hits, and every code
  path of the real pair runs. eagle=True gives an EAGLE draft instead (ssd_jax/models/eagle.py, random weights over the
  same reduced vocabulary, reading a 4-layer target): its guesses are poor, but every code path of a draft that
  reads the target's features runs. dtype: the params' dtype ('bfloat16' for 16-bit tests); kv_dtype: the target
  KV cache's (as in `load`).
  """
  import jax
  import jax.numpy as jnp

  from .models.config import tiny_config
  from .models.model import init_params
  from .models.tokenizer import byte_level_tokenizer

  tok = TextTokenizer(byte_level_tokenizer())
  known = [i for i in range(tok.vocab_size) if not 0xA1 <= ord(tok.tok.id_to_token(i)[0]) <= 0xFF]
  tcfg = tiny_config(vocab_size=tok.vocab_size, name="tiny-target", n_layers=4 if eagle else 2)
  dcfg = tiny_config(vocab_size=tok.vocab_size, head_vocab=len(known), name="tiny-draft")
  tparams = checkpoints.cast_params(init_params(jax.random.key(seed), tcfg, scale=0.3), dtype)
  if eagle:
    from .models import eagle as eagle_model
    ecfg = eagle_model.config_for_target(tcfg, len(known), name="tiny-eagle")
    eparams = eagle_model.init_params(jax.random.key(seed + 1), ecfg, tparams, np.asarray(known), scale=0.3)
    return Pipeline(LoadedModel(tcfg, tparams, "tiny-target"), tok, LoadedModel(ecfg, eparams, "tiny-eagle"),
                    placement=make_placement(target_devices, draft_devices), kv_dtype=kv_dtype)
  head_ids = jnp.asarray(known, jnp.int32)
  vocab_map = jnp.zeros((tok.vocab_size,), jnp.int32).at[head_ids].set(jnp.arange(len(known), dtype=jnp.int32))
  dparams = dict(tparams, embed=tparams["embed"][head_ids], head_ids=head_ids, vocab_map=vocab_map)
  return Pipeline(LoadedModel(tcfg, tparams, "tiny-target"), tok, LoadedModel(dcfg, dparams, "tiny-draft"),
                  placement=make_placement(target_devices, draft_devices), kv_dtype=kv_dtype)
