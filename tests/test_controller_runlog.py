"""The run log: restarts and exposure as the run itself recorded them."""

import warnings

import pytest

from simulator.controller.runlog import RunLog, failure_evidence, read_events


def session(log_events, sid, *times, stop=False):
    log_events.append({"event": "start", "session": sid, "session_s": 0.0})
    for t in times:
        log_events.append({"event": "save", "session": sid, "session_s": t})
    if stop:
        log_events.append({"event": "stop", "session": sid, "session_s": times[-1] + 1})


def test_sessions_without_a_clean_stop_that_were_followed_by_another_are_failures():
    events = []
    session(events, "a", 100.0, 200.0)  # crashed
    session(events, "b", 50.0, stop=True)  # stopped cleanly (e.g. a planned requeue)
    session(events, "c", 30.0)  # crashed, restarted as "now"
    ev = failure_evidence(events, exclude_session="now")
    assert ev.failures == 2
    assert ev.sessions == 3
    assert ev.exposure_s == 200.0 + 51.0 + 30.0


def test_the_last_session_is_not_a_failure_when_nothing_came_after_it():
    events = []
    session(events, "a", 10.0)
    assert failure_evidence(events).failures == 0


def test_a_torn_final_line_is_skipped_and_the_next_record_starts_a_fresh_line(tmp_path):
    first = RunLog(tmp_path, session="a")
    first.append("start", session_s=0.0)
    first.append("save", session_s=5.0, step=3)
    with open(first.path, "a") as f:
        f.write('{"event": "save", "sess')  # a crash in mid-append
    second = RunLog(tmp_path, session="b")
    second.append("start", session_s=0.0)
    events = read_events(first.path)
    assert [(e["session"], e["event"]) for e in events] == [
        ("a", "start"),
        ("a", "save"),
        ("b", "start"),
    ]
    ev = second.evidence()
    assert (ev.failures, ev.exposure_s) == (1, 5.0)


def test_a_disabled_log_writes_nothing(tmp_path):
    RunLog(tmp_path, enabled=False).append("start", session_s=0.0)
    assert not list(tmp_path.iterdir())


def test_launches_that_never_began_training_are_neither_failures_nor_exposure():
    events = []
    session(events, "a", 100.0)  # trained (saved), then crashed: a failure
    events.append({"event": "start", "session": "b", "session_s": 0.0})
    events.append({"event": "refused", "session": "b", "session_s": 4.0, "reason": "config"})
    events.append({"event": "start", "session": "c", "session_s": 0.0})  # died setting up
    events.append({"event": "start", "session": "d", "session_s": 0.0})
    events.append({"event": "restore", "session": "d", "session_s": 30.0, "step": 0})
    ev = failure_evidence(events, exclude_session="now")
    assert ev.failures == 2  # a, and d (it began training, then no clean stop)
    assert ev.exposure_s == 100.0 + 30.0
    assert ev.sessions == 4


def test_an_unwritable_run_log_warns_once_and_never_raises(tmp_path):
    log = RunLog(tmp_path, session="a")
    (tmp_path / "runlog.jsonl").mkdir()  # whatever stands in its way: EISDIR here
    with pytest.warns(UserWarning, match="cannot write the run log"):
        log.append("start", session_s=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log.append("save", session_s=1.0)
