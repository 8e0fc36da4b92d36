"""The OpenAI-compatible server (ssd_jax/serve/, scripts/serve.py) through the real `openai` client and raw HTTP.

A server runs in a thread of this process on a free localhost port: over the real SmolLM2 target (the suite's
`smollm2` pipeline, AR: it has no draft) for the answers, whose greedy tokens must equal Pipeline.generate's for
the same prompt alone, and over the tiny random pair for the queue, where a test holds the engine's batch to fill it.
"""
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings

import openai
import pytest
from commands import run_script, script_path

from ssd_jax.decode import DecodeOptions
from ssd_jax.models.tokenizer import TextTokenizer, byte_level_tokenizer
from ssd_jax.serve.app import create_app, make_server, model_id
from ssd_jax.serve.engine import Engine
from ssd_jax.serve.reply import Reply

PROMPTS = ["What is the capital of France?", "Name a colour.", "Say hello in Spanish.", "What is 2 + 2?",
           "Name a planet.", "Write one word about the sea.", "What do bees make?", "Count to three."]


@contextlib.contextmanager
def serving(engine: Engine):
  """Yields the base URL of a server over `engine` on a free localhost port; stops it (and the engine) after."""
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  server = make_server(create_app(engine), port=sock.getsockname()[1], log_level="warning", log_config=None)
  thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
  thread.start()
  deadline = time.monotonic() + 30
  while not server.started and thread.is_alive() and time.monotonic() < deadline:
    time.sleep(0.02)
  assert server.started, "the server did not start"
  try:
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
  finally:
    server.should_exit = True
    thread.join(30)
    assert not thread.is_alive(), "the server did not stop"


def post(url: str, body):
  """Returns (status, JSON body, headers: names in any case) of a POST of `body` (bytes as they are, anything else
  as JSON)."""
  data = body if isinstance(body, bytes) else json.dumps(body).encode()
  req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(req, timeout=120) as r:
      return r.status, json.loads(r.read()), r.headers
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read()), e.headers


@pytest.fixture(scope="module")
def real(smollm2):
  """(pipeline, OpenAI client, base URL) of a server over the real SmolLM2 target."""
  with serving(Engine(smollm2, max_batch=8, default_max_tokens=16)) as url:
    yield smollm2, openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300), url


def _alone(pipe, prompts, n: int, chat: bool = True):
  """Returns Pipeline.generate's greedy answers, each prompt in a batch of its own."""
  return pipe.generate(prompts, max_new_tokens=n, temperature=0.0, batch_size=1, chat=chat)


@pytest.mark.slow
def test_models_and_greedy_completions_equal_the_pipelines(real):
  """/v1/models names the target; a greedy completion (the prompt raw, as OpenAI's completions take it), streamed
  and not, has Pipeline.generate's tokens for the prompt alone, its usage counts and finish_reason."""
  pipe, client, _ = real
  name = model_id(pipe)
  assert [m.id for m in client.models.list().data] == [name]
  prompt = "The capital of France is"
  want = _alone(pipe, [prompt], 12, chat=False)[0]
  r = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0)
  assert r.model_extra["ssd_jax"]["token_ids"] == want.token_ids and r.choices[0].text == want.text
  assert r.usage.prompt_tokens == len(pipe.encode_prompt(prompt, chat=False))
  assert r.usage.completion_tokens == len(want.token_ids)
  assert r.choices[0].finish_reason == ("stop" if want.token_ids[-1] in pipe.tokenizer.eos_ids else "length")
  assert r.model_extra["ssd_jax"]["mode"] == "ar" and r.model_extra["ssd_jax"]["requested"]["k"] == "auto"
  chunks = list(client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0, stream=True))
  assert "".join(c.choices[0].text for c in chunks) == want.text
  assert [c.choices[0].finish_reason for c in chunks][-1] == r.choices[0].finish_reason
  assert chunks[-1].model_extra["ssd_jax"]["token_ids"] == want.token_ids


@pytest.mark.slow
def test_chat_streamed_and_not_is_the_models_own_template(real):
  """A chat is the model's chat template around the messages: the same tokens as Pipeline.generate(prompt); the
  stream opens with the assistant's role, and stream_options.include_usage adds the usage chunk."""
  pipe, client, _ = real
  want = _alone(pipe, [PROMPTS[0]], 10)[0]
  messages = [{"role": "user", "content": PROMPTS[0]}]
  r = client.chat.completions.create(model=model_id(pipe), messages=messages, max_tokens=10, temperature=0)
  assert r.choices[0].message.content == want.text and r.choices[0].message.role == "assistant"
  assert r.model_extra["ssd_jax"]["token_ids"] == want.token_ids
  assert r.usage.completion_tokens == len(want.token_ids)
  chunks = list(client.chat.completions.create(model=model_id(pipe), messages=messages, max_tokens=10,
                                               temperature=0, stream=True, stream_options={"include_usage": True}))
  assert chunks[0].choices[0].delta.role == "assistant"
  assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
  assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.token_ids)


@pytest.mark.slow
def test_sixteen_concurrent_streams_share_batches_and_keep_their_solo_answers(real):
  """16 streaming chat clients at once (each prompt twice, with max_tokens 6 and 10), twice the engine's max_batch:
  every one completes with its answer alone (a row cut at its own max_tokens), and the server ran some of them in
  one batch."""
  pipe, client, _ = real
  asks = [(p, n) for n in (6, 10) for p in PROMPTS]
  want = {(p, n): g.text for n in (6, 10) for p, g in zip(PROMPTS, _alone(pipe, PROMPTS, n))}
  got, rows, errors = {}, [], []

  def ask(prompt, n):
    try:
      chunks = list(client.chat.completions.create(model=model_id(pipe), max_tokens=n, temperature=0, stream=True,
                                                   messages=[{"role": "user", "content": prompt}]))
      got[prompt, n] = "".join(c.choices[0].delta.content or "" for c in chunks)
      rows.append(chunks[-1].model_extra["ssd_jax"]["batch_rows"])
    except Exception as e:  # noqa: BLE001 -- reported below
      errors.append(repr(e))

  threads = [threading.Thread(target=ask, args=a) for a in asks]
  for t in threads:
    t.start()
  for t in threads:
    t.join(300)
  assert errors == [] and len(got) == 16 and got == want
  assert max(rows) > 1, rows


@pytest.mark.slow
def test_stop_strings_cut_the_answer_where_they_begin(real):
  """A stop string taken from the middle of the greedy answer: the answer up to it, finish_reason 'stop', fewer
  tokens; streamed, the same text (the start of a stop string is held back, never sent)."""
  pipe, client, _ = real
  full = _alone(pipe, [PROMPTS[0]], 16)[0]
  stop = full.text[len(full.text) // 2:len(full.text) // 2 + 3]
  want = full.text[:full.text.index(stop)]
  args = dict(model=model_id(pipe), messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=16, temperature=0,
              stop=[stop, "never said"])
  r = client.chat.completions.create(**args)
  assert r.choices[0].message.content == want and r.choices[0].finish_reason == "stop"
  assert r.usage.completion_tokens < len(full.token_ids)
  streamed = list(client.chat.completions.create(**args, stream=True))
  assert "".join(c.choices[0].delta.content or "" for c in streamed) == want
  assert streamed[-1].choices[0].finish_reason == "stop"


BAD = [  # (body changes, status, param): each refused before the model runs
    ({"max_tokens": "ten"}, 400, "max_tokens"), ({"temperature": -1}, 400, "temperature"),
    ({"temperature": "hot"}, 400, "temperature"), ({"top_p": 0}, 400, "top_p"), ({"top_p": 1.5}, 400, "top_p"),
    ({"n": 2}, 400, "n"), ({"stream": "yes"}, 400, "stream"), ({"stop": [""]}, 400, "stop"),
    ({"frobnicate": 1}, 400, "frobnicate"), ({"mode": "sd"}, 400, "mode"), ({"mode": "fast"}, 400, "mode"),
    ({"k": "x"}, 400, "k"), ({"model": "gpt-4"}, 404, "model"), ({"prompt": [1] * 8192}, 400, "prompt"),
    ({"max_tokens": 9000}, 400, "max_tokens"), ({"prompt": ""}, 400, "prompt"),
    ({"logit_bias": {"1": 5}}, 400, "logit_bias"),
]


@pytest.mark.slow
def test_bad_input_gets_its_status_and_an_openai_error_and_no_traceback(real, caplog):
  """Malformed JSON, a body that is no object, bad types and values, an unknown model, a prompt or max_tokens past
  the context, n > 1: each its status and OpenAI's error object naming the field; the log holds no traceback; the
  real client raises its own error types; the server then still answers."""
  pipe, client, url = real
  good = {"model": model_id(pipe), "prompt": "Hi", "max_tokens": 2, "temperature": 0}
  cases = [(b'{"model": ', 400, None), (b"[1, 2]", 400, None)] + [({**good, **change}, s, p) for change, s, p in BAD]
  for body, status, param in cases:
    got, err, _ = post(url + "/v1/completions", body)
    assert got == status, (body, got, err)
    assert set(err["error"]) == {"message", "type", "param", "code"} and err["error"]["message"], err
    assert err["error"]["param"] == param, (body, err)
  got, err, _ = post(url + "/v1/chat/completions", {"model": model_id(pipe), "messages": [{"role": "tool"}]})
  assert got == 400 and err["error"]["param"] == "messages[0].role"
  got, err, _ = post(url + "/v1/nothing", good)
  assert got == 404 and "error" in err
  with pytest.raises(openai.BadRequestError, match="only n=1"):
    client.completions.create(model=model_id(pipe), prompt="Hi", n=3)
  with pytest.raises(openai.NotFoundError):
    client.completions.create(model="gpt-4", prompt="Hi")
  assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.exc_info]
  assert post(url + "/v1/completions", good)[0] == 200


def test_a_full_queue_gets_429_with_retry_after_and_a_gone_client_leaves_it():
  """The tiny pair, one request a batch and two waiting at most: while the engine's batch is held, a third waiting
  request gets 429 with Retry-After and OpenAI's error; a streaming client that goes away while waiting leaves the
  queue; released, the held and the waiting requests are answered."""
  from ssd_jax import api

  pipe = api.load_tiny()
  entered, release = threading.Event(), threading.Event()
  choose = pipe.batch_decoder

  def held(*args, **kwargs):  # the engine's batch waits here until the test releases it
    entered.set()
    assert release.wait(60)
    return choose(*args, **kwargs)

  pipe.batch_decoder = held
  engine = Engine(pipe, max_batch=1, max_queue=2)
  body = {"model": model_id(pipe), "prompt": "ab", "max_tokens": 2, "temperature": 0, "mode": "ar"}
  with serving(engine) as url, _finally(release.set):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    answers = []
    first = threading.Thread(target=lambda: answers.append(post(url + "/v1/completions", body)))
    first.start()
    assert entered.wait(30)
    gone = client.completions.create(model=body["model"], prompt="ab", max_tokens=2, temperature=0, stream=True,
                                     extra_body={"mode": "ar"})  # it waits in the queue; its headers come at once
    second = threading.Thread(target=lambda: answers.append(post(url + "/v1/completions", body)))
    second.start()
    _until(lambda: engine.waiting == 2)
    status, err, headers = post(url + "/v1/completions", body)
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert err["error"]["code"] == "queue_full" and err["error"]["type"] == "rate_limit_error"
    gone.close()
    _until(lambda: engine.waiting == 1)
    release.set()
    first.join(120)
    second.join(120)
    assert [a[0] for a in answers] == [200, 200]
    assert answers[0][1]["choices"] == answers[1][1]["choices"]
    assert 1 <= answers[0][1]["usage"]["completion_tokens"] <= 2


@contextlib.contextmanager
def _finally(act):
  """Calls act() on leaving, however the block ends (a held engine released before its server stops)."""
  try:
    yield
  finally:
    act()


def _until(condition, timeout: float = 30.0) -> None:
  deadline = time.monotonic() + timeout
  while not condition():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.02)


def test_a_reply_keeps_its_own_end_and_holds_back_what_may_change():
  """Reply on the byte-level tokenizer (a token a byte): a stop string split over tokens is held back until it is
  known, then cut with the tokens after it dropped; max_tokens and a stop id end it; a character whose UTF-8 bytes
  span tokens is sent whole."""
  tok = TextTokenizer(byte_level_tokenizer())
  ids = tok.encode("Hello world. Bye")
  r = Reply(tok, 100, stop=["d. B"])
  assert r.add(ids[:10]) == "Hello worl" and r.add(ids[10:13]) == "" and r.finish is None  # "d. " may begin it
  assert r.add(ids[13:]) == "" and r.finish == "stop" and r.text == "Hello worl"
  assert r.ids == ids[:14] and r.add(ids) == ""  # kept up to the token that completed "d. B"; then nothing more
  r = Reply(tok, 100, stop=["d. X"])
  assert r.add(ids[:13]) == "Hello worl" and r.add(ids[13:]) == "d. Bye" and r.finish is None
  r = Reply(tok, 5)
  assert r.add(ids) == "Hello" and r.finish == "length" and len(r.ids) == 5
  r = Reply(tok, 100, stop_ids=tok.eos_ids)
  assert r.add(ids[:3] + [tok.eos_id] + ids[3:]) == "Hel" and r.finish == "stop" and len(r.ids) == 4
  e = tok.encode("\u00e9!")  # two bytes, two tokens
  r = Reply(tok, 100)
  assert len(e) == 3 and r.add(e[:1]) == "" and r.add(e[1:]) == "\u00e9!"


@pytest.mark.parametrize("args,line", [
    (["--max-batch", "0"], "--max-batch must be >= 1, got 0"),
    (["--quantize", "int4"], "unknown weights 'int4'"),
    (["--port", "70000"], "--port must be <= 65535, got 70000"),
])
def test_serve_py_refuses_bad_flags_in_one_line_before_loading(args, line):
  """Bad flags: exit code 2 and one line on stderr, before JAX or a model loads."""
  r = subprocess.run([sys.executable, script_path("serve.py"), *args], capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and line in r.stderr, r.stderr[-2000:]


def test_serve_py_refuses_a_port_in_use_before_loading():
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    r = subprocess.run([sys.executable, script_path("serve.py"), "--port", str(taken.getsockname()[1])],
                       capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and "serve.py: error: cannot listen on 127.0.0.1:" in r.stderr, r.stderr[-2000:]
  assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="SSD's draft process needs a core of its own")
def test_a_lost_draft_process_is_one_log_line_and_the_server_goes_on(caplog):
  """The tiny pair, SSD with its draft in its own process: the process killed in the middle of the second request's
  batch; the target finishes it alone (AR's tokens), the engine logs it in one line, and the third request runs SSD
  with a fresh process."""
  from ssd_jax import api
  from ssd_jax.decode import EveryRow

  pipe = api.load_tiny()
  engine = Engine(pipe, spec_settings={"placement": "processes"})
  body = {"model": model_id(pipe), "prompt": "Tell me", "max_tokens": 12, "temperature": 0, "mode": "ssd", "k": 2,
          "fan_out": 2}
  want = pipe.generate_ids([pipe.encode_prompt("Tell me", chat=False)], mode="ar", max_new_tokens=12)[0].token_ids
  assert len(want) == 12  # no end-of-sequence early: the second batch has rounds left when its draft goes
  dec = pipe.decoder("ssd", pipe.spec_options(None, k=2, fan_out=2, placement="processes"))  # the one the engine gets
  generate, kill = dec.generate, []

  def killing(prompts, opts, stream):  # the second batch's draft process killed at its third piece
    pieces = []

    def hook(row, ids):
      pieces.append(row)
      if kill and len(pieces) == 3:
        dec.draft._proc.kill()
      stream(row, ids)
    return generate(prompts, opts, stream=EveryRow(hook))

  dec.generate = killing
  with warnings.catch_warnings(), _finally(dec.close), serving(engine) as url:  # closed once the engine stopped
    warnings.simplefilter("ignore", api.DraftLostWarning)  # as serve.py does: the engine says it in its own line
    answers = [post(url + "/v1/completions", body)]
    kill.append(True)
    answers.append(post(url + "/v1/completions", body))
    kill.clear()
    answers.append(post(url + "/v1/completions", body))
  assert [a[0] for a in answers] == [200] * 3
  assert [a[1]["ssd_jax"]["token_ids"] for a in answers] == [want] * 3
  assert [a[1]["ssd_jax"]["mode"] for a in answers] == ["ssd"] * 3
  lost = [r.getMessage() for r in caplog.records if "draft side was lost" in r.getMessage()]
  assert len(lost) == 1 and "\n" not in lost[0] and "exited" in lost[0], lost
  assert not [r for r in caplog.records if r.exc_info]


def test_serve_bench_measures_each_level_beside_decode_py(tmp_path):
  """scripts/serve_bench.py starts the server (the real target, AR: --draft none), runs 1 and then 3 clients at once
  and decode.py's batches of the same sizes: every request answered, latencies in order (first token before the
  end), tokens counted from the usage, and each figure in its JSON and table."""
  out = tmp_path / "out"
  r = run_script("serve_bench.py", "--concurrency", "1,3", "--requests", "3", "--max-tokens", "4", "--datasets",
                 "gsm8k", "--num-prompts", "2", "--server-args", "--draft none --no-warm-up", "--out-dir", str(out),
                 timeout=900)  # serve_bench's own warm-up round compiles what it meets; test_slots tests warm()
  assert r.returncode == 0, r.stderr[-3000:]
  levels = json.loads((out / "serve_bench.json").read_text())["levels"]
  assert [lv["concurrency"] for lv in levels] == [1, 3] and [lv["requests"] for lv in levels] == [3, 3]
  for lv in levels:
    assert lv["errors"] == [] and 3 <= lv["completion_tokens"] <= 12 and lv["tok_s"] > 0 and lv["decode_tok_s"] > 0
    assert 0 < lv["ttft_ms"][0] <= lv["ttft_ms"][1] and lv["ttft_ms"][0] <= lv["e2e_ms"][0] <= lv["e2e_ms"][1]
    assert lv["modes"] == ["ar K=0"]
  assert levels[0]["mean_batch_rows"] == 1 and levels[1]["mean_batch_rows"] > 1  # three clients shared batches
  table = (out / "serve_bench.md").read_text()
  assert table.count("\n| 1 | 3 |") == 1 and table.count("\n| 3 | 3 |") == 1


def test_serve_bench_refuses_bad_levels_in_one_line():
  r = run_script("serve_bench.py", "--concurrency", "2,x", timeout=120)
  assert r.returncode == 2 and r.stderr.strip().splitlines() == [
      "serve_bench.py: error: --concurrency takes comma-separated integers, got '2,x'"]


def test_a_static_batch_stops_once_every_request_in_it_has_ended(monkeypatch):
  """Static batching, the tiny pair: a request that ends early (at its own stop string) ends its row, so its batch
  stops with the other request's 4 tokens instead of running to the 48 the first asked for; each answer is the one
  it gets alone."""
  from ssd_jax import api
  from ssd_jax.decode import rounds

  pipe = api.load_tiny()
  long = pipe.generate(["ab"], max_new_tokens=48, temperature=0.0, chat=False, mode="ar")[0].text
  stop = next(long[i:i + 2] for i in range(3, 20) if long.find(long[i:i + 2]) == i)  # its first occurrence
  short = pipe.generate(["xy"], max_new_tokens=4, temperature=0.0, chat=False, mode="ar")[0].text
  run, calls = rounds.run_rounds, []
  monkeypatch.setattr(rounds, "run_rounds", lambda st, s: calls.append(run(st, s)) or calls[-1])
  engine = Engine(pipe, max_batch=2, gather=5.0, batching="static")  # the two requests share one batch
  base = {"model": model_id(pipe), "temperature": 0, "mode": "ar"}
  with serving(engine) as url:
    answers = {}
    asks = {"long": dict(base, prompt="ab", max_tokens=48, stop=[stop]), "short": dict(base, prompt="xy", max_tokens=4)}
    threads = [threading.Thread(target=lambda n=n, b=b: answers.update({n: post(url + "/v1/completions", b)}))
               for n, b in asks.items()]
    for t in threads:
      t.start()
    for t in threads:
      t.join(120)
  (status, long_r, _), (status2, short_r, _) = answers["long"], answers["short"]
  assert status == status2 == 200
  assert long_r["choices"][0]["text"] == long[:long.index(stop)] and long_r["choices"][0]["finish_reason"] == "stop"
  assert short_r["choices"][0]["text"] == short
  assert len(calls) == 1 and long_r["ssd_jax"]["batch_rows"] == 2
  assert calls[0]["rounds"] <= 2  # AR's chunks of 4 steps: the short request's tokens, not the long one's 48


def _slow_steps(monkeypatch, seconds: float, calls: list):
  """Makes each call of a continuous batch take at least `seconds` (the tiny pair is too fast to watch), counting
  them in `calls` (the batch's live rows at each)."""
  from ssd_jax.decode import slots

  step = slots.SlotBatch.step

  def slow(self):
    calls.append(self.live)
    time.sleep(seconds)
    return step(self)

  monkeypatch.setattr(slots.SlotBatch, "step", slow)


def test_continuous_batching_a_request_joins_a_running_batch_and_leaves_at_its_own_end(monkeypatch):
  """The tiny pair, continuous batching: a short request sent while a long one streams joins its batch between
  calls and is answered while the long one still runs; each answer is the one its prompt gets alone."""
  from ssd_jax import api

  pipe = api.load_tiny()
  want = {p: pipe.generate([p], max_new_tokens=n, temperature=0.0, chat=False, mode="ar")[0].text
          for p, n in (("ab", 60), ("xy", 4))}
  calls, done = [], {}
  _slow_steps(monkeypatch, 0.03, calls)
  engine = Engine(pipe, max_batch=4)
  with serving(engine) as url:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    name = model_id(pipe)
    ar = {"mode": "ar"}  # a lone request of the default mode runs SD in a static batch (the pair has a draft)
    stream = client.completions.create(model=name, prompt="ab", max_tokens=60, temperature=0, stream=True,
                                       extra_body=ar)
    chunks = iter(stream)
    text = [next(chunks).choices[0].text]  # the long request runs
    short = client.completions.create(model=name, prompt="xy", max_tokens=4, temperature=0, extra_body=ar)
    done["short"] = len(calls)
    text += [c.choices[0].text for c in chunks]
    done["long"] = len(calls)
  assert short.choices[0].text == want["xy"] and "".join(text) == want["ab"]
  assert short.model_extra["ssd_jax"]["batching"] == "continuous" and short.model_extra["ssd_jax"]["batch_rows"] == 2
  assert done["short"] < done["long"]  # answered while the long one still stepped
  assert 2 in calls and calls[-1] == 1  # the short row left; the long one finished alone


def test_continuous_batching_a_gone_client_frees_its_row_for_the_next_request(monkeypatch):
  """The tiny pair, two rows: of two long streams (60 tokens), one client goes away after its first tokens. Its row
  is freed within a call or two and the waiting request takes it, answered while the other long stream still runs;
  the other stream's answer and the waiting request's are their answers alone."""
  from ssd_jax import api

  pipe = api.load_tiny()
  want = {p: pipe.generate([p], max_new_tokens=n, temperature=0.0, chat=False, mode="ar")[0].text
          for p, n in (("ab", 60), ("xy", 4))}
  calls, at = [], {}
  _slow_steps(monkeypatch, 0.03, calls)
  engine = Engine(pipe, max_batch=2, gather=1.0)  # the two streams start together
  with serving(engine) as url:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    name, ar = model_id(pipe), {"mode": "ar"}
    streams = {}
    opening = [threading.Thread(target=lambda p=p: streams.update({p: client.completions.create(
        model=name, prompt=p, max_tokens=60, temperature=0, stream=True, extra_body=ar)})) for p in ("ab", "cd")]
    for t in opening:
      t.start()
    for t in opening:
      t.join(60)
    kept, gone = iter(streams["ab"]), iter(streams["cd"])
    text = [next(kept).choices[0].text]
    next(gone)
    answer = []
    waiting = threading.Thread(target=lambda: answer.append(client.completions.create(
        model=name, prompt="xy", max_tokens=4, temperature=0, extra_body=ar)) or at.update(xy=len(calls)))
    waiting.start()
    _until(lambda: engine.waiting == 1)
    streams["cd"].close()
    waiting.join(60)
    text += [c.choices[0].text for c in kept]
    at["ab"] = len(calls)
  assert answer and answer[0].choices[0].text == want["xy"] and "".join(text) == want["ab"]
  assert at["xy"] < at["ab"] <= 16  # the waiting request took the gone one's row: 60 tokens are 15 calls of 4


def test_default_mode_requests_arriving_together_run_continuous_ar_and_a_lone_one_runs_k_autos_pick():
  """The tiny pair (its default mode speculates, k='auto'): two requests sent together run as one continuous AR
  batch, whatever k='auto' would pick for two rows; a request alone on an idle server runs what it picks for one (a
  static batch). Each answer is the prompt's alone."""
  from ssd_jax import api

  pipe = api.load_tiny()
  want = {p: pipe.generate([p], max_new_tokens=6, temperature=0.0, chat=False, mode="ar")[0].text for p in ("ab", "xy")}
  engine = Engine(pipe, max_batch=2, gather=5.0)
  body = {"model": model_id(pipe), "max_tokens": 6, "temperature": 0}
  with serving(engine) as url:
    answers = {}
    threads = [threading.Thread(target=lambda p=p: answers.update({p: post(url + "/v1/completions",
                                                                              dict(body, prompt=p))}))
               for p in ("ab", "xy")]
    for t in threads:
      t.start()
    for t in threads:
      t.join(120)
    alone = post(url + "/v1/completions", dict(body, prompt="ab"))
  for p, (status, r, _) in answers.items():
    assert status == 200 and r["choices"][0]["text"] == want[p]
    assert (r["ssd_jax"]["batching"], r["ssd_jax"]["mode"], r["ssd_jax"]["batch_rows"]) == ("continuous", "ar", 2)
  pick = pipe.batch_decoder([len(pipe.encode_prompt("ab", chat=False))], pipe.default_mode, pipe.spec_options(None),
                            DecodeOptions(max_new_tokens=6), asked=False)
  assert alone[0] == 200 and alone[1]["choices"][0]["text"] == want["ab"]
  assert (alone[1]["ssd_jax"]["batching"], alone[1]["ssd_jax"]["mode"]) == ("static", pick.mode)


def test_warm_up_compiles_what_a_lone_request_and_a_pair_run():
  """The tiny pair: after Engine.warm(), a lone default-mode request (a static SD batch, k=auto's pick) and two
  sent together (continuous AR) compile no target program, with different max_tokens and prompts in either prompt
  bucket; their answers are their solo ones."""
  from ssd_jax import api

  pipe = api.load_tiny()
  long_prompt = "abcdefghij" * 8  # past the first prompt bucket
  want = {(p, n): pipe.generate([p], max_new_tokens=n, temperature=0.0, chat=False, mode="ar")[0].text
          for p, n in (("ab", 6), ("xy", 9), (long_prompt, 150))}
  built, make = [], pipe.decoder
  pipe.decoder = lambda *a, **kw: built.append(make(*a, **kw)) or built[-1]
  engine = Engine(pipe, max_batch=2, gather=2.0, default_max_tokens=200)
  engine.warm()
  warmed = {id(d): d for d in built}
  assert {d.mode for d in warmed.values()} == {"ar", pipe.default_mode} != {"ar"}
  compiles = {i: d.programs.compiles for i, d in warmed.items()}
  with serving(engine) as url:
    got, ran = {}, []
    for p, n in (("ab", 6), (long_prompt, 150)):
      status, r, _ = post(url + "/v1/completions", {"model": model_id(pipe), "prompt": p, "max_tokens": n,
                                                    "temperature": 0})
      assert status == 200, r
      got[p, n] = r["choices"][0]["text"]
      ran.append((r["ssd_jax"]["batching"], r["ssd_jax"]["mode"]))
    threads = [threading.Thread(target=lambda p=p, n=n: got.update({(p, n): post(url + "/v1/completions", {
        "model": model_id(pipe), "prompt": p, "max_tokens": n, "temperature": 0})[1]["choices"][0]["text"]}))
        for p, n in (("ab", 6), ("xy", 9))]
    for t in threads:
      t.start()
    for t in threads:
      t.join(120)
  assert got == want and ran == [("static", pipe.default_mode)] * 2
  assert {id(d) for d in built} == set(warmed)  # no decoder built after the warm-up
  assert {i: d.programs.compiles for i, d in warmed.items()} == compiles
