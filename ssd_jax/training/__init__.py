"""Training the drafts, module by role.

The standalone draft: draft_data (windows of ShareGPT and the target's answers), head_vocab (its reduced vocabulary),
draft_init (the target-derived start and the surgery that grows a trained draft), draft_step (loss, optimizer, the
jitted step), teacher (the target's top-k, cached), draft_eval (agreement with the target), draft_setup and
draft_loop (the run scripts/train_draft.py drives: `draft_loop.train`).
The EAGLE draft: features (the target's features, cached), eagle_data, eagle_train (the rollout loss and the loop)
and eagle_eval (teacher-forced statistics).
"""
