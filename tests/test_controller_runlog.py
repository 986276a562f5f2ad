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


def test_a_session_that_restored_but_never_stepped_is_no_failure():
    # This writer records "train" at a session's first step (start: records_train), so a crash
    # between restore() and the first step (a bug, an OOM building the model) is the script's.
    def start(sid):
        events.append({"event": "start", "session": sid, "session_s": 0.0, "records_train": True})

    events = []
    start("a")
    events.append({"event": "restore", "session": "a", "session_s": 20.0, "step": 0})
    events.append({"event": "crashed", "session": "a", "session_s": 21.0})
    start("b")
    events.append({"event": "restore", "session": "b", "session_s": 20.0, "step": 0})
    events.append({"event": "train", "session": "b", "session_s": 25.0, "step": 1})
    ev = failure_evidence(events, exclude_session="now")
    assert (ev.failures, ev.exposure_s, ev.sessions) == (1, 25.0, 2)  # b only


_CRASH_AFTER_RESTORE = """
import os, sys, torch
from simulator.controller import AdaptiveCheckpointer
from simulator.policies import FixedInterval
ckpt = AdaptiveCheckpointer(sys.argv[1], model=torch.nn.Linear(2, 2), policy=FixedInterval(1e9))
ckpt.restore()
for step in range(1, int(sys.argv[2]) + 1):
    ckpt.step(step)
os._exit(1)  # a crash: no close, no exit hook
"""


def test_a_real_crash_before_the_first_step_is_not_counted_and_one_after_it_is(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import torch

    from simulator.controller import AdaptiveCheckpointer
    from simulator.policies import FixedInterval

    script = tmp_path / "crash.py"
    script.write_text(_CRASH_AFTER_RESTORE)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"}

    def failures_after(*launches):
        root = tmp_path / f"ck-{'-'.join(map(str, launches))}"
        for steps in launches:
            run = subprocess.run(
                [sys.executable, str(script), str(root), str(steps)],
                capture_output=True, text=True, timeout=120, env=env,
            )  # fmt: skip
            assert run.returncode == 1, run.stderr[-2000:]
        ckpt = AdaptiveCheckpointer(root, model=torch.nn.Linear(2, 2), policy=FixedInterval(1e9))
        try:
            return ckpt.stats["failures_seen"]
        finally:
            ckpt.close(finished=False)

    assert failures_after(0, 0) == 0  # two launches that died before training: none
    assert failures_after(3, 0) == 1  # one that trained three steps, one that did not


def test_an_unwritable_run_log_warns_once_and_never_raises(tmp_path):
    log = RunLog(tmp_path, session="a")
    (tmp_path / "runlog.jsonl").mkdir()  # whatever stands in its way: EISDIR here
    with pytest.warns(UserWarning, match="cannot write the run log"):
        log.append("start", session_s=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log.append("save", session_s=1.0)


# -- a hostile or edited run log ------------------------------------------------------------
# The run log lies in the checkpoint directory, which anyone who can write checkpoints can
# edit: it must never be written through a link, never hang the launch, and a line that this
# module did not write must be skipped, not raise from deep inside the checkpointer.


def test_a_run_log_that_is_a_symlink_is_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "runlog.jsonl").symlink_to(victim)
    log = RunLog(run, session="a")
    with pytest.warns(UserWarning, match="is a symlink"):
        assert log.evidence().sessions == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per log, not on every append
        log.append("start", session_s=0.0)
        log.append("save", session_s=5.0, step=3)
    assert victim.read_text() == "the user's file\n"
    with pytest.raises(OSError, match="is a symlink"):
        read_events(run / "runlog.jsonl")
    assert read_events(run / "runlog.jsonl", follow=True) == []  # a path a person gave


def test_a_checkpointer_over_a_symlinked_run_log_trains_and_leaves_the_target_alone(tmp_path):
    torch = pytest.importorskip("torch")
    from simulator.controller import AdaptiveCheckpointer
    from simulator.policies import FixedInterval

    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "runlog.jsonl").symlink_to(victim)
    model = torch.nn.Linear(2, 2)
    with pytest.warns(UserWarning, match="run log"):
        ck = AdaptiveCheckpointer(run, model=model, policy=FixedInterval(1e9))
        assert ck.restore() == 0
        for step in range(1, 4):
            ck.step(step)
        ck.close()
    assert victim.read_text() == "root:x:0:0\n"
    assert (run / "step-00000003").is_dir()  # the checkpoints themselves are unaffected


@pytest.mark.timeout(30)  # the old reader blocked here for ever, waiting for a writer
def test_a_run_log_that_is_a_fifo_does_not_hang_the_launch(tmp_path):
    import os

    os.mkfifo(tmp_path / "runlog.jsonl")
    log = RunLog(tmp_path, session="a")
    with pytest.warns(UserWarning, match="not a regular file"):
        assert log.evidence().sessions == 0
    log.append("start", session_s=0.0)  # warned already; neither blocks nor raises


GARBAGE = [
    "[" * 100_000 + "]" * 100_000,  # nesting deep enough to exhaust the parser's recursion
    '{"event": "save", "session": "x", "session_s": ' + "9" * 5000 + "}",  # > int digit limit
    '{"event": "save", "session": "x", "session_s": ' + "9" * 4000 + "}",  # float() overflows
    '{"event": "save", "session": "x", "session_s": NaN}',
    '{"event": "save", "session": "x", "session_s": Infinity}',
    '{"event": "save", "session": "x", "session_s": -5}',
    '{"event": "save", "session": "x", "session_s": true}',
    '{"event": "save", "session": "x", "session_s": "12"}',
    '{"event": "save", "session": ["x"], "session_s": 1}',
    '{"event": {"a": 1}, "session": "x", "session_s": 1}',
    '{"event": "save", "session": "x", "session_s": 1, "step": "3"}',
    '{"event": "save", "session": "x", "session_s": 1, "step": 1e400}',
    '{"event": "save", "session": "x", "session_s": 1, "step": -1}',
    '{"event": "finished", "session": "x", "session_s": 1, "step": ' + "9" * 30 + "}",
    '"just a string"',
    "\x00\xff garbage",
]


@pytest.mark.parametrize("line", GARBAGE, ids=range(len(GARBAGE)))
def test_a_line_this_module_did_not_write_is_skipped(tmp_path, line):
    good = RunLog(tmp_path, session="a")
    good.append("start", session_s=0.0)
    good.append("save", session_s=5.0, step=3)
    with open(good.path, "a", encoding="utf-8", errors="surrogateescape") as f:
        f.write(line + "\n")
    later = RunLog(tmp_path, session="b")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        events = read_events(later.path)
        ev = later.evidence()
    assert [(e["session"], e["event"]) for e in events] == [("a", "start"), ("a", "save")]
    assert (ev.failures, ev.exposure_s) == (1, 5.0)


def test_a_checkpointer_restores_over_a_run_log_full_of_garbage(tmp_path):
    torch = pytest.importorskip("torch")
    from simulator.controller import AdaptiveCheckpointer
    from simulator.policies import FixedInterval

    model = torch.nn.Linear(2, 2)
    with AdaptiveCheckpointer(tmp_path, model=model, policy=FixedInterval(1e9)) as ck:
        ck.restore()
        for step in range(1, 4):
            ck.step(step)
    with open(tmp_path / "runlog.jsonl", "a", encoding="utf-8") as f:
        f.write("\n".join(GARBAGE[:3] + GARBAGE[4:]) + "\n")
        # a save record whose estimates are not numbers: never fed to the schedule
        f.write('{"event": "save", "session": "z", "session_s": 1, "step": 3, ')
        f.write('"estimates": {"write_s": "fast", "evil": 1}}\n')
    ck = AdaptiveCheckpointer(tmp_path, model=model, policy=FixedInterval(1e9))
    assert ck.restore() == 3
    assert ck.finished
    ck.close()
