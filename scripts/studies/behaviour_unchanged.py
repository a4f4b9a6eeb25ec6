"""Does a change of the package's code change what it trains? Runs arms of ``time_to_accuracy.py`` (its flags and
evaluation; ``--study real``: of ``time_to_accuracy_real.py``, the real model's configuration) for one seed and
records, per arm, the held-out evaluations, the generated tokens at every step, a SHA-256 of the final parameters
(with LoRA, the adapter's among them), the package's state and every logged entry but its timings; ``--compare``
checks two such records for equality.

    # before the change (a worktree of the old commit, this file copied into its scripts/studies/):
    (cd /tmp/before && python scripts/studies/behaviour_unchanged.py --out /tmp/behaviour_before.json)
    python scripts/studies/behaviour_unchanged.py --out /tmp/behaviour_after.json      # after it
    python scripts/studies/behaviour_unchanged.py --compare /tmp/behaviour_before.json /tmp/behaviour_after.json
    python scripts/studies/behaviour_unchanged.py --study real --arms keep_failed skip-rate-prior --max_steps 3 \
        --eval_steps 3 --out /tmp/real_after.json          # the real model's first steps

(A commit older than the ``python -m`` layout of ``scripts/studies/`` ran the copied file by path, with
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

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies.time_to_accuracy import TimeToAccuracyArguments, arm_flags, common_flags
from studies.time_to_accuracy_real import RealTimeToAccuracyArguments

ARMS = ["trl", "masking", "keep_failed", "dynamic", "skip-rate", "skip-rate-prior-f02"]
TIMINGS = ("time", "runtime", "per_second", "generation_s")  # logged keys that measure the clock, not the training
COMPARED = ("arm", "eval", "num_tokens", "params_sha256", "state", "logged")


@dataclass
class BehaviourArguments:
    study: str = field(default="spread", metadata={"help": "'spread' (time_to_accuracy.py) or 'real'."})
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


def run_arm(job: tuple[str, str, int, int, int]) -> dict:
    import trl_zerostd
    from studies.runs import optimizer_steps, train_job

    study, arm, seed, max_steps, eval_steps = job
    arguments = RealTimeToAccuracyArguments if study == "real" else TimeToAccuracyArguments
    args = arguments(arms=[arm], seeds=[seed], max_steps=max_steps, eval_steps=eval_steps)
    flags = [*arm_flags(arm, args), *common_flags(args)]
    path = f"outputs/behaviour/{study}-{arm}-seed{seed}"
    trainer = train_job((arm, flags, args.learning_rate, seed, max_steps, path))
    steps = optimizer_steps(trainer.state.log_history)
    return {
        "arm": arm,
        "package": str(Path(trl_zerostd.__file__).parent),
        "eval": [[e["step"], e["eval_reward"]] for e in trainer.state.log_history if "eval_reward" in e],
        "num_tokens": [entry["num_tokens"] for entry in steps],
        "params_sha256": params_sha256(trainer.model),
        "state": package_state(trainer),
        "logged": [
            {key: value for key, value in entry.items() if not any(part in key for part in TIMINGS)}
            for entry in trainer.state.log_history
        ],
    }


def package_state(trainer) -> dict | None:
    """The package's running state (``ZeroStdState.state_dict`` without the settings, whose fields change with the
    package's version) and a SHA-256 of the skipper's success rates; None for TRL's own trainer."""
    state = getattr(trainer, "zero_std", None)
    if state is None:
        return None
    running = {key: value for key, value in state.state_dict().items() if key != "settings"}
    skipper = state.skipper
    if skipper is not None:
        rates = skipper.rates if hasattr(skipper, "rates") else skipper.predictor.rates  # 0.2, or 0.1's layout
        digest = hashlib.sha256()
        for name in ("successes", "rows", "group_counts"):
            digest.update(getattr(rates, name).numpy().tobytes())
        running["success_rates_sha256"] = digest.hexdigest()
    return running


def compare(before: list[dict], after: list[dict]) -> bool:
    """Print, per arm, whether every recorded field is equal; True when all are."""
    same = True
    for old, new in zip(before, after, strict=True):
        fields = {key: old.get(key) == new.get(key) for key in COMPARED}
        print(f"{old['arm']}: " + ", ".join(f"{key} {'equal' if ok else 'DIFFERS'}" for key, ok in fields.items()))
        same &= all(fields.values())
    return same


def main(args: BehaviourArguments) -> int:
    if args.compare:
        before, after = (json.loads(Path(path).read_text()) for path in args.compare)
        return 0 if compare(before, after) else 1
    jobs = [(args.study, arm, args.seed, args.max_steps, args.eval_steps) for arm in args.arms]
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
