"""The two engines implement one model: their means agree within Monte-Carlo error.

The matrix is every failure family (exponential, Weibull shape 0.5/0.7/2, lognormal) with the
GPU count known (each GPU fails on its own) or not (a job-level lifetime), every policy, and
trace replay. On each cell both engines run the same replicas (``simulator.engines.streams``); the
DES is the reference. A mean passes when |des − fast| < 4 combined standard errors plus a
floor of 1e-6 of the work: trace cells replay identical failure times, so both engines give
the same numbers up to float rounding and their difference has no Monte-Carlo error at all;
the floor only absorbs that rounding (and the fast engine's schedule, which it continues at
its last interval once that settles to 1e-6). Cells that only the DES can run are listed in
``DES_ONLY`` with the reason, and checked to be refused by the fast engine with that reason.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.engines import choose
from simulator.errors import InputError
from simulator.model.scenario import Scenario
from simulator.policies import make_policy

FAILURES = (
    "exponential",
    "weibull:shape=0.5",
    "weibull:shape=0.7",
    "weibull:shape=2",
    "lognormal:sigma=1",
)
POLICIES = ("young", "daly", "optimal", "adaptive", "fixed")
GPUS = (16, None)
WORK_H = 60.0
JOB_MTBF_H = 6.0


def _scenario(gpus, failure) -> Scenario:
    common = dict(checkpoint_s=300.0, restart_s=600.0, work_h=WORK_H, failure=failure)
    if gpus is None:
        return Scenario(mtbf_h=JOB_MTBF_H, **common)
    return Scenario(gpus=gpus, gpu_mtbf_h=JOB_MTBF_H * gpus, **common)


def _policy(name):
    return make_policy(name, interval_s=2400.0 if name == "fixed" else None)


def _trace(rng):
    # A random subset of a cluster's failure log: every replica replays a different one.
    return np.sort(rng.uniform(0.0, 400 * 3600.0, rng.integers(40, 90)))


def _means(scenario, policy, replicas, failure_times=None):
    out = {}
    for which in ("des", "fast"):
        res = choose.simulate(
            scenario,
            _policy(policy),
            replicas=replicas,
            seed=11,
            engine=which,
            workers=1,
            progress=False,
            failure_times=failure_times,
        )
        assert res.meta["engine"] == which
        wall = res.records["wall_h"].to_numpy()
        out[which] = (wall.mean(), wall.std(ddof=1) / math.sqrt(wall.size))
    return out


def _assert_agree(cell, m):
    (d, dse), (f, fse) = m["des"], m["fast"]
    tol = 4.0 * math.hypot(dse, fse) + 1e-6 * WORK_H
    print(f"{cell}: des {d:.3f} ± {dse:.3f} h, fast {f:.3f} ± {fse:.3f} h")
    assert abs(d - f) < tol, f"{cell}: des {d:.4f} ± {dse:.4f} h vs fast {f:.4f} ± {fse:.4f} h"


CELLS = [(g, fam, pol) for g in GPUS for fam in FAILURES for pol in POLICIES]
QUICK = [
    (16, "weibull:shape=0.5", "adaptive"),
    (None, "weibull:shape=0.7", "adaptive"),
    (16, "lognormal:sigma=1", "optimal"),
    (None, "exponential", "young"),
]


def _id(cell):
    g, fam, pol = cell
    return f"gpus={g}-{fam}-{pol}"


@pytest.mark.parametrize("cell", QUICK, ids=_id)
def test_the_engines_agree_on_a_quick_subset_of_the_matrix(cell):
    g, fam, pol = cell
    _assert_agree(_id(cell), _means(_scenario(g, fam), pol, replicas=150))


@pytest.mark.slow
@pytest.mark.parametrize("cell", CELLS, ids=_id)
def test_the_engines_agree_on_every_cell_of_the_matrix(cell):
    g, fam, pol = cell
    _assert_agree(_id(cell), _means(_scenario(g, fam), pol, replicas=400))


@pytest.mark.parametrize("gpus", GPUS)
@pytest.mark.parametrize("policy", ["adaptive", "fixed"])
def test_the_engines_agree_on_trace_replay(gpus, policy):
    cell = f"trace-gpus={gpus}-{policy}"
    _assert_agree(cell, _means(_scenario(gpus, "exponential"), policy, 40, failure_times=_trace))


@pytest.mark.slow
@pytest.mark.parametrize("gpus", GPUS)
@pytest.mark.parametrize("policy", POLICIES)
def test_the_engines_agree_on_trace_replay_for_every_policy(gpus, policy):
    cell = f"trace-gpus={gpus}-{policy}"
    _assert_agree(cell, _means(_scenario(gpus, "exponential"), policy, 100, failure_times=_trace))


DES_ONLY = {
    "spares": (dict(spares=2, repair_h=24.0), "spares"),
    "async saves": (dict(async_checkpoint=True, staging_s=5.0), "async_checkpoint"),
    "node failures": (dict(gpus_per_node=8, node_mtbf_h=5000.0), "node_mtbf_h"),
}
"""Cells only the DES applies to, with the field the fast engine names when it refuses."""


@pytest.mark.parametrize("name", DES_ONLY)
def test_cells_only_the_des_models_are_refused_by_the_fast_engine_with_the_reason(name):
    extra, field = DES_ONLY[name]
    s = Scenario(gpus=16, gpu_mtbf_h=96.0, checkpoint_s=300.0, restart_s=600.0, work_h=5.0, **extra)
    assert choose.choose_engine(s, "auto") == "des"
    with pytest.raises(InputError, match=field):
        choose.choose_engine(s, "fast")
    assert (
        choose.simulate(s, "optimal", replicas=2, seed=0, workers=1, progress=False).meta["engine"]
        == "des"
    )


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("policy", ["adaptive", "fixed"])
def test_with_a_job_level_lifetime_both_engines_replay_the_same_failures_replica_by_replica(
    failure, policy
):
    # One stream rule and one stationary-start sampler: the same seed is the same history.
    s = _scenario(None, failure)
    runs = [
        choose.simulate(
            s, _policy(policy), replicas=12, seed=4, engine=e, workers=1, progress=False
        )
        for e in ("des", "fast")
    ]
    des, fst = (r.records for r in runs)
    for key in ("wall_h", "lost_h", "checkpoint_h", "failures", "checkpoints"):
        np.testing.assert_allclose(fst[key], des[key], rtol=1e-9, atol=1e-9, err_msg=key)


@pytest.mark.parametrize("failure", FAILURES[1:])
def test_every_gpu_starts_at_the_same_stationary_age_in_both_engines(failure):
    from simulator.engines import fast
    from simulator.engines.des import failure_source_for
    from simulator.engines.streams import replica_seeds, replica_streams

    s = _scenario(16, failure)
    seeds = replica_seeds(8, 5)
    first_fast = fast.draw_failure_times(s, seeds, 2e6, "per_gpu")[:, 0]
    first_des = [failure_source_for(s, *replica_streams(ss)[:2]).next_failure_s() for ss in seeds]
    np.testing.assert_allclose(first_fast, first_des, rtol=1e-12)
