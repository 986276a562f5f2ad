"""The money model: GPU-hours, waste, storage, and whole-job bills."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import analytic
from simulator.errors import InputError
from simulator.model import money

HOUR = 3600.0


def test_a_thousand_gpus_at_two_dollars_cost_48000_dollars_a_day():
    assert money.gpu_usd_per_day(1000, 2.0) == pytest.approx(48_000.0)
    assert money.usd_lost_per_day(1000, 2.0, 0.1) == pytest.approx(4_800.0)


def test_one_terabyte_at_two_cents_per_gb_month_costs_240_dollars_a_year():
    # 1 TB = 1000 GB (SI, as cloud storage bills), 12 months × 1000 GB × $0.02 = $240.
    per_day = money.storage_usd_per_day(1e12, 1, 0.02)
    assert per_day * 365.25 == pytest.approx(240.0)
    assert money.storage_usd_per_day(1e12, 3, 0.02) == pytest.approx(3 * per_day)


def test_daily_cost_leaves_storage_out_unless_size_and_price_are_both_known():
    base = dict(gpus=8, usd_per_gpu_hour=1.0, waste_fraction=0.2)
    assert money.daily_cost(**base).storage_usd is None
    assert money.daily_cost(**base, checkpoint_bytes=1e12).storage_usd is None
    assert money.daily_cost(**base, usd_per_gb_month=0.02).storage_usd is None
    day = money.daily_cost(**base, checkpoint_bytes=1e12, usd_per_gb_month=0.02)
    assert day.storage_usd == pytest.approx(2 * 240.0 / 365.25)  # two retained by default
    assert day.total_usd == pytest.approx(day.ideal_usd + day.storage_usd)


@settings(max_examples=100, deadline=None)
@given(
    gpus=st.integers(1, 100_000),
    price=st.floats(0.0, 20.0),
    delta=st.floats(1.0, 3600.0),
    mtbf_h=st.floats(0.1, 1000.0),
    restart=st.floats(0.0, 7200.0),
)
def test_money_lost_is_the_waste_share_of_the_ideal_day_at_the_optimal_interval(
    gpus, price, delta, mtbf_h, restart
):
    mtbf = mtbf_h * HOUR
    tau = analytic.optimal_interval(delta, mtbf)
    waste = analytic.waste_fraction(tau, delta, mtbf, restart)
    day = money.daily_cost(gpus=gpus, usd_per_gpu_hour=price, waste_fraction=waste)
    assert 0.0 <= day.lost_usd <= day.ideal_usd
    assert day.useful_usd + day.lost_usd == pytest.approx(day.ideal_usd)
    assert day.lost_usd == pytest.approx(gpus * price * 24 * waste)


@settings(max_examples=100, deadline=None)
@given(
    gpus=st.integers(1, 100_000),
    price=st.floats(0.01, 20.0),
    delta=st.floats(1.0, 3600.0),
    mtbf_h=st.floats(0.5, 1000.0),
    work_h=st.floats(1.0, 5000.0),
)
def test_expected_job_bill_over_ideal_bill_is_one_over_useful_fraction(
    gpus, price, delta, mtbf_h, work_h
):
    mtbf, restart = mtbf_h * HOUR, 600.0
    tau = analytic.optimal_interval(delta, mtbf)
    wall_h = money.expected_wall_h(tau, delta, mtbf, restart, work_h)
    job = money.job_cost(gpus=gpus, usd_per_gpu_hour=price, work_h=work_h, expected_wall_h=wall_h)
    waste = analytic.waste_fraction(tau, delta, mtbf, restart)
    assert job.expected_usd / job.ideal_usd == pytest.approx(1 / (1 - waste), rel=1e-9)
    assert job.excess_usd >= 0
    assert job.ideal_usd == pytest.approx(gpus * price * work_h)


def test_job_storage_is_billed_for_the_expected_wall_time():
    job = money.job_cost(
        gpus=10, usd_per_gpu_hour=1.0, work_h=100.0, expected_wall_h=120.0, storage_usd_per_day=2.4
    )
    assert job.storage_usd == pytest.approx(2.4 * 5)
    assert job.expected_usd == pytest.approx(10 * 120.0 + 12.0)
    assert job.excess_usd == pytest.approx(10 * 20.0 + 12.0)


def test_cost_functions_broadcast_over_arrays():
    waste = np.array([0.01, 0.1, 0.5])
    lost = money.usd_lost_per_day(np.array([[8], [16]]), 2.0, waste)
    assert lost.shape == (2, 3)
    assert lost[1, 2] == pytest.approx(16 * 2.0 * 24 * 0.5)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(gpus=0, usd_per_gpu_hour=1.0, waste_fraction=0.1), "gpus"),
        (dict(gpus=8, usd_per_gpu_hour=-1.0, waste_fraction=0.1), "usd_per_gpu_hour"),
        (dict(gpus=8, usd_per_gpu_hour=1.0, waste_fraction=1.5), "waste_fraction"),
        (dict(gpus=8, usd_per_gpu_hour=float("nan"), waste_fraction=0.1), "usd_per_gpu_hour"),
        (
            dict(
                gpus=8,
                usd_per_gpu_hour=1.0,
                waste_fraction=0.1,
                checkpoint_bytes=-1.0,
                usd_per_gb_month=0.02,
            ),
            "checkpoint_bytes",
        ),
    ],
)
def test_bad_inputs_raise_one_line_naming_the_field(kwargs, field):
    with pytest.raises(InputError, match=field) as info:
        money.daily_cost(**kwargs)
    assert "\n" not in str(info.value)


def test_a_job_cannot_finish_faster_than_its_failure_free_work():
    with pytest.raises(InputError, match="expected_wall_h"):
        money.job_cost(gpus=8, usd_per_gpu_hour=1.0, work_h=100.0, expected_wall_h=90.0)


def test_records_are_frozen():
    day = money.daily_cost(gpus=8, usd_per_gpu_hour=1.0, waste_fraction=0.1)
    with pytest.raises(AttributeError):
        day.lost_usd = 0.0


def test_an_infinite_expected_wall_time_gives_an_infinite_bill_not_an_error():
    wall_h = money.expected_wall_h(600.0, 3000.0, 3.6, 0.0, 100.0)  # δ/M ≈ 833: e^833 overflows
    assert wall_h == float("inf")
    job = money.job_cost(gpus=8, usd_per_gpu_hour=1.0, work_h=100.0, expected_wall_h=wall_h)
    assert job.expected_usd == float("inf") and job.ideal_usd == pytest.approx(800.0)
