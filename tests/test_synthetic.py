import ast

from ssd_jax.data import datasets, synthetic


def test_code_stubs_are_signature_and_docstring_only():
  prompts = synthetic.code_prompts(60, seed=1)
  assert len(prompts) == 60 and len(set(prompts)) == 60
  for p in prompts:
    assert p.startswith(synthetic.CODE_HEADER)
    (fn,) = ast.parse(p[len(synthetic.CODE_HEADER):]).body  # one function, nothing else
    assert isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_")
    # The body is the docstring alone: the answer, not the prompt, holds the implementation.
    assert len(fn.body) == 1 and ast.get_docstring(fn)
  assert len(synthetic.stdlib_function_stubs()) > 500  # enough for the default 400


def test_code_stubs_from_a_given_tree(tmp_path):
  (tmp_path / "mod.py").write_text('def f(x):\n  """Returns x doubled, as an int, for any number x."""\n'
                                  '  return 2 * x\n'
                                  'def _g(x):\n  """Private: never a prompt, although it has a docstring."""\n'
                                  'def h(x):\n  return x\n')
  (tmp_path / "test_mod.py").write_text('def t(x):\n  """A test module is skipped, whatever it holds."""\n')
  (tmp_path / "broken.py").write_text("def (:\n")  # unparsable files are skipped, not fatal
  assert synthetic.stdlib_function_stubs(str(tmp_path)) == [
      'def f(x):\n    """Returns x doubled, as an int, for any number x."""\n']


def test_math_and_instruction_prompts_are_filled_and_seeded():
  for seed in range(5):
    ms = synthetic.math_prompts(200, seed)
    assert len(ms) == 200 and not any("{" in m or "}" in m for m in ms)
    assert ms == synthetic.math_prompts(200, seed)
  assert synthetic.math_prompts(50, 0) != synthetic.math_prompts(50, 1)
  ins = synthetic.instruction_prompts(300, 0)
  assert len(set(ins)) == 300 and not any("{" in s for s in ins)


def test_question_and_writing_prompts_are_filled_distinct_and_seeded():
  for build, n in ((synthetic.question_prompts, 700), (synthetic.writing_prompts, 700)):
    ps = build(n, 0)
    assert len(ps) == n and len(set(ps)) == n, build.__name__
    assert not any("{" in p or "}" in p for p in ps)
    assert ps == build(n, 0) and ps != build(n, 1)
  # Every writing template is used, not only the first ones (a template whose fills run out is passed over).
  ws = synthetic.writing_prompts(700, 0)
  firsts = {t.split("{")[0] for t in synthetic._WRITING}
  assert all(any(w.startswith(f) for w in ws) for f in firsts)
  # A comparison names two different subjects.
  diff = [q for q in synthetic.question_prompts(1000, 3) if q.startswith("What are the main differences between")]
  assert diff and all(q.split(" between ")[1].split(" and ")[0] != q.split(" and ")[1][:-1] for q in diff)


def test_synthetic_prompts_interleave_the_kinds():
  recs = synthetic.synthetic_prompts(2, 3, 1)
  assert [r["kind"] for r in recs] == ["code", "math", "instruction", "code", "math", "math"]
  recs = synthetic.synthetic_prompts(0, 0, 1, n_question=2, n_writing=1)
  assert [r["kind"] for r in recs] == ["instruction", "question", "writing", "question"]


def test_no_synthetic_prompt_is_a_benchmark_prompt():
  recs = synthetic.synthetic_prompts(400, 300, 400, n_question=1000, n_writing=1000)
  ours = {r["prompt"].strip() for r in recs}
  for name in ("humaneval", "gsm8k", "alpaca", "mtbench"):
    theirs = {p.strip() for p in datasets.load_prompts(name)}
    assert not ours & theirs, name
