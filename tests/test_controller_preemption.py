"""Preemption with tiers: a write in flight is finished, and a grace period picks the tier.

The signal is real (SIGTERM sent to this process; the checkpointer's handler sets its flag)
and so are the directories; only the persistent tier's speed is set by the test, through the
storage protocol: a :class:`LocalStorage` whose commit takes as long as the test says, on the
checkpointer's own (injected) clock or on the wall clock.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from test_controller_tiers import Clock, make_run, train

from simulator import ckptio
from simulator.controller import AdaptiveCheckpointer, LocalStorage
from simulator.controller.runlog import RUNLOG, read_events
from simulator.controller.storage import checkpoint_name
from simulator.model.tiers import TierSchedule
from simulator.policies import FixedInterval


class SlowStorage(LocalStorage):
    """A persistent tier whose commit takes ``seconds`` on ``clock`` (a Clock: moved; None:
    slept on the wall clock), and records when each commit ended."""

    def __init__(self, root, seconds: float, clock: Clock | None = None):
        super().__init__(root)
        self.seconds, self.clock = seconds, clock
        self.committed: list[tuple[str, float]] = []

    def commit(self, name, write):
        if self.clock is not None:
            self.clock.t += self.seconds
        else:
            time.sleep(self.seconds)
        super().commit(name, write)
        self.committed.append((name, time.monotonic()))


def sigterm_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_a_write_in_flight_is_finished_before_the_preemption_save_not_abandoned(tmp_path):
    model, opt = make_run()
    storage = SlowStorage(tmp_path, 0.5)
    ck = AdaptiveCheckpointer(
        tmp_path, model=model, optimizer=opt, storage=storage, async_save=True,
        policy=FixedInterval(1e9), on_preemption="stop", keep_last=3,
    )  # fmt: skip
    ck.restore()
    train(model, opt, 1)
    ck.save(1)  # returns after the staging copy; its write (0.5 s) runs behind
    assert storage.committed == []
    train(model, opt, 2)
    sigterm_self()
    assert ck.step(2) is True and ck.preempted
    # Both committed, in order: the write in flight first, then the preemption's own.
    assert [n for n, _ in storage.committed] == [checkpoint_name(1), checkpoint_name(2)]
    for step in (1, 2):
        ckptio.verify_checkpoint(tmp_path / checkpoint_name(step))
    ck.close(finished=False)
    assert [e["event"] for e in read_events(tmp_path / RUNLOG)][-2:] == ["preempted", "stop"]


def test_a_signal_during_a_synchronous_save_lets_it_finish_then_saves_the_next_step(tmp_path):
    model, opt = make_run()
    storage = SlowStorage(tmp_path, 0.3)
    ck = AdaptiveCheckpointer(
        tmp_path, model=model, optimizer=opt, storage=storage, policy=FixedInterval(1e9),
        on_preemption="stop", keep_last=3,
    )  # fmt: skip
    ck.restore()
    train(model, opt, 1)
    timer = threading.Timer(0.1, sigterm_self)  # lands while save(1) is writing
    timer.start()
    ck.save(1)
    timer.join()
    train(model, opt, 2)
    assert ck.step(2) is True
    assert [n for n, _ in storage.committed] == [checkpoint_name(1), checkpoint_name(2)]
    ck.close(finished=False)


def _tiered(tmp_path, local_root, clock, persistent_s, **kw):
    model, opt = make_run()
    ck = AdaptiveCheckpointer(
        tmp_path, model=model, optimizer=opt, local_dir=local_root, clock=clock,
        storage=SlowStorage(tmp_path, persistent_s, clock), on_preemption="stop",
        policy=TierSchedule({"local": 1.0, "persistent": 3.0}), probe_steps=5, **kw,
    )  # fmt: skip
    return ck, model, opt


def _train_to(ck, model, opt, clock, start, stop):
    for step in range(start + 1, stop + 1):
        train(model, opt, step)
        clock.t += 0.1
        ck.step(step)


@pytest.mark.parametrize("grace_s", [5.0, 1.0])
def test_the_grace_period_sends_the_preemption_save_to_the_tier_that_fits(
    tmp_path, local_root, grace_s
):
    clock = Clock()
    ck, model, opt = _tiered(tmp_path, local_root, clock, 2.0, preemption_grace_s=grace_s)
    ck.restore()
    _train_to(ck, model, opt, clock, 0, 40)  # persistent saved at 35: a 2 s stall measured
    assert ck.stats["save_stall_s"] == pytest.approx(2.0)
    train(model, opt, 41)
    sigterm_self()
    clock.t += 0.3  # the step in progress ends 0.3 s after the signal
    assert ck.step(41) is True
    event = read_events(tmp_path / RUNLOG)[-1]
    assert event["event"] == "preempted" and event["grace_s"] == grace_s
    if grace_s == 5.0:  # 2 s fits in the 4.7 s left
        assert event["tier"] == "persistent"
        assert event["since_signal_s"] == pytest.approx(2.3)
        assert (tmp_path / checkpoint_name(41)).is_dir()
    else:  # 2 s does not fit in the 0.7 s left: the local tier, at once
        assert event["tier"] == "local"
        assert event["since_signal_s"] == pytest.approx(0.3)
        assert not (tmp_path / checkpoint_name(41)).exists()
        assert ck.stats["local_last_saved_step"] == 41
    ck.close(finished=False)
    # The relaunch resumes at the preempted step, from whichever tier holds it.
    clock2 = Clock()
    again, model2, _ = _tiered(tmp_path, local_root, clock2, 2.0)
    assert again.restore() == 41
    assert again.stats["restored_tier"] == ("persistent" if grace_s == 5.0 else "local")
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters(), strict=True)
    )
    again.close(finished=False)


def test_without_a_local_tier_a_save_too_long_for_the_grace_is_made_anyway_and_said(
    tmp_path, caplog
):
    clock = Clock()
    model, opt = make_run()
    ck = AdaptiveCheckpointer(
        tmp_path, model=model, optimizer=opt, clock=clock, policy=FixedInterval(3.0),
        storage=SlowStorage(tmp_path, 2.0, clock), on_preemption="stop", probe_steps=5,
        preemption_grace_s=1.0,
    )  # fmt: skip
    ck.restore()
    _train_to(ck, model, opt, clock, 0, 40)
    train(model, opt, 41)
    sigterm_self()
    with caplog.at_level("WARNING", logger="simulator.controller"):
        assert ck.step(41) is True
    assert "no local tier: saving step 41 to the persistent tier anyway" in caplog.text
    assert read_events(tmp_path / RUNLOG)[-1]["tier"] == "persistent"
    assert (tmp_path / checkpoint_name(41)).is_dir()
    ck.close(finished=False)


def test_before_any_persistent_save_is_timed_the_preemption_save_goes_to_the_local_tier(
    tmp_path, local_root, caplog
):
    clock = Clock()
    ck, model, opt = _tiered(tmp_path, local_root, clock, 2.0, preemption_grace_s=1.0)
    ck.restore()
    _train_to(ck, model, opt, clock, 0, 12)  # the probe ended at 5; no persistent save yet
    assert ck.stats["save_stall_s"] is None
    train(model, opt, 13)
    sigterm_self()
    with caplog.at_level("WARNING", logger="simulator.controller"):
        assert ck.step(13) is True
    assert "no persistent save has been timed yet" in caplog.text
    assert read_events(tmp_path / RUNLOG)[-1]["tier"] == "local"
    assert ck.stats["local_last_saved_step"] == 13
    ck.close(finished=False)
