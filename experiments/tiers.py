"""Study — what a host-memory tier is worth: two tiers against the best single tier, against
in-memory saving at every step and against just-in-time checkpointing, in dollars.

The Llama 3 failure mix in two tiers (the ``llama3-tiers`` preset: host memory with a peer
copy, and persistent storage) at 1,024, 16,384 and 100,000 GPUs, with the same job saving its
memory copy after every training step (Gemini) or just in time after a failure (EuroSys'24)
instead, all on the same failures; a waste map over the two intervals at 16,384 GPUs with the
simulated optimum, the first-order prediction and the hand-set values people use marked; and
how the answer moves with the share of failures the memory tier survives. Every number is the
DES (``simulator.tier_search``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from experiments._report import Report, figure, table
from simulator.display import format_duration, format_usd
from simulator.engines.streams import search_and_check
from simulator.model.scenario import Scenario, load_scenario
from simulator.model.tier_plan import ROUGH_STRAIN, first_order_plan, first_order_strain
from simulator.model.tiers import Tier, TierSchedule, final_tiers, scheduled
from simulator.optimize import paired_excess
from simulator.tier_search import evaluate_schedules, simulate_tier_plan

REPLICAS = 16
REPLICAS_AT = {1024: 64}
"""More replicas where a replica meets few failures (1,024 GPUs: about four in 200 h), so
that the search does not fit noise; such replicas are cheap."""
SEED = 2026
WORK_H = 200.0
"""Failure-free compute per simulated job, hours: shorter than the preset's 1,296 h so the
study runs in minutes; waste and dollars per day are rates, so the job's length barely moves
them (the final save and the start-up are amortised over 200 h instead of 1,296 h)."""
SIZES = (1024, 16384, 100_000)
HAND_SET = {"memory": 600.0, "persistent": 3600.0}
"""Values people set by hand: host memory every 10 minutes, persistent storage every hour."""
STEP_S = 5.9
"""Seconds of compute per training step, derived for Llama 3 405B at 16,384 GPUs (an
assumption): 6 FLOPs per parameter and token × 405e9 parameters × 16M tokens a batch, over
16,384 GPUs at 400 TFLOPs each (arXiv:2407.21783, Table 4) = 5.9 s; taken as the same at every
size (a fixed batch per GPU)."""
STEP_STALL_S = 0.06
"""Training stall each step's snapshot to host memory and its copy to a peer add, seconds (an
assumption: 1% of a step). Gemini (SOSP'23) interleaves that traffic with training's and
reports no loss of throughput, so this is conservative against it."""
SHARES = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
MAP_POINTS = 9
WORKERS = None  # every core


def at_size(base: Scenario, gpus: int) -> Scenario:
    return dataclasses.replace(base, gpus=gpus, work_h=WORK_H, name=f"llama3-tiers-{gpus}")


def with_jit(s: Scenario) -> Scenario:
    """The memory tier replaced by just-in-time checkpointing (EuroSys'24): after a failure
    the memory tier survives, the healthy replicas write the state to persistent storage (its
    60 s) and the job restores it from there (60 s); no memory copies, no work lost."""
    memory, persistent = (next(t for t in s.tiers if t.name == n) for n in ("memory", "persistent"))
    jit = dataclasses.replace(
        memory, name="jit", jit=True, checkpoint_s=persistent.checkpoint_s,
        restore_s=persistent.restore_s,
    )  # fmt: skip
    return dataclasses.replace(s, tiers=(jit, persistent), name=f"{s.name}-jit")


def with_every_step(s: Scenario) -> Scenario:
    """The memory tier saved after every training step instead (Gemini, SOSP'23): a snapshot
    to host memory and a peer after each ``STEP_S`` step, stalling ``STEP_STALL_S``, restored
    as the memory tier is (10 s) after the same failures; a failure it survives loses only the
    step under way."""
    memory, persistent = (next(t for t in s.tiers if t.name == n) for n in ("memory", "persistent"))
    step = Tier(
        name="memory", every_step=True, step_s=STEP_S, step_stall_s=STEP_STALL_S,
        restore_s=memory.restore_s, survives=memory.survives,
    )  # fmt: skip
    return dataclasses.replace(s, tiers=(step, persistent), name=f"{s.name}-every-step")


def ci_text(lo: float, hi: float, fmt) -> str:
    return f"{fmt(lo)} to {fmt(hi)}"


def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def shown(saved: dict) -> str:
    """'yes' only when the whole 95% interval of the saving is above zero."""
    if saved["lo"] > 0:
        return "yes"
    if saved["hi"] < 0:
        return "no: one tier is cheaper"
    if saved["lo"] == saved["hi"] == 0:
        return "the same schedule"
    return "not shown"


def points(x: dict) -> str:
    return f"{100 * x['mean']:+.2f} ({100 * x['lo']:+.2f} to {100 * x['hi']:+.2f})"


def size_rows(base: Scenario) -> tuple[pd.DataFrame, dict, list[dict]]:
    rows, plans, strategies = [], {}, []
    for gpus in SIZES:
        s = at_size(base, gpus)
        runs = dict(replicas=REPLICAS_AT.get(gpus, REPLICAS), seed=SEED, workers=WORKERS)
        sim = simulate_tier_plan(
            s, extra={"hand-set": TierSchedule(dict(HAND_SET))}, per_replica=True, **runs
        )
        plans[gpus] = (s, sim)
        # The same failures (the same classes on the same check seeds), other strategies.
        step = simulate_tier_plan(with_every_step(s), per_replica=True, **runs)
        jit = simulate_tier_plan(with_jit(s), per_replica=True, **runs)
        strategies += strategy_records(s, sim, step, jit)
        mem_lo, mem_hi = sim["tier_intervals_ci95_s"]["memory"]
        single = sim["single_tier_simulated"]
        saved = sim["waste_saved_vs_single_tier"]
        day = s.gpus * s.usd_per_gpu_hour * 24.0
        hand = sim["extra"]["hand-set"]
        rows.append(
            {
                "GPUs": f"{gpus:,}",
                "job MTBF": format_duration(s.system_mtbf_s),
                "memory every (95% CI)": f"{format_duration(sim['tier_intervals_s']['memory'])} "
                f"({ci_text(mem_lo, mem_hi, format_duration)})",
                "persistent every": _every(s, sim, "persistent"),
                "two tiers: waste (95% CI)": f"{pct(sim['waste_fraction'])} "
                f"({ci_text(*sim['waste_fraction_ci95'], pct)})",
                "two tiers (USD)": sim["usd_lost_per_day"],
                "one tier: every": format_duration(sim["single_tier_interval_s"]),
                "one tier: waste": pct(single["waste_fraction"]),
                "one tier (USD)": single["usd_lost_per_day"],
                "saved per day (95% CI)": f"{format_usd(saved['mean'] * day)} "
                f"({ci_text(saved['lo'] * day, saved['hi'] * day, format_usd)})",
                "two tiers cheaper": shown(saved),
                "hand-set 10 min / 1 h: excess points": points(hand["excess_waste"]),
            }
        )
    return pd.DataFrame(rows), plans, strategies


def strategy_records(s: Scenario, sim: dict, step: dict, jit: dict) -> list[dict]:
    """Each strategy's waste and dollars a day (95% CIs) at one size, and what it costs beyond
    the two tiers per day, paired replica by replica on the same failures (95% CI)."""
    day = s.gpus * s.usd_per_gpu_hour * 24.0
    two = np.asarray(sim["check_waste"]["tiers"])
    memory = format_duration(sim["tier_intervals_s"]["memory"])
    entries = [
        (f"two tiers: memory every {memory}, persistent every "
         f"{_plain_every(s, sim, 'persistent')}", sim, two),
        (f"one tier: persistent every {format_duration(sim['single_tier_interval_s'])}",
         sim["single_tier_simulated"], np.asarray(sim["check_waste"]["single_tier"])),
        (f"memory every step + persistent every {_plain_every(s, step, 'persistent')}", step,
         np.asarray(step["check_waste"]["tiers"])),
        (f"JIT + persistent every {_plain_every(s, jit, 'persistent')}", jit,
         np.asarray(jit["check_waste"]["tiers"])),
    ]  # fmt: skip
    out = []
    for i, (label, summary, waste) in enumerate(entries):
        more = paired_excess(waste, two)
        out.append(
            {
                "gpus": s.gpus,
                "kind": ("two tiers", "one tier", "memory every step", "JIT")[i],
                "strategy": label,
                "waste": summary["waste_fraction"],
                "waste_ci": summary["waste_fraction_ci95"],
                "usd": summary["usd_lost_per_day"],
                "usd_ci": summary["usd_lost_per_day_ci95"],
                "more": None if i == 0 else {k: more[k] * day for k in ("mean", "lo", "hi")},
            }
        )
    return out


def strategy_table(records: list[dict]) -> pd.DataFrame:
    rows = []
    for r in records:
        more = r["more"]
        if more is None:
            against, verdict = "-", "-"
        else:
            against = f"{format_usd(more['mean'])} ({ci_text(more['lo'], more['hi'], format_usd)})"
            verdict = (
                "two tiers cheaper" if more["lo"] > 0
                else "two tiers dearer" if more["hi"] < 0
                else "not shown"
            )  # fmt: skip
        rows.append(
            {
                "GPUs": f"{r['gpus']:,}",
                "strategy": r["strategy"],
                "waste (95% CI)": f"{pct(r['waste'])} ({ci_text(*r['waste_ci'], pct)})",
                "lost per day (95% CI)": f"{format_usd(r['usd'])} "
                f"({ci_text(*r['usd_ci'], format_usd)})",
                "more than two tiers, per day (95% CI)": against,
                "verdict": verdict,
            }
        )
    return pd.DataFrame(rows)


def strategy_figure(records: list[dict]):
    """Dollars lost a day by each strategy, one panel per size (each its own linear scale, so
    the differences show), with their 95% CIs: the table's numbers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = ("two tiers", "one tier", "memory every step", "JIT")
    markers = ("o", "s", "D", "^")
    fig, axes = plt.subplots(1, len(SIZES), figsize=(9.0, 3.8))
    for ax, gpus in zip(axes, SIZES, strict=True):
        by = {r["kind"]: r for r in records if r["gpus"] == gpus}
        for k, kind in enumerate(kinds):
            r = by[kind]
            lo, hi = r["usd_ci"]
            ax.errorbar(
                [k], [r["usd"]], yerr=[[r["usd"] - lo], [hi - r["usd"]]], fmt=markers[k],
                ms=7, capsize=4, color=f"C{k}", label=kind, zorder=3,
            )  # fmt: skip
        ax.set_xticks(range(len(kinds)), ["two\ntiers", "one\ntier", "every\nstep", "JIT"])
        ax.set_xlim(-0.6, len(kinds) - 0.4)
        ax.set_ylim(0, 1.12 * max(r["usd_ci"][1] for r in by.values()))  # room over the top
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_dollars))
        ax.set_title(f"{gpus:,} GPUs", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("US dollars lost per day (mean, 95% CI)")
    fig.suptitle("Llama 3 failure mix: what each checkpointing strategy loses a day", fontsize=9)
    fig.tight_layout()
    return axes[0]


def _dollars(v: float, _=None) -> str:
    """An axis tick in dollars: $800, $60k, $1.5M."""
    if v >= 1e6:
        return f"${v / 1e6:.1f}M"
    return f"${v / 1e3:,.0f}k" if v >= 1e4 else f"${v:,.0f}"


def _break_even(records: list[dict]) -> str:
    """The stall per step at which saving every step would lose what two tiers lose, by first
    order from the measured means: each second of stall a step adds about (1 − waste)/step to
    the waste fraction."""
    lines = []
    for gpus in SIZES:
        by = {r["kind"]: r for r in records if r["gpus"] == gpus}
        two, step = by["two tiers"]["waste"], by["memory every step"]["waste"]
        even = STEP_STALL_S + (two - step) * STEP_S / (1.0 - step)
        lines.append(
            f"{gpus:,} GPUs: about {even:.2g} s"
            if even > 0
            else f"{gpus:,} GPUs: none (two tiers lose less even with no stall a step)"
        )
    return (
        "How far the every-step result rests on its assumed stall: the stall per step at which "
        "it would lose as much as two tiers, from the measured means by first order (each "
        f"second of stall a step adds about (1 − waste)/{STEP_S:g} to the waste fraction): "
        + "; ".join(lines)
        + "."
    )


def _unsearched(s: Scenario, tier: str) -> str:
    """A tier the search left off the schedule: the job's final save goes there when its copy
    is one the job ends with (``final_tiers``), else nothing does, as the CLI says it."""
    return "final save only" if tier in {t.name for t in final_tiers(s.tiers)} else "never"


def _plain_every(s: Scenario, sim: dict, tier: str) -> str:
    value = sim["tier_intervals_s"][tier]
    return (
        _unsearched(s, tier) if tier not in sim["tier_intervals_ci95_s"] else format_duration(value)
    )


def _every(s: Scenario, sim: dict, tier: str) -> str:
    value = sim["tier_intervals_s"][tier]
    if tier not in sim["tier_intervals_ci95_s"]:
        return _unsearched(s, tier)
    lo, hi = sim["tier_intervals_ci95_s"][tier]
    return f"{format_duration(value)} ({ci_text(lo, hi, format_duration)})"


def waste_map(s: Scenario, sim: dict):
    """The waste over a grid of (memory, persistent) intervals, on the search's seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = first_order_plan(s)["tier_intervals_s"]
    found = sim["tier_intervals_s"]
    axes = {}
    for name in ("memory", "persistent"):
        marks = [first[name], found[name], HAND_SET[name]]
        axes[name] = np.geomspace(min(marks) / 2, max(marks) * 2, MAP_POINTS)
    grid = [
        TierSchedule({"memory": float(m), "persistent": float(p)})
        for p in axes["persistent"]
        for m in axes["memory"]
    ]
    searched = TierSchedule({k: float(v) for k, v in found.items()})
    walls = evaluate_schedules(
        s, [*grid, searched], replicas=REPLICAS, seed=SEED, workers=WORKERS
    )  # the search's optimum on the grid's seeds too, for a like-for-like comparison
    per_run = 1.0 - s.work_s / walls
    waste = per_run[:-1].mean(axis=1).reshape(MAP_POINTS, MAP_POINTS)
    fig, ax = plt.subplots(figsize=(6.4, 5.0))
    mesh = ax.pcolormesh(
        axes["memory"] / 60, axes["persistent"] / 60, 100 * waste, shading="nearest",
        cmap="viridis_r",
    )  # fmt: skip
    fig.colorbar(mesh, ax=ax, label="waste, % of wall time (mean over replicas)")
    mx, px = np.meshgrid(axes["memory"] / 60, axes["persistent"] / 60)
    ax.scatter(mx, px, s=4, color="white", alpha=0.6, label="simulated schedule")
    for label, at, marker in (
        ("simulated optimum", found, "*"),
        ("first order (Benoit et al.)", first, "^"),
        ("hand-set: 10 min / 1 h", HAND_SET, "s"),
    ):
        ax.scatter(
            at["memory"] / 60, at["persistent"] / 60, marker=marker, s=110, color="C3",
            edgecolors="black", label=label, zorder=3,
        )  # fmt: skip
    ax.set(
        xscale="log", yscale="log", xlabel="host-memory tier: save every (minutes of compute)",
        ylabel="persistent tier: save every (minutes of compute)",
    )  # fmt: skip
    ax.set_title(f"{s.gpus:,} GPUs, Llama 3 failure mix: waste over the two intervals", fontsize=9)
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks([t for t in (1, 2, 3, 5, 10, 20, 30, 60) if
                   axes["memory"][0] / 60 <= t <= axes["memory"][-1] / 60])  # fmt: skip
    ax.set_yticks([t for t in (10, 20, 30, 60, 120, 240, 480, 960) if
                   axes["persistent"][0] / 60 <= t <= axes["persistent"][-1] / 60])  # fmt: skip
    # Below the map, so that it hides no cell.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    fig.tight_layout()
    best = np.unravel_index(np.argmin(waste), waste.shape)
    return ax, {
        "searched_waste_same_seeds": float(per_run[-1].mean()),
        "grid_best_waste": float(waste[best]),
        "grid_best": (float(axes["memory"][best[1]]), float(axes["persistent"][best[0]])),
        "grid_min": float(waste.min()),
        "grid_max": float(waste.max()),
        "evaluations": len(grid),
    }


def class_breakdown(s: Scenario, sim: dict) -> pd.DataFrame:
    """Where the time goes, class by class: lost work and recovery per day of wall time under
    the two-tier optimum and under the best single tier, on the check's fresh replicas."""
    from simulator.optimize import evaluate

    single = {t.name: math.inf for t in scheduled(s.tiers)} | {
        sim["single_tier"]: sim["single_tier_interval_s"]
    }
    schedules = {
        "two tiers": TierSchedule(dict(sim["tier_intervals_s"])),
        "one tier": TierSchedule(single),
    }
    _, check = search_and_check(SEED)  # simulate_tier_plan's check seeds
    out = evaluate(
        s, list(schedules.values()), replicas=REPLICAS, seed=check, engine="des",
        workers=WORKERS,
    )  # fmt: skip
    days = out["wall_s"] / 86400.0
    rows = []
    for c in s.failure_classes:
        row = {
            "class": c.name,
            "failures per day": float((out[f"failures_{c.name}"] / days)[0].mean()),
        }
        for i, label in enumerate(schedules):
            for part in ("lost", "recovery"):
                per_day = out[f"{part}_by_{c.name}_s"][i] / 3600.0 / days[i]
                row[f"{label}: {part} (h/day)"] = float(per_day.mean())
        rows.append(row)
    return pd.DataFrame(rows)


def share_scenario(base: Scenario, share: float) -> Scenario:
    """The preset at 16,384 GPUs with its failures split in two classes: a share the memory
    tier survives and the rest, which only the persistent copy survives."""
    s = at_size(base, 16384)
    rate = s.failure_rate_per_s
    classes = []
    for name, part in (("survivable", share), ("fatal", 1.0 - share)):
        if part > 0:
            classes.append(
                {"name": name, "mtbf_h": 1.0 / (part * rate) / 3600.0, "detection_s": 60.0,
                 "restart_s": 600.0, "nodes_lost": 1}
            )  # fmt: skip
    names = [c["name"] for c in classes]
    tiers = [
        {"name": "memory", "checkpoint_s": 2.0, "restore_s": 10.0,
         "survives": [n for n in names if n == "survivable"]},
        {"name": "persistent", "checkpoint_s": 60.0, "restore_s": 60.0, "survives": names},
    ]  # fmt: skip
    keep = {k: v for k, v in s.to_dict().items() if k not in ("failure_class", "tier")}
    return Scenario(**{**keep, "failure_classes": classes, "tiers": tiers})


def share_rows(base: Scenario) -> pd.DataFrame:
    rows = []
    for share in SHARES:
        s = share_scenario(base, share)
        sim = simulate_tier_plan(s, replicas=REPLICAS, seed=SEED, workers=WORKERS)
        saved = sim["waste_saved_vs_single_tier"]
        day = s.gpus * s.usd_per_gpu_hour * 24.0
        rows.append(
            {
                "share the memory tier survives": f"{share:.0%}",
                "memory every": _every(s, sim, "memory"),
                "persistent every": _every(s, sim, "persistent"),
                "two tiers: waste": pct(sim["waste_fraction"]),
                "one tier": f"{sim['single_tier']} every "
                f"{format_duration(sim['single_tier_interval_s'])}",
                "one tier: waste": pct(sim["single_tier_simulated"]["waste_fraction"]),
                "saved per day (95% CI)": f"{format_usd(saved['mean'] * day)} "
                f"({ci_text(saved['lo'] * day, saved['hi'] * day, format_usd)})",
                "two tiers cheaper": shown(saved),
            }
        )
    return pd.DataFrame(rows)


FIRST_ORDER_SIZES = (1024, 4096, 16384, 32768, 65536, 100_000)
FIRST_ORDER_REPLICAS = 100


def first_order_rows(base: Scenario) -> pd.DataFrame:
    """The first-order plan against the DES at the plan's own intervals, by cluster size: how
    rough the closed form is as failures stop being rare against the intervals and recoveries
    (``tier_plan.first_order_strain``, which ``ckptsim optimize`` warns about past
    ``ROUGH_STRAIN``). The DES's waste is the whole job's, its final save included (about
    0.02 points over 200 h at these sizes)."""
    from simulator.tier_search import waste_summary

    rows = []
    for gpus in FIRST_ORDER_SIZES:
        s = at_size(base, gpus)
        plan = first_order_plan(s)
        iv = plan["tier_intervals_s"]
        walls = evaluate_schedules(
            s, [TierSchedule(dict(iv))], replicas=FIRST_ORDER_REPLICAS, seed=SEED,
            workers=WORKERS,
        )  # fmt: skip
        des = waste_summary(s, walls[0])
        lo, hi = des["waste_fraction_ci95"]
        high = plan["waste_fraction"] / des["waste_fraction"] - 1.0
        rows.append(
            {
                "GPUs": f"{gpus:,}",
                "Σ rate × (recovery + interval)": f"{first_order_strain(s, iv):.3f}",
                "first-order waste": pct(plan["waste_fraction"]),
                "DES at its intervals (95% CI)": f"{pct(des['waste_fraction'])} "
                f"({ci_text(lo, hi, pct)})",
                "first order high by (relative)": f"{high:+.1%}",
                "warned": "yes" if first_order_strain(s, iv) > ROUGH_STRAIN else "no",
                "_share": high / first_order_strain(s, iv),
            }
        )
    return pd.DataFrame(rows)


def main() -> None:
    rep = Report(
        "tiers", "Two checkpoint tiers against one, against every-step saving and JIT, in dollars"
    )
    base = load_scenario("llama3-tiers")
    df, plans, strategies = size_rows(base)
    strategy_link = figure(strategy_figure(strategies), "tiers-strategies")
    s16, sim16 = plans[16384]
    ax, grid = waste_map(s16, sim16)
    map_link = figure(ax, "tiers-waste-map")
    classes = class_breakdown(s16, sim16)
    shares = share_rows(base)
    holds = first_order_rows(base)
    warned = holds[holds["warned"] == "yes"]["_share"]
    holds = holds.drop(columns="_share")
    found = sim16["tier_intervals_s"]
    rep.add(f"""
Scenario: the `llama3-tiers` preset (the Llama 3 failure mix of arXiv:2407.21783 Table 5 in six
classes; a host-memory tier with a peer copy, 2 s stall, 10 s restore, surviving every class but
silent data corruption; persistent storage, 60 s stall, 60 s restore, surviving all), with
{WORK_H:g} h of failure-free compute (the preset has 1,296 h; waste and dollars per day are
rates) at ${base.usd_per_gpu_hour:.2f} per GPU-hour. The failure classes are per GPU or per
node, so the job's failure rate grows with the cluster.

Method: the tiered discrete-event model (`simulator.engines.des_tiers`). For each size,
`simulator.tier_search.simulate_tier_plan`: the two intervals searched together under common
random numbers ({REPLICAS} replicas per schedule, {REPLICAS_AT[1024]} at 1,024 GPUs, where a
replica meets only a few failures; seed {SEED}; two rounds of a 3×3 design in log
interval around the closed form — the first-order plan, or today's exact single-tier optimum
where one tier serves every failure class — each smoothed by a least-squares quadratic, 18
schedules, a round again while its minimum lies on its edge), the best single tier
(persistent only) searched the same way, then the two optima, the closed-form plan and the
hand-set schedule run again on as many fresh replicas, the same failures for all four, so
differences are paired (t 95% CI). Intervals: percentile
bootstrap 95% CI over the last round's replicas.

## What two tiers are worth, by cluster size

{table(df)}

*Saved per day*: the single tier's waste minus the two tiers', per replica on the same
failures, times GPUs × price × 24 h. *Hand-set*: memory every 10 min and persistent every hour,
its waste minus the simulated optimum's, in points of wall time (95% CI).

## Two tiers against in-memory saving at every step and against just-in-time checkpointing

The same job at each size with its memory tier replaced, on the same failures as the two tiers
(the same failure classes on the same fresh check seeds), each strategy's persistent interval
searched as above:

{table(strategy_table(strategies))}

{strategy_link}

*Waste* and *lost per day*: means over the check's fresh replicas, t 95% CI. *More than two
tiers, per day*: the strategy's waste minus the two tiers', replica by replica on the same
failures, times GPUs × price × 24 h (t 95% CI); *two tiers cheaper* only when that whole
interval is above zero. Waste is measured over the whole job, the final save included.

What each strategy assumes:

- *Two tiers*: the `llama3-tiers` memory tier (a copy in host memory and on a peer, 2 s stall
  a save) and persistent storage (60 s), each at its searched interval.
- *One tier*: persistent storage alone: no copy in host memory or on a peer.
- *Memory every step + persistent* (Gemini, SOSP'23): after every {STEP_S:g} s training step
  a snapshot to host memory and a peer, stalling {STEP_STALL_S:g} s a step (both assumptions:
  the step is derived from Llama 3's Table 4 and taken as the same at every size; the stall is
  1% of a step, conservative against Gemini's reported no loss of throughput), restored in
  10 s after the failures the memory tier survives, which lose only the step under way; silent
  data corruption rolls back to persistent storage. The DES books each step's stall with the
  compute (no event per step).
- *JIT + persistent*: just-in-time checkpointing (Gupta et al., EuroSys'24): after a failure
  the memory tier would survive, the healthy data-parallel replicas write the state they hold
  to persistent storage (60 s, paid in the recovery) and the job resumes from it (60 s
  restore), losing no work; the other failures (silent data corruption) roll back to the
  persistent tier. Its assumption: a healthy replica of every shard survives each such
  failure.

{_break_even(strategies)}

Where the time goes at 16,384 GPUs, class by class: hours of the job's wall time per day lost to
rolled-back work and to recovery, means over the check's {REPLICAS} fresh replicas (failures per
day under the two-tier schedule; both schedules meet the same failure times). What is not here
is the save stalls.

{table(classes, ".3g")}

## The waste over both intervals (16,384 GPUs)

{map_link}

Each cell is one schedule's mean waste over the same {REPLICAS} replicas (the search's seeds),
{grid["evaluations"]} schedules on a {MAP_POINTS}×{MAP_POINTS} log grid spanning half the smallest
to twice the largest marked value on each axis; white dots are the schedules simulated. Waste
runs from {pct(grid["grid_min"])} to {pct(grid["grid_max"])} over the grid. The grid's best cell
(memory every {format_duration(grid["grid_best"][0])}, persistent every
{format_duration(grid["grid_best"][1])}) wastes {pct(grid["grid_best_waste"])}; the search, with
18 schedules, chose memory every {format_duration(found["memory"])} and persistent every
{format_duration(found["persistent"])}, which wastes {pct(grid["searched_waste_same_seeds"])} on
the same replicas and {pct(sim16["waste_fraction"])} on the fresh ones (95% CI
{pct(sim16["waste_fraction_ci95"][0])} to {pct(sim16["waste_fraction_ci95"][1])}).

## How the answer moves with the share of failures the memory tier survives (16,384 GPUs)

The preset's failures at 16,384 GPUs (job MTBF {format_duration(s16.system_mtbf_s)}), split in
two classes at the same total rate: a share the memory tier survives and the rest, which roll
back to persistent storage (60 s detection and 600 s restart for both).

{table(shares)}

At 0% the memory tier restores nothing, so it is never saved (the job ends on the persistent
copy, which outlives it) and the two answers are the same schedule: today's single-tier optimum;
at 100% no failure needs persistent storage, so only the final save goes there (the degenerate
cases of the model).

## Where the first order holds

The first-order plan (`ckptsim optimize` without `--simulate`) against the DES run at the
plan's own intervals, {FIRST_ORDER_REPLICAS} replicas each (seed {SEED}), the `llama3-tiers`
mix from 1,024 to 100,000 GPUs with {WORK_H:g} h of work. The first-order forms take failures to
be rare against each interval and recovery; Σ rate × (recovery + interval) measures how far
they are not, and the plan warns past {ROUGH_STRAIN:g} (the *warned* column). The first-order
sum charges every failure a whole recovery and half an interval and lets none strike during a
recovery or a save; the DES does neither. Measured here, where it is warned the first-order
waste runs high by {warned.min():.2f} to {warned.max():.2f} times that sum, relative; there
`--simulate` gives the recommendation.

{table(holds)}
""")
    rep.write()


if __name__ == "__main__":
    main()
