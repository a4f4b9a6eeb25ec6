"""Does a change of the package's code change what it trains? Runs arms of ``time_to_accuracy.py`` (its flags and
evaluation) for one seed and records, per arm, the held-out evaluations, the generated tokens at every step and a
SHA-256 of the final parameters; ``--compare`` checks two such records for equality.

    # before the change (a worktree of the old commit, this file copied into its benchmarks/):
    (cd /tmp/before && python -m benchmarks.behaviour_unchanged --out /tmp/behaviour_before.json)
    python -m benchmarks.behaviour_unchanged --out /tmp/behaviour_after.json      # after it
    python -m benchmarks.behaviour_unchanged --compare /tmp/behaviour_before.json /tmp/behaviour_after.json

(A commit older than the ``python -m`` layout of ``benchmarks/`` ran the copied file by path, with
``PYTHONPATH=/tmp/before``.)

Each run trains in a fresh process (the seed fixes everything on CPU), two at a time.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.time_to_accuracy import TimeToAccuracyArguments, arm_flags, common_flags

ARMS = ["trl", "masking", "dynamic", "skip-rate-prior-f02", "dynamic+skip-prior-8g-screen4"]


@dataclass
class BehaviourArguments:
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    seed: int = field(default=0)
    max_steps: int = field(default=60)
    eval_steps: int = field(default=20)
    out: str | None = field(default=None, metadata={"help": "Where to write the record (JSON)."})
    compare: list[str] = field(default_factory=list, metadata={"help": "Two records to compare."})
    jobs: int = field(default=2)


def params_sha256(model) -> str:
    """SHA-256 over every parameter's bytes, in name order."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def run_arm(job: tuple[str, int, int, int]) -> dict:
    import trl_zerostd
    from benchmarks.runs import optimizer_steps, train_job

    arm, seed, max_steps, eval_steps = job
    args = TimeToAccuracyArguments(arms=[arm], seeds=[seed], max_steps=max_steps, eval_steps=eval_steps)
    flags = [*arm_flags(arm, args), *common_flags(args)]
    trainer = train_job((arm, flags, args.learning_rate, seed, max_steps, f"outputs/behaviour/{arm}-seed{seed}"))
    steps = optimizer_steps(trainer.state.log_history)
    return {
        "arm": arm,
        "package": str(Path(trl_zerostd.__file__).parent),
        "eval": [[e["step"], e["eval_reward"]] for e in trainer.state.log_history if "eval_reward" in e],
        "num_tokens": [entry["num_tokens"] for entry in steps],
        "params_sha256": params_sha256(trainer.model),
    }


def compare(before: list[dict], after: list[dict]) -> bool:
    """Print, per arm, whether every recorded field is equal; True when all are."""
    same = True
    for old, new in zip(before, after, strict=True):
        fields = {key: old[key] == new[key] for key in ("arm", "eval", "num_tokens", "params_sha256")}
        print(f"{old['arm']}: " + ", ".join(f"{key} {'equal' if ok else 'DIFFERS'}" for key, ok in fields.items()))
        same &= all(fields.values())
    return same


def main(args: BehaviourArguments) -> int:
    if args.compare:
        before, after = (json.loads(Path(path).read_text()) for path in args.compare)
        return 0 if compare(before, after) else 1
    jobs = [(arm, args.seed, args.max_steps, args.eval_steps) for arm in args.arms]
    with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        records = pool.map(run_arm, jobs)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(records, indent=1))
    print(f"{args.out}: {[(r['arm'], r['eval'][-1][1], r['params_sha256'][:12]) for r in records]}")
    return 0


if __name__ == "__main__":
    from trl import TrlParser

    (parsed,) = TrlParser((BehaviourArguments,)).parse_args_and_config()
    sys.exit(main(parsed))
