"""scripts/decode.py and scripts/train_draft.py as a user runs them."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script, *args, timeout=600):
  return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", script), *args], capture_output=True,
                        text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("args,msg", [
    (["--mode", "nonsense"], "unknown --mode"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--prompts", "/nonexistent.jsonl"], "does not exist"),
    (["--temperature", "-1"], "--temperature"),
    (["--mode", "ssd", "--fan-out", "1,2,3"], "K+1 = 2"),  # K is 1 by default
    (["--k", "0"], "--k must be >= 1"),
])
def test_decode_bad_input_one_line_no_traceback(args, msg):
  r = run("decode.py", *args)
  assert r.returncode == 2
  assert msg in r.stderr
  assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


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
  out2 = tmp_path / "ssd.jsonl"
  # No --mode: with the shipped draft loaded the script's default is SSD (without one, AR, as above).
  r = run("decode.py", "--prompt", "Say hi.", "--max-new-tokens", "10", "--json-out", str(out2))
  assert r.returncode == 0, r.stderr
  s = json.loads(out2.read_text())["stats"]
  assert s["mode"] == "ssd" and "cache_hit_rate" in s and "target_idle_seconds" in s
  assert s["devices"]["draft"] not in s["devices"]["target"]  # the script split the CPU: the draft has its own
  r = run("decode.py", "--prompt", "word " * 9000, "--draft", "none")
  assert r.returncode == 2 and "exceeds the context" in r.stderr and "Traceback" not in r.stderr


def test_target_corpus_from_a_prompt_file(tmp_path):
  """make_target_corpus.py --prompts-file answers those prompts (here the synthetic ones), in order of length."""
  from ssd_jax import api, train
  prompts = tmp_path / "p.jsonl"
  r = run("make_synthetic_prompts.py", "--out", str(prompts), "--code", "1", "--math", "1", "--instructions", "2")
  assert r.returncode == 0, r.stderr
  texts = [json.loads(line)["prompt"] for line in prompts.read_text().splitlines()]
  assert len(texts) == 4
  out = tmp_path / "answers"
  r = run("make_target_corpus.py", "--tiny", "--prompts-file", str(prompts), "--skip-prompts", "1", "--out", str(out))
  assert r.returncode == 0, r.stderr[-2000:]
  ids, mask, _, _ = train.load_answer_shards(str(out), heldout_every=10**6)
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


@pytest.mark.slow
def test_target_corpus_then_training_and_resume(tmp_path):
  """make_target_corpus.py, then train_draft.py on ShareGPT mixed with that corpus, then a resume."""
  import re
  import shutil

  import numpy as np

  from ssd_jax import checkpoints, train
  work, out = tmp_path / "work", tmp_path / "draft"
  r = run("make_target_corpus.py", "--tiny", "--out", str(work / "target_answers"))
  assert r.returncode == 0, r.stderr[-2000:]
  ids, mask, _, _ = train.load_answer_shards(str(work / "target_answers"), heldout_every=10**6)
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
  cfg, params, tok = checkpoints.load_model(str(out))
  assert cfg.head_vocab == 512 and tok is not None
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
  # The cached teacher: built once under the work dir, read again (not recomputed) by a resume.
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

  from ssd_jax import train
  for b in (0, 1, 2, 3, 4):
    np.savez(tmp_path / f"shard_{b:05d}.npz", ids=np.full(3, b, np.uint16), mask=np.ones(3, np.uint8))
  np.savez(tmp_path / "shard_00005.tmp.npz", ids=np.zeros(3, np.uint16), mask=np.ones(3, np.uint8))  # in flight
  ids, _, hids, _ = train.load_answer_shards(str(tmp_path), heldout_every=2, heldout_offset=1)
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
