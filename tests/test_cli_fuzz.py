"""Property: whatever flags and values a user types, ``ckptsim`` answers (status 0) or refuses in
one line (status 2) — never a traceback, never a run past its budget.

Argument lists are drawn from each subcommand's own flags (read from the real parser), with
values that are mostly wrong: zero, negative, huge, NaN, text, bad specs, unwritable paths.
The CLI's ``main()`` runs in-process with a tiny ``--max-core-hours`` so that anything valid
finishes in moments (or is refused by the estimate, which is part of what is tested).
"""

from __future__ import annotations

import argparse
import os
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli import build_parser, main

GOOD = ["1", "2", "3", "8", "16", "64", "60", "600", "0.5", "2.5", "100"]
"""Values most flags accept, so that a draw often gets past argparse into the command."""
NUMBERS = [
    "0", "-1", "1", "2", "3", "8", "60", "600", "1e-300", "1e300", "1e-9", "nan", "inf", "-inf",
    "0.001", "0.5", "2.5", "1e6", "1e12", "99999999999999999999999", "abc", "", "1e400", "7.0",
]  # fmt: skip
SPECIAL = {
    "--failure": [
        "exponential", "weibull:shape=0.7", "weibull:shape=1e-6", "weibull:shape=0.001",
        "weibull:shape=1,shape=2", "weibull", "lognormal:sigma=40", "lognormal:sigma=1",
        "gamma", "", "WEIBULL:SHAPE=2", "weibull:shape=nan", "exponential:shape=1",
        "empirical:life.csv", "empirical:fail.csv", "EMPIRICAL: life.csv", "empirical:",
        "empirical", "empirical:empty.csv", "empirical:bin.csv", "empirical:/nonexistent",
        "empirical:.", "empirical:log.csv",
    ],
    "--scenario": [
        "llama3", "opt175b", "titan", "llama3-mix", "llama3-tiers", "nosuch", "/dev/null", ".",
        "log.csv",
    ],
    "--out": [
        "o.csv", "o.parquet", "o.xlsx", "", "/proc/none/o.csv", "sub/o.csv", "o", "o.png",
        "o.svg", ".", "log.csv/x.csv", "/dev/full",
    ],
    "--policies": ["young", "fixed:3600", "fixed:-1", "fixed:1e-9", "", "nope", "young,daly"],
    "--vary": [
        "checkpoint_s=30,60", "gpus=nan", "mtbf_h=log:1:10:3", "x=1", "checkpoint_s",
        "gpus=1.5", "work_h=lin:1:2:0", "restart_s=1e400", "failure=1", "gpus=1e30",
    ],
    "--log": ["log.csv", "empty.csv", "bin.csv", "/nonexistent", "."],
    "--table": ["log.csv", "empty.csv", "table.csv", "/nonexistent"],
    "--profile": ["/nonexistent", "/dev/null", "log.csv"],
    "--sizes": ["1024,4096", "a,b", "-5", "", "99999999999999999999999"],
    "--dask-scheduler": ["nonsense"],
    "--format": ["ckptsim", "torch", "nope"],
    "--interval-s": NUMBERS,
    "--trace": ["fail.csv", "life.csv", "empty.csv", "bin.csv", "/nonexistent", "."],
    "--end": [*NUMBERS, "2024-02-01", "2023-01-01", "tomorrow"],
    "--scenario-out": ["s.toml", "", "/proc/none/s.toml", ".", "/dev/full"],
    "--plot": ["p.png", "p.svg", "p.xlsx", "", "/proc/none/p.png", "."],
    **{
        f"--{role}-column": ["time", "node", "cause", "repair", "duration", "event", "nope", ""]
        for role in ("time", "duration", "event", "component", "cause", "repair")
    },
}  # fmt: skip
COMMANDS = ("optimize", "simulate", "sweep", "plot", "fit")
LOGS = ["fail.csv", "life.csv", "empty.csv", "bin.csv", "log.csv", "/nonexistent", "."]
"""Failure logs for ``fit`` (written by ``_workspace``), good and bad."""


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _flag_strategy(action: argparse.Action):
    flag = action.option_strings[-1]
    if action.nargs == 0:  # store_true and friends
        return st.just([flag])
    if flag in SPECIAL:
        values = st.sampled_from(SPECIAL[flag])
    elif action.choices:
        values = st.sampled_from([*action.choices, "bogus"])
    else:
        good = st.sampled_from(GOOD)
        values = good | good | good | st.sampled_from(NUMBERS) | st.floats().map(repr)
    return values.map(lambda v: [flag, v])


BASES = ["", "--mtbf-h 3 --work-h 2", "--gpus 64 --gpu-mtbf-h 5000 --work-h 2 --replicas 3"]
"""A job to start from (later flags override it), so that commands get to their real work."""


def argv_for(name: str):
    sub = _subparser(name)
    flags = [
        a for a in sub._actions if a.option_strings and a.option_strings[0] not in ("-h", "--help")
    ]
    positional = {
        "plot": st.sampled_from(["interval", "size", "breakdown", "cost", "tornado", "controller"]),
        "simulate": st.sampled_from(["", "llama3", "nosuch.toml"]),
        "fit": st.sampled_from(LOGS),
    }.get(name, st.just(""))

    @st.composite
    def build(draw):
        chosen = draw(st.lists(st.sampled_from(flags), max_size=5))
        argv = [name]
        first = draw(positional)
        if first:
            argv.append(first)
        if name != "fit":  # fit describes no job
            argv += draw(st.sampled_from(BASES)).split()
        for action in chosen:
            argv += draw(_flag_strategy(action))
        if name not in ("optimize", "fit") or "--simulate" in argv:
            # Budgets small enough that anything valid ends in moments; in-process, one worker.
            argv += ["--max-core-hours", "0.0001"]
        if any(a.option_strings == ["--workers"] for a in flags):
            argv += ["--workers", "1"]
        return argv

    return build()


def _workspace(tmp_path):
    os.chdir(tmp_path)
    (tmp_path / "log.csv").write_text("step,time_s,interval_s\n1,10,600\n2,20,900\n")
    (tmp_path / "table.csv").write_text("gpus,interval_s\n1024,900\n4096,600\n")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00")
    rows = [f"2024-01-{d:02d}T{h:02d}:00:00,{n},{c},{r}" for d, h, n, c, r in (
        (1, 3, 1, "hw", 2.5), (2, 7, 2, "sw", 0.5), (4, 1, 1, "hw", 3.0), (5, 9, 3, "sw", 1.0),
        (8, 2, 2, "hw", 4.0), (9, 5, 1, "sw", 0.2), (12, 8, 3, "hw", 6.0), (15, 4, 2, "sw", 0.7),
    )]  # fmt: skip
    (tmp_path / "fail.csv").write_text("time,node,cause,repair\n" + "\n".join(rows) + "\n")
    (tmp_path / "life.csv").write_text(
        "duration,event\n" + "".join(f"{t},{1 - t % 2}\n" for t in range(3, 40, 3))
    )


EXAMPLE_LIMIT_S = 60
"""No example may run longer: with the tiny budget, anything valid ends in well under a second
here, so one that runs a minute is a runaway (and would otherwise hang the suite, unnamed)."""


class Runaway(BaseException):  # past any `except Exception` in the CLI
    pass


def _runaway(signum, frame):
    raise Runaway


def check(argv, capsys):
    previous = signal.signal(signal.SIGALRM, _runaway)
    signal.alarm(EXAMPLE_LIMIT_S)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors
        code = exc.code
    except Runaway:
        pytest.fail(f"ran over {EXAMPLE_LIMIT_S} s despite the budget: {argv}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capsys.readouterr()
    if os.environ.get("CKPTSIM_FUZZ_LOG"):
        with open(os.environ["CKPTSIM_FUZZ_LOG"], "a") as f:
            f.write(f"{code} {argv}\n")
    assert code in (0, 2), (argv, err)
    assert "Traceback" not in err, (argv, err)
    if code == 2:
        lines = [
            x for x in err.splitlines() if x.strip() and not x.startswith(("note:", "warning:"))
        ]
        assert len(lines) == 1, (argv, err)
    else:
        assert "nan%" not in out and " inf" not in out, (argv, out)


def _fuzz(examples: int):
    @pytest.mark.parametrize("name", COMMANDS)
    def test(name, tmp_path, capsys):
        _workspace(tmp_path)
        here = os.getcwd()

        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
            database=None,
        )
        @given(argv=argv_for(name))
        def prop(argv):
            os.chdir(here)
            check(argv, capsys)

        prop()

    return test


test_any_argument_list_gets_an_answer_or_one_line_and_status_2 = _fuzz(examples=40)
test_any_argument_list_gets_an_answer_or_one_line_and_status_2_at_length = pytest.mark.slow(
    _fuzz(examples=500)
)
