"""``ckptsim simulate``: Monte-Carlo replicas of the discrete-event cluster model.

Where ``ckptsim optimize`` gives the closed-form mean for exponential failures, this runs the
job itself — per-GPU lifetimes (exponential, Weibull, lognormal), failures during saves and
recoveries, spare nodes and repairs, asynchronous saves — many times, and reports the
distribution of wall time, lost work, overheads and cost: mean, 95% CI, p50/p90/p99.
Which engine runs it (``--engine``) is ``simulator.engines.choose``'s rule; this module only parses
and renders.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

from simulator.cli.common import (
    add_budget_flags,
    add_scenario_flags,
    add_workers_flag,
    positive_float,
    positive_int,
    seed_int,
)
from simulator.display import count, format_duration, format_usd
from simulator.errors import InputError

POLICIES = ("young", "daly", "optimal", "adaptive", "controller")
"""simulator.policies.POLICY_NAMES less "fixed" (that is --interval-s), spelled out here so
that building the parser imports no numpy or scipy (``ckptsim --help`` stays fast)."""

DESCRIPTION = """\
Simulate a training job on a failing cluster, many times over, and report the distribution
(not just the mean) of its wall time, lost work, checkpoint and recovery overhead and cost.
Every GPU (and, with --node-mtbf-h, every node) ages and fails on its own; a failure can
strike while computing, while a checkpoint is written (that save does not count) or during
recovery, and rolls the job back to its last completed checkpoint. Saves follow a policy
(--policy) or a fixed interval (--interval-s)."""

EPILOG = """\
examples:
  ckptsim simulate
      the embedded default: Llama 3 405B on 16,384 H100s, optimal interval, 100 replicas
  ckptsim simulate --scenario llama3 --failure weibull:shape=0.7 --policy young --json
  ckptsim simulate --gpus 1024 --gpu-mtbf-h 50000 --checkpoint-s 90 --restart-s 900 \\
      --work-h 720 --interval-s 3600 --spares 2 --repair-h 24 --out runs.parquet

  ckptsim simulate --gpus 4096 --checkpoint-s 60 --restart-s 600 --work-h 500 \\
      --usd-per-gpu-hour 2 --trace my-failures.csv --time-column failed_at --trace-start random
      replay a real failure log (timestamps, or numbers with --unit) instead of a model; with
      no failure rate given the policy plans with the log's own MTBF (give --mtbf-h or
      --gpu-mtbf-h to see what planning for another rate costs on these failures)
  ckptsim simulate --scenario llama3-tiers --tier-interval-s memory=600 \\
      --tier-interval-s persistent=3600 --replicas 50
      a tier schedule by hand (a tier not named takes optimize's closed form; inf: no saves
      on a schedule); the header names each interval and where it came from, and the table
      adds failures, lost work and recovery per class, saves and restores per tier:
        failures gpu ... lost by gpu (h) ... saves memory ... restores persistent
  ckptsim simulate --scenario llama3-tiers --trace log.csv --cause-column cause \\
      --cause-class "GPU HBM3"=gpu --cause-class "Network switch"=network ...
      replay a log against failure classes and tiers: each failure restores from the tier
      that survives its class

Replicas run in parallel on all cores and are reproducible from --seed on any core count.
Intervals are compute time between saves; --out writes one row per replica (.csv/.parquet)."""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="Monte-Carlo discrete-event simulation: distribution of wall time and cost",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    parser.add_argument(
        "scenario_file",
        nargs="?",
        metavar="SCENARIO",
        help="scenario TOML file or preset (same as --scenario)",
    )
    add_scenario_flags(parser)
    pol = parser.add_argument_group("when to save")
    which = pol.add_mutually_exclusive_group()
    which.add_argument(
        "--policy",
        choices=POLICIES,
        help="interval policy (default: optimal, the exact optimum for exponential failures); "
        "controller: what the live AdaptiveCheckpointer decides, learning the failure rate "
        "from the failures a replica meets (DES only)",
    )
    pol.add_argument(
        "--prior-mtbf-h",
        type=positive_float("hours"),
        metavar="H",
        help="with --policy controller: the MTBF its prior believes (default: the job's true "
        "one), to see what a wrong prior costs while the run learns",
    )
    pol.add_argument(
        "--step-s",
        type=positive_float("seconds"),
        metavar="S",
        help="with --policy controller: seconds per training step; the controller then saves "
        "only between steps and, starting with no checkpoint, runs its 20-step probe before "
        "the first interval, as it does in training",
    )
    pol.add_argument(
        "--tier-interval-s",
        action="append",
        default=[],
        metavar="NAME=S",
        help="with [[tier]] tables: save tier NAME every S seconds of compute (repeatable; "
        "inf: no saves on a schedule, only the job's final save if its copy is one the job "
        "ends with; a tier not named keeps its interval_s, else the closed form that ckptsim "
        "optimize gives; the header and --json's tier_intervals_s say which ran)",
    )
    which.add_argument(
        "--interval-s",
        type=positive_float("seconds"),
        metavar="S",
        help="save every S seconds of compute instead of a policy",
    )
    tr = parser.add_argument_group(
        "trace replay",
        "--trace replays the failure times of a log (CSV or Parquet, one failure per row)\n"
        "instead of drawing them from the failure model: a replica meets exactly the log's\n"
        "failures within its wall time, whatever --gpus says (--gpus prices the job). The log\n"
        "is read as `ckptsim fit` reads it (rows at one instant are one failure; blank times\n"
        "are refused). Numbers are times since the job's start; with timestamps the job starts\n"
        "at the first. The policy plans with the scenario's MTBF if it has one, else the\n"
        "log's (span / failures); the output shows both. --failure, --node-mtbf-h and\n"
        "--component-age describe the model a trace replaces, so they are refused with it.",
    )
    tr.add_argument("--trace", metavar="FILE", help="failure log to replay")
    tr.add_argument(
        "--time-column",
        metavar="C",
        help="column of failure times (default: the only column, or one named time/timestamp)",
    )
    tr.add_argument(
        "--unit",
        choices=("s", "min", "h", "d"),
        help="unit of numeric failure times (default h, as `ckptsim fit` reads the same log; "
        "timestamps are parsed as dates)",
    )
    tr.add_argument(
        "--cause-column",
        metavar="C",
        help="with [[failure_class]] tables: column of each failure's cause (default: one named "
        "cause/category/reason/type, as `ckptsim fit` reads it); a scenario of several classes "
        "needs one, so that each replayed failure has its class",
    )
    tr.add_argument(
        "--system-column",
        metavar="C",
        help="a log of several systems (a column named system/cluster/machine) is refused: "
        "replay one system's rows; C = none pools them as one system's failures",
    )
    tr.add_argument(
        "--cause-class",
        action="append",
        default=[],
        metavar="CAUSE=CLASS",
        help="replay failures the log gives cause CAUSE as failure class CLASS (repeatable); a "
        "cause that is itself a class's name needs none; any other cause is an error",
    )
    tr.add_argument(
        "--trace-start",
        choices=("first", "random"),
        default="first",
        help="first (default): every replica replays the log from its start; random: each "
        "from its own uniform start, at most the log's span less 1.5x the job's expected wall "
        "time (so replicas differ; a job longer than the log replays it from its start, warned)",
    )
    mc = parser.add_argument_group("Monte Carlo and output")
    mc.add_argument(
        "--replicas", type=positive_int, default=100, metavar="N", help="replicas (default 100)"
    )
    mc.add_argument("--seed", type=seed_int, default=0, help="random seed (default 0)")
    mc.add_argument(
        "--engine",
        choices=("auto", "des", "fast"),
        default="auto",
        help="des: the discrete-event reference; fast: the vectorised engine (plain model "
        "only); auto (default): fast where it applies, else des",
    )
    add_workers_flag(mc)
    mc.add_argument("--out", metavar="FILE", help="write per-replica records: .csv or .parquet")
    mc.add_argument("--json", action="store_true", help="print one JSON object instead")
    mc.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_budget_flags(parser)
    parser.set_defaults(func=run)


def _scenario(args: argparse.Namespace):
    from simulator.cli.common import scenario_from_args, uses_default_preset

    if args.scenario_file:
        if args.scenario and args.scenario != args.scenario_file:
            raise InputError("give the scenario once: as SCENARIO or as --scenario, not both")
        args.scenario = args.scenario_file
    return scenario_from_args(args), uses_default_preset(args)


_REPLAY_REPLACES = (
    ("failure", "--failure"),
    ("node_mtbf_h", "--node-mtbf-h"),
    ("component_age", "--component-age"),
)
"""Flags of the failure model that a replayed trace replaces, so they would do nothing."""


def _trace(args: argparse.Namespace, scenario):
    """The replay (None without --trace: its times, or times with classes, its own MTBF and
    whether the policy plans with it) and the scenario it runs against."""
    causes_given = args.cause_column is not None or bool(args.cause_class)
    if args.trace is None:
        if (
            args.time_column is not None or args.unit is not None
            or args.trace_start != "first" or causes_given or args.system_column is not None
        ):  # fmt: skip
            raise InputError(
                "--time-column, --unit, --trace-start, --cause-column, --cause-class and "
                "--system-column need --trace FILE"
            )
        return None, scenario
    for field, flag in _REPLAY_REPLACES:
        if getattr(args, field, None) is not None:
            raise InputError(
                f"{flag} sets the failure model, which --trace replaces with the log's own "
                "failures; give one of them"
            )
    from simulator.model.trace import classes_of, read_trace_log, trace_mtbf_s

    names = [c.name for c in scenario.failure_classes]
    read = dict(
        time_column=args.time_column, unit=args.unit or "h", system_column=args.system_column
    )
    classes = None
    if causes_given or len(names) > 1:
        if not names:
            raise InputError(
                "--cause-column and --cause-class map a log's causes to [[failure_class]] "
                "tables; this scenario has none"
            )
        log = read_trace_log(args.trace, cause_column=args.cause_column, causes=True, **read)
        classes = classes_of(log.causes, names, _cause_map(args.cause_class))
    else:  # one class, or none: every failure is of it
        log = read_trace_log(args.trace, **read)
    for note in log.notes:
        print(f"note: {note}", file=sys.stderr)
    times = log.times_s
    mtbf_h = trace_mtbf_s(times) / 3600.0
    planned = scenario.has_mtbf
    if not planned:
        scenario = scenario.with_overrides(mtbf_h=mtbf_h)
    else:
        ignored = [f for f in ("node_mtbf_h",) if getattr(scenario, f, None) is not None]
        if ignored:
            print(
                f"note: the scenario's {', '.join(ignored)} is not simulated: --trace replaces "
                "its failure model (the policy still plans with the scenario's rate)",
                file=sys.stderr,
            )
    if getattr(args, "gpus", None) is not None:
        print(
            f"note: --trace replays the log's failures as logged: --gpus {args.gpus} sizes the "
            "job (its cost, and with --gpu-mtbf-h the MTBF the policy plans with), not how "
            "often failures come",
            file=sys.stderr,
        )
    replay = {"times": times, "classes": classes, "mtbf_h": mtbf_h, "planned": planned}
    return replay, scenario


def _failure_times(args, replay, scenario, wall_factor: float):
    """What the engines replay: the trace from its start, or a ``TraceStart`` whose window
    leaves 1.5x the job's expected wall time (``wall_factor`` x its work) ahead of each
    replica's start."""
    from simulator.model.trace import ClassTrace, TraceStart

    if replay is None:
        return None
    times, classes = replay["times"], replay["classes"]
    if args.trace_start == "random":
        keep_s = 1.5 * max(wall_factor, 1.0) * (scenario.work_s or 0.0)
        return TraceStart(times, keep_s=keep_s, classes=classes)
    return times if classes is None else ClassTrace(times, classes)


def _cause_map(pairs: list[str]) -> dict[str, str]:
    """--cause-class CAUSE=CLASS flags as a dict (the last '=' splits, so a cause may hold one)."""
    out: dict[str, str] = {}
    for text in pairs:
        cause, sep, name = text.rpartition("=")
        cause, name = cause.strip(), name.strip()
        if not sep or not cause or not name:
            raise InputError(f"--cause-class {text!r}: give CAUSE=CLASS, e.g. 'GPU HBM3'=gpu")
        if cause in out:
            raise InputError(f"--cause-class {cause!r} is given twice; give it once")
        out[cause] = name
    return out


def _tier_schedule(args: argparse.Namespace, scenario):
    """The tier schedule of a tiered scenario and where each tier's interval came from
    (``--tier-interval-s``, the tier's ``interval_s``, the closed form ``ckptsim optimize``
    gives, or a single-tier policy); (None, {}) without [[tier]] tables."""
    if not scenario.tiers:
        if args.tier_interval_s:
            raise InputError("--tier-interval-s needs a scenario with [[tier]] tables")
        return None, {}
    from simulator.model.tier_plan import closed_form_plan
    from simulator.model.tiers import TierSchedule, scheduled

    implicit = scenario.tiers[0].implicit  # failure classes, and the scenario's own save
    if implicit and (args.policy or args.interval_s) and not args.tier_interval_s:
        # One tier: a fixed interval, or what a closed-form policy gives at the classes'
        # total rate; a policy that adapts as it goes is not modelled with failure classes.
        if args.interval_s is not None:
            schedule = TierSchedule.for_scenario(scenario, {"persistent": args.interval_s})
            return dataclasses.replace(schedule, name="fixed"), {"persistent": "--interval-s"}
        if args.policy in ("adaptive", "controller"):
            raise InputError(
                f"--policy {args.policy} is not modelled with [[failure_class]] tables yet; "
                "give --interval-s, or --policy young, daly or optimal"
            )
        from simulator.policies import PolicyContext, make_policy

        ctx = PolicyContext.from_scenario(scenario, whole_job=True)
        seconds = float(make_policy(args.policy).next_interval_s(ctx))
        schedule = TierSchedule.for_scenario(scenario, {"persistent": seconds})
        origin = f"--policy {args.policy}"  # at the classes' total rate
        return dataclasses.replace(schedule, name=args.policy), {"persistent": origin}
    if args.policy or args.interval_s:
        raise InputError(
            "with [[tier]] tables give each tier's interval as --tier-interval-s NAME=SECONDS, "
            "not --policy or --interval-s"
        )
    given = _tier_intervals(args.tier_interval_s)
    origins = dict.fromkeys(given, "--tier-interval-s")
    unset = []
    for t in scheduled(scenario.tiers):
        if t.name not in given:
            if t.interval_s is None:
                unset.append(t.name)
            else:
                origins[t.name] = "interval_s"
    if unset:  # the closed form (``ckptsim optimize``'s) for the tiers the user left open
        plan = closed_form_plan(scenario)["tier_intervals_s"]
        given.update({name: plan[name] for name in unset})
        origins.update(dict.fromkeys(unset, "closed form"))  # ckptsim optimize's
    schedule = TierSchedule.for_scenario(scenario, given)
    return schedule, {n: origins[n] for n in schedule.intervals_s}


def _tier_intervals(flags: list[str]) -> dict[str, float]:
    """--tier-interval-s NAME=SECONDS flags as a dict; ``inf`` takes a tier off the schedule
    (only the job's final save goes there, if its copy is one the job ends with)."""
    given: dict[str, float] = {}
    for text in flags:
        name, sep, value = text.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not sep or not name or math.isnan(seconds):
            raise InputError(f"--tier-interval-s {text!r}: give NAME=SECONDS, e.g. memory=600")
        if not seconds > 0:
            raise InputError(
                f"--tier-interval-s {text!r}: the interval must be a positive number of compute "
                f"seconds between saves to {name} (or inf: no saves on a schedule), got {value}"
            )
        if name in given:
            raise InputError(f"--tier-interval-s {name} is given twice; give it once")
        given[name] = seconds
    return given


def tier_plan_text(summary: dict) -> str:
    """Each tier's interval as it ran, and where it came from, for the run's header."""
    from simulator.cli.optimize import _every

    final = set(summary.get("final_tiers", []))
    origins = summary.get("tier_intervals_from", {})
    parts = []
    for name, value in summary["tier_intervals_s"].items():
        every = _every(name, math.inf if value is None else value, final)
        every = every if every in ("final save only", "never") else f"every {every}"
        parts.append(f"{name} {every}" + (f" ({origins[name]})" if name in origins else ""))
    return "; ".join(parts)


def _note_trace_end(summary: dict, result, failure_times, seed) -> None:
    """Warn when replicas outran the trace (no failures past its end: optimistic), when a
    random start could not vary them (the job needs the whole trace), or when they met none of
    it at all (is --unit right?); the summary counts them."""
    from simulator.model.trace import coverage

    got = coverage(failure_times, result.records["wall_h"].to_numpy(), seed)
    if got is None:
        return
    summary["trace_span_h"] = got["span_h"]
    summary["replicas_past_trace_end"] = got["past_end"]
    if got.get("fixed"):
        summary["trace_start"] = "first (the job needs the whole trace)"
        print(
            f"warning: --trace-start random: the job's expected wall time (with a 1.5x margin) "
            f"is longer than the trace ({got['span_h']:,.1f} h), so every replica replays it "
            "from its start and meets the same failures; replay a longer trace",
            file=sys.stderr,
        )
    elif "fixed" in got:
        summary["trace_start"] = "random"
    if got["first_h"] is not None and got["first_h"] > got["longest_h"]:
        print(
            f"warning: no failure of the trace came within any replica's wall time (the first "
            f"is {got['first_h']:,.1f} h in; the longest replica ran {got['longest_h']:,.1f} h): "
            "is --unit right? (numbers are hours unless --unit says)",
            file=sys.stderr,
        )
    if got["past_end"] and "fixed" in got and not got["fixed"]:
        print(
            f"warning: {got['past_end']} of {got['replicas']} replicas ran past the end of the "
            f"trace ({got['span_h']:,.1f} h) from their random start and met no failure after "
            "it: their results are optimistic; replay a longer trace",
            file=sys.stderr,
        )
    elif got["past_end"]:
        print(
            f"warning: the trace's failures end {got['span_h']:,.1f} h in, but "
            f"{got['past_end']} of {got['replicas']} replicas ran longer (up to "
            f"{got['longest_h']:,.1f} h) and met no failure after it: their results are "
            "optimistic; replay a longer trace",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    from simulator.cli.common import (
        enforce_budget,
        output_path,
        print_json,
        require_failure_rate,
        require_work,
        workers_for,
    )
    from simulator.engines import budget
    from simulator.engines.choose import choose_engine, simulate
    from simulator.engines.results import OUT_SUFFIXES
    from simulator.model.scenario import DEFAULT_PRESET
    from simulator.policies import make_policy

    out = output_path(args, OUT_SUFFIXES)  # before the work, not after it
    scenario, default = _scenario(args)
    replay, scenario = _trace(args, scenario)
    require_failure_rate(scenario)
    require_work(scenario)
    if default:
        print(
            f"note: no scenario or flags given, so this is the embedded default preset "
            f"{DEFAULT_PRESET} ({scenario.gpus:,} GPUs); see --help to describe your own job",
            file=sys.stderr,
        )
    schedule, origins = _tier_schedule(args, scenario)
    policy = schedule or make_policy(args.policy or "optimal", interval_s=args.interval_s)
    if args.prior_mtbf_h is not None:
        if args.policy != "controller":
            raise InputError("--prior-mtbf-h needs --policy controller")
        policy = dataclasses.replace(policy, prior_mtbf_s=args.prior_mtbf_h * 3600.0)
    if args.step_s is not None:
        if args.policy != "controller":
            raise InputError("--step-s needs --policy controller (the steps the controller counts)")
        policy = dataclasses.replace(policy, step_s=args.step_s)
    workers = workers_for(args, args.replicas, "ckptsim simulate")
    engine = choose_engine(scenario, args.engine, [policy])
    if scenario.tiers:  # the tiers' own save costs, not the scenario's one save
        est = budget.tier_estimate(scenario, [policy], args.replicas, workers=workers)
    else:
        intervals = budget.policy_intervals(scenario, [policy])
        est = budget.estimate(scenario, intervals, args.replicas, engine=engine, workers=workers)
    enforce_budget(args, est, workers)
    failure_times = _failure_times(args, replay, scenario, est.wall_factor)
    result = simulate(
        scenario,
        policy,
        replicas=args.replicas,
        seed=args.seed,
        engine=args.engine,
        workers=workers,
        progress=not args.no_progress and sys.stderr.isatty(),
        failure_times=failure_times,
    )
    summary = result.summary()
    summary["interval_s"] = args.interval_s
    if schedule is not None:  # which intervals ran, and where each came from
        from simulator.model.tiers import final_tiers

        summary["tier_intervals_s"] = dict(schedule.intervals_s)
        summary["tier_intervals_from"] = origins
        summary["final_tiers"] = [t.name for t in final_tiers(scenario.tiers)]
        for name, value in schedule.intervals_s.items():
            if math.isinf(value) and origins.get(name) == "--tier-interval-s":
                what = (
                    "is saved only at the job's final save"
                    if name in summary["final_tiers"]
                    else "is never saved (the job ends on a copy that outlives it)"
                )
                print(f"note: --tier-interval-s {name}=inf: {name} {what}", file=sys.stderr)
    for key, value in (("prior_mtbf_h", args.prior_mtbf_h), ("step_s", args.step_s)):
        if value is not None:  # the controller's settings, so saved results tell runs apart
            summary[key] = value
    if replay is not None:
        # The job meets the log's failures: its MTBF is the log's; the policy's may differ.
        summary["planned_mtbf_h"] = summary["mtbf_h"]
        summary["mtbf_h"] = replay["mtbf_h"]
        summary["trace_failures"] = len(replay["times"])
    _note_trace_end(summary, result, failure_times, args.seed)
    if out is not None:
        summary["out"] = str(result.to_file(out))
    if args.json:
        print_json(summary)
    else:
        print(render(summary))
    return 0


ROWS = (
    ("wall time (h)", "wall_h", "{:,.1f}"),
    ("lost work (h)", "lost_h", "{:,.1f}"),
    ("checkpoint stalls (h)", "checkpoint_h", "{:,.1f}"),
    ("recovery (h)", "recovery_h", "{:,.1f}"),
    ("waste (% of wall)", "waste_fraction", "{:.2%}"),
    ("failures", "failures", "{:,.1f}"),
    ("checkpoints", "checkpoints", "{:,.0f}"),
    ("cost (USD)", "usd", format_usd),
)


def _is_part_mean(key: str) -> bool:
    from simulator.engines.results import is_part

    return key.endswith("_mean") and is_part(key[:-5])


def _part_label(column: str) -> str:
    """'failures gpu', 'lost by gpu (h)', 'saves memory': a per-part column for a person."""
    if column.endswith("_h"):
        return column[:-2].replace("_", " ", 2) + " (h)"
    return column.replace("_", " ", 1)


def render(s: dict) -> str:
    """The human table and a one-line verdict."""
    policy = f"every {format_duration(s['interval_s'])}" if s.get("interval_s") else s["policy"]
    if s.get("tier_intervals_s"):
        policy += f" [{tier_plan_text(s)}]"
    if s.get("prior_mtbf_h") is not None:
        policy += f", prior MTBF {s['prior_mtbf_h']:g} h"
    if s.get("step_s") is not None:
        policy += f", {s['step_s']:g} s per step"
    if s.get("trace_failures") is not None:
        mtbf = (
            f"job MTBF {s['mtbf_h']:.3g} h (the trace: {s['trace_failures']:,} failures in "
            f"{s.get('trace_span_h', math.nan):,.1f} h)"
        )
        planned = s.get("planned_mtbf_h")
        if planned is not None and not math.isclose(planned, s["mtbf_h"], rel_tol=1e-3):
            mtbf += f", the policy plans with the scenario's {planned:.3g} h"
    else:
        mtbf = f"job MTBF {s['mtbf_h']:.3g} h ({s['failure']})"
    head = (
        f"{s['scenario']}: {count(s['replicas'], 'replica')} on the {s['engine']} engine, "
        f"seed {s['seed']}, "
        f"policy {policy}, {mtbf}, work {s['work_h']:,.1f} h"
    )
    lines = [head, ""]
    rows = [("", ["mean", "95% CI of mean", "p50", "p90", "p99"])]
    parts = [(_part_label(key[:-5]), key[:-5], "{:,.1f}") for key in s if _is_part_mean(key)]
    for label, key, fmt in (*ROWS, *parts):
        if f"{key}_mean" not in s:
            continue
        show = fmt if callable(fmt) else fmt.format
        lo, hi = s[f"{key}_ci95"]
        ci = f"{show(lo)} - {show(hi)}" if math.isfinite(lo) else "n/a"
        cells = [show(s[f"{key}_mean"]), ci] + [
            show(s[f"{key}_{p}"]) for p in ("p50", "p90", "p99")
        ]
        rows.append((label, cells))
    # Each column as wide as its widest cell, two spaces apart: a long label (a failure
    # cause's recovery) or a nine-digit dollar figure never runs into the next column.
    label_w = max(len(label) for label, _ in rows)
    widths = [max(len(cells[i]) for _, cells in rows) for i in range(len(rows[0][1]))]
    for label, cells in rows:
        lines.append(
            f"{label:{label_w}}"
            + "".join(f"  {c:>{w}}" for c, w in zip(cells, widths, strict=True))
        )
    extra = s["wall_h_mean"] - s["work_h"]
    verdict = (
        f"verdict: {s['work_h']:,.1f} h of work takes {s['wall_h_mean']:,.1f} h on average "
        f"(p99 {s['wall_h_p99']:,.1f} h): {extra:,.1f} h of saves, lost work and recovery, "
        f"{s['waste_fraction_mean']:.1%} of wall time"
    )
    if "usd_mean" in s:
        verdict += f", {format_usd(s['usd_mean'])} per run"
    lines += ["", verdict + "."]
    if s.get("out"):
        lines.append(f"per-replica records: {s['out']}")
    return "\n".join(lines)
