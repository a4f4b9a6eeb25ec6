"""Tests of ``trl_zerostd/core/monitor.py``: when the stall warning fires, that it fires once, and that its advice fits
the cause."""

from functools import partial

from trl_zerostd.core.monitor import StallMonitor, stall_advice


def test_warns_after_patience_untrained_steps_and_only_once():
    monitor = StallMonitor(patience=3)
    assert [monitor.observe_step(0), monitor.observe_step(0)] == [None, None]
    assert monitor.observe_step(5) is None  # a trained step resets the run
    assert [monitor.observe_step(0), monitor.observe_step(0)] == [None, None]
    warning = monitor.observe_step(0)
    assert "3 optimizer steps in a row trained no row" in warning and "zero_std_kl='keep_failed'" in warning
    assert all(monitor.observe_step(0) is None for _ in range(5))


def test_warns_when_the_low_tied_share_stays_high_over_the_window():
    monitor = StallMonitor(window=4, low_tied_threshold=0.5)
    assert all(monitor.observe_batch(0.9) is None for _ in range(3))  # a window not full yet
    assert "tied at the lowest reward" in monitor.observe_batch(0.9)
    quiet = StallMonitor(window=4, low_tied_threshold=0.5)
    assert all(quiet.observe_batch(share) is None for share in [0.9, 0.1, 0.9, 0.1, 0.5, 0.5])


def test_state_round_trips():
    monitor = StallMonitor(window=3)
    monitor.observe_step(0)
    monitor.observe_batch(0.7)
    restored = StallMonitor(window=3)
    restored.load_state_dict(monitor.state_dict())
    assert restored.state_dict() == monitor.state_dict()
    assert monitor.state_dict() == {"untrained_run": 1, "low_tied": [0.7], "warned": False, "cause": "failed"}


def test_advice_names_only_the_options_not_in_use():
    assert "zero_std_kl='keep_failed'" in stall_advice() and "dynamic_sampling=True" in stall_advice()
    assert "zero_std_kl" not in stall_advice(zero_std_kl="keep_failed")
    assert "dynamic_sampling" not in stall_advice(dynamic_sampling=True)
    assert "learning_rate" in stall_advice(zero_std_kl="keep", dynamic_sampling=True)
    monitor = StallMonitor(patience=1, advice=partial(stall_advice, dynamic_sampling=True))
    assert "dynamic_sampling" not in monitor.observe_step(0)


def test_keep_failed_is_advised_with_beta_above_0_and_to_grpo_only():
    """keep_failed keeps a KL term: with beta=0 there is none, and RLOO refuses it."""
    assert "beta > 0 with zero_std_kl='keep_failed'" in stall_advice(beta=0.0)
    with_kl = stall_advice(beta=0.04)
    assert "zero_std_kl='keep_failed'" in with_kl and "beta > 0" not in with_kl
    assert "zero_std_kl" not in stall_advice(beta=0.04, kind="rloo")


def test_the_advice_follows_the_cause_the_last_batch_shows():
    """Truncated rows are helped by a longer max_completion_length, not by keep_failed; a tie at the one reward seen
    is not a failure; a tie at the highest reward is a solved batch."""
    advice = partial(stall_advice, beta=0.04)
    for (low, high, truncated), cause, expected, absent in [
        ((0.0, 0.0, 1.0), "truncated", "max_completion_length", "keep_failed"),
        ((0.0, 0.0, 0.0), "tied", "tell completions apart", "keep_failed"),
        ((0.0, 1.0, 0.0), "solved", "harder prompts", "keep_failed"),
        ((1.0, 0.0, 0.0), "failed", "keep_failed", "max_completion_length"),
    ]:
        monitor = StallMonitor(patience=1, advice=advice)
        assert monitor.observe_batch(low, high, truncated) is None
        assert monitor.cause == cause
        warning = monitor.observe_step(0)
        assert expected in warning and absent not in warning, cause
