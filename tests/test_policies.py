"""Policies: the same objects the simulator and the live controller ask 'when is the next save?'."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize, stats

from simulator import analytic
from simulator.controller.estimate import FailureRatePosterior
from simulator.errors import InputError
from simulator.model.failures import Exponential, LogNormal, Weibull
from simulator.policies import (
    Adaptive,
    Daly,
    ExactOptimal,
    FixedInterval,
    Policy,
    PolicyContext,
    Young,
    make_policy,
    optimal_fraction,
)


def ctx(**kw):
    base = dict(checkpoint_s=60.0, restart_s=600.0, mtbf_s=3.0 * 3600)
    base.update(kw)
    return PolicyContext(**base)


def daly_wall_per_work(tau, delta, mtbf):
    # Daly (2006) T_w / Ts with R = 0, written out here independently of simulator.analytic.
    return mtbf * math.expm1((tau + delta) / mtbf) / tau


def numeric_optimum(delta, mtbf):
    res = optimize.minimize_scalar(
        daly_wall_per_work,
        bounds=(1e-6 * mtbf, 5 * mtbf),
        args=(delta, mtbf),
        method="bounded",
        options={"xatol": 1e-10 * mtbf},
    )
    return res.x


def test_every_policy_satisfies_the_protocol_and_make_policy_knows_the_names():
    for name in ("young", "daly", "optimal", "adaptive"):
        policy = make_policy(name)
        assert isinstance(policy, Policy)
        assert policy.name == name
    assert make_policy("adaptive", interval_s=300.0) == FixedInterval(300.0)
    with pytest.raises(InputError, match="unknown policy"):
        make_policy("hourly")


def test_fixed_interval_rejects_non_positive_seconds():
    for bad in (0.0, -5.0, math.nan, math.inf):
        with pytest.raises(InputError, match="interval_s"):
            FixedInterval(bad)


def test_young_is_the_square_root_of_twice_delta_times_mtbf():
    assert Young().next_interval_s(ctx(checkpoint_s=50.0, mtbf_s=10_000.0)) == pytest.approx(1000.0)


@settings(max_examples=40, deadline=None)
@given(
    delta=st.floats(1.0, 600.0),
    mtbf=st.floats(600.0, 1e6),
)
def test_exact_optimal_minimises_dalys_wall_time_numerically(delta, mtbf):
    tau = ExactOptimal().next_interval_s(ctx(checkpoint_s=delta, mtbf_s=mtbf))
    best = numeric_optimum(delta, mtbf)
    assert daly_wall_per_work(tau, delta, mtbf) <= daly_wall_per_work(best, delta, mtbf) * (
        1 + 1e-9
    )


def test_daly_sits_between_young_and_the_optimum_for_small_delta():
    c = ctx(checkpoint_s=60.0, mtbf_s=4 * 3600.0)
    exact = ExactOptimal().next_interval_s(c)
    assert abs(Daly().next_interval_s(c) - exact) < abs(Young().next_interval_s(c) - exact)


@settings(max_examples=40, deadline=None)
@given(delta=st.floats(1.0, 3600.0), mtbf=st.floats(60.0, 1e7), age=st.floats(0.0, 1e6))
def test_adaptive_without_a_component_model_is_the_exact_optimum_at_the_given_mtbf(
    delta, mtbf, age
):
    c = ctx(checkpoint_s=delta, mtbf_s=mtbf, age_s=age)
    assert Adaptive().next_interval_s(c) == pytest.approx(numeric_optimum(delta, mtbf), rel=1e-5)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 20_000), age=st.floats(0.0, 1e7))
def test_adaptive_with_exponential_components_ignores_age(n, age):
    comp = Exponential(50_000 * 3600.0)
    c = ctx(mtbf_s=comp.mean / n, age_s=age, component=comp, n_components=n)
    assert Adaptive().next_interval_s(c) == pytest.approx(
        ExactOptimal().next_interval_s(c), rel=1e-9
    )


def test_adaptive_interval_is_the_optimum_at_the_mean_hazard_over_that_interval():
    # Independent check with scipy's own Weibull hazard, integrated numerically.
    comp = Weibull.from_mean(2000 * 3600.0, 0.7)
    n, age, delta = 64, 6 * 3600.0, 120.0
    mtbf = comp.mean_s / n
    c = ctx(checkpoint_s=delta, mtbf_s=mtbf, age_s=age, component=comp, n_components=n)
    tau = Adaptive(bound=1e6, renews="all").next_interval_s(c)
    dist = stats.weibull_min(0.7, scale=comp.scale)
    failures, _ = integrate.quad(lambda t: n * dist.pdf(t) / dist.sf(t), age, age + tau)
    local_mtbf = tau / failures
    assert tau == pytest.approx(numeric_optimum(delta, local_mtbf), rel=1e-5)


def test_adaptive_lengthens_with_age_under_infant_mortality_and_shortens_under_wear_out():
    n = 1024
    young_parts = Weibull.from_mean(20_000 * 3600.0, 0.6)
    worn_parts = Weibull.from_mean(20_000 * 3600.0, 2.5)
    ages = [0.0, 600.0, 3600.0, 6 * 3600.0, 48 * 3600.0]

    def intervals(comp):
        return [
            Adaptive(bound=1e6, renews="all").next_interval_s(
                ctx(mtbf_s=comp.mean_s / n, age_s=a, component=comp, n_components=n)
            )
            for a in ages
        ]

    assert np.all(np.diff(intervals(young_parts)) > 0)
    assert np.all(np.diff(intervals(worn_parts)) < 0)


def test_adaptive_keeps_the_local_mtbf_within_its_bound_of_the_given_mtbf():
    n = 16_384
    mtbf = 3.0 * 3600.0
    opt = ExactOptimal()
    low, high = (opt.next_interval_s(ctx(mtbf_s=m)) for m in (mtbf / 10, mtbf * 10))
    infant = Weibull.from_mean(mtbf * n, 0.5)  # infinite hazard at age 0
    late = LogNormal.from_mean(mtbf * n, 0.5)  # hazard ~ 0 for young parts
    at_zero = [
        Adaptive(bound=10.0, renews="all").next_interval_s(
            ctx(mtbf_s=mtbf, age_s=0.0, component=comp, n_components=n)
        )
        for comp in (infant, late)
    ]
    assert at_zero == pytest.approx([low, high])
    for age in (60.0, 3600.0, 86_400.0, 1e6):
        for comp in (infant, late):
            c = ctx(mtbf_s=mtbf, age_s=age, component=comp, n_components=n)
            assert (
                low * (1 - 1e-9)
                <= Adaptive(bound=10.0, renews="all").next_interval_s(c)
                <= high * (1 + 1e-9)
            )
    with pytest.raises(InputError, match="bound"):
        Adaptive(bound=0.5)


def test_adaptive_follows_the_controllers_failure_rate_posterior():
    # What the live controller does: feed the posterior MTBF; more failures -> shorter interval.
    prior = FailureRatePosterior.from_prior(mtbf_s=6 * 3600.0, weight=2.0)
    calm = prior.observe(failures=0, exposure_s=24 * 3600.0)
    flaky = prior.observe(failures=12, exposure_s=24 * 3600.0)
    policy = make_policy("adaptive")
    t_calm = policy.next_interval_s(ctx(mtbf_s=calm.mtbf_s))
    t_flaky = policy.next_interval_s(ctx(mtbf_s=flaky.mtbf_s))
    assert t_flaky < t_calm
    assert t_flaky == pytest.approx(numeric_optimum(60.0, flaky.mtbf_s), rel=1e-5)


@settings(max_examples=200, deadline=None)
@given(x=st.floats(1e-14, 50.0))
def test_fast_scalar_optimum_matches_the_lambert_w_closed_form(x):
    # Against analytic.optimal_interval, and against the defining equation itself.
    a = optimal_fraction(x)
    assert 0 < a <= 1
    assert a == pytest.approx(analytic.optimal_interval(x, 1.0), rel=1e-9)
    if x > 20:  # 1 − a underflows; the equation can no longer be evaluated in floats
        return
    phi = -a - math.log1p(-a) if a > 1e-3 else a * a / 2 + a**3 / 3 + a**4 / 4 + a**5 / 5
    assert phi == pytest.approx(x, rel=1e-8)


def test_adaptive_on_a_large_cluster_where_only_the_failed_part_renews_is_nearly_exponential():
    # 16,384 Weibull(0.7) GPUs: one new part next to 16,383 in their long-run state is a
    # superposition of renewal processes, which is close to Poisson at rate n / mean.
    n = 16_384
    comp = Weibull.from_mean(50_677 * 3600.0, 0.7)
    c = ctx(checkpoint_s=60.0, mtbf_s=comp.mean_s / n, age_s=0.0, component=comp, n_components=n)
    exact = ExactOptimal().next_interval_s(c)
    assert Adaptive().next_interval_s(c) == pytest.approx(exact, rel=0.02)
    # Whereas assuming every part is new at a restart would checkpoint far more often.
    assert Adaptive(renews="all").next_interval_s(c) < 0.7 * exact


def test_adaptive_with_one_component_is_the_same_whichever_parts_renew():
    comp = Weibull.from_mean(10 * 3600.0, 0.6)
    for age in (0.0, 3600.0, 36_000.0):
        c = ctx(checkpoint_s=60.0, mtbf_s=comp.mean_s, age_s=age, component=comp, n_components=1)
        assert Adaptive().next_interval_s(c) == Adaptive(renews="all").next_interval_s(c)


# -- what a policy sees of a scenario -----------------------------------------------------
def test_the_context_of_a_scenario_with_node_failures_carries_the_jobs_whole_rate():
    from simulator.model.scenario import Scenario

    s = Scenario(gpus=2048, gpus_per_node=16, gpu_mtbf_h=1e5, node_mtbf_h=1e4, checkpoint_s=60.0)
    c = PolicyContext.from_scenario(s, age_s=600.0)
    assert c.mtbf_s == pytest.approx(s.system_mtbf_s) and c.age_s == 600.0
    assert c.n_components == 2048 and c.component.mean_s == pytest.approx(1e5 * 3600)
    assert c.other_rate_per_s == pytest.approx(128 / (1e4 * 3600))
    # Exponential parts: the hazard-aware policy is the exact optimum at the job's MTBF
    # (30 h with node failures), not at the GPUs' 48.8 h.
    assert Adaptive().local_mtbf_s(c, 3600.0) == pytest.approx(s.system_mtbf_s, rel=1e-9)
    assert Adaptive().next_interval_s(c) == pytest.approx(
        ExactOptimal().next_interval_s(c), rel=1e-9
    )


def test_the_context_of_a_job_level_lifetime_is_the_jobs_own_lifetime():
    from simulator.model.scenario import Scenario

    s = Scenario(mtbf_h=4.0, failure="weibull:shape=0.5", checkpoint_s=600.0, restart_s=600.0)
    c = PolicyContext.from_scenario(s)
    assert isinstance(c.component, Weibull) and c.component.shape == 0.5
    assert c.n_components == 1 and c.component.mean_s == pytest.approx(4 * 3600)
    # Young failures come soon after a restart: the interval just after one is shorter than
    # the exponential optimum, and much longer once the job has survived a while.
    young = Adaptive().next_interval_s(c)
    old = Adaptive().next_interval_s(PolicyContext.from_scenario(s, age_s=20 * 3600))
    assert young < ExactOptimal().next_interval_s(c) < old


# -- the live controller's decision, simulated --------------------------------------------------
def test_the_controller_policy_decides_as_the_live_schedule_does_from_the_same_evidence():
    # One rule (schedule.learned_context): the Schedule the AdaptiveCheckpointer runs and the
    # ControllerPolicy the DES runs must give the same interval from the same prior and
    # failures, a Weibull component's hazard included.
    from simulator.controller.schedule import ControllerPolicy, Schedule

    prior_mtbf, n = 8 * 3600.0, 512
    component = Weibull.from_mean(prior_mtbf * n, 0.7)
    for failures, exposure in [(0, 0.0), (3, 5 * 3600.0), (40, 100 * 3600.0)]:
        schedule = Schedule(
            policy=Adaptive(),
            prior=FailureRatePosterior.from_prior(prior_mtbf),
            restart_s=600.0,
            checkpoint_prior_s=90.0,
            asynchronous=False,
            component=component,
            n_components=n,
        )
        schedule.set_history(failures, exposure)
        live = schedule.policy.next_interval_s(schedule.context(age_s=1800.0))
        ctx = PolicyContext(
            checkpoint_s=90.0, restart_s=600.0, mtbf_s=prior_mtbf, age_s=1800.0,
            component=component, n_components=n, failures_seen=failures, exposure_s=exposure,
        )  # fmt: skip
        simulated = ControllerPolicy().next_interval_s(ctx)
        assert simulated == pytest.approx(live, rel=1e-12), (failures, exposure)


def test_the_controller_policy_learns_the_rate_and_waits_for_an_async_write():
    from simulator.controller.schedule import ControllerPolicy

    truth = 10 * 3600.0
    base = dict(checkpoint_s=60.0, restart_s=600.0, mtbf_s=truth)
    wrong = ControllerPolicy(prior_mtbf_s=100 * truth)
    first = wrong.next_interval_s(PolicyContext(**base))
    # 200 failures in 2,000 h: the posterior is within 1% of the truth, and so the interval.
    later = wrong.next_interval_s(PolicyContext(**base, failures_seen=200, exposure_s=200 * truth))
    posterior = FailureRatePosterior.from_prior(100 * truth).observe(200, 200 * truth)
    assert later == pytest.approx(ExactOptimal().next_interval_s(
        PolicyContext(**{**base, "mtbf_s": posterior.mtbf_s})
    ))  # fmt: skip
    assert first > 5 * later
    clamped = ControllerPolicy().next_interval_s(PolicyContext(**base, write_s=50_000.0))
    assert clamped == 50_000.0  # the next save cannot start before the last write ends


def test_every_policy_that_claims_to_be_steady_gives_one_interval_whatever_the_run_has_met():
    """``steady`` lets the DES skip asking between failures; a policy that claims it must not
    read the age, the failures seen, the exposure or the saves (checked on many contexts)."""
    import dataclasses

    from simulator.controller.schedule import ControllerPolicy
    from simulator.model.scenario import Scenario
    from simulator.optimize import Scaled
    from simulator.policies import (
        Adaptive,
        Daly,
        ExactOptimal,
        FixedInterval,
        PolicyContext,
        Young,
        is_steady,
    )

    scenario = Scenario(
        gpus=512,
        gpu_mtbf_h=5000.0,
        failure="weibull:shape=0.6",
        checkpoint_s=60.0,
        restart_s=300.0,
        work_h=100.0,
    )
    base = PolicyContext.from_scenario(scenario)
    variants = [
        dataclasses.replace(
            base,
            age_s=a,
            failures_seen=f,
            exposure_s=e,
            checkpoints_committed=c,
            saves_since_start=k,
        )
        for a in (0.0, 1.0, 3600.0, 1e6)
        for f in (0, 3)
        for e in (0.0, 5e4)
        for c in (0, 7)
        for k in (0, 2)
    ]
    claims = [FixedInterval(900.0), Young(), Daly(), ExactOptimal(), Scaled(Young(), 2.0)]
    for policy in claims:
        assert is_steady(policy), policy
        assert len({policy.next_interval_s(ctx) for ctx in variants}) == 1, policy.name
    # The ones that do read the run are not steady (Adaptive reads the age here).
    for policy in (Adaptive(), ControllerPolicy(), Scaled(Adaptive(), 2.0)):
        assert not is_steady(policy), policy
    assert len({Adaptive().next_interval_s(ctx) for ctx in variants}) > 1
