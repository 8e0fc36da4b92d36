"""Reading other projects' model files: llama.cpp GGUF files and Hugging Face safetensors directories.

Both give numpy params in our layout (model.py: [in, out] matrices, rotate-half RoPE): safetensors in the dtype
each tensor is stored in, GGUF in float32 (its quantized blocks have no 16-bit form to keep). What their configs
mean, and what we refuse to compute, is families.py's.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os

import numpy as np

from .families import CheckpointError, gguf_model_config, hf_model_config

# Safetensors dtypes we read, each kept as stored (float64, which no accelerator computes in, narrows to float32);
# anything else (integer or 8-bit quantized weights) is refused.
_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": "bfloat16"}


# ----------------------------------------------------------------------------------------------------------- GGUF

def unpermute_qk(w_out_in: np.ndarray, n_heads: int) -> np.ndarray:
  """Undoes llama.cpp's q/k row permutation, giving the Hugging Face rotate-half layout ([out, in] weights)."""
  out, d = w_out_in.shape
  hd = out // n_heads
  return w_out_in.reshape(n_heads, hd // 2, 2, d).swapaxes(1, 2).reshape(out, d)


def permute_qk(w_out_in: np.ndarray, n_heads: int) -> np.ndarray:
  """Applies llama.cpp's q/k row permutation (inverse of unpermute_qk); used to write test GGUF files."""
  out, d = w_out_in.shape
  hd = out // n_heads
  return w_out_in.reshape(n_heads, 2, hd // 2, d).swapaxes(1, 2).reshape(out, d)


def read_gguf(path: str, progress: bool = True, keep_blocks: bool = False):
  """Returns (ModelConfig, params as numpy, metadata dict) for a GGUF file (llama, qwen2, qwen3).

  Default: float32 even for F16/BF16 tensors (dequantize() widens every GGUF type; `load_model(..., dtype=)` narrows).
  keep_blocks: matrices in Q8_0/Q4_1 stay in their blocks (blocks.BlockWeight) and F16/BF16 tensors in 16 bits;
  other types are dequantized to float32."""
  from tqdm.auto import tqdm

  from .blocks import from_gguf

  tensors, cfg, meta, deq = _open_gguf(path)  # refuses what we do not compute before reading the weights
  shapes = {t.name: tuple(int(x) for x in reversed(t.shape)) for t in tensors}

  def kept(t):
    kind = t.tensor_type.name
    if kept_as_blocks(kind, shapes[t.name]):
      return from_gguf(np.asarray(t.data), kind, transposed=False)
    if kind in ("F16", "BF16"):
      import ml_dtypes
      dt = np.float16 if kind == "F16" else ml_dtypes.bfloat16
      return np.asarray(t.data).view(dt).reshape(shapes[t.name])
    return deq(t)
  read = kept if keep_blocks else deq
  weights = {t.name: read(t) for t in tqdm(tensors, desc="reading GGUF", disable=not progress, unit="tensor")}
  return cfg, _gguf_params(weights, cfg, permuted_qk=meta.get("general.architecture") == "llama"), meta


def kept_as_blocks(kind: str, shape: tuple) -> bool:
  """Whether read_gguf(keep_blocks=True) keeps a tensor of this GGUF type and [out, in] shape in its blocks."""
  from .blocks import KINDS, QK

  return kind in KINDS and len(shape) == 2 and shape[1] % QK == 0


def gguf_tensors(path: str):
  """Returns (ModelConfig, [(name, GGUF type name, shape [out, in], bytes in the file)]) of a GGUF file without
  reading its weights."""
  tensors, cfg = _open_gguf(path)[:2]
  return cfg, [(t.name, t.tensor_type.name, tuple(int(x) for x in reversed(t.shape)), int(t.n_bytes))
               for t in tensors]


def gguf_header(path: str):
  """Returns (ModelConfig, metadata dict) of a GGUF file from its metadata and tensor shapes, without dequantizing
  weights."""
  return _open_gguf(path)[1:3]


def _open_gguf(path: str):
  """Returns (tensors, ModelConfig, metadata dict, dequantizer of one tensor to float32) of a GGUF file
  (gguf_file.read_gguf_file: its header only, the weights mapped, not read)."""
  from gguf.quants import dequantize

  from .gguf_file import read_gguf_file

  try:
    meta, tensors = read_gguf_file(path)
  except Exception as e:  # a file cut short or not GGUF at all: one line that says so
    raise CheckpointError(f"cannot read GGUF file {path}: {e}") from e
  shapes = {t.name: tuple(int(x) for x in reversed(t.shape)) for t in tensors}
  deq = lambda t: dequantize(t.data, t.tensor_type).reshape(shapes[t.name]).astype(np.float32)  # noqa: E731
  rope_freqs = next((deq(t) for t in tensors if t.name == "rope_freqs.weight"), None)
  try:
    cfg = gguf_model_config(meta, shapes, path, rope_freqs)
  except (KeyError, TypeError) as e:
    raise CheckpointError(f"{path}: GGUF metadata lacks or garbles a field the model needs ({e})") from e
  return tensors, cfg, meta, deq


def _gguf_params(tensors: dict, cfg, permuted_qk: bool) -> dict:
  """Returns our params from llama.cpp's tensors ([out, in] in numpy order). Only the `llama` converter permutes q/k
  rows (for its interleaved RoPE); Qwen GGUFs keep Hugging Face's order. A matrix in GGUF blocks stays in them (its
  rows are our columns)."""
  from .blocks import BlockWeight, take_rows

  def tr(name):
    w = tensors[name]
    return dataclasses.replace(w, transposed=True) if isinstance(w, BlockWeight) else np.ascontiguousarray(w.T)

  def qk(name, heads):
    w = tensors[name]
    if not permuted_qk:
      return tr(name)
    if isinstance(w, BlockWeight):  # whole output rows move
      order = unpermute_qk(np.arange(w.rows_shape[0])[:, None], heads)[:, 0]
      return dataclasses.replace(take_rows(w, order), transposed=True)
    return np.ascontiguousarray(unpermute_qk(w, heads).T)
  layers = []
  for i in range(cfg.n_layers):
    b = f"blk.{i}."
    lp = {"attn_norm": tensors[b + "attn_norm.weight"], "wq": qk(b + "attn_q.weight", cfg.n_heads),
          "wk": qk(b + "attn_k.weight", cfg.n_kv_heads), "wv": tr(b + "attn_v.weight"),
          "wo": tr(b + "attn_output.weight"), "mlp_norm": tensors[b + "ffn_norm.weight"],
          "w_gate": tr(b + "ffn_gate.weight"), "w_up": tr(b + "ffn_up.weight"), "w_down": tr(b + "ffn_down.weight")}
    if cfg.attn_bias:
      lp.update(bq=tensors[b + "attn_q.bias"], bk=tensors[b + "attn_k.bias"], bv=tensors[b + "attn_v.bias"])
    if cfg.qk_norm:
      lp.update(q_norm=tensors[b + "attn_q_norm.weight"], k_norm=tensors[b + "attn_k_norm.weight"])
    layers.append(lp)
  params = {"embed": tensors["token_embd.weight"], "layers": layers, "final_norm": tensors["output_norm.weight"]}
  if not cfg.tie_embeddings:
    params["lm_head"] = tr("output.weight")
  return params


# ------------------------------------------------------------------------------------------- Hugging Face safetensors

def safetensors_files(directory: str) -> list[str]:
  """Returns the safetensors files of a Hugging Face directory: those its index names when it is sharded, else
  model.safetensors. Other *.safetensors beside them (Mistral's consolidated.safetensors) are another format."""
  index = os.path.join(directory, "model.safetensors.index.json")
  if os.path.exists(index):
    try:
      with open(index) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, AttributeError) as e:
      raise CheckpointError(f"cannot read {index}: {type(e).__name__}: {e}") from e
    missing = [s for s in shards if not os.path.exists(os.path.join(directory, s))]
    if missing:
      raise CheckpointError(f"{directory}: shard {missing[0]} named by model.safetensors.index.json is missing")
    return [os.path.join(directory, s) for s in shards]
  single = os.path.join(directory, "model.safetensors")
  return [single] if os.path.exists(single) else sorted(glob.glob(os.path.join(directory, "*.safetensors")))


def _safetensors_header(path: str) -> tuple[dict, int]:
  """Returns (the header of a safetensors file without its __metadata__, the offset where its data starts)."""
  try:
    with open(path, "rb") as f:
      n = int.from_bytes(f.read(8), "little")
      header = json.loads(f.read(n))
  except (OSError, ValueError) as e:
    raise CheckpointError(f"cannot read {path}: {type(e).__name__}: {e}") from e
  header.pop("__metadata__", None)
  return header, 8 + n


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """Returns the tensors of one safetensors file as numpy arrays in their stored dtype (float32/16, bfloat16; float64
  narrows to float32), each read into memory.

  Parsed here rather than by safetensors.numpy, which cannot give bfloat16 (numpy has no such dtype)."""
  return {name: np.array(view) for name, view in safetensors_views(path).items()}


def safetensors_entries(path: str):
  """Returns (data start, [(name, numpy dtype, shape, begin, end)]) of one safetensors file, each tensor's dtype and
  byte span checked against its shape (offsets relative to the data start)."""
  import ml_dtypes

  header, start = _safetensors_header(path)
  entries = []
  for name, info in header.items():
    dt = _ST_DTYPES.get(info.get("dtype"))
    if dt is None:
      raise CheckpointError(f"{path}: tensor {name} has dtype {info.get('dtype')} (only float32/16, bfloat16 load)")
    dt = np.dtype(ml_dtypes.bfloat16 if dt == "bfloat16" else dt)
    begin, end = info["data_offsets"]
    shape = tuple(info["shape"])
    if end - begin != int(np.prod(shape)) * dt.itemsize:
      raise CheckpointError(f"{path}: tensor {name} does not fit its offsets (truncated or corrupt file)")
    entries.append((name, dt, shape, begin, end))
  return start, entries


def safetensors_views(path: str) -> dict[str, np.ndarray]:
  """Returns the tensors of one safetensors file as read-only memory-mapped numpy views in their stored dtype
  (float64 narrows to float32, copying): nothing is read until a view is used, so a loader can place one tensor at
  a time."""
  start, entries = safetensors_entries(path)
  data = np.memmap(path, np.uint8, "r", offset=start) if os.path.getsize(path) > start else np.zeros(0, np.uint8)
  out = {}
  for name, dt, shape, begin, end in entries:
    if end > data.size:
      raise CheckpointError(f"{path}: tensor {name} does not fit its offsets (truncated or corrupt file)")
    view = data[begin:end].view(dt).reshape(shape)
    out[name] = view.astype(np.float32) if dt == np.float64 else view
  return out


def read_hf_safetensors(directory: str, progress: bool = True):
  """Returns (ModelConfig, numpy params in their stored dtypes) from a Hugging Face Llama/Mistral/Qwen2/Qwen3
  directory, all in host memory (sharded_load.load_hf_sharded places them tensor by tensor instead)."""
  from tqdm.auto import tqdm

  cfg, files = hf_config(directory)
  t = {}
  for fn in tqdm(files, desc="reading safetensors", disable=not progress, unit="file"):
    t.update({k.removeprefix("model."): v for k, v in read_safetensors(fn).items()})
  if cfg.tie_embeddings and "lm_head.weight" in t and not np.array_equal(t["lm_head.weight"], t["embed_tokens.weight"]):
    raise CheckpointError(f"{directory}: tie_word_embeddings is true but lm_head.weight differs from the embedding; "
                          f"refusing to guess which head the model means")
  return cfg, map_layout(lambda e: np.ascontiguousarray(t[e[0]].T) if e[1] else t[e[0]], hf_layout(cfg))


def hf_config(directory: str):
  """Returns (ModelConfig, safetensors files) of a Hugging Face directory, checked from config.json and the tensor
  names in the headers before any weight is read: a refusal is instant."""
  cfg_path = os.path.join(directory, "config.json")
  if not os.path.exists(cfg_path):
    raise CheckpointError(f"{directory} has no config.json; expected a Hugging Face model directory")
  with open(cfg_path) as f:
    hf = json.load(f)
  files = safetensors_files(directory)
  if not files:
    raise CheckpointError(f"{directory} has no *.safetensors files")
  names = {k.removeprefix("model.") for fn in files for k in _safetensors_header(fn)[0]}
  try:
    cfg = hf_model_config(hf, names, os.path.basename(os.path.normpath(directory)), directory)
  except (KeyError, TypeError) as e:
    raise CheckpointError(f"{cfg_path} lacks or garbles a field the model needs ({e})") from e
  return cfg, files


def hf_layout(cfg) -> dict:
  """Returns, with the structure of our params, (Hugging Face tensor name without `model.`, transposed?) per param:
  HF keeps matrices [out, in], we keep [in, out]."""
  layers = []
  for i in range(cfg.n_layers):
    pre = f"layers.{i}."
    a = pre + "self_attn."
    lp = {"attn_norm": (pre + "input_layernorm.weight", False),
          "mlp_norm": (pre + "post_attention_layernorm.weight", False),
          "wq": (a + "q_proj.weight", True), "wk": (a + "k_proj.weight", True), "wv": (a + "v_proj.weight", True),
          "wo": (a + "o_proj.weight", True), "w_gate": (pre + "mlp.gate_proj.weight", True),
          "w_up": (pre + "mlp.up_proj.weight", True), "w_down": (pre + "mlp.down_proj.weight", True)}
    if cfg.attn_bias:
      lp.update(bq=(a + "q_proj.bias", False), bk=(a + "k_proj.bias", False), bv=(a + "v_proj.bias", False))
    if cfg.qk_norm:
      lp.update(q_norm=(a + "q_norm.weight", False), k_norm=(a + "k_norm.weight", False))
    layers.append(lp)
  params = {"embed": ("embed_tokens.weight", False), "layers": layers, "final_norm": ("norm.weight", False)}
  if not cfg.tie_embeddings:
    params["lm_head"] = ("lm_head.weight", True)
  return params


def is_layout_entry(x) -> bool:
  return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str)


def map_layout(fn, layout):
  """Maps `fn` over the (name, transposed) entries of an hf_layout tree."""
  import jax
  return jax.tree.map(fn, layout, is_leaf=is_layout_entry)
