"""``ckptsim plot controller`` draws the interval a live run chose, from the run's own log."""

from __future__ import annotations

import pytest
import torch

from simulator import plots
from simulator.cli import main
from simulator.controller import AdaptiveCheckpointer
from simulator.controller.runlog import RUNLOG
from simulator.policies import FixedInterval


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _session(directory, start, end, interval_s):
    clock = FakeClock()
    ck = AdaptiveCheckpointer(
        directory,
        model=torch.nn.Linear(2, 2),
        policy=FixedInterval(interval_s),
        clock=clock,
        probe_steps=2,
        total_steps=end,
    )
    step = ck.restore()
    assert step == start
    for step in range(start + 1, end + 1):
        clock.now += 1.0  # a second per step
        ck.step(step)
    ck.close()


@pytest.fixture
def run_dir(tmp_path):
    """A real run log: two sessions (a restart at step 22) saving every 10 steps."""
    _session(tmp_path / "ck", 0, 22, 10.0)
    _session(tmp_path / "ck", 22, 42, 10.0)
    return tmp_path / "ck"


def test_the_run_log_gives_each_saves_interval_on_one_time_axis_across_restarts(run_dir):
    df = plots.read_run_log(run_dir)
    assert df["step"].tolist() == [12, 22, 32, 42]
    assert df["interval_s"].tolist() == [10.0] * 4
    assert df["session"].nunique() == 2
    assert df["time_s"].is_monotonic_increasing  # the second session continues the first's
    ax = plots.controller_intervals(run_dir)
    assert [line.get_label() for line in ax.get_lines()][:1] == ["restart"]


@pytest.mark.parametrize("as_file", [False, True])
def test_cli_plots_a_checkpoint_directory_or_its_runlog(run_dir, tmp_path, capsys, as_file):
    log = run_dir / RUNLOG if as_file else run_dir
    assert main(["plot", "controller", "--log", str(log), "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 0 and (tmp_path / "c.svg").exists()


@pytest.mark.parametrize("content", [None, b"", b"\x00\xff garbage\n{not json\n", b'{"x": 1}\n'])
def test_an_empty_missing_or_unreadable_run_log_is_one_line_and_exit_2(tmp_path, capsys, content):
    directory = tmp_path / "ck"
    directory.mkdir()
    if content is not None:
        (directory / RUNLOG).write_bytes(content)
    code = main(["plot", "controller", "--log", str(directory), "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "Traceback" not in err
    assert "run log" in err
    assert not (tmp_path / "c.png").exists()


def test_a_run_log_with_no_saves_yet_says_so(tmp_path, capsys):
    ck = AdaptiveCheckpointer(tmp_path, model=torch.nn.Linear(2, 2))
    ck.close()
    code = main(["plot", "controller", "--log", str(tmp_path), "--out", str(tmp_path / "c")])
    assert code == 2 and "no saves" in capsys.readouterr().err


def test_an_empty_runlog_file_given_by_path_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / RUNLOG).write_bytes(b"")
    code = main(["plot", "controller", "--log", str(tmp_path / RUNLOG), "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "empty" in err
