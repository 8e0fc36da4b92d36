"""decode.py keeps every finished answer: --json-out is written as each batch finishes, Ctrl-C and SIGTERM keep what
is done, --resume answers the rest (and refuses a file of other settings); a draft process killed mid-run costs the
run its speed, not its answer. Real runs of the script on the embedded target."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ssd_jax.cli_util import UsageError
from ssd_jax.results_file import ResultsFile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = ["Say hi.", "What is 3+4?", "Name a fruit.", "Count to five.", "Say hi.", "Spell cat.", "Name a colour.",
           "What is 2+2?"]


def _prompts(tmp_path, prompts=PROMPTS):
  f = tmp_path / "p.jsonl"
  f.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
  return str(f)


def _decode(*args):
  return [sys.executable, os.path.join(ROOT, "scripts", "decode.py"), *args]


def _answers(path):
  return [(r["prompt"], r["token_ids"], r["text"]) for r in map(json.loads, open(path).read().splitlines())]


def _run_until(cmd, n_answers: int, act):
  """Starts cmd, calls act(proc) once n_answers stats lines are on its stderr, and returns (exit code, stderr)."""
  # SIGINT at its default in the child: a suite started in the background (`cmd &` in a script) runs with SIGINT
  # ignored, which the child would inherit, and Python then installs no Ctrl-C handler.
  proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  err, seen = [], 0
  for line in proc.stderr:
    err.append(line)
    if line.startswith("--- "):
      seen += 1
      if seen == n_answers:
        act(proc)
  return proc.wait(timeout=600), "".join(err)


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_keeps_its_answers_and_resume_finishes_it(tmp_path, sig, code):
  """Stopped after 2 of 8 answers: those are in the file, the run says how many and exits with its own code;
  --resume answers the other 6 and the file holds what an uninterrupted run writes (greedy; timings aside);
  another setting is refused in one line, and a file with every answer needs no run."""
  prompts, out, full = _prompts(tmp_path), tmp_path / "out.jsonl", tmp_path / "full.jsonl"
  args = ["--prompts", prompts, "--max-new-tokens", "40", "--ignore-eos", "--draft", "none", "--batch-size", "1"]
  rc, err = _run_until(_decode(*args, "--json-out", str(out)), 2, lambda p: p.send_signal(sig))
  assert rc == code, err
  kept = _answers(out)
  assert 2 <= len(kept) < len(PROMPTS) and f"{len(kept)} of {len(PROMPTS)} answers are in {out}" in err
  assert "Traceback" not in err
  if sig == signal.SIGTERM:
    return  # the rest as after Ctrl-C
  r = subprocess.run(_decode(*args, "--json-out", str(out), "--max-new-tokens", "41", "--resume"),
                     capture_output=True, text=True, cwd=ROOT)
  assert r.returncode == 2 and "written with other settings (--max-new-tokens differ)" in r.stderr
  assert len(r.stderr.strip().splitlines()) == 1 and _answers(out) == kept
  r = subprocess.run(_decode(*args, "--json-out", str(out), "--resume"), capture_output=True, text=True, cwd=ROOT)
  assert r.returncode == 0, r.stderr
  assert r.stderr.count("\n--- ") + r.stderr.startswith("--- ") == len(PROMPTS) - len(kept)  # only the rest ran
  r = subprocess.run(_decode(*args, "--json-out", str(full)), capture_output=True, text=True, cwd=ROOT)
  assert r.returncode == 0, r.stderr
  assert _answers(out) == _answers(full)
  r = subprocess.run(_decode(*args, "--json-out", str(out), "--resume"), capture_output=True, text=True, cwd=ROOT)
  assert r.returncode == 0 and "every prompt already has its answer" in r.stderr


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPU cores")
def test_a_draft_process_killed_mid_run_is_one_line_and_the_answer_is_ars(tmp_path):
  """`--mode ssd` with the draft in its own process, the process killed (SIGKILL, as the OOM killer) once the first
  answer is out: one line says so, the run completes, every answer equals AR's."""
  prompts, out, ar = _prompts(tmp_path, PROMPTS[:3]), tmp_path / "out.jsonl", tmp_path / "ar.jsonl"
  args = ["--prompts", prompts, "--max-new-tokens", "48", "--ignore-eos", "--batch-size", "1"]

  def kill_draft(proc):
    children = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
    assert len(children) == 1
    time.sleep(0.3)  # into the second prompt's rounds
    os.kill(int(children[0]), signal.SIGKILL)

  rc, err = _run_until(_decode(*args, "--mode", "ssd", "--k", "2", "--ssd-placement", "processes", "--json-out",
                               str(out)), 1, kill_draft)
  assert rc == 0, err
  lost = [line for line in err.splitlines() if "draft process exited" in line]
  assert len(lost) == 1 and "the target finishes the run alone (AR)" in lost[0] and "Traceback" not in err
  r = subprocess.run(_decode(*args, "--mode", "ar", "--json-out", str(ar)), capture_output=True, text=True, cwd=ROOT)
  assert r.returncode == 0, r.stderr
  assert _answers(out) == _answers(ar)
  rows = [json.loads(line)["stats"] for line in open(out)]
  assert sum(s["rounds_without_draft"] > 0 for s in rows) == 1  # the prompt it was lost in; the next got a new one


class _Gen:
  def __init__(self, prompt):
    self.prompt = prompt

  def to_dict(self):
    return {"prompt": self.prompt, "token_ids": [1], "text": "x", "stats": {}}


def test_resume_reads_whole_lines_and_matches_prompts_by_count(tmp_path):
  """A last line cut short (a run killed mid-write) is dropped; a repeated prompt is answered as often as it is
  asked; a line that is not JSON elsewhere is refused in one line."""
  path = str(tmp_path / "o.jsonl")
  f = ResultsFile(path, {"seed": 0}, ["a", "b", "a"], resume=False)
  assert f.todo == [0, 1, 2]
  f.open()
  f.write(_Gen("a"))
  f.close()
  with open(path, "a") as g:
    g.write('{"prompt": "b", "tok')  # cut short
  f = ResultsFile(path, {"seed": 0}, ["a", "b", "a"], resume=True)
  assert f.todo == [1, 2] and f.answered_before == 1
  f.open()
  f.write(_Gen("b"))
  f.close()
  assert [json.loads(line)["prompt"] for line in open(path)] == ["a", "b"]
  with open(path, "a") as g:
    g.write("not json\n" + json.dumps({"prompt": "a", "settings": {"seed": 0}}) + "\n")
  with pytest.raises(UsageError, match="line 3 .* is not JSON"):
    ResultsFile(path, {"seed": 0}, ["a", "b", "a"], resume=True)
