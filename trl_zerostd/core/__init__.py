"""The pure core: functions on tensors with no trainer or TRL import, each testable alone. ``groups``: rows, groups,
masks and task rewards; ``plan``: the row plan of a batch and the rows each forward reads; ``advantages``: GRPO's and
RLOO's advantages under a plan; ``monitor``: the stall monitor; ``settings``: the package's fields and their checks.

The functions of ``groups`` and ``plan`` are also reachable here (``core.decide_row_plan``).
"""

from .groups import (
    MASK_REASONS,
    check_groups_share_prompt,
    decisive_functions,
    expand_groups,
    grouped,
    mismatched_groups,
    rejected_rows,
    tied_groups,
    truncated_rows,
    unscorable_rows,
    weighted_task_reward,
    widen_reward_range,
    zero_std_groups,
)
from .plan import (
    LossRows,
    RowPlan,
    RowRole,
    decide_row_plan,
    forward_rows,
    loss_rows,
    loss_rows_needed,
    plan_loss_rows,
    plan_metrics,
)

__all__ = [
    "MASK_REASONS", "LossRows", "RowPlan", "RowRole", "check_groups_share_prompt", "decide_row_plan",
    "decisive_functions", "expand_groups", "forward_rows", "grouped", "loss_rows", "loss_rows_needed",
    "mismatched_groups", "plan_loss_rows", "plan_metrics", "rejected_rows", "tied_groups",
    "truncated_rows", "unscorable_rows", "weighted_task_reward", "widen_reward_range", "zero_std_groups",
]  # fmt: skip
