"""Benchmarking: the bench's plan and arithmetic (`plan`), its figures (`plots`), timing one compiled step
(`step_cost`) and the decode loop around its rounds (`loop_cost`), the transformers peer (`hf_peer`, with `hf_export`
writing the draft for it), llama.cpp's (`llamacpp_peer`) and a CPU kernel's A/B against a git revision (`kernel_ab`).
scripts/bench.py (its code: ssd_jax/cli/bench*.py), scripts/eval_draft.py, scripts/dev/bench_kernel_ab.py and
scripts/experiments/round_cost.py are the commands over them."""
