"""Tests of ``trl_zerostd/monitor.py``: when the stall warning fires, and that it fires once."""

from trl_zerostd.monitor import StallMonitor, stall_advice


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
    assert restored.state_dict() == monitor.state_dict() == {"untrained_run": 1, "low_tied": [0.7], "warned": False}


def test_advice_names_only_the_options_not_in_use():
    assert "zero_std_kl='keep_failed'" in stall_advice() and "dynamic_sampling=True" in stall_advice()
    assert "zero_std_kl" not in stall_advice(zero_std_kl="keep_failed")
    assert "dynamic_sampling" not in stall_advice(dynamic_sampling=True)
    assert "learning_rate" in stall_advice("keep", True)
    monitor = StallMonitor(patience=1, advice=stall_advice(dynamic_sampling=True))
    assert "dynamic_sampling" not in monitor.observe_step(0)
