"""``ckptsim optimize``: the best checkpoint interval for one job, from the closed forms.

For exponential failures with system MTBF M, save cost δ and restart cost R, Daly's expected
wall time T_w(τ) is exact, so its minimiser τ* (Lambert W) is the best fixed interval. The
command sets Young's, Daly's first- and higher-order estimates and the usual defaults (every
30 min, hourly, every 3 h, every 500/1000 steps) beside τ*, with their waste, expected wall
time and money lost per day. ``simulator.recommend.recommend`` builds the result (the dict
``--json`` prints); this module only parses the flags and ``render``s the human table, which
``ckptsim demo`` reuses.

An interval here is compute time between saves (τ); each save stalls training for δ on top.
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from typing import Any

from simulator.cli.common import (
    add_budget_flags,
    add_scenario_flags,
    add_workers_flag,
    positive_float,
    positive_int,
    seed_int,
)
from simulator.display import (
    count,
    format_duration,
    format_hours,
    format_percent,
    format_steps,
    format_usd,
)
from simulator.errors import InputError

DESCRIPTION = """\
How often should this job checkpoint? Given the cluster's failure rate (a system MTBF, or
GPUs and a per-GPU MTBF, plus a per-node MTBF if nodes fail too), the training stall of one
save (δ) and the time to restart (R), print the interval that minimises expected wall time,
and set the classic estimates (Young 1974, Daly 2006) and the usual defaults (every 30 min,
hourly, every 3 h, every 500 or 1000 steps) beside it: waste, expected wall time for --work-h
hours of compute, and money lost per day at --usd-per-gpu-hour. The formulas assume
exponential (memoryless) failures; for Weibull or measured failure models, check the answer
with `ckptsim simulate`.

A scenario with [[tier]] and [[failure_class]] tables (llama3-tiers) gets every tier's
interval at once: the first-order plan (Benoit et al. 2017; the exact single-tier optimum
when one tier serves every class) with its waste and dollars, the best single tier beside it
and what each assumes; --simulate searches every tier's interval on the simulator, and its
optimum is then the recommendation (the top-level JSON keys; the closed form stays under
"closed_form")."""

EPILOG = """\
examples:
  ckptsim optimize
      the embedded default: Llama 3 405B on 16,384 H100s (Meta's published failure rate)
  ckptsim optimize --gpus 1024 --gpu-mtbf-h 50000 --checkpoint-s 90 --restart-s 900 \\
      --work-h 720 --usd-per-gpu-hour 2.5 --step-s 4.2
  ckptsim optimize --scenario opt175b --checkpoint-s 60 --json
  ckptsim optimize --scenario llama3-tiers
      two tiers (host memory + peer, persistent storage) against six failure classes:
        tier                  save every    failures it restores (per h)
        memory                   3.5 min                          0.3187
        persistent                2.68 h                         0.00463
      then the waste and dollars of the tiers and of one tier, and the recommendation
  ckptsim optimize --scenario llama3-tiers --simulate --replicas 100
      every tier's interval by simulation, with 95% CIs: the recommendation

Intervals are compute time between saves; every save stalls training for --checkpoint-s.
With [[tier]] tables each tier sets its own save (checkpoint_s, async with staging_s,
restore_s, retention) in the file: the save flags do not reach them and are refused.
Presets: llama3, llama3-mix (its interruptions by cause), llama3-tiers (the mix with a
memory tier), opt175b, bloom176b, titan, titan-record (simulator/presets/*.toml, with their
sources)."""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "optimize",
        help="best checkpoint interval, waste and money lost (closed forms)",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    add_scenario_flags(parser)
    out = parser.add_argument_group("output")
    out.add_argument(
        "--step-s",
        type=positive_float("seconds"),
        metavar="S",
        help="time per training step, seconds (adds the every-500/1000-steps defaults)",
    )
    out.add_argument("--json", action="store_true", help="print one JSON object instead")
    measured = parser.add_argument_group(
        "measured checkpoint cost",
        "Take δ (and the restore time, added to R) from a `ckptsim bench --out` profile, "
        "extrapolated to --params parameters sharded over the job's nodes, through the "
        "--storage-bytes-per-s cap if one is given (with [[tier]] tables: the cap of the "
        "profiled tier, --profile-tier, else its storage_bytes_per_s).",
    )
    measured.add_argument("--profile", metavar="FILE", help="cost profile JSON from ckptsim bench")
    measured.add_argument(
        "--params", type=positive_float("parameters"), metavar="P", help="model size, e.g. 70e9"
    )
    measured.add_argument("--format", help="format in the profile to use (default ckptsim)")
    measured.add_argument(
        "--profile-tier",
        metavar="NAME",
        help="with [[tier]] tables: the tier the profile measured (default: the one tier that "
        "survives every failure class); its save, write and restore times are replaced",
    )
    sim = parser.add_argument_group(
        "simulation",
        "--simulate also finds the optimum by discrete-event simulation under common random "
        "numbers (right for Weibull/lognormal failures, where the closed forms are not); with "
        "[[tier]] tables, every tier's interval at once and the best single tier beside it.",
    )
    sim.add_argument("--simulate", action="store_true", help="add the simulated optimum")
    sim.add_argument("--replicas", type=positive_int, help="replicas per candidate (default 200)")
    sim.add_argument("--seed", type=seed_int, help="random seed (default 0)")
    add_workers_flag(sim, "worker processes for the DES")
    sim.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_budget_flags(parser)
    parser.set_defaults(func=run)


def apply_profile(args: argparse.Namespace, scenario):
    """Lay a measured cost (--profile, --params) over the scenario: δ and restore time.

    Returns the scenario (δ as its checkpoint_s, R grown by the measured restore) and the
    predicted cost as a dict, or the scenario unchanged and None without --profile.
    """
    if not getattr(args, "profile", None):
        for flag in ("params", "format", "profile_tier"):
            if getattr(args, flag, None) is not None:
                raise InputError(
                    f"--{flag.replace('_', '-')} needs --profile FILE (a cost profile from "
                    "ckptsim bench)"
                )
        return scenario, None
    args.format = args.format or "ckptsim"
    if args.params is None:
        raise InputError("--profile needs --params P, the model size in parameters (e.g. 70e9)")
    if args.checkpoint_s is not None:
        raise InputError("give either --checkpoint-s or --profile, not both")
    for field in ("write_bytes_per_s_per_node", "read_bytes_per_s"):
        if getattr(scenario, field) is not None:
            flag = "--" + field.replace("_", "-")
            raise InputError(f"give either {flag} or --profile (it measured them), not both")
    import dataclasses

    from simulator.model.checkpoint_cost import CostProfile
    from simulator.model.tiers import with_measured_tier

    nodes = scenario.nodes or 1
    tier = _profiled_tier(args, scenario) if scenario.tiers else None
    cap = scenario.storage_bytes_per_s
    if tier is not None and tier.storage_bytes_per_s is not None:
        cap = tier.storage_bytes_per_s
    if getattr(args, "profile_cap", None) is not None:  # --storage-bytes-per-s for the tier
        cap = args.profile_cap
    predicted = CostProfile.load(args.profile).predict(
        params=args.params, nodes=nodes, format=args.format, aggregate_bytes_per_s=cap
    )
    if tier is not None:
        scenario = with_measured_tier(scenario, tier.name, predicted)
    else:
        # The prediction has the storage cap in it already: left in the scenario, the cap
        # would turn checkpoint_bytes back into a write time of its own and replace the
        # measured one.
        scenario = dataclasses.replace(
            scenario,
            checkpoint_s=predicted.stall_s,
            restart_s=scenario.restart_s + predicted.restore_s,
            checkpoint_bytes=predicted.bytes,
            storage_bytes_per_s=None,
        )
    info = {
        "profile": str(args.profile),
        "format": args.format,
        "params": args.params,
        "nodes": nodes,
        "stall_s": predicted.stall_s,
        "write_s": predicted.write_s,
        "restore_s": predicted.restore_s,
        "bytes": predicted.bytes,
        "aggregate_bytes_per_s": predicted.aggregate_bytes_per_s,
        "warnings": list(predicted.warnings),
    }
    if tier is not None:
        info["tier"] = tier.name
    for warning in predicted.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return scenario, info


SIMULATION_FLAGS = ("replicas", "seed", "workers", "no_progress", "max_core_hours", "max_memory_gb")
"""What only a simulated search uses: given without --simulate, a user expects them to count."""


def _only_with_simulate(args: argparse.Namespace) -> None:
    """Refuse, in one line, a simulation flag given without --simulate (it would do nothing);
    then fill the simulation's defaults."""
    if not args.simulate:
        given = [f for f in SIMULATION_FLAGS if getattr(args, f, None) not in (None, False)]
        if given:
            flags = ", ".join("--" + f.replace("_", "-") for f in given)
            raise InputError(
                f"{flags} only matter{'s' if len(given) == 1 else ''} with --simulate (the "
                "closed forms are not simulated); add --simulate or drop "
                + ("it" if len(given) == 1 else "them")
            )
    args.replicas = 200 if args.replicas is None else args.replicas
    args.seed = 0 if args.seed is None else args.seed


def run(args: argparse.Namespace) -> int:
    from simulator.cli.common import (
        print_json,
        require_failure_rate,
        require_work,
        scenario_flags,
        scenario_from_args,
        uses_default_preset,
    )
    from simulator.model.scenario import DEFAULT_PRESET

    _only_with_simulate(args)
    default = uses_default_preset(args)
    # Beside --profile, --storage-bytes-per-s is the cap the profiled tier's measured cost is
    # extrapolated through (what the profile's warnings ask for), even over [[tier]] tables.
    held = {"storage_bytes_per_s": None} if getattr(args, "profile", None) else {}
    scenario = scenario_from_args(args, let_through=held)
    args.profile_cap = held.get("storage_bytes_per_s")
    require_failure_rate(scenario)
    if default:
        source = f"embedded default preset {DEFAULT_PRESET}"
    elif args.scenario:
        flags = any(getattr(args, k, None) is not None for k in scenario_flags())
        source = f"--scenario {args.scenario}" + (" with flag overrides" if flags else "")
    else:
        source = "command-line flags"
    if default:
        print(
            f"note: no --scenario or flags given, so this is the {source} "
            f"({scenario.gpus:,} GPUs); see --help to describe your own job",
            file=sys.stderr,
        )
    if scenario.spares is not None and not args.simulate:
        print(
            "note: the closed forms leave out waiting for a spare (spares, repair_h); "
            "--simulate adds that wait",
            file=sys.stderr,
        )
    if scenario.tiers:
        return _run_tiers(args, scenario)
    scenario, measured = apply_profile(args, scenario)
    # The flags are in the scenario already: δ follows its one rule (staging copy if async,
    # else the write time from bytes and bandwidths, else checkpoint_s), as in the simulators.
    from simulator.recommend import recommend, scenario_stall_s

    delta_s = scenario_stall_s(scenario)
    result = recommend(scenario, step_s=args.step_s, checkpoint_s=delta_s, source=source)
    if measured:
        result["measured_cost"] = measured
    if args.simulate:
        from simulator.cli.common import enforce_budget, workers_for
        from simulator.engines import budget
        from simulator.engines.choose import choose_engine
        from simulator.optimize import optimize_by_simulation

        require_work(scenario, "--simulate")
        if args.replicas < 2:
            raise InputError("--simulate needs --replicas 2 or more (the search fits to noise)")
        engine = choose_engine(scenario, "auto")
        workers = 1 if engine == "fast" else workers_for(args, args.replicas, "ckptsim optimize")
        est = budget.estimate(
            scenario,
            budget.search_intervals(scenario),
            args.replicas,
            engine=engine,
            workers=workers,
        )
        enforce_budget(args, est, workers)
        result["simulated"] = optimize_by_simulation(
            scenario,
            replicas=args.replicas,
            seed=args.seed,
            workers=workers,
            progress=not args.no_progress and sys.stderr.isatty(),
        )
        result["simulated_interval_s"] = result["simulated"]["interval_s"]
    if args.json:
        for warning in result["warnings"]:
            print(f"warning: {warning}", file=sys.stderr)
        print_json(result)
    else:
        print(render(result))
        if measured:
            print(
                f"measured cost ({measured['format']} in {measured['profile']}): "
                f"{measured['params']:.3g} parameters over {measured['nodes']:,} nodes -> stall "
                f"{measured['stall_s']:.3g} s, restore {measured['restore_s']:.3g} s (added to R)"
            )
        if args.simulate:
            print(render_simulated(result["simulated"], result["optimal_interval_s"]))
    return 0


def _profiled_tier(args: argparse.Namespace, scenario):
    """The tier ``--profile`` measured: ``--profile-tier``, else the one scheduled tier that
    survives every failure class (the persistent one, which a benchmark of a disk measures)."""
    from simulator.model.tier_plan import class_terms
    from simulator.model.tiers import scheduled

    saved = scheduled(scenario.tiers)
    if args.profile_tier is not None:
        tier = next((t for t in scenario.tiers if t.name == args.profile_tier), None)
        if tier is None:
            names = ", ".join(t.name for t in scenario.tiers)
            raise InputError(f"--profile-tier: no tier named {args.profile_tier!r} ({names})")
        if tier not in saved:
            raise InputError(
                f"--profile-tier {tier.name}: a profile measures a save on a schedule, and "
                f"{tier.name} is saved {'just in time' if tier.jit else 'every step'}"
            )
        return tier
    classes = {name for name, _, _ in class_terms(scenario)}
    every = [t for t in saved if classes <= t.survives]
    if len(every) != 1:
        raise InputError(
            "--profile with [[tier]] tables: name the tier it measured with --profile-tier "
            f"({', '.join(t.name for t in saved)})"
        )
    return every[0]


def _run_tiers(args: argparse.Namespace, scenario) -> int:
    """A scenario with [[tier]] tables: every tier's interval, and the best single tier beside
    (``simulator.tier_recommend``); with --simulate the simulated optimum is the answer."""
    from simulator.cli.common import print_json
    from simulator.tier_recommend import adopt_simulated, recommend_tiers

    if args.step_s is not None:
        raise InputError(
            "--step-s with [[tier]] tables is not modelled yet: the tiers' intervals are given "
            "in seconds of compute"
        )
    scenario, measured = apply_profile(args, scenario)
    result = recommend_tiers(scenario)
    if measured:
        result["measured_cost"] = measured
    for warning in result["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    if args.simulate:
        result = adopt_simulated(result, _simulate_tiers(args, scenario), scenario)
    if args.json:
        print_json(result)
    else:
        print("\n".join(_render_tiers(result, scenario, measured)))
    return 0


def _every(name: str, interval_s: float, final: set[str]) -> str:
    """A tier's interval for a person: a duration, or when it is infinite, whether the job's
    final save still goes there ("final save only") or nothing ever does ("never")."""
    if math.isfinite(interval_s):
        return format_duration(interval_s)
    return "final save only" if name in final else "never"


def _render_tiers(result: dict[str, Any], scenario, measured) -> list[str]:
    """The human table: the closed form's tiers and single tier with what each assumes, the
    simulated optimum with --simulate, and the recommendation."""
    import re

    from simulator.model.tiers import final_tiers
    from simulator.tier_recommend import STRATEGY_HINT

    closed = result["closed_form"]
    classes = len(scenario.failure_classes) or 1
    final = {t.name for t in final_tiers(scenario.tiers)}
    lines = [
        f"ckptsim optimize: {scenario.name} ({len(scenario.tiers)} "
        f"tier{'s' if len(scenario.tiers) != 1 else ''}, "
        f"{classes} failure class{'es' if classes != 1 else ''})",
        *textwrap.wrap(f"closed form: {closed['method']}", 96, subsequent_indent="  "),
        "",
        f"{'tier':<16}{'save every':>16}{'failures it restores (per h)':>32}",
    ]
    for name, interval_s in closed["tier_intervals_s"].items():
        rate = result["tier_failure_rates_per_h"][name]
        lines.append(f"{name:<16}{_every(name, interval_s, final):>16}{rate:>32.4g}")
    for name, rate in result["jit_failure_rates_per_h"].items():
        lines.append(f"{name:<16}{'on failure':>16}{rate:>32.4g}   (just in time)")
    for name, rate in result["every_step_failure_rates_per_h"].items():
        lines.append(f"{name:<16}{'every step':>16}{rate:>32.4g}")

    def cost(waste: str, lost: str, storage: str) -> str:
        text = f"waste {format_percent(closed[waste])}"
        if lost in closed:
            text += f", {format_usd(closed[lost])}/day lost"
        if closed[storage] is not None:
            text += f", {format_usd(closed[storage])}/day storage"
        return text

    def assumes(parts: list[str]) -> list[str]:
        # A number and its unit stay on one line (a no-break space while wrapping).
        text = re.sub(r"(\d) s\b", "\\1\u00a0s", "assumes " + "; ".join(parts))
        wrapped = textwrap.wrap(text, 96, initial_indent="  ", subsequent_indent="    ")
        return [line.replace("\u00a0", " ") for line in wrapped]

    lines += [
        "",
        "tiers as above: "
        + cost("optimal_waste_fraction", "usd_lost_per_day", "storage_usd_per_day"),
        *assumes(result["assumes"]["tiers"]),
        f"one tier ({result['single_tier']} every "
        f"{format_duration(closed['single_tier_interval_s'])}): "
        + cost(
            "single_tier_waste_fraction",
            "single_tier_usd_lost_per_day",
            "single_tier_storage_usd_per_day",
        ),
        *assumes([result["assumes"]["single_tier"]]),
    ]
    if not any(t.jit or t.every_step for t in scenario.tiers):
        lines += textwrap.wrap(STRATEGY_HINT, 96)
    if measured:
        lines += textwrap.wrap(
            f"measured cost of {measured['tier']} ({measured['format']} in "
            f"{measured['profile']}): {measured['params']:.3g} parameters over "
            f"{measured['nodes']:,} nodes -> stall {measured['stall_s']:.3g} s, write "
            f"{measured['write_s']:.3g} s, restore {measured['restore_s']:.3g} s (replacing the "
            "table's)",
            96,
        )
    if result["final_save_s"]:
        job = closed["job_waste_fraction"]
        text = (
            f"The waste and dollars are rates; the job's final save ({result['final_save_s']:.3g}"
            " s) is paid once"
            + (f": over this job's work the tiers waste {format_percent(job)}." if job else ".")
        )
        lines += textwrap.wrap(text, 96)
    if "simulated" in result:
        lines += ["", *_render_simulated_tiers(result["simulated"], final, scenario)]
    lines += ["", *textwrap.wrap(result["recommendation"], 96, subsequent_indent="  ")]
    return lines


def _simulate_tiers(args: argparse.Namespace, scenario) -> dict[str, Any]:
    """The simulated optimum of every tier at once (``simulator.tier_search``), in budget."""

    from simulator.cli.common import enforce_budget, require_work, workers_for
    from simulator.engines import budget
    from simulator.tier_search import budget_schedules, simulate_tier_plan

    require_work(scenario, "--simulate")
    if args.replicas < 2:
        raise InputError("--simulate needs --replicas 2 or more (the search fits to noise)")
    workers = workers_for(args, args.replicas, "ckptsim optimize")
    est = budget.tier_estimate(scenario, budget_schedules(scenario), args.replicas, workers=workers)
    enforce_budget(args, est, workers)
    return simulate_tier_plan(
        scenario, replicas=args.replicas, seed=args.seed, workers=workers,
        progress=not args.no_progress and sys.stderr.isatty(),
    )  # fmt: skip


def _render_simulated_tiers(sim: dict[str, Any], final: set[str], scenario) -> list[str]:
    """The simulated optimum's lines: each tier with its interval's CI (and the tiers saved
    just in time or every step, which every schedule runs as they are), then the waste and
    dollars of the tiers, of the closed-form plan and of the best single tier, measured on
    fresh seeds, and what the tiers save against the single tier."""

    def span(lo: float, hi: float) -> str:
        return f"{format_duration(lo)} to {format_duration(hi)}"

    def cost(s: dict[str, Any]) -> str:
        lo, hi = s["waste_fraction_ci95"]
        text = (
            f"waste {format_percent(s['waste_fraction'])} "
            f"(95% CI {format_percent(lo)} to {format_percent(hi)})"
        )
        if "usd_lost_per_day" in s:
            text += f", {format_usd(s['usd_lost_per_day'])}/day lost"
        return text

    lines = [
        *textwrap.wrap(f"Simulated optimum ({sim['method']}; {sim['evaluations']} schedules):", 96),
        f"{'tier':<16}{'save every':>16}   95% CI",
    ]
    for name, value in sim["tier_intervals_s"].items():
        ci = sim["tier_intervals_ci95_s"].get(name)
        lines.append(f"{name:<16}{_every(name, value, final):>16}   {span(*ci) if ci else ''}")
    for t in scenario.tiers:
        if t.jit or t.every_step:
            every = "on failure" if t.jit else "every step"
            lines.append(f"{t.name:<16}{every:>16}   (as set: in every schedule)".rstrip())
    single = sim["single_tier"]
    saved, by_first = sim["waste_saved_vs_single_tier"], sim["waste_saved_vs_first_order"]
    if math.isfinite(sim["single_tier_interval_s"]):
        alone = (
            f"every {format_duration(sim['single_tier_interval_s'])}, 95% CI "
            f"{span(*sim['single_tier_interval_ci95_s'])}"
        )
    else:
        alone = "final save only"
    lines += [
        f"tiers as above: {cost(sim)}",
        f"closed-form plan, simulated: {cost(sim['first_order'])}",
        *textwrap.wrap(f"one tier ({single} {alone}): {cost(sim['single_tier_simulated'])}", 96),
    ]
    against = (
        f"{100 * by_first['mean']:+.2f} points (95% CI {100 * by_first['lo']:+.2f} to "
        f"{100 * by_first['hi']:+.2f})"
    )
    if by_first["hi"] < 0:
        lines.append(
            f"The closed-form plan wasted less than the search's answer on the fresh replicas, "
            f"{against}: the search is noisy at this --replicas; the recommendation keeps the "
            "closed-form intervals."
        )
    elif by_first["lo"] > 0:
        lines.append(f"The search's answer wastes less than the closed-form plan: {against}.")
    else:
        lines.append(
            f"What the search's answer saves over the closed-form plan: {against}; a "
            "difference is not shown."
        )
    if sim.get("at_edge"):
        lines.append(
            "The search ended on the edge of its last design: the optimum may lie further "
            "out than it reached; rerun with more --replicas or check with ckptsim simulate."
        )
    points = (
        f"{100 * saved['mean']:+.2f} points (95% CI {100 * saved['lo']:+.2f} to "
        f"{100 * saved['hi']:+.2f})"
    )
    if saved["lo"] == saved["hi"] == 0:
        lines.append("The best schedule found saves to one tier only: the single-tier answer.")
    elif saved["lo"] > 0:
        lines.append(f"The tiers waste less than one tier: {points} of the wall time.")
    elif saved["hi"] < 0:
        lines.append(f"One tier wastes less than the tiers: {points} in the tiers' favour.")
    else:
        lines.append(f"What the tiers save over one tier: {points}; a difference is not shown.")
    return lines


def render_simulated(sim: dict[str, Any], closed_form_s: float) -> str:
    """The simulated optimum and each baseline's paired excess, a line each."""
    lo, hi = sim["interval_ci_s"]
    lines = [
        "",
        f"by simulation ({sim['engine']} engine, {sim['replicas']} replicas per candidate, "
        f"common random numbers; objective {sim['objective']}):",
        f"  optimum {format_duration(sim['interval_s'])} (95% CI {format_duration(lo)} to "
        f"{format_duration(hi)}); closed form {format_duration(closed_form_s)}",
    ]
    for name, entry in sim["policies"].items():
        if name == "optimum":
            continue
        lines.append(
            f"  {name:<18} {format_duration(entry['interval_s']):>9}  {entry['excess_pct']:+7.2f}% "
            f"(95% CI {entry['excess_pct_lo']:+.2f}% to {entry['excess_pct_hi']:+.2f}%)"
        )
    return "\n".join(lines)


# -- the result ---------------------------------------------------------------------------
# -- the human table ----------------------------------------------------------------------
def render(result: dict[str, Any], width: int = 100) -> str:
    """The human report for a ``recommend`` result: header, table, recommendation."""
    s = result["scenario"]
    gpus = result.get("gpus")
    cluster = f"{count(gpus, 'GPU')}, " if gpus else ""
    parts = [f"per GPU {s['gpu_mtbf_h']:,.0f} h"] if "gpu_mtbf_h" in s else []
    if "node_mtbf_h" in s:
        parts.append(f"per node {s['node_mtbf_h']:,.0f} h")
    per_gpu = f" ({', '.join(parts)})" if parts else ""
    costs = f"save δ {format_duration(result['checkpoint_s'])}, restart R "
    costs += format_duration(result["restart_s"])
    if result["restart_s"] != s.get("restart_s", result["restart_s"]):
        costs += " (detection + restart + load + warm-up)"
    if "work_h" in result:
        costs += f", work {result['work_h']:,.0f} h"
    if "usd_per_gpu_hour" in result:
        costs += f", ${result['usd_per_gpu_hour']:.2f} per GPU-hour"
    if result.get("step_s"):
        costs += f", {result['step_s']:.3g} s per step"
    source = result.get("scenario_source")
    title = s.get("name", "scenario") + (f" ({source})" if source else "")
    if source == "command-line flags":
        title = "job described by command-line flags"
    lines = [
        f"ckptsim optimize: {title}",
        f"  cluster  {cluster}{result['failure']} failures, system MTBF "
        f"{format_duration(result['system_mtbf_s'])}{per_gpu}",
        f"  costs    {costs}",
    ]
    for warning in result["warnings"]:
        lines += textwrap.wrap(f"warning: {warning}", width=width, subsequent_indent="  ")
    lines += ["", _table(result["rows"]), ""]
    lines += textwrap.wrap(result["recommendation"], width=width, subsequent_indent="  ")
    return "\n".join(lines)


def _table(rows: list[dict[str, Any]]) -> str:
    from simulator.recommend import FORMULA_KEYS

    first = rows[0]
    columns = [("policy", lambda r: r["label"] + (" *" if r["key"] == "optimal" else ""), "<")]
    columns.append(("interval", lambda r: format_duration(r["interval_s"]), ">"))
    if "steps" in first:
        columns.append(("steps", lambda r: format_steps(r["steps"]), ">"))
    columns.append(("waste", lambda r: format_percent(r["waste_fraction"]), ">"))
    if "expected_wall_h" in first:
        columns.append(("expected wall", lambda r: format_hours(r["expected_wall_h"]), ">"))
    if "usd_lost_per_day" in first:
        columns.append(("lost per day", lambda r: format_usd(r["usd_lost_per_day"]), ">"))
        columns.append(
            ("excess per day", lambda r: _plus(format_usd(r["excess_usd_per_day"])), ">")
        )
    elif "expected_wall_h" in first:
        columns.append(("excess wall", lambda r: _plus(format_hours(r["excess_wall_h"])), ">"))
    else:
        columns.append(
            ("excess waste", lambda r: f"+{100 * r['excess_waste_fraction']:.2f} pts", ">")
        )
    cells = [[render_cell(r) for _, render_cell, _ in columns] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _, _) in enumerate(columns)]

    def line(values):
        return "  ".join(
            f"{v:{a}{w}}" for v, w, (_, _, a) in zip(values, widths, columns, strict=True)
        )

    out = [line([h for h, _, _ in columns]), line(["-" * w for w in widths])]
    for i, row in enumerate(rows):
        if i and row["key"] not in FORMULA_KEYS and rows[i - 1]["key"] in FORMULA_KEYS:
            out.append("")  # closed forms above, the usual defaults below
        out.append(line(cells[i]).rstrip())
    out.append("* minimises Daly's expected wall time exactly (Lambert W)")
    return "\n".join(out)


def _plus(text: str) -> str:
    return text if text.startswith(("-", ">", "n/a")) else "+" + text
