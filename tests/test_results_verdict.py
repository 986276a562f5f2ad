"""The one rule every report and ``ckptsim bench`` use to call a goal met."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.display import format_duration, format_usd
from simulator.engines.results import (
    goal_verdict,
    mean_ci,
    median_ci,
    ratio_intervals,
    ratio_verdict,
)
from simulator.errors import InputError


def test_a_goal_is_met_only_when_every_points_whole_interval_meets_it():
    tight = mean_ci([1.01, 1.02, 1.03])
    assert goal_verdict([tight], at_least=0.9) == "met"
    straddles = mean_ci([0.85, 1.0, 1.15])  # mean meets 0.9, the interval does not
    assert goal_verdict([straddles], at_least=0.9) == "not shown"
    assert goal_verdict([tight, straddles], at_least=0.9) == "not shown"


def test_one_sample_shows_nothing_however_good_it_looks():
    # The bench report once called the writer goal met from a single 500M repeat.
    assert goal_verdict([mean_ci([1.29])], at_least=0.9) == "not shown"
    assert goal_verdict([mean_ci([1.01, 1.02]), mean_ci([1.29])], at_least=0.9) == "not shown"


def test_any_measured_point_whose_mean_misses_makes_it_not_met():
    good = mean_ci([1.2, 1.25, 1.3])
    assert goal_verdict([good, mean_ci([0.82, 0.84])], at_least=0.9) == "not met"
    assert goal_verdict([mean_ci([0.2])], at_most=0.1) == "not met"
    assert goal_verdict([mean_ci([1.5, 1.6, 1.7])], at_least=-2, at_most=2) == "met"
    assert goal_verdict([mean_ci([1.5, 1.9, 2.3])], at_least=-2, at_most=2) == "not shown"
    assert goal_verdict([mean_ci([2.1, 2.2, 2.3])], at_least=-2, at_most=2) == "not met"


def test_the_median_interval_takes_the_order_statistics_of_published_tables():
    # Le Boudec, Performance Evaluation of Computer and Communication Systems, Table A.1: at
    # 95 % the median's interval runs from the 2nd to the 9th of 10 values, the 6th to the
    # 15th of 20 (binomial order statistics), whatever the distribution.
    assert median_ci(range(1, 11)) == (5.5, 2.0, 9.0)
    assert median_ci(range(1, 21)) == (10.5, 6.0, 15.0)
    # Fewer than 6 values cannot cover the median with 95 %: no interval, nothing shown.
    m, lo, hi = median_ci([0.95, 0.97, 0.99, 1.0, 1.01])
    assert m == 0.99 and lo != lo and hi != hi
    assert goal_verdict([(m, lo, hi)], at_least=0.9) == "not shown"


def test_one_stalled_repeat_moves_a_mean_interval_not_the_median_one():
    # Per-repeat ratios on a shared machine: 19 repeats at disk speed, one stalled 3.5x by a
    # neighbour's burst of I/O (as measured on the project's VM).
    ratios = [0.95, 0.96, 0.97, 0.98, 0.99] * 4
    ratios[7] = 0.28
    assert goal_verdict([mean_ci(ratios)], at_least=0.9) == "not shown"
    assert median_ci(ratios)[1:] == (0.96, 0.98)
    assert goal_verdict([median_ci(ratios)], at_least=0.9) == "met"
    # ...but a slowdown in most repeats is still seen.
    assert goal_verdict([median_ci([0.85] * 12 + [0.99] * 8)], at_least=0.9) == "not met"


def test_a_ratio_that_is_not_a_number_never_makes_a_goal_met():
    # Review 2: numpy sorts NaN last, so the median's bounds came from the finite values and
    # a NaN centre was skipped: "met" from a failed measurement.
    m, lo, hi = median_ci([0.95] * 10 + [math.nan])
    assert math.isnan(m) and math.isnan(lo) and math.isnan(hi)
    assert ratio_verdict([ratio_intervals([0.95] * 10 + [math.nan], rate=True)], at_least=0.9) == (
        "not shown"
    )


def test_a_slow_path_in_a_minority_of_repeats_fails_the_expected_cost():
    # Review 2: a restore 3x slower in 9 of 30 repeats costs every failure on average 1.6x the
    # goal's time; the median and its interval (ranks 10 and 21 of 30) never see it.
    ratios = [0.95] * 21 + [0.95 / 3] * 9
    p = ratio_intervals(ratios, rate=True)
    assert (p["median"], p["low"], p["high"]) == (0.95, 0.95, 0.95)
    assert p["expected"] == pytest.approx(1 / (21 / 30 / 0.95 + 9 / 30 * 3 / 0.95))
    assert p["expected"] < 0.6 and ratio_verdict([p], at_least=0.9) == "not met"
    # The same repeats with the baseline stalled instead (ratio 3x high): the code is not slow,
    # the expected time ratio falls, and both views clear the goal.
    p = ratio_intervals([0.95] * 21 + [0.95 * 3] * 9, rate=True)
    assert p["expected_low"] > 0.9 and ratio_verdict([p], at_least=0.9) == "met"


def test_stalls_only_the_baseline_takes_do_not_hide_a_slow_path_of_the_code():
    # Review 3: the code at 0.95 of the disk in a typical repeat, 3x slower in 9 of 60 repeats
    # (0.73 of a quiet disk on average), beside a baseline stalled 3x in 18 other repeats (in
    # one run on the project's VM the raw write stalled more often than the save). Total time
    # over total time, tried in place of the mean of per-repeat ratios, called this "met" (1.17
    # [0.93, 1.46]): it credits the code with every baseline stall in full. Per repeat, a
    # baseline stall can give back at most the repeat's own time.
    rates = [0.95 / 3] * 9 + [0.95 * 3] * 18 + [0.95] * 33
    p = ratio_intervals(rates, rate=True)
    assert p["median"] == pytest.approx(0.95)
    assert p["expected"] < 0.9 and ratio_verdict([p], at_least=0.9) == "not met"


def test_expected_cost_of_a_time_ratio_is_its_plain_mean():
    # A stall over a save is a time already: its expectation is the mean, bounds as mean_ci's.
    stalls = [0.05, 0.06, 0.07, 0.05, 0.06, 0.07]
    p = ratio_intervals(stalls, rate=False)
    assert (p["expected"], p["expected_low"], p["expected_high"]) == mean_ci(stalls)
    assert ratio_verdict([p], at_most=0.1) == "met"
    one_slow = ratio_intervals([*stalls[:-1], 0.6], rate=False)
    assert ratio_verdict([one_slow], at_most=0.1) != "met"


def test_no_points_or_no_bound_is_refused_or_not_shown():
    assert goal_verdict([], at_least=0.9) == "not shown"
    with pytest.raises(InputError, match="at_least and/or at_most"):
        goal_verdict([mean_ci([1.0, 1.1])])


def test_money_is_dollars_with_thousands_separators_never_scientific():
    assert format_usd(4.982e7) == "$49,820,000"
    assert format_usd(-3827.4) == "-$3,827"
    assert format_usd(-0.2) == "$0"  # no "-$0"
    assert format_usd(float("nan")) == "—" and format_usd(float("inf")) == "> $1e308"
    assert format_usd(1.8e13) == "$1.8e+13"  # not 14 digits of commas


def test_durations_are_in_the_unit_a_reader_thinks_in():
    assert [format_duration(s) for s in (45, 1116, 5400, 7.2e6)] == [
        "45 s", "18.6 min", "1.50 h", "2,000 h",
    ]  # fmt: skip


def test_the_interval_of_a_never_negative_column_stops_at_zero():
    from simulator.engines.results import describe

    rare = [0.0] * 19 + [1.0]  # 1 failure in 20 replicas: the t-interval dips below 0
    d = describe(rare)
    assert d["mean"] == 0.05 and d["ci95"][0] == 0.0 and d["ci95"][1] > 0.05
    signed = [-1.0] + [0.0] * 18 + [1.0]  # a difference may be negative: left alone
    assert describe(signed)["ci95"][0] < 0


@pytest.mark.parametrize("n", [2, 5])
def test_too_few_repeats_for_a_median_interval_give_no_expected_interval_either(n):
    # Student's t over two stall-prone timings put a stored rate at "0.27 to inf": a time
    # interval reaching below 0. Below 6 repeats neither view has an interval.
    p = ratio_intervals([0.81, 0.30, 0.9, 0.7, 1.1][:n], rate=True)
    assert math.isnan(p["low"]) and math.isnan(p["expected_low"]) and math.isnan(p["expected_high"])
    assert math.isfinite(p["expected"]) and ratio_verdict([p], at_least=0.9) != "met"
    six = ratio_intervals([0.81, 0.30, 0.9, 0.7, 1.1, 0.95], rate=True)
    assert math.isfinite(six["low"]) and 0 < six["expected_low"] < six["expected_high"]


def test_min_repeats_is_where_the_median_first_has_an_interval():
    from simulator.engines.results import MIN_REPEATS

    assert math.isnan(median_ci(range(MIN_REPEATS - 1))[1])
    assert math.isfinite(median_ci(range(MIN_REPEATS))[1])


def test_a_point_without_an_interval_says_why_in_both_views():
    from simulator.engines.results import interval_texts

    few = ratio_intervals([0.9, 1.0], rate=True)
    assert interval_texts(few) == ("— (too few repeats)",) * 2
    failed = ratio_intervals([0.95] * 9 + [math.nan], rate=True)
    assert interval_texts(failed) == ("— (a failed repeat)",) * 2
    p = ratio_intervals([0.9, 1.0, 0.95, 0.92, 0.97, 0.99, 0.93], rate=True)
    median_text, expected_text = interval_texts(p, ".3f")
    low, high = (float(x) for x in median_text.split(" to "))
    assert low <= p["low"] < low + 0.001 and high - 0.001 < p["high"] <= high
    low, high = (float(x) for x in expected_text.split(" to "))
    assert low <= p["expected_low"] and p["expected_high"] <= high


def test_a_printed_interval_holds_the_computed_one_so_a_missed_goal_never_reads_met():
    """A low end of 0.8997 printed at two decimals is 0.89: rounded to nearest it read 0.90,
    a goal of 90 % apparently met while the verdict (unrounded) said not met."""
    from simulator.cli.bench import _interval
    from simulator.engines.results import interval_texts, outward

    assert outward(0.8997, 1.0301) == ("0.89", "1.04")
    assert outward(0.29, 0.3, ".3f") == ("0.290", "0.300")  # exact decimals stay as they are
    assert outward(-0.0011, 2.0) == ("-0.01", "2.00")
    assert outward(-0.0301, -0.0011) == ("-0.04", "0.00")  # a high end rounded up to zero
    assert outward(-0.0, 0.0) == ("0.00", "0.00")
    assert outward(0.5, math.inf) == ("0.50", "inf")
    assert outward(np.float64(0.8997), np.float64(1e30)) == ("0.89", f"{1e30:.2f}")
    point = {"low": 0.8997, "high": 1.03, "expected_low": 0.88995, "expected_high": 1.0}
    point |= {"median": 0.98, "expected": 0.95, "n": 40, "values": [0.98] * 40}
    assert interval_texts(point) == ("0.89 to 1.03", "0.88 to 1.00")
    assert _interval(0.8997, 1.0301) == " [0.89, 1.04]"
    assert _interval(math.nan, math.nan) == ""


def test_the_bench_help_states_the_repeats_a_goal_interval_needs(capsys):
    # The CLI's help spells the number out (importing the statistics module costs its start
    # time): it must be MIN_REPEATS.
    from simulator.cli import main
    from simulator.engines.results import MIN_REPEATS

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert f"need {MIN_REPEATS} or more for the median" in " ".join(capsys.readouterr().out.split())


def test_a_failure_whose_message_cannot_be_shown_is_still_described_for_the_other_ranks():
    from simulator.controller.integrity import IncompatibleCheckpoint
    from simulator.controller.shared_failure import KINDS, describe

    class Mute(Exception):
        def __str__(self):
            raise RuntimeError("no str")

    kind, text = describe(Mute(), "restoring step-1", 1)
    assert KINDS[kind][1] is RuntimeError
    assert text == "rank 1 failed restoring step-1: Mute: (its message cannot be shown)"
    refusal = IncompatibleCheckpoint("it does not fit")
    assert describe(refusal, "x", 0)[1] == "it does not fit"  # rank 0's word for word
    assert describe(refusal, "x", 2)[1] == "it does not fit (on rank 2)"
