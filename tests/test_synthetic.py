import ast

from ssd_jax import datasets, synthetic


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


def test_synthetic_prompts_interleave_the_kinds():
  recs = synthetic.synthetic_prompts(2, 3, 1)
  assert [r["kind"] for r in recs] == ["code", "math", "instruction", "code", "math", "math"]


def test_no_synthetic_prompt_is_a_benchmark_prompt():
  recs = synthetic.synthetic_prompts(400, 300, 400)
  ours = {r["prompt"].strip() for r in recs}
  for name in ("humaneval", "gsm8k", "alpaca", "mtbench"):
    theirs = {p.strip() for p in datasets.load_prompts(name)}
    assert not ours & theirs, name
