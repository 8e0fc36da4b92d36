"""scripts/decode.py and scripts/train_draft.py as a user runs them."""
import json
import os
import subprocess
import sys

import pytest
from commands import run_script as run  # a script as a user runs it, on this checkout's package

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("args,msg", [
    (["--mode", "nonsense"], "unknown mode 'nonsense'; choose one of ar, sd, ssd"),
    (["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
    (["--prompts", "/nonexistent.jsonl"], "does not exist"),
    (["--temperature", "-1"], "temperature must be a finite number >= 0, got -1.0"),
    (["--mode", "ssd", "--k", "2", "--fan-out", "1,2"], "K+1 = 3"),
    (["--mode", "ssd", "--fan-out", "1,2"], "k='auto' takes a single fan-out F"),  # K is auto by default
    (["--k", "0"], "K (draft tokens per round) must be an integer >= 1 or 'auto'"),
    (["--temperature", "nan"], "temperature must be a finite number"),  # was decoded greedily
    (["--temperature", "inf"], "temperature must be a finite number"),
    (["--top-p", "nan"], "top_p must be in (0, 1]"),
    (["--seed", str(2**63)], "seed must be an integer in [-2^63, 2^63)"),
    (["--seed", str(-2**63 - 1)], "seed must be an integer in [-2^63, 2^63)"),
    (["--attention", "flash"], "unknown attention implementation 'flash'; choose one of auto, ref, cpu, pallas"),
    (["--backup", "psychic"], "unknown backup 'psychic'"),
    (["--json-out", "/nonexistent-dir/out.jsonl"], "the directory /nonexistent-dir does not exist"),
    (["--json-out", ROOT], "is a directory; give a file name"),
    (["--prompts", ROOT], "is a directory; give a JSONL file"),
    (["--fan-out-strategy", "geometric", "--draft", "none"], "no draft is loaded (--draft none)"),
    # 17 x 16000 branches of 16 tokens: terabytes of draft distributions, refused before anything is loaded.
    (["--mode", "ssd", "--k", "16", "--fan-out", "16000"], "lower the fan-out, K or the batch size"),
])
def test_decode_bad_input_one_line_no_traceback(args, msg):
  r = run("decode.py", *args)
  assert r.returncode == 2
  assert r.stderr.startswith("decode.py: error: ") and msg in r.stderr
  assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _unusable(tmp_path, write: bool) -> str:
  """Returns a path this process cannot write (write=True) or read: by permissions, or for root (whom permissions
  do not stop) a procfs file that refuses the operation."""
  if os.geteuid() == 0:
    return "/proc/version" if write else "/proc/self/clear_refs"
  if write:
    d = tmp_path / "read-only"
    d.mkdir()
    d.chmod(0o500)
    return str(d / "out.jsonl")
  f = tmp_path / "secret.jsonl"
  f.write_text('{"prompt": "hi"}\n')
  f.chmod(0)
  return str(f)


def _draft_without_weights(tmp_path, calibration: str | None = None) -> str:
  """Returns a draft directory holding only the shipped draft's config.json (and a calibration file): enough for the
  checks that run before loading, which must fail before the missing weights are noticed."""
  d = tmp_path / "draft"
  d.mkdir()
  (d / "config.json").write_text(open(os.path.join(ROOT, "checkpoints", "draft-smollm2", "config.json")).read())
  if calibration is not None:
    (d / "fan_out_calibration.json").write_text(calibration)
  return str(d)


@pytest.mark.parametrize("case", ["unwritable json-out", "unreadable prompts", "binary prompts",
                                  "draft without calibration", "calibration of the wrong shape"])
def test_decode_bad_files_one_line_no_traceback(tmp_path, case):
  """Bad paths and files fail in a second, before any model is loaded (the drafts here have no weights)."""
  if case == "unwritable json-out":
    args, msg = ["--json-out", _unusable(tmp_path, write=True)], "cannot be written"
  elif case == "unreadable prompts":
    args, msg = ["--prompts", _unusable(tmp_path, write=False)], "cannot be read"
  elif case == "binary prompts":
    (tmp_path / "p.jsonl").write_bytes(b"\xff\xfe{}")
    args, msg = ["--prompts", str(tmp_path / "p.jsonl")], "is not UTF-8 text"
  elif case == "draft without calibration":  # the default mode: checked even where it would be unused
    args = ["--fan-out-strategy", "geometric", "--draft", _draft_without_weights(tmp_path)]
    msg = "no fan-out calibration at"
  else:
    args = ["--mode", "ssd", "--fan-out-strategy", "geometric", "--draft",
            _draft_without_weights(tmp_path, '{"0": [0.5, 0.3]}')]
    msg = "entry '0' is not {temperature: {a_p, r, ...}}"
  r = run("decode.py", *args)
  assert r.returncode == 2 and msg in r.stderr, r.stderr[-2000:]
  assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_decode_json_out_is_checked_without_touching_the_file(tmp_path):
  """The early --json-out check leaves no file behind and does not empty an existing one."""
  from ssd_jax.cli_util import UsageError, check_output_file
  new, old = tmp_path / "new.jsonl", tmp_path / "old.jsonl"
  old.write_text("kept\n")
  check_output_file(str(new), "--json-out")
  check_output_file(str(old), "--json-out")
  assert not new.exists() and old.read_text() == "kept\n"
  with pytest.raises(UsageError, match="does not exist"):
    check_output_file(str(tmp_path / "missing" / "o.jsonl"), "--json-out")


def test_negative_seeds_are_accepted():
  """JAX makes keys from any 64-bit integer: only values outside int64 are refused."""
  import jax

  from ssd_jax.decode import DecodeOptions
  for seed in (-1, -2**63, 2**63 - 1):
    DecodeOptions(seed=seed)
    jax.random.key(seed)
  for seed in (2**63, -2**63 - 1):
    with pytest.raises(ValueError, match="seed must be"):
      DecodeOptions(seed=seed)
    with pytest.raises(OverflowError):
      jax.random.key(seed)


def test_options_the_mode_does_not_read_are_listed():
  from ssd_jax.cli import decode
  args = decode.parse_args(["--k", "3", "--fan-out", "5", "--backup", "fast", "--ssd-placement", "processes",
                            "--saguaro-c", "0.5", "--fan-out-strategy", "geometric", "--fan-out-miss", "5,5,5"])
  ssd_only = ["--fan-out", "--fan-out-miss", "--fan-out-strategy", "--backup", "--saguaro-c", "--ssd-placement"]
  assert decode.ignored_options(args, "ssd") == []
  assert decode.ignored_options(args, "sd") == ssd_only
  assert decode.ignored_options(args, "ar") == ["--k"] + ssd_only
  assert decode.ignored_options(decode.parse_args([]), "ar") == []  # defaults are never reported
  assert decode.ignored_options(decode.parse_args(["--draft", "d"]), "ar") == ["--draft"]
  assert decode.ignored_options(decode.parse_args(["--draft", "d"]), "sd") == []
  assert decode.ignored_options(decode.parse_args(["--draft", "none"]), "ar") == []  # asks for what ar does
  assert decode.ignored_options(decode.parse_args(["--draft-weights", "q8_0"]), "ar") == ["--draft-weights"]
  chunk = decode.parse_args(["--ar-chunk", "8", "--k", "2"])
  assert decode.ignored_options(chunk, "sd") == ["--ar-chunk"] and decode.ignored_options(chunk, "ar") == ["--k"]
  assert decode.ignored_options(decode.parse_args(["--ar-chunk", "8"]), "ssd") == []  # k=auto may run AR


def test_ar_still_refuses_a_draft_that_is_not_there(tmp_path):
  """--mode ar reads no draft, but a --draft path that does not exist is a mistake worth one line, not silence."""
  r = run("decode.py", "--mode", "ar", "--draft", str(tmp_path / "missing"), "--max-new-tokens", "1", "--prompt", "Hi")
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert r.stderr.strip() == f"decode.py: error: no model named or found at '{tmp_path / 'missing'}'"
  sd = run("decode.py", "--mode", "sd", "--draft", str(tmp_path / "missing"), "--max-new-tokens", "1", "--prompt", "Hi")
  assert sd.returncode == 2 and sd.stderr == r.stderr  # the same line as a mode that reads it


def test_decode_warns_about_options_the_mode_ignores_and_runs():
  """--mode ar with SD/SSD options: one warning line naming them, then the decode runs (exit 0)."""
  r = run("decode.py", "--mode", "ar", "--draft", "none", "--k", "3", "--fan-out", "5", "--max-new-tokens", "1",
          "--prompt", "Hi")
  assert r.returncode == 0, r.stderr[-2000:]
  warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
  assert warnings == ["warning: --k, --fan-out do nothing under --mode ar"]
  assert "Traceback" not in r.stderr


def test_speculation_memory_estimate():
  """The estimate's parts, by the shapes of draft_tree's outputs, and the check's message."""
  from ssd_jax.memory_check import check_speculation_memory, speculation_memory
  from ssd_jax.models.config import tiny_config
  cfg = tiny_config(vocab_size=300, head_vocab=100)  # n_layers 2, n_heads 4, n_kv_heads 2, head_dim 8
  est = speculation_memory(cfg, batch=2, k=3, fan_out=(4, 2, 1, 1), max_prompt=10, max_new=20)
  n = 8
  slots = 128  # 10 + 20 + (3 + 2 + 3 * 8) = 59 -> one block of 128
  # the cache three times: its q [B, N, K, V_out] and the small parts (candidates, labels, tokens, glue laws)
  one = 4 * (2 * n * 3 * 100 + 2 * n + n + 2 * n * 3 + 2 * 4 * 100)
  assert est["tree_q"] == 3 * one and est["tree_step"] == 3 * 2 * n * 100 * 4
  assert est["draft_kv"] == 2 * cfg.n_layers * 2 * slots * cfg.n_kv_heads * cfg.head_dim * 4
  assert est["attention_scores"] == 0
  assert speculation_memory(cfg, 2, 3, (4, 2, 1, 1), 10, 20, scores=True)["attention_scores"] == 2 * 4 * n * slots * 4
  assert est["total"] == est["tree_q"] + est["tree_step"] + est["draft_kv"]
  check_speculation_memory(cfg, 2, 3, (4, 2, 1, 1), 10, 20, available=est["total"])
  check_speculation_memory(cfg, 2, 3, (4, 2, 1, 1), 10, 20, available=None)  # unknown: no check
  with pytest.raises(ValueError, match=r"K=3 with fan-out 4,2,1,1 \(8 branches of 3 tokens, batch 2\)"):
    check_speculation_memory(cfg, 2, 3, (4, 2, 1, 1), 10, 20, available=est["total"] - 1)


def test_auto_placement_and_default_mode(monkeypatch):
  """'auto' is the split placement on a CPU with two or more cores, else the in-process devices; the default mode
  is the fastest measured on the backend (SD on a CPU with the shipped draft), AR where nothing was measured, and
  SD instead of SSD where the draft has no hardware of its own."""
  from ssd_jax import api, defaults
  auto = defaults.auto_ssd_placement
  assert auto("cpu", 1, False, 2) == "processes" and auto("cpu", 1, False, 16) == "processes"
  assert auto("cpu", 1, False, 1) == "devices"  # one core: nothing to split
  assert auto("cpu", 2, False, 8) == "devices" and auto("cpu", 1, True, 8) == "devices"  # TP / multi-process
  assert auto("gpu", 1, False, 64) == "devices" and auto("tpu", 4, False, 64) == "devices"
  mode = defaults.default_mode
  assert mode(True, "cpu", True) == "sd" and mode(True, "cpu", False) == "sd"  # measured: SD beats AR and SSD
  assert mode(True, "tpu", True) == "ar"  # not measured: AR
  monkeypatch.setitem(defaults.FASTEST_MEASURED, "gpu", "ssd")
  assert mode(True, "gpu", True) == "ssd" and mode(True, "gpu", False) == "sd" and mode(False, "gpu", True) == "ar"

  pipe = api.load_tiny()
  assert pipe.ssd_placement == "auto"
  monkeypatch.setitem(defaults.FASTEST_MEASURED, "cpu", "ssd")  # as if SSD had measured fastest on a CPU
  monkeypatch.setattr(defaults, "usable_cores", lambda: 2)
  assert pipe.mode_and_placement() == ("ssd", "processes")  # its own process: hardware of its own
  assert pipe.decoder("ssd", pipe.spec_options(k=1, fan_out=2)).draft.remote  # the draft side in a child process
  monkeypatch.setattr(defaults, "usable_cores", lambda: 1)
  assert pipe.mode_and_placement() == ("sd", "devices")  # one core: nothing for SSD's draft to run on
  assert not pipe.decoder("ssd", pipe.spec_options(k=1, fan_out=2)).draft.remote
  pipe.draft = None
  assert pipe.default_mode == "ar"


def test_the_default_mode_is_the_fastest_this_machine_measured(tmp_path, monkeypatch):
  """Calibrated (bench.py --calibrate's speeds by mode at batch 1), a run without a mode gets the fastest of AR, SD
  and SSD, SSD only where the draft has hardware of its own; never slower than AR; uncalibrated, the backend's table."""
  from ssd_jax import api, defaults
  from ssd_jax.decode import auto_k
  mode, fast = defaults.default_mode, {"ar": 80.0, "sd": 95.0, "ssd": 101.0}
  assert mode(True, "cpu", True, fast) == "ssd" and mode(True, "cpu", False, fast) == "sd"
  assert mode(True, "tpu", True, {"ar": 50.0, "sd": 45.0, "ssd": 49.0}) == "ar"
  assert mode(True, "cpu", True, {"ar": 50.0, "sd": 55.0}) == "sd"  # SSD not measured: not chosen
  assert mode(True, "tpu", True, {"sd": 90.0, "ssd": 99.0}) == "ar"  # no AR figure to beat: the table's (none)
  assert mode(False, "cpu", True, fast) == "ar"
  monkeypatch.setenv("SSD_JAX_CACHE", str(tmp_path))
  monkeypatch.setenv("SSD_JAX_STEP_COSTS", str(tmp_path / "step_costs"))
  monkeypatch.setitem(defaults.FASTEST_MEASURED, "cpu", "sd")
  monkeypatch.setattr(defaults, "usable_cores", lambda: 2)
  pipe = api.load_tiny()
  assert pipe.mode_and_placement() == ("sd", "processes")  # not calibrated here
  table = auto_k.CostTable((auto_k.StepCosts({1: 7.0}, {1: {2: 8.0}}, {1: 0.8}, prefix=64),), modes_tok_s=fast)
  os.makedirs(os.path.dirname(pipe.step_costs_path()), exist_ok=True)
  with open(pipe.step_costs_path(), "w") as f:
    f.write(table.to_json())
  assert pipe.mode_and_placement() == ("ssd", "processes")
  monkeypatch.setattr(defaults, "usable_cores", lambda: 1)
  assert pipe.mode_and_placement() == ("sd", "devices")  # one core: SSD's draft has nothing of its own


def test_the_plan_reads_the_calibrated_default_before_any_weight(tmp_path, monkeypatch):
  """decode.py decides the default mode, and so whether to load the draft at all, from its LoadPlan before any
  weight is read. bench.py --calibrate's speeds reach that decision too, under a key a plan knows (target, draft,
  weight formats, ...): on a backend whose table says AR (an accelerator nobody measured), a calibration that
  measured SD faster keeps the draft; another weight format is another load, not calibrated."""
  from ssd_jax import api, defaults
  from ssd_jax.decode import auto_k
  monkeypatch.setenv("SSD_JAX_STEP_COSTS", str(tmp_path))
  monkeypatch.setattr(defaults, "FASTEST_MEASURED", {})  # nothing measured on this backend: AR
  monkeypatch.setattr(defaults, "usable_cores", lambda: 2)
  plan = api.prepare()  # the default pair; no weight read
  assert plan.draft is not None and plan.mode_and_placement() == ("ar", "processes")
  auto_k.save_modes(plan.measured_modes_path(), {"ar": 100.0, "sd": 120.0, "ssd": 90.0})
  assert plan.mode_and_placement() == ("sd", "processes")
  auto_k.save_modes(plan.measured_modes_path(), {"ar": 100.0, "sd": 120.0, "ssd": 130.0})
  assert plan.mode_and_placement() == ("ssd", "processes")
  other = api.prepare(weights="full")
  assert other.measured_modes_path() != plan.measured_modes_path() and other.mode_and_placement()[0] == "ar"
  assert plan.without_draft().mode_and_placement()[0] == "ar"
  # The pipeline the plan loads carries the key calibrate writes under (bench_machine.calibrate).
  assert api.load_prepared(plan).measured_modes_path == plan.measured_modes_path()


_COMPILE = ("from ssd_jax.cli_util import compile_cache; d = compile_cache(); import jax, jax.numpy as jnp; "
            "jax.jit(lambda x: x * 2 + 1)(jnp.ones(3)).block_until_ready(); print(d)")


@pytest.mark.parametrize("setting", ["default", "user", "off"])
def test_scripts_keep_compiled_programs_in_a_cache(tmp_path, setting):
  """The scripts' persistent compilation cache: under SSD_JAX_CACHE/xla by default (programs land there), the
  user's JAX_COMPILATION_CACHE_DIR left as it is, none with SSD_JAX_NO_COMPILE_CACHE."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION", "JAX_PERSISTENT", "SSD_JAX_NO_C"))}
  env["SSD_JAX_CACHE"] = str(tmp_path / "cache")
  env["SSD_JAX_COMPILE_CACHE"] = "1"  # also on an Intel host, where it is off by default
  if setting == "user":
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "theirs")
  if setting == "off":
    env["SSD_JAX_NO_COMPILE_CACHE"] = "1"
  r = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  ours = tmp_path / "cache" / "xla"
  if setting == "default":
    assert r.stdout.strip() == str(ours) and any(ours.iterdir())
  elif setting == "user":
    assert r.stdout.strip() == str(tmp_path / "theirs") and not ours.exists()
  else:
    assert r.stdout.strip() == "None" and not ours.exists()


def test_compile_cache_is_off_by_default_on_intel_cpus(monkeypatch):
  from ssd_jax import cli_util
  for k in ("SSD_JAX_NO_COMPILE_CACHE", "SSD_JAX_COMPILE_CACHE", "JAX_COMPILATION_CACHE_DIR"):
    monkeypatch.delenv(k, raising=False)
  monkeypatch.setattr(cli_util, "_intel_cpu", lambda: True)
  assert cli_util.compile_cache() is None and "JAX_COMPILATION_CACHE_DIR" not in os.environ


def test_decode_empty_prompt_file(tmp_path):
  f = tmp_path / "p.jsonl"
  f.write_text("\n")
  r = run("decode.py", "--prompts", str(f))
  assert r.returncode == 2 and "holds no prompts" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_decode_json_out_and_prompt_too_long(tmp_path):
  prompts = tmp_path / "p.jsonl"
  prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["Say hi.", "What is 3+4?"]) + "\n")
  out = tmp_path / "o.jsonl"
  r = run("decode.py", "--prompts", str(prompts), "--json-out", str(out), "--max-new-tokens", "8", "--ignore-eos",
          "--draft", "none")
  assert r.returncode == 0, r.stderr
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [row["prompt"] for row in rows] == ["Say hi.", "What is 3+4?"]
  for row in rows:
    assert len(row["token_ids"]) == 8
    s = row["stats"]
    for k in ("mode", "new_tokens", "target_forwards", "tokens_per_target_forward", "prefill_seconds",
              "decode_seconds", "tokens_per_second"):
      assert k in s
    assert s["mode"] == "ar" and s["new_tokens"] == 8
  out2 = tmp_path / "default.jsonl"
  # No --mode: the fastest measured on this backend (ssd_jax.defaults); with the shipped draft on a CPU, SD.
  r = run("decode.py", "--prompt", "Say hi.", "--max-new-tokens", "10", "--json-out", str(out2))
  assert r.returncode == 0, r.stderr
  s = json.loads(out2.read_text())["stats"]
  # SD with k='auto' at batch 1: the target in GGUF blocks (weights='auto' on a CPU) gets K=0, plain AR, from the
  # built-in table, or the K this machine's measured step costs choose (a cache `bench.py --calibrate` may have written
  # here); test_auto_k checks the choice itself.
  assert (s["mode"], s.get("k", 0) >= 1) in (("ar", False), ("sd", True))
  # --mode ssd without a placement: 'auto', the draft in its own process on a CPU with two cores or more (K given:
  # k='auto' may choose plain AR for the GGUF-block target).
  r = run("decode.py", "--prompt", "Say hi.", "--max-new-tokens", "10", "--mode", "ssd", "--k", "2", "--json-out",
          str(out2))
  assert r.returncode == 0, r.stderr
  s = json.loads(out2.read_text())["stats"]
  assert s["mode"] == "ssd" and "cache_hit_rate" in s and "target_idle_seconds" in s
  if len(os.sched_getaffinity(0)) >= 2:
    assert s["placement"]["kind"] == "processes" and set(s["placement"]["draft_cores"]).isdisjoint(
        s["placement"]["target_cores"])
  r = run("decode.py", "--prompt", "word " * 9000, "--draft", "none")
  assert r.returncode == 2 and "exceeds the context" in r.stderr and "Traceback" not in r.stderr


def test_target_corpus_from_a_prompt_file(tmp_path):
  """make_target_corpus.py --prompts-file answers those prompts (here the synthetic ones), in order of length."""
  from ssd_jax import api
  from ssd_jax.training.draft_data import load_answer_shards
  prompts = tmp_path / "p.jsonl"
  r = run("make_synthetic_prompts.py", "--out", str(prompts), "--code", "1", "--math", "1", "--instructions", "2")
  assert r.returncode == 0, r.stderr
  texts = [json.loads(line)["prompt"] for line in prompts.read_text().splitlines()]
  assert len(texts) == 4
  out = tmp_path / "answers"
  r = run("make_target_corpus.py", "--tiny", "--prompts-file", str(prompts), "--skip-prompts", "1", "--out", str(out))
  assert r.returncode == 0, r.stderr[-2000:]
  ids, mask, _, _ = load_answer_shards(str(out), heldout_every=10**6)
  pipe = api.load(draft=None)
  got = sorted(texts[1:], key=lambda t: len(pipe.encode_prompt(t)))  # the first was skipped
  want = sum((pipe.encode_prompt(t) for t in got), [])
  assert ids[mask == 0][:len(pipe.encode_prompt(got[0]))].tolist() == pipe.encode_prompt(got[0])
  assert (mask == 0).sum() == len(want) + 3 and (mask == 1).sum() <= 3 * 5  # prompt + "\n"; <= 4 tokens + end
  assert json.loads((out / "manifest.json").read_text())["source"] == f"prompt file {prompts}"
  r = run("make_target_corpus.py", "--prompts-file", str(prompts), "--skip-prompts", "4", "--out", str(out))
  assert r.returncode == 2 and "no prompts left" in r.stderr and "Traceback" not in r.stderr
  r = run("make_target_corpus.py", "--prompts-file", str(tmp_path / "missing.jsonl"), "--out", str(out))
  assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """make_target_corpus.py, then train_draft.py on ShareGPT mixed with that corpus, then a resume; returns
  (tmp dir, work dir, exported draft, the first run's stderr)."""
  import numpy as np

  from ssd_jax.training.draft_data import load_answer_shards
  tmp_path = tmp_path_factory.mktemp("train_draft")
  work, out = tmp_path / "work", tmp_path / "draft"
  r = run("make_target_corpus.py", "--tiny", "--out", str(work / "target_answers"))
  assert r.returncode == 0, r.stderr[-2000:]
  ids, mask, _, _ = load_answer_shards(str(work / "target_answers"), heldout_every=10**6)
  assert len(ids) == len(mask) and 0 < mask.sum() < len(mask)
  # Every answer closes its turn: the last masked token of each answer run is <|im_end|>.
  ends = np.flatnonzero((mask[:-1] == 1) & (mask[1:] == 0))
  assert len(ends) == 3 and (ids[ends] == 2).all()
  r = run("train_draft.py", "--tiny", "--work-dir", str(work), "--out", str(out), "--max-conversations", "20",
          "--corpus-mix", "0.5")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "target-answer corpus" in r.stderr and "held-out agreement" in r.stderr
  first_err = r.stderr
  extra = json.loads((out / "extra.json").read_text())
  assert extra["train_tokens"] > 0 and 0 <= extra["heldout_agreement"] <= 1 and extra["corpus_mix"] == 0.5
  r = run("train_draft.py", "--tiny", "--work-dir", str(work), "--out", str(out), "--max-conversations", "20",
          "--corpus-mix", "0.5", "--steps", "4")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "resumed from step 3" in r.stderr
  return tmp_path, work, out, first_err


@pytest.mark.slow
def test_target_corpus_then_training_and_resume(trained):
  """The fixture's runs (corpus, training, resume) passed their checks; the export loads with its tokenizer."""
  from ssd_jax.models import checkpoints
  _, _, out, _ = trained
  cfg, _, tok = checkpoints.load_model(str(out))
  assert cfg.head_vocab == 512 and tok is not None


@pytest.mark.slow
def test_training_continues_from_a_draft_and_grows_it(trained):
  """--init-from with distillation adds to the draft's tokens; --grow-layers / --grow-head train on and resume."""
  import numpy as np

  from ssd_jax.models import checkpoints
  tmp_path, _, out, _ = trained
  cfg, params, _ = checkpoints.load_model(str(out))
  # Continue training that draft with distillation, in a new work dir: its tokens add to the ones it had.
  prior = json.loads((out / "extra.json").read_text())["train_tokens"]
  out2 = tmp_path / "draft2"
  r = run("train_draft.py", "--tiny", "--work-dir", str(tmp_path / "work2"), "--out", str(out2),
          "--max-conversations", "20", "--target-corpus", "none", "--init-from", str(out), "--distill-weight", "0.5")
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"trained on {prior:,} tokens before" in r.stderr
  extra2 = json.loads((out2 / "extra.json").read_text())
  assert extra2["init_train_tokens"] == prior and extra2["train_tokens"] == prior + 3 * 2 * 32
  assert extra2["init_extra"] == json.loads((out / "extra.json").read_text())  # the chain describes itself
  cfg2, params2, _ = checkpoints.load_model(str(out2))
  assert cfg2 == cfg and (np.asarray(params2["head_ids"]) == np.asarray(params["head_ids"])).all()
  assert not np.allclose(np.asarray(params2["embed"]), np.asarray(params["embed"]))  # it trained
  # Grow that draft (deeper, then wider) and train on, then resume the grown run.
  def grown_args(tag, *flags):  # a run from `out` in its own work dir and export
    return ["--tiny", "--work-dir", str(tmp_path / f"work_{tag}"), "--out", str(tmp_path / f"d{tag}"),
            "--max-conversations", "20", "--target-corpus", "none", "--init-from", str(out), *flags]

  def grown_run(tag, *flags, says):
    r = run("train_draft.py", *grown_args(tag, *flags))
    assert r.returncode == 0, r.stderr[-2000:]
    assert says in r.stderr
    cfg_x, params_x, _ = checkpoints.load_model(str(tmp_path / f"d{tag}"))
    extra_x = json.loads((tmp_path / f"d{tag}" / "extra.json").read_text())
    r = run("train_draft.py", *grown_args(tag, *flags), "--steps", "4")
    assert r.returncode == 0 and "resumed from step 3" in r.stderr, r.stderr[-2000:]
    return cfg_x, params_x, extra_x

  # Deepen it (1 layer -> 2).
  cfg_g, params_g, extra_g = grown_run("g", "--grow-layers", "1", says="grown from 1 to 2 layers")
  assert cfg_g.n_layers == 2 and len(params_g["layers"]) == 2
  assert extra_g["grown"] == "from 1 to 2 layers (--grow-layers)"
  # Widen its head (512 -> 520 tokens): the old rows keep their tokens.
  cfg_h, params_h, extra_h = grown_run("h", "--grow-head", "8", says="head grown from 512 to 520 tokens")
  assert cfg_h.head_vocab == 520 and set(np.asarray(params["head_ids"]).tolist()) < set(
      np.asarray(params_h["head_ids"]).tolist())
  assert extra_h["grown_head"] == "from 512 to 520 tokens (--grow-head)"
  for bad, msg in ((["--init-from", str(out), "--grow-layers", "2"], "--grow-layers must be in [1, 1]"),
                   (["--grow-layers", "1"], "without --init-from"), (["--grow-head", "4"], "without --init-from")):
    r = run("train_draft.py", "--tiny", "--work-dir", str(tmp_path / "work_b"), "--out", str(tmp_path / "db"),
            "--max-conversations", "20", "--target-corpus", "none", *bad)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
  r = run("train_draft.py", "--tiny", "--work-dir", str(tmp_path / "work3"), "--out", str(tmp_path / "d3"),
          "--init-from", str(tmp_path / "missing"))
  assert r.returncode == 2 and "not an ssd-jax checkpoint" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_training_reads_several_corpora_and_whole_examples(trained):
  """Two corpus directories are read as one; --whole-examples packs them; a missing directory is named."""
  import re
  import shutil
  tmp_path, work, out, first_err = trained
  # Two corpus directories are read as one (here the same shards twice: twice the answer tokens).
  n_one = int(re.search(r"target-answer corpus .*?: ([\d,]+) answer tokens", first_err).group(1).replace(",", ""))
  shutil.copytree(work / "target_answers", tmp_path / "answers_copy")
  both = f"{work / 'target_answers'},{tmp_path / 'answers_copy'}"
  r = run("train_draft.py", "--tiny", "--work-dir", str(tmp_path / "work4"), "--out", str(tmp_path / "d4"),
          "--max-conversations", "20", "--target-corpus", both, "--steps", "1")
  assert r.returncode == 0, r.stderr[-2000:]
  assert f": {2 * n_one:,} answer tokens for training" in r.stderr, r.stderr[-2000:]
  assert json.loads((tmp_path / "d4" / "extra.json").read_text())["target_windows"] == "every 32 tokens of the stream"
  # --whole-examples: windows of whole prompt-and-answer examples; the export says so.
  r = run("train_draft.py", "--tiny", "--work-dir", str(tmp_path / "work7"), "--out", str(tmp_path / "d7"),
          "--max-conversations", "20", "--target-corpus", both, "--corpus-mix", "1", "--whole-examples", "--steps", "1")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "whole prompt-and-answer" in json.loads((tmp_path / "d7" / "extra.json").read_text())["target_windows"]
  r = run("train_draft.py", "--tiny", "--work-dir", str(work), "--out", str(out), "--target-corpus",
          f"{work / 'target_answers'},{tmp_path / 'missing'}")
  assert r.returncode == 2 and f"no target-answer corpus at {tmp_path / 'missing'} " in r.stderr


@pytest.mark.slow
def test_cached_teacher_is_built_once_and_shared(trained):
  """--teacher-top-k: built once under the work dir, read again (not recomputed) by a resume, shared by a later
  stage through --teacher-cache-dir; its preconditions fail in one line."""
  import re
  tmp_path, work, _, _ = trained
  cached = ["--tiny", "--work-dir", str(tmp_path / "work5"), "--out", str(tmp_path / "d5"), "--max-conversations",
            "20", "--target-corpus", str(work / "target_answers"), "--corpus-mix", "1", "--distill-weight", "0.5",
            "--teacher-top-k", "8"]
  r = run("train_draft.py", *cached)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "teacher cache: the target's top-8" in r.stderr and "of its probability on answer tokens" in r.stderr
  kept = float(re.search(r"top-8 from .*?, ([\d.]+) of its probability", r.stderr).group(1))
  assert 0 < kept <= 1.001 and re.search(r"windows in \d+ s", r.stderr) and re.search(r"2 steps in \d+ s", r.stderr)
  assert json.loads((tmp_path / "d5" / "extra.json").read_text())["train_config"]["teacher_top_k"] == 8
  r = run("train_draft.py", *cached, "--steps", "4")
  assert r.returncode == 0 and "resumed from step 3" in r.stderr and "teacher cache:" not in r.stderr
  # A later stage in another work dir shares that cache through --teacher-cache-dir.
  shared = [*cached[:2], str(tmp_path / "work6"), *cached[3:], "--teacher-cache-dir",
            str(tmp_path / "work5" / "teacher_cache")]
  r = run("train_draft.py", *shared, "--steps", "1")
  assert r.returncode == 0 and "teacher cache:" not in r.stderr and str(tmp_path / "work5") in r.stderr
  for bad, msg in ((["--corpus-mix", "0.5"], "--corpus-mix 1"), (["--teacher-top-k", "513"], "[1, 512]"),
                   (["--target-corpus", "none"], "there is none"),
                   (["--target-corpus", "none", "--distill-weight", "0", "--teacher-top-k", "0", "--whole-examples"],
                    "--whole-examples packs the target-answer corpus")):
    r = run("train_draft.py", *cached, "--fresh", *bad)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_answer_shards_heldout_rule_is_stable(tmp_path):
  import numpy as np

  from ssd_jax.training.draft_data import load_answer_shards
  for b in (0, 1, 2, 3, 4):
    np.savez(tmp_path / f"shard_{b:05d}.npz", ids=np.full(3, b, np.uint16), mask=np.ones(3, np.uint8))
  np.savez(tmp_path / "shard_00005.tmp.npz", ids=np.zeros(3, np.uint16), mask=np.ones(3, np.uint8))  # in flight
  ids, _, hids, _ = load_answer_shards(str(tmp_path), heldout_every=2, heldout_offset=1)
  assert sorted(set(ids.tolist())) == [0, 2, 4] and sorted(set(hids.tolist())) == [1, 3]


@pytest.mark.slow
def test_eval_draft_scores_the_shipped_draft_and_reuses_answers(tmp_path):
  """eval_draft.py on one GSM8K prompt: alphas are probabilities, E[tokens] follows them, answers are reused."""
  answers, out = tmp_path / "answers.json", tmp_path / "eval.json"
  args = ("--datasets", "gsm8k", "--num-prompts", "1", "--max-new-tokens", "12", "--answers", str(answers),
          "--json-out", str(out))
  r = run("eval_draft.py", *args)
  assert r.returncode == 0, r.stderr[-2000:]
  rep = json.loads(out.read_text())
  s = rep["sets"]["gsm8k"]
  assert 0 < s["positions"] <= 12 and 0 <= s["alpha_greedy"] <= 1 and 0 <= s["alpha_t1"] <= 1
  a = s["alpha_greedy"]
  assert s["expected_tokens_greedy"]["4"] == pytest.approx(sum(a ** i for i in range(5)))
  assert len(json.loads(answers.read_text())["gsm8k"]["answers"][0]) == s["positions"]
  for k in ("1", "2", "8"):  # rounds replayed from the ranks: every answer token is emitted by some round
    x = s["replayed_greedy"][k]
    assert x["tokens_per_forward"] == pytest.approx(s["positions"] / x["rounds"])
    assert 1 <= x["tokens_per_forward"] <= int(k) + 1 and 0 <= x["acceptance"] <= 1
  assert rep["pooled_replayed_greedy"] == s["replayed_greedy"]  # one set: pooled is that set
  c = rep["cost"]
  assert c["draft_step_ms"] > 0 and c["target_step_ms"] > 0
  assert c["draft_over_target_time"] == pytest.approx(c["draft_step_ms"] / c["target_step_ms"])
  assert c["target_macs_per_token"] == 134_479_872  # SmolLM2-135M: 30 layers' matrices + the 49,152-row head
  r = run("eval_draft.py", *args)
  assert r.returncode == 0 and "the target's answers from" in r.stderr
  assert json.loads(out.read_text())["sets"]["gsm8k"] == s  # same answers, same scores
  r = run("eval_draft.py", *args, "--fan-out-strategy", "geometric")  # the shipped draft's calibration
  assert r.returncode == 0, r.stderr[-2000:]
  g = json.loads(out.read_text())["sets"]["gsm8k"]["replayed_greedy"]
  for k in ("2", "8"):
    assert sum(g[k]["fan_out"]) == 3 * (int(k) + 1) and s["replayed_greedy"][k]["fan_out"] == [3] * (int(k) + 1)
    same = ("tokens_per_forward", "acceptance", "rounds")  # the fan-out changes hits, not rounds
    assert {x: g[k][x] for x in same} == {x: s["replayed_greedy"][k][x] for x in same}
  r = run("eval_draft.py", "--num-prompts", "0")
  assert r.returncode == 2 and "Traceback" not in r.stderr


def test_a_signal_python_drops_in_a_weakref_callback_still_stops_the_run(capfd):
  """Ctrl-C that lands while a weak-reference callback runs (the program cache forgets dead arrays in one) raises
  where Python drops it ("Exception ignored"): Interrupts keeps it, check() raises it with Ctrl-C's exit code, and
  the dropped report is not printed. It once let a run go on to its end and exit 0 (a CI run, 2026-12-08)."""
  import signal
  import weakref

  from ssd_jax.cli_util import Interrupted, Interrupts

  class Thing:
    pass

  def callback(_):
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10_000):  # the handler runs here, in the callback
      pass

  # Python's own Ctrl-C handler, as a command has it: an xdist worker starts with SIGINT ignored, which Interrupts
  # would keep ignored
  outer = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    with Interrupts() as stop:
      thing = Thing()
      ref = weakref.ref(thing, callback)
      del thing  # the callback runs; the exception raised in it is dropped on the way
      assert ref() is None and stop.code == 130
      with pytest.raises(Interrupted) as e:
        stop.check()
      assert e.value.code == 130
    assert "Exception ignored" not in capfd.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    with Interrupts() as stop:
      stop.check()  # nothing came: nothing raised
  finally:
    signal.signal(signal.SIGINT, outer)
