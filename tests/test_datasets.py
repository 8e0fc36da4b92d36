import json

import pytest

from ssd_jax.data import datasets


def _conv(*msgs):
  """A ShareGPT record: messages alternate human / gpt."""
  return {"conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": m} for i, m in enumerate(msgs)]}


@pytest.fixture
def sharegpt(tmp_path):
  recs = [_conv("Tell me a joke please", "ok", "Now make it longer please", "ok", "continue", "ok"),
          _conv("hi", "hello", "What is a monad exactly?", "..."),
          _conv("tell me a joke please ", "again"),                 # a repeat of the first, up to case and space
          _conv("Write a haiku about rain", "...", "Tell me a joke please", "..."),  # a later turn that opens #1
          _conv("Explain TCP slow start", "...", "now make it longer please", "...")]
  text = "[" + ",".join(json.dumps(r) for r in recs) + ', {"conversations": [{"from": "human", "val'  # truncated
  path = tmp_path / "sharegpt.json"
  path.write_text(text)
  return str(path)


def test_truncated_file_is_read_record_by_record(sharegpt):
  convs = list(datasets.iter_sharegpt(sharegpt))
  assert len(convs) == 5 and convs[0][:2] == [("user", "Tell me a joke please"), ("assistant", "ok")]


def test_first_and_later_user_turns(sharegpt):
  first = list(datasets.sharegpt_user_turns(path=sharegpt))
  assert first == ["Tell me a joke please", "Write a haiku about rain", "Explain TCP slow start"]
  later = list(datasets.sharegpt_user_turns(which="later", path=sharegpt))
  # "continue" is too short, the second "make it longer" a repeat, "Tell me a joke please" a first turn already.
  assert later == ["Now make it longer please", "What is a monad exactly?"]
  assert list(datasets.sharegpt_user_turns(1, 1, path=sharegpt)) == ["Write a haiku about rain"]
  assert list(datasets.sharegpt_user_turns(5, 2, path=sharegpt)) == ["Explain TCP slow start"]
  with pytest.raises(ValueError, match="'first' or 'later'"):
    next(datasets.sharegpt_user_turns(which="all", path=sharegpt))


def test_calibration_prompts_are_the_first_turn_tail(sharegpt):
  assert datasets.sharegpt_calibration_prompts(1, sharegpt, reserve=2) == ["Write a haiku about rain"]
  assert datasets.sharegpt_calibration_prompts(2, sharegpt, reserve=2) == ["Write a haiku about rain",
                                                                           "Explain TCP slow start"]
  for bad in (0, 3):
    with pytest.raises(ValueError, match="between 1 and 2"):
      datasets.sharegpt_calibration_prompts(bad, sharegpt, reserve=2)


def test_training_prompts_leave_out_the_calibration_prompts(sharegpt):
  first = datasets.sharegpt_training_prompts(10, path=sharegpt, reserve=1)
  assert first == ["Tell me a joke please", "Write a haiku about rain"]  # the last first turn is reserved
  assert datasets.sharegpt_calibration_prompts(1, sharegpt, reserve=1) == ["Explain TCP slow start"]
  assert datasets.sharegpt_training_prompts(1, 1, path=sharegpt, reserve=1) == ["Write a haiku about rain"]
  assert datasets.sharegpt_training_prompts(10, which="later", path=sharegpt, reserve=1) == [
      "Now make it longer please", "What is a monad exactly?"]


def test_file_lock_makes_a_second_process_wait_for_the_first(tmp_path):
  """Two processes fetching the same wheel (or converting the same target) take turns: the second enters only after
  the first has left, and then finds the first's file instead of writing it again."""
  import subprocess
  import sys
  import textwrap
  lock, log = tmp_path / "x.lock", tmp_path / "log"
  code = textwrap.dedent(f"""
    import sys, time
    from ssd_jax.data.wheel_data import file_lock
    with file_lock({str(lock)!r}):
      open({str(log)!r}, "a").write(sys.argv[1] + " in\\n")
      time.sleep(0.6)
      open({str(log)!r}, "a").write(sys.argv[1] + " out\\n")
  """)
  procs = [subprocess.Popen([sys.executable, "-c", code, name]) for name in ("a", "b")]
  assert [p.wait(60) for p in procs] == [0, 0]
  first, second = log.read_text().splitlines()[0].split()[0], log.read_text().splitlines()[2].split()[0]
  # Whoever entered first left before the other entered (unlocked, both would be in at once).
  assert log.read_text().splitlines() == [f"{first} in", f"{first} out", f"{second} in", f"{second} out"]
  assert {first, second} == {"a", "b"}
