"""The llama.cpp peer (ssd_jax/bench/llamacpp_peer.py, bench.py --peer llamacpp): llama-bench's JSON report parsed
from recorded real output, the command lines built, and one-line errors when the binary is missing or fails. No test
needs llama-bench: a shell script stands in for it where one must run."""
import argparse
import json
import os
import stat

import pytest

from ssd_jax.bench import llamacpp_peer as lp
from ssd_jax.cli import bench, bench_peers
from ssd_jax.cli_util import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TG = os.path.join(FIXTURES, "llama_bench_tg.json")  # llama-bench -p 0 -n 128 -t 1 -o json (build b11434)
PP = os.path.join(FIXTURES, "llama_bench_pp.json")  # llama-bench -p 1,2,3,5,9 -n 0 -d 300 -t 1 -o json


def _read(path):
  with open(path) as f:
    return f.read()


def _fake_bench(tmp_path, body: str):
  """Returns the path of an executable shell script standing in for llama-bench."""
  path = tmp_path / "llama-bench"
  path.write_text("#!/bin/sh\n" + body + "\n")
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return str(path)


def test_generation_report_is_parsed_from_real_output():
  raw = json.loads(_read(TG))
  (rec,) = lp.parse_report(_read(TG))
  assert rec["test"] == f"tg{raw[0]['n_gen']}" and rec["n_prompt"] == 0 and rec["n_depth"] == 0
  assert rec["threads"] == raw[0]["n_threads"] == 1
  assert rec["tokens_per_second"] == pytest.approx(raw[0]["avg_ts"])
  assert rec["ms"] == pytest.approx(raw[0]["avg_ns"] / 1e6)
  assert rec["samples_ms"] == pytest.approx([s / 1e6 for s in raw[0]["samples_ns"]])
  # tg: the mean rate and the mean time of one repetition describe the same n_gen tokens
  assert rec["n_gen"] / (rec["ms"] / 1e3) == pytest.approx(rec["tokens_per_second"], rel=0.05)
  info = lp.about(_read(TG))
  assert info["build_number"] == raw[0]["build_number"] and info["model_type"] == raw[0]["model_type"]


def test_forward_report_gives_one_record_per_token_count():
  recs = lp.parse_report(_read(PP))
  assert [r["n_prompt"] for r in recs] == list(lp.VERIFY_TOKENS)
  assert [r["test"] for r in recs] == [f"pp{t} @ d300" for t in lp.VERIFY_TOKENS]
  assert all(r["n_gen"] == 0 and r["n_depth"] == 300 for r in recs)
  lines = lp.forward_lines(recs)
  assert lines[2] == f"| pp1 @ d300 | {recs[0]['ms']:.1f} | 1.00x |"
  assert lines[4] == f"| pp3 @ d300 | {recs[2]['ms']:.1f} | {recs[2]['ms'] / recs[0]['ms']:.2f}x |"


def test_report_after_log_lines_and_bad_reports():
  text = "load_backend: loaded CPU backend\n" + _read(TG)
  assert lp.parse_report(text) == lp.parse_report(_read(TG))
  for bad, msg in (("no json here", "no test results"), ("[]", "no test results"), ("[{\"n_prompt\": 1", "not valid"),
                   ("[{\"n_prompt\": 0, \"n_gen\": 4}]", "lacks a field")):
    with pytest.raises(lp.LlamaBenchError, match=msg):
      lp.parse_report(bad)


def test_command_lines():
  assert lp.generation_command("/b/llama-bench", "m.gguf", 2, 128) == [
    "/b/llama-bench", "-m", "m.gguf", "-p", "0", "-n", "128", "-t", "2", "-r", "5", "-o", "json"]
  assert lp.forward_command("lb", "m.gguf", 1, depth=300, repetitions=3) == [
    "lb", "-m", "m.gguf", "-p", "1,2,3,5,9", "-n", "0", "-d", "300", "-t", "1", "-r", "3", "-o", "json"]
  with pytest.raises(ValueError, match="threads"):
    lp.generation_command("lb", "m.gguf", 0, 128)


def test_threads_follow_the_affinity():
  saved = os.sched_getaffinity(0)
  try:
    os.sched_setaffinity(0, {min(saved)})
    assert lp.usable_cores() == 1
  finally:
    os.sched_setaffinity(0, saved)
  assert lp.usable_cores() == len(saved)


def test_missing_binary_is_one_clear_error(tmp_path, monkeypatch):
  monkeypatch.delenv("LLAMA_BENCH", raising=False)
  monkeypatch.setenv("PATH", str(tmp_path))
  with pytest.raises(lp.LlamaBenchError,
                     match="needs llama.cpp's llama-bench: build it with scripts/dev/build_llamacpp"):
    lp.find_binary()
  with pytest.raises(lp.LlamaBenchError, match=r"not found at /no/such/llama-bench \(--peer-bin\)"):
    lp.find_binary("/no/such/llama-bench")
  monkeypatch.setenv("LLAMA_BENCH", "/no/where")
  with pytest.raises(lp.LlamaBenchError, match=r"not found at /no/where \(\$LLAMA_BENCH\)"):
    lp.find_binary()
  plain = tmp_path / "plain"
  plain.write_text("")
  with pytest.raises(lp.LlamaBenchError, match="not executable"):
    lp.find_binary(str(plain))
  fake = _fake_bench(tmp_path, "exit 0")
  assert lp.find_binary(fake) == fake
  monkeypatch.delenv("LLAMA_BENCH")
  assert lp.find_binary() == fake  # on the PATH
  with pytest.raises(lp.LlamaBenchError, match="llama-bench not found: /no/such"):
    lp.run(["/no/such", "-o", "json"])


def test_a_failing_binary_is_one_clear_error(tmp_path):
  fake = _fake_bench(tmp_path, "echo 'main: loading model' >&2; echo 'error: failed to load model m.gguf' >&2; exit 1")
  with pytest.raises(lp.LlamaBenchError, match=r"^llama-bench failed \(exit 1\): error: failed to load model m.gguf$"):
    lp.measure(fake, "m.gguf", 128, threads=1)


def test_measure_and_the_table_beside_ours(tmp_path):
  fake = _fake_bench(tmp_path, f'case "$*" in *"-n 0"*) cat {PP};; *) cat {TG};; esac')
  got = lp.measure(fake, "m.gguf", 128, threads=1, verify_depth=300)
  assert got["command"] == lp.generation_command(fake, "m.gguf", 1, 128)
  assert got["generation"] == lp.parse_report(_read(TG))[0]
  assert [f["n_prompt"] for f in got["forwards"]] == list(lp.VERIFY_TOKENS)
  tps = got["generation"]["tokens_per_second"]
  table = lp.markdown(got, {"ar": tps / 2, "sd": tps * 1.5})
  assert f"| ar | {tps / 2:.2f} | 0.50x |" in table and f"| sd | {tps * 1.5:.2f} | 1.50x |" in table


def test_bench_beside_ours_and_its_errors(tmp_path):
  fake = _fake_bench(tmp_path, f"cat {TG}")
  args = argparse.Namespace(peer_bin=fake, target=str(tmp_path / "m.gguf"), tiny=False, max_new_tokens=128,
                            baseline_cores="target")
  variants = [argparse.Namespace(label="ar")]
  result = {"summary": {"by_variant": {"ar": {"all": {"tokens_per_second": 40.0}}}}}
  saved = os.sched_getaffinity(0)
  if len(saved) >= 2:
    lines = bench_peers.llamacpp_beside(result, args, variants)
    tps = lp.parse_report(_read(TG))[0]["tokens_per_second"]
    assert result["llamacpp"]["ours_over_llamacpp"]["ar"] == pytest.approx(40.0 / tps)
    assert f"| ar | 40.00 | {40.0 / tps:.2f}x |" in lines
    assert os.sched_getaffinity(0) == saved  # the pin for llama-bench is undone
  for argv, msg in ((["--peer", "llamacpp", "--peer-bin", "/no/such/llama-bench"], "llama-bench not found at"),
                    (["--peer", "llamacpp", "--tiny", "--peer-bin", fake], "needs a GGUF target"),
                    (["--peer", "llamacpp", "--batch-size", "2", "--peer-bin", fake], "batch-1")):
    with pytest.raises(UsageError, match=msg):
      bench.main(argv)
