"""Does prompt skipping's exploration controller reach its target share of zero-variance groups? A simulation of
``skipping.ExploreProbs`` alone, no model: each generation batch draws ``groups`` outcomes from a population that is
20% informative, 40% all-low, 40% all-high, where a zero-variance kind is drawn in proportion to its ``p`` (as a
prompt with one zero-variance outcome in a row is). The controller steers ``p`` by each kind's share of the groups
generated: by one batch's share (``share_decay`` 0, the controller before issue 18) or by a share decayed over
batches (``share_decay`` 0.9, the default). One batch's share is 0 or at least 1/groups, so steering by it is biased.

    python -m benchmarks.explore_controller

Prints, per batch size and target, the mean zero-variance share of the second half of 2,000 batches (mean over 5
seeds) and the final p of each kind. The lowest share reachable is 0.167 (both p at the floor 0.05).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from trl_zerostd.predictors import SHARE_DECAY, ExploreProbs

POPULATION = (0.2, 0.4, 0.4)  # informative, all-low, all-high


@dataclass
class ControllerArguments:
    groups: list[int] = field(default_factory=lambda: [4, 8, 16], metadata={"help": "Groups per generation batch."})
    targets: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5])
    batches: int = field(default=2000)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    min_draw_prob: float = field(default=0.05)


def simulate(groups: int, target: float, share_decay: float, batches: int, seed: int, min_draw_prob: float = 0.05):
    """``(mean zero-variance share over the second half, final p all-low, final p all-high)``."""
    generator = torch.Generator().manual_seed(seed)
    probs = ExploreProbs(target=target, min_draw_prob=min_draw_prob, share_decay=share_decay)
    shares = []
    for batch in range(batches):
        weights = torch.tensor([POPULATION[0], POPULATION[1] * probs.all_low, POPULATION[2] * probs.all_high])
        outcomes = torch.multinomial(weights / weights.sum(), groups, replacement=True, generator=generator)
        probs.adapt(outcomes)
        if batch >= batches // 2:
            shares.append((outcomes != 0).float().mean().item())
    return statistics.fmean(shares), probs.all_low, probs.all_high


def main(args: ControllerArguments) -> None:
    print(
        "| groups a batch | target | share, one batch's (decay 0) | share, decayed (decay 0.9) | final p low / high, decay 0 | final p low / high, decay 0.9 |"  # noqa: E501
    )
    print("|---|---|---|---|---|---|")
    for groups in args.groups:
        for target in args.targets:
            row = []
            for decay in (0.0, SHARE_DECAY):
                runs = [simulate(groups, target, decay, args.batches, seed, args.min_draw_prob) for seed in args.seeds]
                row.append(tuple(statistics.fmean(run[i] for run in runs) for i in range(3)))
            (old, old_low, old_high), (new, new_low, new_high) = row
            print(f"| {groups} | {target} | {old:.3f} | {new:.3f} | {old_low:.2f} / {old_high:.2f} | "
                  f"{new_low:.2f} / {new_high:.2f} |")  # fmt: skip


if __name__ == "__main__":
    from trl import TrlParser

    (parsed,) = TrlParser((ControllerArguments,)).parse_args_and_config()
    main(parsed)
