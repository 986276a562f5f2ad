"""The tiered DES's work budget against what it costs: estimated and measured core time.

``simulator.engines.budget.tier_estimate`` refuses a tiered run it expects to exceed
``--max-core-hours`` before it starts, so it must be conservative without being absurd (an
audit found the plain DES's rate and one event per GPU made it 15 to 185 times too high). Here
each case runs its replicas in this one process (``time.process_time``, setup included) right
after its estimate, and the table gives the ratio estimate / measured: it should lie between 1
(never under) and about 3. The cases: ``llama3-tiers`` at its first-order intervals at 1,024,
16,384 and 100,000 GPUs (200 h of work) and at 16,384 GPUs over its 1,296 h; a memory tier
saved every 2 s (a save stalling as long as the compute between saves: ~2x the work); and
the two calibration probes behind the constants: many components with almost no failures
(``COMPONENT_S``), and one component with many failures and saves (``TIER_EVENTS_PER_S``).

Run: ``python -m experiments.bench_tier_budget`` (~1 min on 2 cores; prints, and with
``--report FILE`` writes what it prints there).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from experiments._report import printed_report, report_option
from simulator.engines import budget
from simulator.engines.des_replicas import run_replica
from simulator.engines.streams import replica_seed
from simulator.model.scenario import Scenario, load_scenario
from simulator.model.tier_plan import first_order_plan
from simulator.model.tiers import TierSchedule


def cases():
    base = load_scenario("llama3-tiers")
    for gpus, work_h in ((1024, 200.0), (16384, 200.0), (16384, 1296.0), (100_000, 200.0)):
        s = dataclasses.replace(base, gpus=gpus, work_h=work_h)
        plan = TierSchedule(dict(first_order_plan(s)["tier_intervals_s"]))
        yield f"llama3-tiers, {gpus:,} GPUs, {work_h:g} h, first order", s, plan, 10
    s = dataclasses.replace(base, work_h=200.0)
    yield "memory every 2 s (2 s stall)", s, TierSchedule({"memory": 2.0, "persistent": 3600.0}), 2
    many = Scenario(
        gpus=524_288, work_h=1.0, failure_classes=[{"name": "g", "gpu_mtbf_h": 1e12}],
        tiers=[{"name": "p", "checkpoint_s": 1.0, "survives": ["g"]}],
    )  # fmt: skip
    yield "probe: 524,288 components, no failure", many, TierSchedule({"p": 1e9}), 3
    busy = Scenario(
        gpus=8, work_h=2000.0, restart_s=10.0, failure_classes=[{"name": "g", "mtbf_h": 1.0}],
        tiers=[{"name": "m", "checkpoint_s": 1.0, "survives": ["g"]},
               {"name": "p", "checkpoint_s": 5.0, "survives": ["g"]}],
    )  # fmt: skip
    yield "probe: 1 component, many events", busy, TierSchedule({"m": 60.0, "p": 600.0}), 3


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    report_option(ap)
    args = ap.parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lines = [f"{'case':<48}{'replicas':>9}{'estimate':>11}{'measured':>11}{'ratio':>8}"]
    print(lines[0])
    for label, s, schedule, replicas in cases():
        est = budget.tier_estimate(s, [schedule], replicas)
        start = time.process_time()
        for i in range(replicas):
            run_replica(s, schedule, replica_seed(0, i))
        took = time.process_time() - start
        lines.append(
            f"{label:<48}{replicas:>9}{est.core_s:>10.2f}s{took:>10.2f}s{est.core_s / took:>8.2f}"
        )
        print(lines[-1], flush=True)
    if args.report is not None:
        printed_report(
            args.report,
            "The tiered DES's work budget: estimate against measured core time",
            "-m experiments.bench_tier_budget",
            argv,
            started,
            "each case's replicas run in this one process right after its estimate; measured "
            "is time.process_time, setup included; ratio is estimate / measured",
            lines,
        )


if __name__ == "__main__":
    main()
