"""When saves happen: fixed intervals on a fake clock, milestones, and the learned failure rate."""

import dataclasses
import itertools
import json
import math

import pytest
import torch
from safetensors.torch import save_file
from scipy.special import lambertw

from simulator import ckptio
from simulator.controller import AdaptiveCheckpointer, LocalBackend
from simulator.controller.runlog import RUNLOG
from simulator.controller.state import flatten
from simulator.controller.storage import checkpoint_name
from simulator.model.scenario import Scenario
from simulator.policies import Adaptive, FixedInterval, PolicyContext


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def run(ck, clock, start, stop, iteration_s):
    saved = []
    for step in range(start, stop):
        clock.now += iteration_s
        if ck.step(step + 1):
            saved.append((step + 1, clock.now))
    return saved


def test_a_fixed_interval_policy_saves_every_interval_s_of_compute(tmp_path):
    clock = FakeClock()
    ck = AdaptiveCheckpointer(
        tmp_path, model=torch.nn.Linear(2, 2), policy=FixedInterval(10.0), clock=clock
    )
    assert ck.restore() == 0
    saved = run(ck, clock, 0, 120, iteration_s=0.5)
    ck.close()
    # The first 20 steps measure the iteration time, then a save every 10 s = 20 steps.
    assert [s for s, _ in saved] == [40, 60, 80, 100, 120]
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(saved)]
    assert gaps == pytest.approx([10.0] * 4)
    assert ck.stats["interval_s"] == 10.0 and ck.stats["iteration_s"] == pytest.approx(0.5)


def test_milestones_are_saved_exactly_and_survive_retention(tmp_path):
    clock = FakeClock()
    ck = AdaptiveCheckpointer(
        tmp_path,
        model=torch.nn.Linear(2, 2),
        policy=FixedInterval(1e6),
        clock=clock,
        keep_last=1,
        total_steps=100,
        milestones=(0.3, 0.6, 0.9),
        probe_steps=5,
    )
    saved = run(ck, clock, 0, 100, iteration_s=1.0)
    ck.save(100)
    ck.close()
    assert [s for s, _ in saved] == [30, 60, 90]
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step-"))
    assert names == [checkpoint_name(s) for s in (30, 60, 90, 100)]


def write_crashed_sessions(directory, n, hours_each):
    with open(directory / RUNLOG, "w") as f:
        for i in range(n):
            for event, t in (("start", 0.0), ("save", hours_each * 3600.0)):
                f.write(json.dumps({"event": event, "session": f"s{i}", "session_s": t}) + "\n")


def first_save(ck, clock, iteration_s):
    """The step of the first save, running steps of ``iteration_s`` until it comes."""
    for step in itertools.count(1):
        clock.now += iteration_s
        if ck.step(step):
            return step
        assert step < 100_000, "no save"


def planned(directory, clock):
    """A checkpointer past its probe: the interval it chose and its stats."""
    scenario = Scenario(mtbf_h=24.0, checkpoint_s=60.0, restart_s=600.0)
    ck = AdaptiveCheckpointer(
        directory, model=torch.nn.Linear(2, 2), scenario=scenario, clock=clock, probe_steps=5
    )
    ck.restore()
    run(ck, clock, 0, 5, iteration_s=1.0)
    stats = ck.stats
    ck.close()
    return stats


def daly_optimum_s(delta_s, mtbf_s):
    """The exact minimiser of Daly's (2006) expected wall time: M·(1 + W₀(−e^(−1−δ/M)))."""
    return mtbf_s * (1.0 + lambertw(-math.exp(-1.0 - delta_s / mtbf_s)).real)


def test_more_restarts_than_the_prior_expects_shrink_the_interval(tmp_path):
    calm, flaky = tmp_path / "calm", tmp_path / "flaky"
    calm.mkdir()
    flaky.mkdir()
    write_crashed_sessions(flaky, n=6, hours_each=1.0)  # 6 failures in 6 h; prior: 1 per 24 h
    a = planned(calm, FakeClock())
    b = planned(flaky, FakeClock())
    assert b["failures_seen"] == 6
    # Gamma–Poisson: prior Gamma(2, 2·24 h) plus 6 failures over the exposure.
    assert b["mtbf_s"] == pytest.approx((2 * 24 * 3600.0 + b["exposure_s"]) / (2 + 6))
    assert b["mtbf_s"] < a["mtbf_s"] / 3
    assert b["interval_s"] < a["interval_s"]
    for s in (a, b):
        assert s["checkpoint_s_source"] == "scenario"
        assert s["interval_s"] == pytest.approx(daly_optimum_s(60.0, s["mtbf_s"]), rel=1e-6)
        assert s["interval_steps"] == round(s["interval_s"] / 1.0)


def test_without_a_save_cost_estimate_the_first_save_comes_after_the_probe(tmp_path):
    clock = FakeClock()
    ck = AdaptiveCheckpointer(
        tmp_path, model=torch.nn.Linear(2, 2), mtbf_h=1.0, clock=clock, probe_steps=7
    )
    assert ck.stats["checkpoint_s_source"] == "first save"
    assert isinstance(ck.schedule.policy, Adaptive)
    saved = run(ck, clock, 0, 7, iteration_s=1.0)
    assert [s for s, _ in saved] == [7]
    assert ck.stats["checkpoint_s_source"] == "measured"
    assert ck.next_due_step > 7
    ck.close()


def test_a_resumed_run_starts_from_the_measurements_in_its_checkpoint(tmp_path):
    clock = FakeClock()
    first = AdaptiveCheckpointer(
        tmp_path, model=torch.nn.Linear(2, 2), policy=FixedInterval(30.0), clock=clock
    )
    run(first, clock, 0, 100, iteration_s=2.0)
    first.close()
    second = AdaptiveCheckpointer(
        tmp_path, model=torch.nn.Linear(2, 2), policy=FixedInterval(30.0), clock=clock
    )
    step = second.restore()
    assert second.stats["iteration_s"] == pytest.approx(2.0)
    assert second.next_due_step == step + 15  # no probe: 30 s / 2 s per step
    second.close()


class CountingBackend(LocalBackend):
    """A single process that counts its collectives."""

    def __init__(self):
        self.broadcasts = 0
        self.barriers = 0

    def broadcast(self, obj):
        self.broadcasts += 1
        return obj

    def barrier(self):
        self.barriers += 1


class TempDirBackend(CountingBackend):
    """Writes loose files like a torch.distributed backend: the checkpointer commits them."""

    def writes_manifest(self):
        return True

    def write(self, tmp_dir, state):
        tensors, tree = flatten(state)
        save_file(tensors, tmp_dir / ckptio.TENSOR_FILE)
        (tmp_dir / ckptio.META_FILE).write_text(json.dumps(tree))


@pytest.mark.parametrize("backend_type", [CountingBackend, TempDirBackend])
def test_collectives_run_only_at_save_time_never_per_step(tmp_path, backend_type):
    clock, backend = FakeClock(), backend_type()
    model = torch.nn.Linear(2, 2)
    ck = AdaptiveCheckpointer(
        tmp_path, model=model, policy=FixedInterval(50.0), clock=clock, backend=backend
    )
    ck.restore()
    after_restore = backend.broadcasts
    saved = run(ck, clock, 0, 1000, iteration_s=1.0)
    ck.close(finished=False)  # no final save of step 1000: only the policy's saves here
    assert len(saved) == 19  # probe at 20, then every 50 steps
    assert backend.broadcasts - after_restore == len(saved) + 1  # + the probe's answer
    assert backend.barriers == (len(saved) if backend.writes_manifest() else 0)
    newest = tmp_path / checkpoint_name(saved[-1][0])
    ckptio.verify_checkpoint(newest)  # the commit made a ckptio checkpoint either way
    manifest = json.loads((newest / ckptio.MANIFEST).read_text())
    assert not any(".rank-" in name for name in manifest["files"])
    again = torch.nn.Linear(2, 2)
    ck2 = AdaptiveCheckpointer(tmp_path, model=again, backend=backend_type())
    assert ck2.restore() == saved[-1][0]
    ck2.close()
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())


# -- the live controller's step rules, simulated ---------------------------------------------
def test_the_simulated_controller_saves_first_where_the_live_one_does_probe_included(tmp_path):
    # The live AdaptiveCheckpointer probes `probe_steps` steps, then chooses its first
    # interval in whole steps; ControllerPolicy(step_s=...) is what the DES runs of it, and must
    # put the first save on the same step. Without a scenario (no δ before the first save) the
    # probe itself ends in the first save.
    from simulator.controller.schedule import ControllerPolicy

    scenario = Scenario(mtbf_h=2.0, checkpoint_s=60.0, restart_s=600.0)
    for step_s, probe in [(7.0, 5), (0.9, 20), (31.0, 3)]:
        clock = FakeClock()
        folder = tmp_path / f"{step_s}"
        ck = AdaptiveCheckpointer(
            folder, model=torch.nn.Linear(2, 2), scenario=scenario, clock=clock,
            probe_steps=probe,
        )  # fmt: skip
        ck.restore()
        live = first_save(ck, clock, step_s)
        ck.close()
        policy = ControllerPolicy(step_s=step_s, probe_steps=probe)
        simulated = policy.next_interval_s(PolicyContext.from_scenario(scenario)) / step_s
        assert simulated == pytest.approx(live, abs=1e-9), (step_s, probe)
        assert live > probe

    clock = FakeClock()
    ck = AdaptiveCheckpointer(
        tmp_path / "none", model=torch.nn.Linear(2, 2), mtbf_h=2.0, clock=clock, probe_steps=7
    )
    live = first_save(ck, clock, 3.0)
    ck.close()
    policy = ControllerPolicy(step_s=3.0, probe_steps=7, first_save_at_probe=True)
    assert policy.next_interval_s(PolicyContext.from_scenario(scenario)) == live * 3.0 == 21.0


def test_in_the_des_the_controller_probes_only_on_a_start_without_a_checkpoint():
    # A failure before the first save lands means the next launch starts from scratch, and the
    # live controller probes again; after a save lands it resumes with the measured iteration
    # time and does not. Every interval is whole steps.
    from simulator.controller.schedule import ControllerPolicy
    from simulator.engines.des_replicas import run_replica

    step_s, probe = 4.0, 10
    inner = ControllerPolicy(step_s=step_s, probe_steps=probe)
    seen = []

    class Recording:
        name, learns = "recording", True

        def next_interval_s(self, ctx):
            seen.append((ctx, inner.next_interval_s(ctx)))
            return seen[-1][1]

    scenario = Scenario(mtbf_h=1.0, checkpoint_s=30.0, restart_s=120.0, work_h=6.0)
    first = inner.next_interval_s(PolicyContext.from_scenario(scenario))
    kills = [first / 2, first / 2 + 120.0 + first + 30.0 + 60.0]  # before save 1; after one
    rec = run_replica(scenario, Recording(), 1, failure_times=kills)
    assert rec["failures"] == 2
    probes = []
    for ctx, interval_s in seen:
        steps = interval_s / step_s
        assert steps == pytest.approx(round(steps), abs=1e-9)
        plain = dataclasses.replace(ctx, checkpoints_committed=1)  # the same, without a probe
        probed = interval_s - inner.next_interval_s(plain) > probe * step_s / 2
        probes.append(probed)
        assert probed == (ctx.checkpoints_committed == 0 and ctx.saves_since_start == 0)
    # The start and the launch after the first kill probe; nothing after the first save does.
    assert probes[:2] == [True, True] and not any(probes[2:])
    assert seen[1][0].failures_seen == 1 and seen[1][0].checkpoints_committed == 0
    assert any(ctx.failures_seen == 2 and ctx.checkpoints_committed > 0 for ctx, _ in seen)
