"""The figure of ``time_to_accuracy.py``'s study: held-out gain against generated tokens and wall time per arm, and
each seed's cost to its target over TRL's."""

from __future__ import annotations

import math
import statistics

from studies.time_to_accuracy_metrics import eval_points, generated_tokens, median, ratios_to_trl, reached, targets

NEVER_X = 4.0  # where the ratio panel draws a seed that never reaches its target


def plot(records: list[dict], args) -> None:
    """Held-out gain over the start (each seed starts from its own warm start) against generated tokens and wall time:
    the mean over seeds per arm, each seed faint; the dotted line is the mean target gain. Right: each seed's tokens
    and wall time to its target over TRL's, the medians marked (the claim; the mean curves average seeds at equal
    steps, which stretches an arm's curve by its costliest seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = targets(records, args.target_fraction)
    start = {r["seed"]: r["eval"][0][1] for r in records if r["arm"] == "trl"}
    figure, all_axes = plt.subplots(1, 3, figsize=(19, 4.8), gridspec_kw={"width_ratios": [1, 1, 0.9]})
    axes, ratio_axis = all_axes[:2], all_axes[2]
    axes[1].sharey(axes[0])
    base = [r for r in records if r["arm"] == "trl"]
    plotted = [r for r in records if r["arm"] in args.plot_arms] or base
    tokens = statistics.fmean(generated_tokens(r)[-1] for r in base)
    wall = statistics.fmean(sum(r["step_time"]) for r in base)
    # to the farthest run plotted, at most 2.5x TRL's (dynamic runs go far past)
    axes[0].set_xlim(0, 1.05 * min(2.5 * tokens, max(generated_tokens(r)[-1] for r in plotted)) / 1e6)
    axes[1].set_xlim(0, 1.05 * min(2.5 * wall, max(sum(r["step_time"]) for r in plotted)))
    for index, arm in enumerate(args.plot_arms):
        runs = [r for r in records if r["arm"] == arm]
        if not runs:
            continue
        points = [[(p[1] - start[r["seed"]], p[2] / 1e6, p[3]) for p in eval_points(r)] for r in runs]
        for run_points in points:
            axes[0].plot([p[1] for p in run_points], [p[0] for p in run_points], color=f"C{index}", alpha=0.15)
            axes[1].plot([p[2] for p in run_points], [p[0] for p in run_points], color=f"C{index}", alpha=0.15)
        mean = [[statistics.fmean(run[k][i] for run in points) for k in range(len(points[0]))] for i in range(3)]
        label = f"{arm} ({len(runs)} seeds)"
        axes[0].plot(mean[1], mean[0], "o-", color=f"C{index}", label=label, markersize=3)
        axes[1].plot(mean[2], mean[0], "o-", color=f"C{index}", label=label, markersize=3)
    axes[0].set_xlabel("generated tokens (millions, TRL's num_tokens)")
    axes[1].set_xlabel("wall clock (s, sum of step times, evaluation excluded)")
    axes[0].set_ylabel(f"held-out reward - start ({args.eval_samples} samples per prompt)")
    mean_target = statistics.fmean(target[seed] - start[seed] for seed in target)
    for axis in axes:
        axis.axhline(mean_target, color="grey", linestyle=":", linewidth=1, label="target (mean over seeds)")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    plot_ratios(ratio_axis, records, args, target)
    figure.suptitle(
        f"{args.title}, held-out split: mean over each arm's seeds (of {len(args.seeds)}), faint: each seed"
    )
    figure.tight_layout()
    figure.savefig(args.plot, dpi=110)
    plt.close(figure)


def plot_ratios(axis, records: list[dict], args, target: dict[int, float]) -> None:
    """Per plotted arm: each seed's tokens (dots) and wall time (crosses) to its target over TRL's, medians as bars;
    a seed that never reaches it is drawn at the right edge (a triangle) and counts as the costliest in the median."""
    base = {r["seed"]: reached(r, target[r["seed"]]) for r in records if r["arm"] == "trl"}
    arms = [arm for arm in args.plot_arms if arm != "trl" and any(r["arm"] == arm for r in records)]
    for row, arm in enumerate(arms):
        ratios = [
            ratios_to_trl(reached(r, target[r["seed"]]), base[r["seed"]])
            for r in records
            if r["arm"] == arm and base.get(r["seed"])
        ]
        for offset, index, marker, label in ((-0.15, 0, "o", "tokens"), (0.15, 1, "x", "wall time")):
            values = [ratio[index] for ratio in ratios]
            shown = [value for value in values if math.isfinite(value)]
            axis.scatter(shown, [row + offset] * len(shown), marker=marker, color=f"C{index}", s=18,
                         label=label if row == 0 else None)  # fmt: skip
            never = len(values) - len(shown)
            axis.scatter([NEVER_X] * never, [row + offset] * never, marker=">", color=f"C{index}", s=18)
            if math.isfinite(median(values)):
                axis.plot([median(values)] * 2, [row + offset - 0.12, row + offset + 0.12], color=f"C{index}",
                          linewidth=3)  # fmt: skip
    axis.set_yticks(range(len(arms)), arms, fontsize=8)
    axis.invert_yaxis()
    for x, style in ((1.0, "-"), (0.5, ":"), (1 / 1.5, "--")):
        axis.axvline(x, color="grey", linestyle=style, linewidth=1)
    axis.set_xscale("log", base=2)
    axis.set_xticks([0.25, 0.5, 2 / 3, 1, 2, NEVER_X], ["0.25", "0.5", "0.67", "1", "2", "never"])
    axis.minorticks_off()
    axis.set_xlabel("to target, / TRL (per seed; bar: median; lines at 1, 1/1.5, 1/2)")
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3, axis="x")
