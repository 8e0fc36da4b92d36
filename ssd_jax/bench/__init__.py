"""Benchmarking: the bench's plan and arithmetic (`plan`), its figures (`plots`), timing one compiled step
(`step_cost`), and the transformers peer (`hf_peer`, with `hf_export` writing the draft for it). scripts/bench.py and
scripts/eval_draft.py are the commands over them."""
