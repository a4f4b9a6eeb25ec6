"""A short pass of hand mutations over the pure core and the trainer plumbing: each must make a test fail.

    .venv/bin/python -m tests.tools.mutation_pass            # every mutation; prints killed / SURVIVED per mutation
    .venv/bin/python -m tests.tools.mutation_pass core loss  # only those whose label contains "core" or "loss"

Each mutation replaces one exact snippet of one file (it must occur exactly once), runs the test suite with -x
(the fast files first), and restores the file. Not collected by pytest (no test_ prefix).

Equivalent mutants, left out because no test can tell them apart (the behaviour is the same):
- ``(count < 2) |`` in ``core.groups.zero_std_groups``: with 0 or 1 valid rows the spread over them is ``-inf`` or 0,
  already at most ``atol``; the clause stays for the reader.
- ``(count > 0) &`` in ``core.groups.tied_groups``: a group with no valid row has ``high = -inf``, never within
  ``atol``.
- ``.masked_fill(~stat_rows, 0.0)`` in ``core.advantages._finish``: rows outside ``stat_rows`` are NaN before every
  statistic, so ``nan_to_num`` already zeroes them; the fill states the contract.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_ORDER = [
    "tests/core/test_groups.py", "tests/core/test_plan.py", "tests/core/test_advantages.py",
    "tests/core/test_monitor.py", "tests/trainer/test_tied_groups.py", "tests/sampling/test_streams.py",
    "tests/sampling/test_sizes.py", "tests/sampling/test_success_rate.py", "tests/sampling/test_skipping.py",
    "tests/sampling/test_passes.py",
    "tests/sampling/test_refill.py", "tests/trainer/test_decisive_rewards.py", "tests/trainer/test_vllm.py",
    "tests/trainer/test_grpo.py", "tests/trainer/test_rloo.py", "tests/trainer/test_adapter.py",
    "tests/trainer/test_dynamic_sampling.py", "tests/trainer/test_prompt_skipping.py",
    "tests/trainer/test_refill_inputs.py", "tests/trainer/test_config.py", "tests/trainer/test_state.py",
    "tests/trainer/test_resume_settings.py", "tests/launch/test_killed_and_resumed.py",
    "tests/launch/test_distributed.py",
]  # fmt: skip

MUTATIONS = [  # (label, file, original, mutant)
    (
        "tied: a lone valid row trains on its tie",
        "core/plan.py",
        ".sum(dim=1) >= 2) & on",
        ".sum(dim=1) >= 1) & on",
    ),
    (
        "tied: rows that train on their tie enter the statistics",
        "core/plan.py",
        "return (self.role == RowRole.TRAIN) & (self.tied_sign == 0)",
        "return self.role == RowRole.TRAIN",
    ),
    (
        "tied: the entropy shapes the advantage with its gradient",
        "core/advantages.py",
        "entropy = entropies.detach() * mask",
        "entropy = entropies * mask",
    ),
    (
        "tied: each rank logs the advantage sizes of its own rows",
        "trainer/loss.py",
        "return abs_advantage_means(sum_over_ranks(self.tied.abs_advantage_sums(self.rows.policy)))",
        "return abs_advantage_means(self.tied.abs_advantage_sums(self.rows.policy))",
    ),
    (
        "tied: a micro-batch without a tied row hands TRL token advantages",
        "trainer/loss.py",
        "        if tied_sign[kept].any():  # TRL's loss reads (B, T) advantages only where a row is shaped",
        "        if True:",
    ),
    (
        "engine: a server request asks for G copies whatever the rows' layout",
        "trainer/engine.py",
        "n = aligned_copies(gather_object(keys), copies)",
        "n = copies",
    ),
    (
        "engine: a round decoded in one call, however large",
        "trainer/engine.py",
        "for rows in [slice(None)] if flat_images else engine_calls(len(prompt_ids), most):",
        "for rows in [slice(None)]:",
    ),
    ("core: spread strictly below atol", "core/groups.py", "((high - low) <= atol)", "((high - low) < atol)"),
    (
        "core: truncated rows masked as ours",
        "core/plan.py",
        "role[truncated] = RowRole.TRL_MASKED",
        "role[truncated] = RowRole.OUT",
    ),
    (
        "core: invalid rows of a tied group masked as zero_std",
        "core/plan.py",
        "zero_std = expand_groups(zero_groups, num_generations) & valid",
        "zero_std = expand_groups(zero_groups, num_generations)",
    ),
    (
        "grpo: truncated rows stay in the statistics",
        "trainer/grpo.py",
        "self._group_size, plan.trainable,",
        'self._group_size, plan.trainable | plan.reasons["truncated"],',
    ),
    (
        "core: keep_failed keeps the all-correct groups",
        "core/plan.py",
        '"keep_failed": low_tied',
        '"keep_failed": high_tied',
    ),
    (
        "core: reward range keeps the max as low end",
        "core/groups.py",
        "return min(reward_range[0], low), max(reward_range[1], high)",
        "return max(reward_range[0], low), max(reward_range[1], high)",
    ),
    (
        "core: scoring forward may forward zero rows",
        "core/plan.py",
        "count = max(int(needed.sum(dim=1).max()), 1)",
        "count = int(needed.sum(dim=1).max())",
    ),
    (
        "core: scoring forward picks the rows not needed",
        "core/plan.py",
        "torch.argsort((~needed[rank]).int(), stable=True)",
        "torch.argsort(needed[rank].int(), stable=True)",
    ),
    (
        "core: exclude drops TRL's own masked rows",
        "core/plan.py",
        "else role > RowRole.OUT",
        "else role >= RowRole.KL_ONLY",
    ),
    (
        "core: exclude keeps no row when all are masked",
        "core/plan.py",
        "padding = max(rows or 1, int(keep.sum()), 1) - int(keep.sum())",
        "padding = max(rows or 0, int(keep.sum())) - int(keep.sum())",
    ),
    ("core: truncation test inverted", "core/groups.py", "ids[-1] not in stop", "ids[-1] in stop"),
    (
        "core: NaN sampling log-probs reject",
        "core/groups.py",
        "torch.nan_to_num((old_logps - sampling_logps) * loss_mask, nan=0.0)",
        "((old_logps - sampling_logps) * loss_mask)",
    ),
    (
        "estimators: masked rows enter GRPO's group statistics",
        "core/advantages.py",
        'rewards = (rewards_per_func * weights).nansum(dim=1).masked_fill(~stat_rows, float("nan"))',
        "rewards = (rewards_per_func * weights).nansum(dim=1)",
    ),
    (
        "estimators: RLOO baseline over the whole group",
        "core/advantages.py",
        "baselines = ((sums - group_rewards) / (counts - 1)).view(-1)",
        "baselines = ((sums - group_rewards) / counts).view(-1)",
    ),
    (
        "sampling: refill ignores the informative rate",
        "sampling/sizes.py",
        "groups = min(math.ceil(missing / rate), MAX_ROUND_BATCHES * batch_groups)",
        "groups = min(missing, MAX_ROUND_BATCHES * batch_groups)",
    ),
    (
        "sampling: surplus informative groups kept over masked ones",
        "sampling/sizes.py",
        "order = torch.cat([informative.nonzero().view(-1), (~informative).nonzero().view(-1)])",
        "order = torch.arange(len(informative))",
    ),
    (
        "sampling: the stream does not reshuffle passes",
        "sampling/streams.py",
        "self.seed + STREAM_SEED_OFFSET + self.epoch",
        "self.seed + STREAM_SEED_OFFSET",
    ),
    ("adapter: masked rows keep their advantage", "trainer/adapter.py", ").masked_fill(plan.masked, 0.0)", ")"),
    (
        "adapter: tool_mask of masked rows not zeroed",
        "trainer/loss.py",
        '        output["tool_mask"] = output["tool_mask"] * forwarded\n',
        "        pass\n",
    ),
    (
        "adapter: exclude keeps TRL's num_items_in_batch",
        "trainer/adapter.py",
        'output["num_items_in_batch"] = (row_tokens * plan.forwarded).sum().to(output["num_items_in_batch"])',
        "pass",
    ),
    (
        "adapter: keep recounts num_items_in_batch over the forwarded rows",
        "trainer/adapter.py",
        "if exclude and not plan.forwarded.all()",
        "if not plan.forwarded.all()",
    ),
    (
        "adapter: scoring forwards forward every row",
        "trainer/batch.py",
        "        self.scoring_rows = core.forward_rows(self.plan.forwarded.view(world_size, -1), rank)\n",
        "        pass\n",
    ),
    (
        "adapter: truncation masked without mask_truncated_completions",
        "trainer/adapter.py",
        "& bool(self.mask_truncated_completions)",
        "",
    ),
    (
        "adapter: the completions table keeps TRL's advantages",
        "trainer/trl_layout.py",
        "    logged.extend(advantages.tolist())\n",
        "    pass\n",
    ),
    (
        "loss: a MoE aux loss of an all-masked rank keeps its weight",
        "trainer/loss.py",
        "        aux_loss = 0.0 * aux_loss\n",
        "        pass\n",
    ),
    (
        "loss: KL-only rows get an entropy bonus",
        "trainer/loss.py",
        "torch.where(kl_only, entropies.detach(), entropies)",
        "entropies",
    ),
    (
        "loss: exclude drops nothing",
        "trainer/loss.py",
        "    if len(kept) < len(role):\n",
        "    if False:\n",
    ),
    (
        "loss: untrained steps counted as trained",
        "trainer/state.py",
        '"zero_std/untrained_step_frac": float(trained == 0)',
        '"zero_std/untrained_step_frac": float(trained != 0)',
    ),
    (
        "grpo: placeholders keep TRL's reference log-probs",
        "trainer/grpo.py",
        'role < core.RowRole.KL_ONLY, call.fill_logps, inputs["ref_per_token_logps"]',
        'role < 0, call.fill_logps, inputs["ref_per_token_logps"]',
    ),
    (
        "grpo: bnpo keep loses the masked rows' tokens",
        "trainer/grpo.py",
        'if self.loss_type == "bnpo" and self._state.settings.zero_std_normalization == "keep":',
        "if False:",
    ),
    (
        "grpo: entropy quantile over every row",
        "trainer/grpo.py",
        "            mask = mask * self._loss_call.rows.policy.to(mask.device).unsqueeze(1).to(mask.dtype)\n",
        "            pass\n",
    ),
    (
        "rloo: masked rows keep their old_logps",
        "trainer/rloo.py",
        'output["old_logps"] = output["old_logps"].masked_fill(role < core.RowRole.KL_ONLY, 0.0)',
        "pass",
    ),
    (
        "skipping: no floor on the draw probability",
        "sampling/success_rate.py",
        "** DRAW_POWER).clamp(min_draw_prob, 1.0)",
        "** DRAW_POWER).clamp(0.0, 1.0)",
    ),
    ("skipping: skipped prompts not counted", "sampling/streams.py", "skipped += seen - len(places)", "skipped += 0"),
    (
        "refill: the rows handed over lose the prompts TRL prepared for them in their round",
        "trainer/refill_passes.py",
        "prompts[:] = [record.prompt for record in cast(list[RowRecord], refilled.records)]",
        'prompts[:] = [row["prompt"] for row in refilled.rows]',
    ),
    (
        "refill: a later round draws (and resets) an earlier round's environments",
        "trainer/trl_layout.py",
        "shown = {name: [env for env in pool if id(env) not in self._drawn] for name, pool in pools.items()}",
        "shown = {name: list(pool) for name, pool in pools.items()}",
    ),
    (
        "refill: a round that more rounds follow runs on through TRL's method",
        "trainer/refill_passes.py",
        "        raise RoundGenerated  # this pass trains nothing: TRL's method ends here\n",
        "        return generated\n",
    ),
    (
        "refill: a colocated engine stays awake through the scoring forwards of the batch that trains",
        "trainer/refill_passes.py",
        "            self.engine_held.close()\n",
        "            pass\n",
    ),
    (
        "loss: image fields not split per row",
        "trainer/loss.py",
        'images = fields.get("pixel_values") is not None and fields.get("num_images") is not None',
        "images = False",
    ),
    (
        "skipping: a hashed collision applies another prompt's history",
        "sampling/skipping.py",
        "return probs if self.hashed is None else torch.where(self.hashed.known(keys), probs, 1.0)",
        "return probs",
    ),
    (
        "passes: a resumed run draws its passes from the first again",
        "trainer/state.py",
        "            self.train_passes.resume_at(pass_in_progress(folder))\n",
        "            pass\n",
    ),
    (
        "passes: a pass drawn afresh is not reseeded",
        "sampling/passes.py",
        "            self.generator.manual_seed(self.seed)\n",
        "            pass\n",
    ),
    (
        "passes: a pass drawn afresh does not draw the passes before it",
        "sampling/passes.py",
        "            for _ in range(epoch):\n",
        "            for _ in range(0):\n",
    ),
    (
        "skipping: the prior's counts never decay",
        "sampling/success_rate.py",
        "self.group_counts *= PRIOR_DECAY",
        "self.group_counts *= 1.0",
    ),
    (
        "skipping: the prior's counts not restored",
        "sampling/success_rate.py",
        'self.group_counts = state["group_counts"].double()',
        "self.group_counts = self.group_counts",
    ),
    (
        "refill: skip_prior_key not passed to the skipper",
        "trainer/state.py",
        "prior_groups=None if prior_key is None else [repr(value) for value in dataset[prior_key]],",
        "prior_groups=None,",
    ),
    (
        "refill: outcomes never recorded",
        "sampling/refill.py",
        "            metrics.update(self._record_outcomes(pool, reward_range))\n",
        "            pass\n",
    ),
    (
        "skipping: invalid rows counted in a group's successes",
        "sampling/skipping.py",
        "level.masked_fill(~valid, 0.0)",
        "level.nan_to_num(0.0)",
    ),
    (
        "skipping: a prompt's earlier groups never fade",
        "sampling/success_rate.py",
        "SUCCESS_DECAY = 0.5",
        "SUCCESS_DECAY = 1.0",
    ),
    (
        "skipping: the success rate ignores its group's rate",
        "sampling/success_rate.py",
        "prior = RATE_PRIOR_ROWS * self.group_rates()[self.groups[slots]]\n        weights",
        "prior = RATE_PRIOR_ROWS * 0.5 + 0 * slots\n        weights",
    ),
    (
        "skipping: a prompt's evidence never fades as its group's rate moves",
        "sampling/success_rate.py",
        "torch.exp(-self.evidence_fade * log_odds_ratio.clamp(min=0))",
        "torch.ones_like(log_odds_ratio)",
    ),
    (
        "skipping: a prompt's successes fade as its group's rate rises (the fade ignores the move's direction)",
        "sampling/success_rate.py",
        "return fade(-change), fade(change)",
        "return fade(change.abs()), fade(change.abs())",
    ),
    (
        "skipping: faded evidence returns to full weight with a new group",
        "sampling/success_rate.py",
        "evidence[recorded] = weighed.float()",
        "evidence[recorded] = evidence[recorded]",
    ),
    (
        "skipping: a group's rate is the ratio of its decayed counts (no prior: a starved group stays starved)",
        "sampling/success_rate.py",
        "(successes + GROUP_RATE_PRIOR_ROWS / 2) / (rows + GROUP_RATE_PRIOR_ROWS)",
        "torch.where(rows > 0, successes / rows.clamp(min=1e-12), 0.5)",
    ),
    (
        "skipping: success-rate draws not relative to the best group",
        "sampling/success_rate.py",
        "return ((self.informative_prob(slots) / best) ** DRAW_POWER).clamp(min_draw_prob, 1.0)",
        "return (self.informative_prob(slots) ** DRAW_POWER).clamp(min_draw_prob, 1.0)",
    ),
    (
        "skipping: an evicted slot keeps its success rate",
        "sampling/skipping.py",
        "self.rates.clear(self.hashed.claim(key_ids))",
        "self.hashed.claim(key_ids)",
    ),
    (
        "skipping: success rates not restored",
        "sampling/skipping.py",
        'self.rates.load_state_dict(state["rates"])',
        "pass",
    ),
    (
        "skipping: a prompt that ties every group is never stuck",
        "sampling/success_rate.py",
        "return torch.where(split, 0.0, stuck)",
        "return torch.zeros_like(stuck)",
    ),
    (
        "monitor: stall needs one more step",
        "core/monitor.py",
        "if self.untrained_run >= self.patience:",
        "if self.untrained_run > self.patience:",
    ),
    (
        "skipping: a batch's rewards do not widen the range its outcomes are decided by",
        "sampling/skipping.py",
        "low_high = widen_reward_range(reward_range, task_rewards, valid) or (0, 0)",
        "low_high = reward_range or (0, 0)",
    ),
    (
        "state: a resume under other stateful settings adopts them",
        "trainer/state.py",
        "        if refused:\n",
        "        if False:\n",
    ),
    (
        "state: a checkpoint that ran a removed feature resumes",
        "core/settings.py",
        "    if departed:\n",
        "    if False:\n",
    ),
    (
        "config: a field set while its feature is off is accepted",
        "core/settings.py",
        "if value != defaults[name] and not getattr(settings, feature):",
        "if False:",
    ),
    (
        "core: keep drops the rows this package masked",
        "core/plan.py",
        'return torch.ones_like(role, dtype=torch.bool) if normalization == "keep" else role > RowRole.OUT',
        "return role > RowRole.OUT",
    ),
    (
        "config: zero_std_kl kept with beta=0",
        "trainer/config.py",
        'settings.zero_std_kl != "mask" and getattr(args, "beta", None) == 0.0:',
        'settings.zero_std_kl != "mask" and False:',
    ),
    (
        "core: a group tied at the one reward seen counts as failed",
        "core/plan.py",
        "    if low is not None and high is not None and high - low <= zero_std_atol:  # both None or neither\n",
        "    if False:\n",
    ),
    (
        "rewards: every reward function decides a tie",
        "core/groups.py",
        "    if decisive is not None:\n        rewards_per_func = rewards_per_func[:, decisive",
        "    if False:\n        rewards_per_func = rewards_per_func[:, decisive",
    ),
    (
        "adapter: ranks hand TRL's loss different numbers of rows",
        "trainer/adapter.py",
        'most_rows = partial(self._over_ranks, reduction="max")',
        "most_rows = int",
    ),
    (
        "state: the batch does not widen the reward range",
        "trainer/state.py",
        "self.reward_range = core.widen_reward_range(self.reward_range, task_rewards, ~(truncated | rejected))",
        "self.reward_range = self.reward_range",
    ),
]


def run(label_filters: list[str]) -> int:
    python = sys.executable
    survivors = []
    for label, name, original, mutant in MUTATIONS:
        if label_filters and not any(part in label for part in label_filters):
            continue
        path = ROOT / "trl_zerostd" / name
        source = path.read_text()
        if source.count(original) != 1:
            print(f"STALE   {label}: the snippet occurs {source.count(original)} times in {name}")
            survivors.append(label)
            continue
        path.write_text(source.replace(original, mutant))
        start = time.perf_counter()
        try:
            done = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TEST_ORDER],
                                  cwd=ROOT, capture_output=True, text=True, check=False)  # fmt: skip
        finally:
            path.write_text(source)
        killed = done.returncode != 0
        failed = next((line for line in done.stdout.splitlines() if line.startswith("FAILED")), "")
        print(f"{'killed ' if killed else 'SURVIVED'} {label} ({time.perf_counter() - start:.0f} s) {failed[:120]}",
              flush=True)  # fmt: skip
        if not killed:
            survivors.append(label)
    print(f"{len(survivors)} survived: {survivors}")
    return len(survivors)


def stop_on_sigterm(signum, frame) -> None:
    """A ``kill`` ends the pass as Ctrl-C does, through ``run``'s ``finally``: the mutated file is restored."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    sys.exit(1 if run(sys.argv[1:]) else 0)
