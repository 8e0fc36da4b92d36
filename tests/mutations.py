"""The mutation run's list (scripts/dev/mutation_run.py plants each one in a copy of the package and runs the tests it
names; tests/test_mutations.py checks, in the fast suite, that every mutation's text still occurs exactly once and its
tests exist). A plain module of tests/: the tool and the test both read the list, neither imports the other."""
from __future__ import annotations

import dataclasses

SAMPLER = "tests/test_rejection_sampler.py"
LAW = "tests/test_sampled_decoding.py"
KEYS = "tests/test_keys.py"
SSD = "tests/test_ssd.py"
PROPOSALS = "tests/test_proposal_laws.py"
EAGLE_LAW = "tests/test_eagle_decode.py::test_eagle_sampled_decoding_follows_the_numpy_law"
SSD_LAW = f"{LAW}::test_sampled_decoding_follows_the_numpy_law[ssd-1.0-1.0]"  # SSD, neural backup, shuffled head
SSD_LAW_TOP_P = f"{LAW}::test_sampled_decoding_follows_the_numpy_law[ssd-1.5-0.7]"
RAGGED = f"{LAW}::test_ragged_rows_follow_their_own_laws"
VERIFY_KEYS = f"{KEYS}::test_verify_draws_each_rows_uniforms_and_its_bonus_apart"
AR_CHUNK = "tests/test_ar_chunk.py"
SD_CHUNK = "tests/test_sd_chunk.py"
PROCESS_LAW = "tests/test_ssd_processes.py::test_split_temperature_one_matches_target_joint_distribution"
# The draft side's chain and tree (steps.draft_propose, draft_tree) are one code for every kind of draft; these are
# the places where they hand on the q they drew from. A mutation named eagle_* plants its bug there too, but only
# tests that draft with an EAGLE draft may catch it: it shows that kind runs through the shared code.
CHAIN_HANDS = "    return tok, model.scatter_to_vocab(params, probs, cfg)"  # draft_propose (SD, SSD's neural backup)
TREE_HANDS = "    out_q = out_q.at[:, :, d].set(probs)"  # draft_tree (SSD's speculation cache)
PROPOSALS_EAGLE = tuple(f"{PROPOSALS}::test_proposals_draw_their_tokens_from_the_q_they_hand_over[eagle-{s}]"
                        for s in ("1.3-0.7-1.0", "0.7-1.0-0.3", "1.0-0.8-0.5"))


def handed(law: str) -> str:
  """Returns the text of a draft law q' computed afresh from the logits `lg` with other settings: what a mutation
  hands the verifier instead of the law its tokens were drawn from."""
  return f"sampling.saguaro_rescale(sampling.processed_probs({law}), saguaro_c, saguaro_top)"


@dataclasses.dataclass(frozen=True)
class Mutation:
  name: str
  file: str           # relative to the repository root
  old: str            # occurs exactly once in `file`
  new: str
  tests: tuple        # pytest node ids / files, run in the copy; at least one must fail
  bug: str            # what the mutation does, in words
  heads: tuple = ("tiny", "real")  # the test heads (SSD_JAX_TEST_HEAD) that must catch it


MUTATIONS = [
    Mutation("bonus_after_all_k_from_residual", "ssd_jax/decode/sampling.py",
             "q_pad = jnp.concatenate([q, jnp.zeros((b, 1, v), q.dtype)], axis=1)",
             "q_pad = jnp.concatenate([q, q[:, -1:]], axis=1)",
             (f"{SAMPLER}::test_every_position_of_a_round_follows_the_target",),
             "after all K accepted, the bonus comes from normalise(max(0, p_{K+1} - q_K)) instead of p_{K+1}"),
    Mutation("residual_from_p", "ssd_jax/decode/sampling.py",
             "resid = jnp.maximum(p_k - q_k, 0.0)", "resid = jnp.maximum(p_k, 0.0)",
             (SAMPLER,), "after a rejection the replacement is drawn from p instead of max(0, p - q)"),
    Mutation("temperature_multiplied", "ssd_jax/decode/sampling.py",
             "jax.nn.softmax(logits / jnp.maximum(temperature, 1e-6), axis=-1)",
             "jax.nn.softmax(logits * jnp.maximum(temperature, 1e-6), axis=-1)",
             (f"{SAMPLER}::test_processed_probs_equals_the_numpy_law",
              f"{LAW}::test_sampled_decoding_follows_the_numpy_law"),
             "temperature applied as logits * T instead of logits / T"),
    Mutation("top_p_on_the_draft_only", "ssd_jax/decode/steps.py",
             "    p = sampling.processed_probs(lg, temperature, top_p)\n    return sampling.rejection_sample",
             "    p = sampling.processed_probs(lg, temperature, 1.0)\n    return sampling.rejection_sample",
             (f"{LAW}::test_sampled_decoding_follows_the_numpy_law",),
             "the verifier's p ignores top_p (the draft and the first token apply it)"),
    Mutation("greedy_verify_at_t_above_0", "ssd_jax/decode/steps.py",
             "accept_len, bonus = jax.lax.cond(temperature > 0, sampled,",
             "accept_len, bonus = jax.lax.cond(temperature > 1e9, sampled,",
             (f"{LAW}::test_sampled_decoding_follows_the_numpy_law", "tests/test_sd.py", SSD),
             "verification (and so AR's step, a verify of no drafts) routed to the greedy rule at T > 0"),
    Mutation("saguaro_chain_hands_plain_q", "ssd_jax/decode/steps.py", CHAIN_HANDS,
             "    return tok, model.scatter_to_vocab(params, sampling.processed_probs(logits_row, temperature, top_p), "
             "cfg)",
             (f"{LAW}::test_chain_proposal_returns_the_q_it_sampled_from",
              f"{LAW}::test_ssd_saguaro_tokens_served_from_the_cache_follow_the_numpy_law"),
             "draft_propose samples from Saguaro's q' but hands the verifier plain q"),
    Mutation("saguaro_tree_hands_plain_q", "ssd_jax/decode/steps.py", TREE_HANDS,
             "    out_q = out_q.at[:, :, d].set(sampling.processed_probs(lg, temperature, top_p))",
             (f"{LAW}::test_tree_returns_the_q_it_sampled_from",
              f"{LAW}::test_ssd_saguaro_tokens_served_from_the_cache_follow_the_numpy_law"),
             "draft_tree samples from Saguaro's q' but caches plain q for the verifier"),
    Mutation("eagle_saguaro_hands_plain_q", "ssd_jax/decode/steps.py", TREE_HANDS,
             "    out_q = out_q.at[:, :, d].set(sampling.processed_probs(lg, temperature, top_p))",
             ("tests/test_eagle_decode.py::test_eagle_ssd_saguaro_tokens_served_from_the_cache_follow_the_numpy_law",),
             "the tree, with an EAGLE draft, samples from Saguaro's q' but caches plain q for the verifier"),
    Mutation("sd_draft_key_reused_across_rounds", "ssd_jax/decode/speculator.py",
             "fold(self.root, self.rnd)", "fold(self.root, 1)",
             (KEYS,), "SD's draft uses round 1's key every round"),
    Mutation("verify_key_reused_across_rounds", "ssd_jax/decode/rounds.py",
             "fold(self.verify_root, rnd)", "fold(self.verify_root, 1)",
             (KEYS,), "the verifier uses round 1's key every round (AR, SD and SSD)"),
    Mutation("ar_chunk_steps_reuse_the_first_key", "ssd_jax/decode/steps.py",
             "active, keys[i], temperature", "active, keys[0], temperature",
             (f"{AR_CHUNK}::test_chunks_give_the_unfused_tokens",),
             "every step of a chunk of AR steps (steps.ar_chunk) draws with the chunk's first key"),
    Mutation("ar_chunks_overlap_in_rounds", "ssd_jax/decode/rounds.py",
             "(rnd - 1) * self.chunk + 1", "rnd",
             (f"{AR_CHUNK}::test_chunks_give_the_unfused_tokens",),
             "chunk r of AR steps takes the keys of rounds r..r+n-1: chunks share keys, and differ from the unfused "
             "loop's"),
    Mutation("sd_chunk_rounds_share_the_verify_key", "ssd_jax/decode/sd_chunk.py",
             "active, vkeys[i], temperature", "active, vkeys[0], temperature",
             (f"{SD_CHUNK}::test_chunks_give_the_unfused_tokens",),
             "every round of a chunk of SD rounds (sd_chunk.py) verifies with the chunk's first round's key"),
    Mutation("sd_chunk_chain_takes_the_rounds_own_key", "ssd_jax/decode/sd_chunk.py",
             "(None, 0))(droot, r + 1)", "(None, 0))(droot, r)",
             (f"{SD_CHUNK}::test_chunks_give_the_unfused_tokens",),
             "the chain a chunk drafts after round r's outcome draws with key r, the key of the chain already "
             "verified in round r"),
    Mutation("sd_chunk_commits_the_first_round_n_times", "ssd_jax/decode/sd_chunk.py",
             "book.commit(acc[i], bonus[i], drafts[i], t1, stream)",
             "book.commit(acc[0], bonus[0], drafts[0], t1, stream)",
             (f"{SD_CHUNK}::test_chunks_give_the_unfused_tokens",),
             "the host commits a chunk's first outcome for each of its rounds"),
    Mutation("verify_reads_a_stale_bonus", "ssd_jax/decode/rounds.py",
             "return self.rep(last), self._active[1]", "return self.rep(self.first), self._active[1]",
             ("tests/test_decode.py::test_greedy_matches_full_forward_argmax",),
             "each verify feeds the first token as x_L instead of the bonus the previous round drew (kept on the "
             "target)"),
    Mutation("sd_chain_tail_misses_the_bonus", "ssd_jax/decode/steps.py",
             "text = jnp.concatenate([window, drafts, bonus[:, None]], axis=1)",
             "text = jnp.concatenate([window, drafts, window[:, -1:]], axis=1)",
             ("tests/test_sd_chain.py",),
             "SD's chain advances its tail on the device with the previous x_L where the bonus goes: the output stays "
             "exact (the verify checks every draft), only the drafts go wrong"),
    Mutation("verify_takes_the_drafts_stream", "ssd_jax/decode/rounds.py",
             "stream_key(opts.seed, VERIFY_STREAM)", "stream_key(opts.seed, 0x5EED)",
             (KEYS,), "the verifier draws from the draft's stream: SD's verify and draft share a round's key"),
    Mutation("ssd_neural_backup_key_reused", "ssd_jax/decode/tree_draft.py",
             "self._key(self.rnd, 2)", "self._key(1, 2)",
             (KEYS,), "SSD's neural backup uses one key every round"),
    Mutation("ssd_fast_backup_key_reused", "ssd_jax/decode/tree_draft.py",
             "self._key(self.rnd, 3)", "self._key(1, 3)",
             (KEYS,), "SSD's fast backup uses one key every round"),
    Mutation("tree_key_reused_across_rounds", "ssd_jax/decode/tree_draft.py",
             "self._key(self.rnd + 1, 1)", "self._key(1, 1)",
             (KEYS,), "the speculation tree is drafted with one key every round"),
    Mutation("tree_key_reused_across_depths", "ssd_jax/decode/steps.py",
             "tok, probs = draw(params, lg, jax.random.fold_in(keys[0], d), ",
             "tok, probs = draw(params, lg, keys[0], ",
             (KEYS,), "every depth of the tree draws with the same key"),
    Mutation("one_key_for_all_rows", "ssd_jax/decode/sampling.py",
             "return jax.random.split(jax.random.fold_in(key, step), batch)",
             "return jnp.stack([jax.random.fold_in(key, step)] * batch)",
             (KEYS, f"{LAW}::test_sampled_decoding_follows_the_numpy_law"),
             "row_keys gives every row the same key (first tokens, AR steps)"),
    Mutation("one_draft_key_for_all_rows", "ssd_jax/decode/steps.py",
             "draw(params, logits_row, jax.random.split(kk, b), ",
             "draw(params, logits_row, jnp.broadcast_to(kk, (b,)), ",
             (KEYS,), "draft_propose draws every row with the same key"),
    Mutation("fast_backup_q_mismatch", "ssd_jax/decode/backup.py",
             "toks = jax.random.randint(key, (batch, k), 0, vocab, dtype=jnp.int32)",
             "toks = jax.random.randint(key, (batch, k), 0, max(vocab // 2, 1), dtype=jnp.int32)",
             (f"{SSD}::test_ssd_temperature_one_exact_with_fast_backups",),
             "the fast backup drafts from half the vocabulary while its q says uniform over all of it"),
    Mutation("ngram_backup_q_mismatch", "ssd_jax/decode/backup.py",
             "return jax.nn.one_hot(tokens, vocab, dtype=jnp.float32)",
             "return jnp.full(tokens.shape + (vocab,), 1.0 / vocab, jnp.float32)",
             (f"{SSD}::test_ssd_temperature_one_exact_with_fast_backups",),
             "the n-gram backup's deterministic proposal handed over as a uniform q"),
    Mutation("row_merging_takes_the_backups_q", "ssd_jax/decode/steps.py",
             "jnp.where(hit[:, None, None], a_q, b_q)", "b_q",
             (f"{SSD}::test_merge_rows_keeps_each_rows_tokens_with_their_q",
              f"{SSD}::test_ssd_temperature_one_exact_with_fast_backups"),
             "rows that hit keep their cached tokens but get the backup's q"),
    Mutation("eagle_ignores_verify_features", "ssd_jax/decode/draft.py",
             "self.hist = self.run(eagle_observe, self.params, self.hist, self.put(features), self.put(start),\n"
             "                         platform=self.platform)",
             "self.hist = self.hist",
             ("tests/test_eagle_decode.py",), "an EAGLE draft drops the target features each verify returns"),
    Mutation("eos_only_at_the_bonus", "ssd_jax/decode/base.py",
             "      new, stopped = self.opts.cut_at_stop(new[: self.opts.max_new_tokens - len(self.out[i])])",
             "      new = new[: self.opts.max_new_tokens - len(self.out[i])]\n"
             "      stopped = bool(new) and new[-1] in self.opts.stop_ids",
             ("tests/test_sd.py::test_greedy_sd_stops_at_the_first_of_several_eos_ids",
              f"{SSD}::test_greedy_ssd_stops_at_the_first_of_several_eos_ids"),
             "a speculative round ends a row only when its last token is a stop id: an EOS among the accepted drafts "
             "is passed over"),
    Mutation("eos_set_read_as_one_id", "ssd_jax/decode/options.py",
             "    return frozenset(() if self.ignore_eos else self.eos_id)",
             "    return frozenset(() if self.ignore_eos else self.eos_id[:1])",
             ("tests/test_decode.py::test_eos_ids_normalised_and_checked",
              "tests/test_sd.py::test_greedy_sd_stops_at_the_first_of_several_eos_ids"),
             "only the first id of the end-of-sequence set stops a row (Llama 3's <|eot_id|> would be passed over)"),
    # Head rows and token ids (the test drafts' heads are shuffled, non-prefix subsets: tests/draft_heads.py).
    Mutation("compact_q_to_a_prefix", "ssd_jax/decode/steps.py",
             "return q[..., head_ids]", "return q[..., :head_ids.shape[0]]",
             (SSD_LAW, PROCESS_LAW),
             "q compacted to the draft's head (pipe, served backup) takes the first V_out token ids, not head_ids"),
    Mutation("scatter_q_to_a_prefix", "ssd_jax/models/model.py",
             'return out.at[..., params["head_ids"]].set(probs_head)',
             "return out.at[..., :probs_head.shape[-1]].set(probs_head)",
             (PROPOSALS, SSD_LAW),
             "a draft's q over its head rows is scattered to the first V_out token ids instead of head_ids"),
    Mutation("chain_returns_head_rows", "ssd_jax/decode/steps.py", CHAIN_HANDS,
             '    return params["vocab_map"][tok], model.scatter_to_vocab(params, probs, cfg)',
             (PROPOSALS, f"{LAW}::test_sampled_decoding_follows_the_numpy_law[sd-1.0-1.0]"),
             "draft_propose returns head rows as token ids (right only for a prefix head)"),
    Mutation("tree_returns_head_rows", "ssd_jax/decode/steps.py",
             "saguaro_top, cfg)\n    out_t = out_t.at[:, :, d].set(tok)",
             'saguaro_top, cfg)\n    tok = params["vocab_map"][tok]\n    out_t = out_t.at[:, :, d].set(tok)',
             (PROPOSALS, SSD_LAW),
             "draft_tree's speculations hold head rows instead of token ids"),
    Mutation("eagle_returns_head_rows", "ssd_jax/decode/steps.py", CHAIN_HANDS,
             '    return params["vocab_map"][tok], model.scatter_to_vocab(params, probs, cfg)',
             PROPOSALS_EAGLE + (EAGLE_LAW + "[ssd-neural-1.0-1.0]",),
             "the chain, with an EAGLE draft, returns head rows as token ids"),
    # Each kind of draft hands the verifier the law it drew from, at every temperature and top-p.
    Mutation("eagle_q_at_temperature_1", "ssd_jax/decode/steps.py", TREE_HANDS,
             f"    out_q = out_q.at[:, :, d].set({handed('lg, 1.0, top_p')})",
             PROPOSALS_EAGLE + (EAGLE_LAW + "[ssd-neural-0.5-0.7]",),
             "the tree, with an EAGLE draft, draws at temperature T but caches its law at T = 1"),
    Mutation("eagle_q_without_top_p", "ssd_jax/decode/steps.py", TREE_HANDS,
             f"    out_q = out_q.at[:, :, d].set({handed('lg, temperature, 1.0')})",
             PROPOSALS_EAGLE + (EAGLE_LAW + "[ssd-neural-1.5-0.7]",),
             "the tree, with an EAGLE draft, draws from the top-p nucleus but caches its law without top-p"),
    # A reviewer's own plants (issue 47's second check) that the list did not hold.
    Mutation("eagle_chain_q_at_temperature_1", "ssd_jax/decode/steps.py", CHAIN_HANDS,
             f"    return tok, model.scatter_to_vocab(params, {handed('logits_row, 1.0, top_p')}, cfg)",
             PROPOSALS_EAGLE + (EAGLE_LAW + "[ssd-neural-1.5-0.7]",),
             "the chain (SD, SSD's neural backup), with an EAGLE draft, draws at T but hands its law at T = 1"),
    Mutation("chain_q_without_top_p", "ssd_jax/decode/steps.py", CHAIN_HANDS,
             f"    return tok, model.scatter_to_vocab(params, {handed('logits_row, temperature, 1.0')}, cfg)", (PROPOSALS, SSD_LAW_TOP_P),
             "draft_propose draws from the top-p nucleus but hands the verifier its law without top-p"),
    Mutation("tree_q_at_temperature_1", "ssd_jax/decode/steps.py", TREE_HANDS,
             f"    out_q = out_q.at[:, :, d].set({handed('lg, 1.0, top_p')})", (PROPOSALS, SSD_LAW_TOP_P),
             "draft_tree draws at temperature T but caches its law at T = 1"),
    # Ragged rows at T > 0: rows of different prompts accept different numbers of drafts.
    Mutation("residual_at_row_0s_accept_len", "ssd_jax/decode/sampling.py",
             "p_k = jnp.take_along_axis(p, accept_len[:, None, None], 1)[:, 0]",
             "p_k = jnp.take_along_axis(p, jnp.broadcast_to(accept_len[:1], accept_len.shape)[:, None, None], 1)"
             "[:, 0]",
             (RAGGED,), "every row's bonus is drawn at row 0's acceptance length (rows of one batch differ)"),
    Mutation("lookup_q_at_row_0s_branch", "ssd_jax/decode/steps.py",
             "return jnp.take_along_axis(tree_q, branch[:, None, None, None], 1)[:, 0]", "return tree_q[:, branch[0]]",
             (SSD + "::test_lookup_serves_each_row_its_own_branch", RAGGED),
             "a cache hit serves each row its own branch's tokens with the q of row 0's branch (branch 0 if row 0 missed)"),
    Mutation("ssd_hit_sends_the_outcome_before_the_next_verify", "ssd_jax/decode/ssd_loop.py",
             "      bytes_in += got\n",
             "      bytes_in += got\n      if was_hit:\n        link.send(\"outcome\", outcome)\n"
             "        _expect(link.receive(), HIT)\n        was_hit = False\n",
             ("tests/test_ssd_round_order.py",),
             "on a hit the target sends the outcome to the draft side and waits for its reply before dispatching "
             "the next verify (the host round trip SSD's round must not have)"),
    Mutation("target_picks_q_at_row_0s_branch", "ssd_jax/decode/rounds.py",
             "q[np.arange(len(branch)), branch]", "q[:, branch[0]]",
             ("tests/test_ssd_round_order.py::test_the_target_picks_each_rows_own_branch_from_the_cache", PROCESS_LAW),
             "the target, looking a hit up in a draft process's cache, gives every row the q of row 0's branch"),
    Mutation("ssd_program_reuses_its_first_rounds_key", "ssd_jax/decode/ssd_loop.py",
             "jax.random.fold_in(root, first_round + i)", "jax.random.fold_in(root, first_round)",
             ("tests/test_ssd_loop.py::test_one_program_draws_the_host_loops_samples",
              "tests/test_ssd_processes.py::test_same_seed_same_samples_in_both_placements"),
             "SSD's rounds in one program verify every round of a call with the call's first key"),
    Mutation("ssd_program_picks_q_at_row_0s_branch", "ssd_jax/decode/ssd_loop.py",
             "cache.q[np.arange(len(branch)), branch]", "cache.q[:, branch[0]]",
             ("tests/test_ssd_loop.py::test_one_program_draws_the_host_loops_samples", PROCESS_LAW),
             "SSD's rounds in one program serve a hit every row's tokens with the q of row 0's branch"),
    Mutation("target_serves_row_0s_cached_tokens", "ssd_jax/decode/speculator.py",
             "return cache.tokens[np.arange(len(branch)), branch]", "return cache.tokens[:, branch[0]]",
             (SSD + "::test_lookup_serves_each_row_its_own_branch", RAGGED),
             "a cache hit serves every row the tokens of row 0's branch, with the q of its own branch: the tokens "
             "and the law verified for them differ"),
    Mutation("fork_candidates_as_head_rows", "ssd_jax/decode/steps.py",
             "return model.to_token_ids(params, top_rows[:, branch_j, rank], cfg), jnp.asarray(branch_j)",
             "return top_rows[:, branch_j, rank], jnp.asarray(branch_j)",
             (SSD + "::test_tree_branches_equal_plain_forward[True]", SSD_LAW),
             "SSD's fork guesses head rows as bonus tokens (the cache stays consistent, and hits the wrong outcomes)"),
    # Keys inside one verify.
    Mutation("verify_uniforms_shared_by_rows", "ssd_jax/decode/sampling.py",
             "u = jax.random.uniform(ku, (b, k), jnp.float32)",
             "u = jnp.broadcast_to(jax.random.uniform(ku, (1, k), jnp.float32), (b, k))",
             (VERIFY_KEYS,), "the verifier's acceptance uniforms are the same for every row"),
    Mutation("verify_uniform_shared_by_positions", "ssd_jax/decode/sampling.py",
             "u = jax.random.uniform(ku, (b, k), jnp.float32)", "u = jax.random.uniform(ku, (b, 1), jnp.float32)",
             (f"{SAMPLER}::test_every_position_of_a_round_follows_the_target",
              f"{LAW}::test_sampled_decoding_follows_the_numpy_law[sd-1.0-1.0]"),
             "the verifier draws one acceptance uniform per row, shared by its K positions"),
    Mutation("verify_uniforms_and_bonus_one_key", "ssd_jax/decode/sampling.py",
             "ku, kb = jax.random.split(key)", "ku = kb = key",
             (VERIFY_KEYS,), "the verifier draws its uniforms and the bonus token from one key"),
    Mutation("reduced_head_target_accepted", "ssd_jax/decode/options.py",
             "if target_cfg.head_vocab is not None:", "if False:",
             ("tests/test_sd.py::test_a_target_with_a_reduced_head_is_rejected",),
             "check_pair lets a target with a reduced head through (verify reads p by token id)"),
    # Only at a real vocabulary's size: ids above int16's 32767 (the tiny pair's ids are all below 4).
    Mutation("draft_ids_through_int16", "ssd_jax/decode/steps.py",
             "  return model.to_token_ids(params, tok, cfg), probs",
             "  return model.to_token_ids(params, tok, cfg).astype(jnp.int16).astype(jnp.int32), probs",
             (f"{LAW}::test_sampled_decoding_follows_the_numpy_law[sd-1.0-1.0]", SSD_LAW,
              EAGLE_LAW + "[ssd-neural-1.0-1.0]"),
             "every draft kind's drafted token ids pass through int16 (ids above 32767 wrap)", ("real",)),
    Mutation("compact_q_by_int16_ids", "ssd_jax/decode/steps.py",
             "return q[..., head_ids]", "return q[..., head_ids.astype(jnp.int16)]",
             (SSD_LAW, PROCESS_LAW),
             "q compacted to the draft's head (pipe, served backup) is gathered by head ids narrowed to int16",
             ("real",)),
    # Issue 57: a lost draft side, and the tests strengthened to catch what their names guard against.
    Mutation("lost_draft_drops_the_verify_in_flight", "ssd_jax/decode/ssd_loop.py",
             "  if pending is None:\n    return last", "  if True:\n    return last",
             ("tests/test_draft_faults.py",),
             "a draft side lost while a verify runs: that verify's outcome is never committed, and the target goes "
             "on alone from the text before it"),
    Mutation("sd_chunks_never_shrink", "ssd_jax/decode/sd_chunk.py",
             "n = next(s for s in self.sizes if s <= left)", "n = self.sizes[0]",
             (f"{SD_CHUNK}::test_one_call_a_chunk",),
             "SD's chunks keep n rounds to the end instead of n/2, .., 1 when fewer tokens are left"),
    Mutation("sd_fuses_a_draft_that_reads_features", "ssd_jax/decode/sd_chunk.py",
             "isinstance(side, ChainDraft) and not dec.feature_layers", "isinstance(side, ChainDraft)",
             (f"{SD_CHUNK}::test_not_fused_for_a_draft_reading_features",),
             "SD's rounds are fused for a draft that reads the target's features (which the fused program lacks)"),
    Mutation("cut_head_in_plain_id_order", "ssd_jax/models/drafts.py",
             "keep = sorted(int(i) for i in keep)", "keep = []",
             ("tests/test_offshelf_drafts.py::test_a_cut_head_keeps_the_special_tokens_wherever_they_lie",),
             "a cut draft head takes the lowest ids, dropping special and end-of-sequence tokens above them"),
    Mutation("gguf_rope_freqs_drop_the_linear_factor", "ssd_jax/models/families.py",
             "divisors=tuple(float(x) * factor for x in", "divisors=tuple(float(x) for x in",
             ("tests/test_families.py::test_a_gguf_with_rope_freqs_and_linear_scaling_applies_both",),
             "a GGUF with rope_freqs.weight and linear scaling applies the divisors only"),
    Mutation("auto_k_reads_batch_ones_costs", "ssd_jax/decode/auto_k.py",
             "ar, verify, draft = costs.at(batch, prefix)", "ar, verify, draft = costs.at(1, prefix)",
             ("tests/test_auto_k.py::test_choose_k_reads_each_batchs_own_costs",),
             "k='auto' weighs every batch by batch 1's step costs"),
    Mutation("acceptance_at_the_first_temperature", "ssd_jax/decode/auto_k.py",
             "float(calibration[min(calibration, key=lambda t: abs(t - temperature))][0])",
             "float(calibration[next(iter(calibration))][0])",
             ("tests/test_auto_k.py::test_acceptance_reads_the_calibration_at_the_nearest_temperature",),
             "k='auto' reads the draft's acceptance at its calibration's first temperature, whatever the run's"),
    Mutation("memory_check_ignores_the_cut_head", "ssd_jax/memory_check.py",
             "cfg = dataclasses.replace(got[0], head_vocab=plan.draft_head_vocab, full_embed=True, "
             "tie_embeddings=False)\n  return cfg, param_bytes(cfg, got[2], fmt), got[2]",
             "return got",
             ("tests/test_memory_check.py::test_a_cut_head_is_sized_as_it_is_held",),
             "decode.py's memory check sizes a draft whose head load() cuts as if it kept its whole head"),
    Mutation("target_not_pinned_in_the_split_placement", "ssd_jax/decode/draft_process.py",
             "    set_process_affinity(self.target_cores)\n", "",
             ("tests/test_threads.py::test_split_placement_keeps_each_sides_threads_on_its_cores",),
             "SSD's split placement leaves the target's threads free to run on the draft's cores"),
]
