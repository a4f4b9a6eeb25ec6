"""The predictor's replay (scripts/studies/predictor_replay.py) on a record written by hand: each probe is predicted
from the groups generated before its step, and scored against the probe's group."""

import pytest

from studies.predictor_replay import Prediction, PredictorReplayArguments, auc, main, replay, scores


def record(seed=0) -> dict:
    """Steps 1 to 4 (indices 0 to 3), groups of 2; probes after 0, 2, 3 and 4 updates (4: after the last step)."""
    return {
        "arm": "trl",
        "seed": seed,
        "train_groups": [
            [0, {"a": [0.0, 0.0], "b": [1.0, 1.0], "c": [0.0, 1.0]}],
            [2, {"a": [0.0, 1.0], "b": [1.0, 1.0], "c": [0.0, 1.0]}],
            [3, {"a": [0.0, 0.0], "b": [0.0, 1.0], "c": [1.0, 1.0]}],
            [4, {"a": [0.0, 1.0], "b": [1.0, 1.0], "c": [0.0, 0.0]}],
        ],  # fmt: skip
        "prompt_rewards": [
            {"a": [0.0, 0.0], "c": [0.0, 1.0, 1.0, 1.0]},
            {"b": [1.0, 1.0]},
            {"a": [0.0, 0.0]},
            {"c": [0.0, 1.0]},
        ],  # fmt: skip
    }


def test_auc_counts_pairs_and_half_a_tie():
    assert auc([0.9, 0.5, 0.5, 0.1], [True, True, False, False]) == (2 + 1.5) / 4
    assert auc([0.3], [True]) != auc([0.3], [True])  # NaN without a negative


def test_each_probe_is_predicted_from_the_groups_before_its_step():
    predictions = replay(record(), evidence_fade=1.0)
    assert [(p.step, p.split) for p in predictions] == [
        (2, True), (2, False), (2, True), (3, False), (3, True), (3, False), (4, True), (4, False), (4, False),
    ]  # fmt: skip
    changed = record()
    changed["prompt_rewards"][2] = {"a": [1.0, 1.0]}  # step index 2: after the probe at 2, before the one at 3
    after_change = replay(changed, evidence_fade=1.0)
    assert after_change[:3] == predictions[:3] and after_change[3:] != predictions[3:]
    a_at_2 = predictions[0]
    assert a_at_2.informative_prob < predictions[2].informative_prob  # "a" tied all wrong, "c" split


def test_the_fade_and_the_level_prior_change_the_predictions():
    plain = replay(record(), evidence_fade=0.0)
    assert replay(record(), evidence_fade=2.0) != plain
    assert replay(record(), 0.0, levels={"a": "1", "b": "2", "c": "1"}) != plain


def test_scores_read_the_lowest_quarter_by_draw_probability_ties_by_informative_prob():
    """Eight probes, four at the floor: the lowest quarter is the two of them least likely to be informative."""
    floor = [
        Prediction(1, informative, 0.05, split)
        for informative, split in ((0.3, True), (0.1, False), (0.2, False), (0.4, True))
    ]
    drawn = [Prediction(1, 0.9, 0.8, split) for split in (True, True, False, True)]
    got = scores([*floor, *drawn])
    assert (got.probes, got.split_frac, got.lowest_quarter_split_frac) == (8, 5 / 8, 0.0)
    assert (got.draw_prob_split, got.draw_prob_tied) == pytest.approx(((0.05 * 2 + 0.8 * 3) / 5, (0.05 * 2 + 0.8) / 3))
    assert got.auc == pytest.approx((2 + 2 + 3 * 2.5) / 15)  # the 0.9s tie with the tied 0.9: half each


def test_main_writes_one_row_per_prior_and_fade(tmp_path):
    import json

    (tmp_path / "trl-seed0.json").write_text(json.dumps(record()))
    args = PredictorReplayArguments(
        runs_dir=str(tmp_path), arms=["trl"], seeds=[0, 1], evidence_fades=[0.0, 1.0], table=str(tmp_path / "t.md")
    )
    out = main(args, levels_of=lambda seed: {"a": "1", "b": "2", "c": "1"})
    assert out.count("\n| no |") == 2 and out.count("\n| yes |") == 2
    assert (tmp_path / "t.md").read_text().strip() == out
    with pytest.raises(SystemExit, match="has train_groups"):
        main(PredictorReplayArguments(runs_dir=str(tmp_path), arms=["skip"], seeds=[0]))
