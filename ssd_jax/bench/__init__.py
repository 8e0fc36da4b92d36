"""Benchmarking: the bench's plan and arithmetic (`plan`), its figures (`plots`), timing one compiled step
(`step_cost`), the transformers peer (`hf_peer`, with `hf_export` writing the draft for it) and a CPU kernel's A/B
against a git revision (`kernel_ab`). scripts/bench.py, scripts/eval_draft.py and scripts/dev/bench_kernel_ab.py are the
commands over them."""
