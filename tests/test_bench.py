"""scripts/bench.py (ssd_jax/cli/bench.py): a tiny-pair smoke run (JSON schema, figures recomputed from the runs),
the summary arithmetic, sweeps, plots, and the Hugging Face export of a reduced-vocabulary draft."""
import importlib.util
import json
import math
import os
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from commands import run_script

from ssd_jax.bench import plan
from ssd_jax.cli_util import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bench():
  from ssd_jax.cli import bench
  return bench


@pytest.fixture(scope="module")
def smoke(bench, tmp_path_factory):
  """One tiny-pair bench run of AR, SD and SSD over two prompts; returns (result JSON, out dir, stdout)."""
  tmp = tmp_path_factory.mktemp("bench")
  prompts = tmp / "tiny.jsonl"
  prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["Say hi.", "What is 3+4?"]) + "\n")
  out = tmp / "out"
  import contextlib
  import io
  buf = io.StringIO()
  with contextlib.redirect_stdout(buf):
    code = bench.main(["--tiny", "--prompts", str(prompts), "--num-prompts", "2", "--max-new-tokens", "8",
                       "--k", "2", "--fan-out", "2", "--out-dir", str(out)])
  assert code == 0
  return json.loads((out / "bench.json").read_text()), out, buf.getvalue()


def test_smoke_schema(smoke):
  res, out, stdout = smoke
  assert res["schema"] == plan.SCHEMA
  for key in ("environment", "args", "datasets", "variants", "warmup", "runs", "summary", "peak_rss_mb"):
    assert key in res
  assert res["datasets"] == ["tiny"]
  assert [v["label"] for v in res["variants"]] == ["ar", "sd", "ssd"]
  assert set(res["warmup"]) == {"ar", "sd", "ssd"}
  assert all(w["compile_seconds"] > 0 for w in res["warmup"].values())  # compiled in the warm-up, not the runs
  assert len(res["runs"]) == 6  # 2 prompts x 3 modes, interleaved prompt by prompt
  assert [r["mode"] for r in res["runs"]] == ["ar", "sd", "ssd"] * 2
  for r in res["runs"]:
    for key in ("dataset", "variant", "prompt_indices", "batch_size", "decode_tokens", "decode_seconds",
                "new_tokens", "target_forwards", "prefill_seconds", "compile_seconds", "rows"):
      assert key in r
    assert r["compile_seconds"] == 0  # nothing left to compile after the warm-up
    (row,) = r["rows"]
    assert len(row["token_ids"]) == 8 and row["stats"]["new_tokens"] == 8
  for lab in ("ar", "sd", "ssd"):
    for d in ("tiny", "all"):
      assert res["summary"]["by_variant"][lab][d]["tokens_per_second"] > 0
  ssd = res["summary"]["by_variant"]["ssd"]["all"]
  assert 0 <= ssd["cache_hit_rate"] <= 1 and 0 <= ssd["target_idle_fraction"] <= 1
  for lab in ("sd", "ssd"):
    assert res["summary"]["by_variant"][lab]["all"]["predicted"]["tokens_per_second"] > 0
  # Greedy SD and SSD reproduce greedy AR.
  for name in ("sd vs ar", "ssd vs ar"):
    rep = res["summary"]["greedy_agreement"][name]
    assert rep["prompts"] == 2 and rep["identical"] == 2
  assert (out / "bench.md").exists() and "| tiny |" in stdout
  assert stdout.count("plots skipped") + stdout.count("plots:") == 1


def test_smoke_figures_are_recomputable_from_the_runs(smoke):
  """Every throughput and ratio equals what the measured times and token counts in the same file give."""
  res, _, _ = smoke
  runs = res["runs"]
  for r in runs:
    assert r["decode_tokens"] == sum(row["stats"]["new_tokens"] - 1 for row in r["rows"])
    assert r["decode_seconds"] == max(row["stats"]["decode_seconds"] for row in r["rows"])
  tps = {}
  for lab in ("ar", "sd", "ssd"):
    mine = [r for r in runs if r["variant"] == lab]
    tps[lab] = sum(r["decode_tokens"] for r in mine) / sum(r["decode_seconds"] for r in mine)
    fig = res["summary"]["by_variant"][lab]["all"]
    assert math.isclose(fig["tokens_per_second"], tps[lab], rel_tol=1e-9)
    assert math.isclose(fig["tokens_per_target_forward"], sum(r["new_tokens"] for r in mine)
                        / sum(r["target_forwards"] for r in mine), rel_tol=1e-9)
  ratios = res["summary"]["ratios"]
  assert set(ratios) == {"sd/ar", "ssd/sd", "ssd/ar"}
  for name, per in ratios.items():
    a, b = name.split("/")
    assert math.isclose(per["all"], tps[a] / tps[b], rel_tol=1e-9)
    assert math.isclose(per["tiny"], per["all"], rel_tol=1e-9)  # one dataset: the same runs


def test_bad_input_fails_before_loading(bench):
  for argv, msg in ((["--modes", "ar,nonsense"], "unknown mode"), (["--batch-size", "0"], "batch_size must be >= 1"),
                    (["--peer", "hf", "--batch-size", "2"], "batch size 1"),
                    (["--sweep", "batch", "--num-prompts", "2"], "--num-prompts >= 8"),
                    (["--sweep-values", "1,2"], "needs --sweep"),
                    (["--temperature", "inf"], "finite number"), (["--temperature", "nan"], "finite number"),
                    (["--seed", str(2**63)], r"seed must be an integer in \[-2\^63, 2\^63\)"),
                    (["--tiny", "--sweep", "temperature", "--sweep-values", "0,nan"], "finite number")):
    with pytest.raises((UsageError, ValueError), match=msg):  # ValueError: an options object's own check
      bench.main(argv)
  if importlib.util.find_spec("torch") is None:  # CI: the peer extra is never installed there
    with pytest.raises(UsageError, match=r"pip install -e \"\.\[peer\]\""):
      bench.main(["--peer", "hf"])


def _fake_run(dataset, variant, tokens, seconds, forwards, index=0, extra=None, token_ids=None):
  stats = {"new_tokens": tokens + 1, "decode_seconds": seconds, "target_forwards": forwards,
           "prefill_seconds": 0.1, **(extra or {})}
  return plan.run_record(dataset, variant, [index], [{"token_ids": token_ids or [1, 2, 3], "stats": stats}])


def test_summary_is_a_ratio_of_sums_and_ratios_follow():
  vs = plan.make_variants(["ar", "sd"], {"temperature": 0.0, "k": 2})
  ar, sd = vs
  runs = [_fake_run("a", ar, 10, 1.0, 11), _fake_run("a", sd, 12, 1.0, 7), _fake_run("b", ar, 30, 2.0, 31, 1),
          _fake_run("b", sd, 30, 1.0, 16, 1, token_ids=[1, 2, 4])]
  s = plan.summarize(runs, vs, ["a", "b"])
  assert s["by_variant"]["ar"]["all"]["tokens_per_second"] == pytest.approx(40 / 3)
  assert s["by_variant"]["sd"]["all"]["tokens_per_second"] == pytest.approx(42 / 2)
  assert s["by_variant"]["sd"]["all"]["median_run_tokens_per_second"] == pytest.approx(21)
  assert s["ratios"]["sd/ar"] == pytest.approx({"a": 1.2, "b": 2.0, "all": 21 / (40 / 3)})
  assert s["by_variant"]["sd"]["b"]["tokens_per_target_forward"] == pytest.approx(31 / 16)
  rep = s["greedy_agreement"]["sd vs ar"]
  assert rep["identical"] == 1 and rep["divergences"] == [{"dataset": "b", "prompt_index": 1,
                                                           "first_differing_token": 2}]


def test_timing_model_uses_per_token_acceptance():
  """SD at K=2 with i.i.d. acceptance 0.5: 2 rounds accept 0, 1 accepts 1, 1 accepts 2 (E[j] = 0.75 = 0.5 + 0.25)."""
  vs = plan.make_variants(["sd"], {"temperature": 0.0, "k": 2})
  stats = {"k": 2, "rounds": 4, "acceptance_rate": 3 / 8, "drafts_tried": 6, "drafts_accepted": 3,
           "verify_seconds": 0.4, "draft_seconds": 0.08}
  pred = plan.predict([_fake_run("a", vs[0], 7, 0.5, 5, extra=stats)], "sd")
  assert pred["per_token_acceptance"] == 0.5 and pred["acceptance"] == 3 / 8
  assert plan.summarize_runs([_fake_run("a", vs[0], 7, 0.5, 5, extra=stats)])["per_token_acceptance"] == 0.5
  assert pred["expected_tokens_per_round"] == pytest.approx(1.75)  # measured: 7 tokens in 4 rounds
  # one verify 0.1 s, two draft steps 0.01 s each: 1.75 tokens per 0.12 s
  assert pred["tokens_per_second"] == pytest.approx(1.75 / 0.12)
  del stats["drafts_tried"], stats["drafts_accepted"]  # an older result file: the per-round rate stands in
  assert plan.predict([_fake_run("a", vs[0], 7, 0.5, 5, extra=stats)], "sd")["per_token_acceptance"] == 3 / 8


def test_sweep_variants_and_baselines():
  base = {"k": 2, "fan_out": "3", "temperature": 0.0, "batch_size": 1, "saguaro_c": 1.0}
  vs = plan.make_variants(["ar", "sd", "ssd"], base, "k", ["1", "3"])
  assert [v.label for v in vs] == ["ar", "sd@k=1", "sd@k=3", "ssd@k=1", "ssd@k=3"]
  assert vs[3].opts["k"] == 1 and vs[3].opts["fan_out"] == "3"
  assert plan.baseline_of(vs[4], "sd", vs).label == "sd@k=3"  # both swept: the same value
  assert plan.baseline_of(vs[4], "ar", vs).label == "ar"      # AR does not depend on K
  with pytest.raises(ValueError, match="unknown sweep"):
    plan.make_variants(["ar"], base, "nonsense")
  # --sweep cores: AR and SD on the first N cores and on all of them; SSD keeps its own placement.
  vs = plan.make_variants(["ar", "ssd"], dict(base, cores="all"), "cores", ["1", "all"])
  assert [(v.label, v.opts["cores"]) for v in vs] == [("ar@cores=1", "1"), ("ar@cores=all", "all"), ("ssd", "all")]
  for bad in ("0", "two"):
    with pytest.raises(ValueError, match="cores value"):
      plan.make_variants(["ar"], base, "cores", [bad])


def _fan_out_sweep_result():
  """A synthetic fan-out sweep whose SSD miss rate follows 0.6 F^-0.5 exactly."""
  base = {"k": 2, "fan_out": "3", "temperature": 0.0, "batch_size": 1, "saguaro_c": 1.0, "backup": "neural"}
  vs = plan.make_variants(["ar", "ssd"], base, "fan-out", ["1", "2", "4", "8"])
  runs = [_fake_run("a", vs[0], 10, 1.0, 11)]
  for v in vs[1:]:
    f = int(v.opts["fan_out"])
    stats = {"k": 2, "rounds": 11, "acceptance_rate": 0.3, "cache_hit_rate": 1 - 0.6 * f ** -0.5,
             "target_idle_seconds": 0.1, "draft_wait_seconds": 0.2, "verify_seconds": 0.5,
             "neural_backup_seconds": 0.1, "backups_used": {"neural": 4}, "backup": "neural"}
    runs.append(_fake_run("a", v, 12, 1.0 + f / 10, 10, extra=stats))
  result = {"args": {"sweep": "fan-out", "max_new_tokens": 13, "temperature": 0.0}, "datasets": ["a"],
            "variants": [{"label": v.label, "mode": v.mode, "options": v.opts, "sweep_value": v.sweep_value}
                         for v in vs], "runs": runs}
  result["summary"] = plan.summarize(runs, vs, ["a"])
  return result


def test_fan_out_sweep_fits_the_power_law():
  result = _fan_out_sweep_result()
  fit = plan.fan_out_fit(result)
  assert fit["r"] == pytest.approx(0.5) and fit["c"] == pytest.approx(0.6) and fit["points"] == 4
  series = plan.sweep_series(result)
  assert [p[0] for p in series["ssd"]] == [1, 2, 4, 8]
  pred = result["summary"]["by_variant"]["ssd@fan-out=4"]["all"]["predicted"]
  assert pred["t_primary"] == pytest.approx(1 + 0.2 / 11 / (0.5 / 11))
  assert "SSD miss rate against fan-out" in plan.markdown(dict(result, fan_out_fit=fit))


def test_plots_from_a_sweep(tmp_path):
  pytest.importorskip("matplotlib")
  from ssd_jax.bench import plots
  result = _fan_out_sweep_result()
  paths = plots.write_plots(result, str(tmp_path))
  names = sorted(os.path.basename(p) for p in paths)
  assert names == ["hit_rate_vs_fan_out.png", "predicted_vs_measured.png", "speed_by_dataset.png",
                   "speed_vs_fan-out.png"]
  assert all(os.path.getsize(p) > 1000 for p in paths)


@pytest.mark.parametrize("field", [dict(qk_norm=True), dict(attn_bias=True)])
def test_hf_export_refuses_what_a_plain_llama_config_cannot_say(field):
  from ssd_jax.bench import hf_export
  from ssd_jax.models.config import tiny_config
  with pytest.raises(ValueError, match="cannot export"):
    hf_export.hf_config(tiny_config(**field), tied=True)


def test_hf_export_of_a_reduced_vocabulary_draft(tmp_path):
  """The exported draft gives our logits on its own tokens and never prefers another token under greedy argmax."""
  from ssd_jax import api
  from ssd_jax.bench import hf_export
  from ssd_jax.models import model, model_files
  pipe = api.load_tiny()
  d = pipe.draft
  info = hf_export.export_llama(d.params, d.cfg, str(tmp_path), tokenizer=pipe.tokenizer.tok, eos_id=2)
  assert info["expanded"] and info["greedy_exact"] and info["fill_token"] == 0
  hf = json.loads((tmp_path / "config.json").read_text())
  assert hf["model_type"] == "llama" and hf["vocab_size"] == d.cfg.vocab_size and not hf["tie_word_embeddings"]
  cfg, params = model_files.read_hf_safetensors(str(tmp_path), progress=False)  # our reader of HF directories
  assert cfg.head_vocab is None and cfg.vocab_size == d.cfg.vocab_size
  # Text with tokens outside the draft's vocabulary (Latin-1 bytes) as inputs as well.
  toks = jnp.asarray(np.random.default_rng(0).integers(0, d.cfg.vocab_size, (3, 12)), jnp.int32)
  ours = model.forward_full(d.params, toks, d.cfg)      # [B, T, head_vocab]
  full = model.forward_full(jax.device_put(params), toks, cfg)  # [B, T, V]
  head_ids = np.asarray(d.params["head_ids"])
  np.testing.assert_allclose(np.asarray(full)[..., head_ids], np.asarray(ours), rtol=1e-5, atol=1e-5)
  unknown = np.setdiff1d(np.arange(d.cfg.vocab_size), head_ids)
  np.testing.assert_array_equal(np.asarray(full)[..., unknown], np.asarray(full)[..., :1].repeat(unknown.size, -1))
  ours_greedy = head_ids[np.asarray(jnp.argmax(ours, -1))]
  np.testing.assert_array_equal(np.asarray(jnp.argmax(full, -1)), ours_greedy)


def test_hf_peer_greedy_equals_ours(tmp_path):
  """transformers' AR and assisted generation on the exported tiny pair give our greedy tokens (needs torch)."""
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from ssd_jax import api
  from ssd_jax.bench import hf_export
  from ssd_jax.bench.hf_peer import HFPeer
  pipe = api.load_tiny()
  for name, m in (("t", pipe.target), ("d", pipe.draft)):
    hf_export.export_llama(m.params, m.cfg, str(tmp_path / name), eos_id=2)
  peer = HFPeer(str(tmp_path / "t"), str(tmp_path / "d"), threads=1)
  ids = pipe.encode_prompt("Say hi.")
  want = pipe.generate_ids([ids], mode="ar", max_new_tokens=10, ignore_eos=True)[0].token_ids
  for mode in ("hf-ar", "hf-sd"):
    got, stats = peer.generate(ids, mode, 10, k=2)
    assert got == want, mode
    assert stats["new_tokens"] == 10 and stats["target_forwards"] >= 1


def test_pipeline_keeps_one_decoder_per_ssd_placement():
  """The bench switches pipe.ssd_placement between variants: each placement must get its own decoder."""
  from ssd_jax import api
  pipe = api.load_tiny()
  pipe.ssd_placement = "devices"
  on_devices = pipe.decoder("ssd", pipe.spec_options(k=2, fan_out=2))
  pipe.ssd_placement = "processes"
  in_processes = pipe.decoder("ssd", pipe.spec_options(k=2, fan_out=2))
  assert not on_devices.draft.remote and in_processes.draft.remote
  pipe.ssd_placement = "devices"
  assert pipe.decoder("ssd", pipe.spec_options(k=2, fan_out=2)) is on_devices


def test_pipeline_runs_its_default_mode_when_none_is_given(monkeypatch):
  """generate() without a mode runs `default_mode` (defaults.default_mode: the fastest measured on the backend, AR
  without a draft); same tokens as AR."""
  from ssd_jax import api, defaults
  pipe = api.load_tiny()
  monkeypatch.setitem(defaults.FASTEST_MEASURED, "cpu", "sd")  # as if SD had measured fastest here
  assert pipe.default_mode == "sd"
  g = pipe.generate("Say hi.", max_new_tokens=6, ignore_eos=True, k=2)[0]
  assert g.stats["mode"] == "sd" and "acceptance_rate" in g.stats
  ar = pipe.generate("Say hi.", mode="ar", max_new_tokens=6, ignore_eos=True)[0]
  assert g.token_ids == ar.token_ids
  pipe.draft = None
  assert pipe.default_mode == "ar"
  assert pipe.generate("Say hi.", max_new_tokens=3)[0].stats["mode"] == "ar"


def test_step_cost_counts_every_weight_matrix_and_times_a_step():
  from ssd_jax.models import model
  from ssd_jax.models.config import ModelConfig
  from ssd_jax.bench.step_cost import compiled_step, interleaved_ms, macs_per_token
  for head_vocab in (None, 40):
    cfg = ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=24,
                      head_vocab=head_vocab, tie_embeddings=True, max_seq_len=128)
    params = model.init_params(jax.random.key(0), cfg)
    # One multiply-accumulate per weight of every matrix a token goes through: the layers' and the (tied) head's.
    matrices = sum(int(np.prod(w.shape)) for lp in params["layers"] for w in lp.values() if w.ndim == 2)
    assert macs_per_token(cfg) == matrices + params["embed"].shape[0] * cfg.d_model
  run = compiled_step(cfg, params, tokens=2, prefix=10, cache_len=32)
  ms = interleaved_ms({"a": run, "b": compiled_step(cfg, params)}, repeats=3)
  assert set(ms) == {"a", "b"} and all(v > 0 for v in ms.values())
  with pytest.raises(ValueError, match="must fit"):
    compiled_step(cfg, params, tokens=4, prefix=30, cache_len=32)


def test_verify_cost_table_on_the_tiny_target(bench, tmp_path, capsys):
  out = tmp_path / "cost.json"
  assert bench.main(["--tiny", "--verify-cost", "--json-out", str(out)]) == 0
  full = json.loads(out.read_text())
  assert full["cpu"] and list(full["formats"]) == ["full"]  # per weight format; the tiny target has only float32
  res = full["formats"]["full"]
  table = res["verify_cost_ms"]
  assert sorted(int(t) for t in table) == list(range(1, 10)) and all(ms > 0 for ms in table.values())
  assert res["weight_bytes"] > 0
  for t, ms in table.items():  # the achieved bandwidth is the weights read over the time taken
    assert res["weights_gbs"][t] == pytest.approx(res["weight_bytes"] / ms / 1e6)
  out = capsys.readouterr().out
  assert "| 9 |" in out and "MB read per forward" in out


def _batch_sweep_result() -> dict:
  """A batch sweep's result as bench.py writes it, reduced to what the plots read: AR and SD at batch 1, 4, 16."""
  tps = {("ar", 1): 25.0, ("ar", 4): 80.0, ("ar", 16): 200.0, ("sd", 1): 35.0, ("sd", 4): 90.0, ("sd", 16): 180.0}
  variants = [{"label": f"{m}@batch={b}", "mode": m, "sweep_value": str(b), "options": {"batch_size": str(b)}}
              for m, b in tps]
  by_variant = {f"{m}@batch={b}": {"all": {"tokens_per_second": t}} for (m, b), t in tps.items()}
  return {"args": {"sweep": "batch"}, "variants": variants, "summary": {"by_variant": by_variant}}


def test_batch_sweep_plots(tmp_path):
  """A batch sweep draws the frontier (per-row against whole-batch tokens a second) and the speedup over AR by batch
  size; other sweeps draw neither."""
  pytest.importorskip("matplotlib")
  from ssd_jax.bench import plots
  result = _batch_sweep_result()
  assert plan.sweep_series(result)["sd"] == [(1, 35.0, None), (4, 90.0, None), (16, 180.0, None)]
  for fn in (plots.batch_frontier, plots.speedup_vs_batch):
    path = str(tmp_path / f"{fn.__name__}.png")
    assert fn(result, path) and os.path.getsize(path) > 1000
    assert not fn(_fan_out_sweep_result(), str(tmp_path / "no.png"))
  assert not os.path.exists(tmp_path / "no.png")


def test_backups_make_one_ssd_series_each():
  base = {"k": 2, "fan_out": "3", "temperature": 0.0, "batch_size": 1, "saguaro_c": 1.0, "backup": "neural"}
  vs = plan.make_variants(["ar", "sd", "ssd"], base, "batch", ["1", "4"], backups=["neural", "fast", "auto"])
  assert [v.label for v in vs] == ["ar@batch=1", "ar@batch=4", "sd@batch=1", "sd@batch=4",
                                   "ssd-neural@batch=1", "ssd-neural@batch=4", "ssd-fast@batch=1", "ssd-fast@batch=4",
                                   "ssd-auto@batch=1", "ssd-auto@batch=4"]
  fast4 = vs[7]
  assert fast4.opts["backup"] == "fast" and fast4.opts["batch_size"] == 4 and fast4.series == "ssd-fast"
  assert plan.baseline_of(fast4, "sd", vs).label == "sd@batch=4" and plan.baseline_of(fast4, "ar", vs).label == \
      "ar@batch=4"
  assert [v.label for v in plan.make_variants(["ssd"], base, backups=["fast", "auto"])] == ["ssd-fast", "ssd-auto"]
  with pytest.raises(ValueError, match="give one"):
    plan.make_variants(["ssd"], base, "backup", backups=["fast"])


def _batch_backups_result():
  """A batch sweep of AR, SD and SSD with two backups at batch 1 and 4, with k=auto's notes for SD."""
  tps = {("ar", 1): 20.0, ("ar", 4): 60.0, ("sd", 1): 30.0, ("sd", 4): 66.0, ("ssd-neural", 1): 24.0,
         ("ssd-neural", 4): 33.0, ("ssd-fast", 1): 22.0, ("ssd-fast", 4): 44.0}
  variants = [{"label": f"{s}@batch={b}", "mode": s.split("-")[0], "series": s, "sweep_value": f"batch={b}",
               "options": {"batch_size": b}} for s, b in tps]
  by_variant = {f"{s}@batch={b}": {"all": {"tokens_per_second": t}} for (s, b), t in tps.items()}
  notes = {"sd@batch=1": [{"batch": 1, "k": 2, "predicted_sd_over_ar": 1.2}, {"batch": 1, "k": 3,
                                                                            "predicted_sd_over_ar": 1.4}],
           "sd@batch=4": [{"batch": 4, "k": 1, "predicted_sd_over_ar": 1.1}]}
  return {"args": {"sweep": "batch"}, "variants": variants, "summary": {"by_variant": by_variant}, "auto_k": notes}


def test_batch_table_with_every_backup_and_the_models_prediction():
  from ssd_jax.bench import by_batch
  result = _batch_backups_result()
  lines = by_batch.markdown(result).splitlines()
  assert lines[0] == ("| batch | ar tok/s | sd tok/s | sd/ar | ssd-fast tok/s | ssd-fast/ar | ssd-fast/sd | "
                      "ssd-neural tok/s | ssd-neural/ar | ssd-neural/sd | sd's K | model sd/ar |")
  assert lines[2] == "| 1 | 20.00 | 30.00 | 1.50x | 22.00 | 1.10x | 0.73x | 24.00 | 1.20x | 0.80x | 2,3 | 1.30x |"
  assert lines[3] == "| 4 | 60.00 | 66.00 | 1.10x | 44.00 | 0.73x | 0.67x | 33.00 | 0.55x | 0.50x | 1 | 1.10x |"
  assert by_batch.markdown(_fan_out_sweep_result()) is None


def test_batch_plots_draw_every_backup_series(tmp_path, monkeypatch):
  pytest.importorskip("matplotlib")
  from ssd_jax.bench import plots
  drawn = {}
  monkeypatch.setattr(plots, "_save", lambda plt, fig, path: drawn.__setitem__(
      os.path.basename(path), sorted(fig.axes[0].get_legend_handles_labels()[1])))
  result = _batch_backups_result()
  assert plots.batch_frontier(result, str(tmp_path / "f.png"))
  assert plots.speedup_vs_batch(result, str(tmp_path / "s.png"))
  assert drawn["f.png"] == ["ar", "sd", "ssd-fast", "ssd-neural"]
  assert drawn["s.png"] == ["sd / ar", "ssd-fast / ar", "ssd-neural / ar"]


def test_backups_flag_is_checked_before_loading(bench):
  for argv, msg in ((["--modes", "ar,sd", "--backups", "fast"], "needs the ssd mode"),
                    (["--backups", "fast,nope"], "unknown backup 'nope'"),
                    (["--backups", "fast", "--sweep", "backup"], "give one")):
    with pytest.raises(UsageError, match=msg):
      bench.main(argv)


def test_batch_table_sets_the_cost_tables_steps_beside_the_runs():
  """An AR run of 4 rows, 40 decode tokens in 0.5 s: 10 steps of 50 ms; an SD run whose 8 verifies took 0.48 s: 60 ms
  each; beside the table's 45 and 70 ms."""
  from ssd_jax.bench import by_batch
  base = {"k": 2, "temperature": 0.0, "batch_size": 4}
  ar, sd = plan.make_variants(["ar", "sd"], base, "batch", ["4"])
  runs = [plan.run_record("a", ar, range(4), [{"token_ids": [1], "stats": {
              "new_tokens": 11, "decode_tokens": 10, "decode_seconds": 0.5, "target_forwards": 11,
              "prefill_seconds": 0.1}}] * 4),
          plan.run_record("a", sd, range(4), [{"token_ids": [1], "stats": {
              "new_tokens": 11, "decode_seconds": 0.9, "target_forwards": 9, "prefill_seconds": 0.1,
              "rounds": 8, "verify_seconds": 0.48}}] * 4)]
  result = {"args": {"sweep": "batch"}, "runs": runs, "summary": plan.summarize(runs, [ar, sd], ["a"]),
            "variants": [{"label": v.label, "mode": v.mode, "series": v.series, "options": v.opts,
                          "sweep_value": v.sweep_value} for v in (ar, sd)],
            "auto_k": {"ar@batch=4": [{"k": 0, "table_ar_ms": 45.0, "predicted_sd_over_ar": 1.0}],
                       "sd@batch=4": [{"k": 2, "table_verify_ms": 70.0, "predicted_sd_over_ar": 1.1}]}}
  assert by_batch.costs_by_batch(result) == {4: pytest.approx((45.0, 50.0, 70.0, 60.0))}
  table = by_batch.markdown(result).splitlines()
  assert table[0].endswith("| sd's K | model sd/ar | AR step ms: table / run | SD verify ms: table / run |")
  assert table[2].endswith("| 2 | 1.10x | 45.0 / 50.0 | 70.0 / 60.0 |")


def test_calibrate_measures_each_mode_and_names_the_default_it_gives(tmp_path):
  """bench.py --tiny --calibrate, as a user runs it: the step costs and each mode's speed at batch 1 (SSD too, its
  draft in its own process on two cores) go to the cache, and the default mode it prints is the fastest of them."""
  env = dict(os.environ, SSD_JAX_STEP_COSTS=str(tmp_path))
  r = run_script("bench.py", "--tiny", "--calibrate", env=env)
  assert r.returncode == 0, r.stderr[-3000:]
  saved = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
  (costs,) = [d for d in saved.values() if "tables" in d]
  speeds, two = costs["modes_tok_s"], len(os.sched_getaffinity(0)) >= 2
  assert speeds.keys() == ({"ar", "sd", "ssd"} if two else {"ar", "sd"}) and min(speeds.values()) > 0
  assert f"the default mode here is now {max(speeds, key=speeds.get)} (" in r.stdout
  # AR on one core and on all (issue 56): for the machine, whatever the models, where it has two cores.
  assert len(saved) == 1 + two
  if two:
    (cores,) = [d["modes_tok_s"] for d in saved.values() if "tables" not in d]
    assert cores.keys() == {"1", "all"} and min(cores.values()) > 0
    assert f"run on {'one core' if cores['1'] > cores['all'] else 'every core'} here" in r.stdout


def test_bench_takes_decode_pys_model_flags_and_hands_them_on(bench, monkeypatch):
  """bench.py loads with decode.py's own model flags (cli_util.add_model_arguments: same names, defaults and
  checks), and hands each to the load and to every variant: the KV cache's dtype, a cut draft head and the draft
  process's timeout once existed in decode.py only."""
  import argparse

  from ssd_jax import api, cli_util
  from ssd_jax.cli import bench_runs
  model = argparse.ArgumentParser()
  cli_util.add_model_arguments(model)
  ours = vars(bench.parse_args([]))
  assert {a.dest: a.default for a in model._actions if a.dest != "help"}.items() <= ours.items()
  args = bench.parse_args(["--kv-dtype", "bfloat16", "--draft-head-vocab", "300", "--draft-timeout", "7",
                           "--ssd-placement", "devices", "--modes", "ar,ssd"])
  seen = {}
  monkeypatch.setattr(api, "load", lambda *a, **kw: seen.update(kw) or SimpleNamespace(draft=object()))
  bench_runs.load_pipe(args, ["ssd"])
  assert (seen["kv_dtype"], seen["draft_head_vocab"], seen["ssd_placement"]) == ("bfloat16", 300, "devices")
  assert {bench_runs.spec_options(v.opts).draft_timeout
          for v in bench.bench_variants(args, bench.check_args(args)) if v.mode == "ssd"} == {7.0}
  with pytest.raises(ValueError, match="KV cache dtype"):
    bench.check_args(bench.parse_args(["--kv-dtype", "int3"]))
  with pytest.raises(UsageError, match="the --tiny pair's draft has its own reduced head"):
    bench.check_args(bench.parse_args(["--tiny", "--draft-head-vocab", "100"]))
  seen.clear()
  monkeypatch.setattr(api, "load_tiny", lambda **kw: seen.update(kw) or SimpleNamespace(draft=object()))
  bench_runs.load_pipe(bench.parse_args(["--tiny", "--kv-dtype", "bfloat16"]), ["sd"])
  assert seen["kv_dtype"] == "bfloat16"
