"""``ckptsim fit``: fit lifetime models to your own failure log and write a scenario from it.

The log (CSV or Parquet) is read by ``simulator.fitting.faillog`` in either shape (lifetimes, or
failure timestamps); ``simulator.fitting.fit`` fits exponential, Weibull and lognormal lifetimes by
censored maximum likelihood, ranks them by AIC and checks each against Kaplan–Meier. With a
cause column each cause gets its own fit (the cause-specific hazard), and with a repair column
its repair-time distribution. ``--scenario-out`` writes the best fit as a scenario TOML that
``ckptsim optimize --scenario`` and ``ckptsim simulate --scenario`` read.
"""

from __future__ import annotations

import sys
from pathlib import Path

from simulator.cli.common import positive_int, print_json
from simulator.errors import InputError

EPILOG = """\
log shapes (columns are auto-detected by name; the flags name them when that fails):
  lifetimes   one row per unit:    duration,event       (event 1 = failed, 0 = censored)
  timestamps  one row per failure: time[,node][,cause][,repair]
              times are numbers in --unit or dates; with a component column a lifetime is
              the gap between one component's failures (its last gap censored at --end),
              without one the gaps of the whole system.

output: each family's parameters with 95% CIs, AIC (lowest is best) and its distance from
Kaplan-Meier; with --json one object: families [{family, params, aic, ci95, ...}], best,
events, censored (parameters ending in _s are seconds).

examples:
  ckptsim fit failures.csv --unit h
  ckptsim fit nodes.parquet --time-column when --component-column node --end 2024-12-31
  ckptsim fit failures.csv --scenario-out mine.toml --checkpoint-s 120 --restart-s 900
  ckptsim optimize --scenario mine.toml"""

_FAMILY_NAMES = ("exponential", "weibull", "lognormal")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fit",
        help="fit failure models to your own failure log (CSV/Parquet) and write a scenario",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog=EPILOG,
    )
    p.add_argument("file", metavar="FILE", help="failure log, CSV or Parquet")
    cols = p.add_argument_group("columns (auto-detected when not given)")
    cols.add_argument("--duration-column", metavar="C", help="lifetimes: time to failure/censoring")
    cols.add_argument("--event-column", metavar="C", help="lifetimes: 1 failed, 0 censored")
    cols.add_argument("--time-column", metavar="C", help="timestamps: when each failure happened")
    cols.add_argument("--component-column", metavar="C", help="timestamps: which unit failed")
    cols.add_argument("--cause-column", metavar="C", help="root cause (one fit per cause)")
    cols.add_argument("--repair-column", metavar="C", help="repair/down time of each failure")
    p.add_argument(
        "--unit",
        choices=("s", "min", "h", "d"),
        default="h",
        help="unit of numeric times and durations in the log (default: %(default)s)",
    )
    p.add_argument(
        "--end",
        metavar="T",
        help="end of observation (a date, or a number in --unit); default: the last failure",
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--plot", metavar="FILE", help="survival curve (Kaplan-Meier and each fit)")
    out.add_argument(
        "--scenario-out",
        metavar="FILE",
        help="write the best fit as a scenario TOML for optimize/simulate --scenario",
    )
    job = p.add_argument_group("job written into --scenario-out")
    job.add_argument(
        "--gpus",
        type=positive_int,
        metavar="N",
        help="units like the log's in the job (default: the log's component count; a "
        "system-gap log needs none)",
    )
    job.add_argument("--checkpoint-s", type=float, metavar="S", help="save stall, seconds")
    job.add_argument("--restart-s", type=float, metavar="S", help="restart time, seconds")
    job.add_argument("--work-h", type=float, metavar="H", help="failure-free compute, hours")
    p.set_defaults(func=run)


def _toml(data: dict, header: list[str]) -> str:
    lines = [f"# {h}" for h in header]
    for key, value in data.items():
        if isinstance(value, str):
            lines.append(f'{key} = "{value}"')
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, int):
            lines.append(f"{key} = {value}")
        else:
            lines.append(f"{key} = {float(value):.6g}")
    return "\n".join(lines) + "\n"


def _unit_s(unit: str) -> float:
    from simulator.fitting.faillog import UNITS

    return UNITS[unit]


def _print_text(args, result) -> None:
    from simulator.fitting.fit import fits_table

    u = _unit_s(args.unit)
    print(
        f"{args.file}: {result['units']} lifetimes ({result['shape']}), "
        f"{result['events']} failures, {result['censored']} censored"
    )
    print(fits_table(result["fits"], u, args.unit))
    for row in result["families"]:
        km = row["km"]
        print(
            f"  {row['family']}: largest gap from Kaplan-Meier {km['max_gap']:.3f}, "
            f"inside its 95% band at {100 * km['in_band']:.0f}% of failure times"
        )
    print(f"best (lowest AIC): {result['best']}")
    if "repair" in result:
        print("\nrepair/down time:")
        print(fits_table(result["repair"]["fits"], u, args.unit))
    for name, sub in result.get("causes", {}).items():
        print(f"\ncause {name}: {sub['events']} failures (others censored), best {sub['best']}")
        print(fits_table(sub["fits"], u, args.unit))
        if "repair" in sub:
            print(f"repair/down time, cause {name}: best {sub['repair']['best']}")
            print(fits_table(sub["repair"]["fits"], u, args.unit))


def _strip(result: dict) -> dict:
    """The JSON view: fit objects dropped (their numbers are in ``families``)."""
    out = {}
    for key, value in result.items():
        if key == "fits":
            continue
        if isinstance(value, dict) and key in ("repair",):
            out[key] = _strip(value)
        elif key == "causes":
            out[key] = {k: _strip(v) for k, v in value.items()}
        else:
            out[key] = value
    return out


def run(args) -> int:
    from simulator.fitting.faillog import read_failure_log
    from simulator.fitting.fit import fit_log, scenario_from_fit
    from simulator.outfile import check_output, write_atomic

    # Both outputs are checked before the fits run, not after.
    scenario_out = plot = None
    if args.scenario_out:
        scenario_out = check_output(args.scenario_out, "--scenario-out", (".toml",))
    if args.plot:
        plot = check_output(args.plot, "--plot", (".png", ".svg"))
    log = read_failure_log(
        args.file,
        unit=args.unit,
        duration_column=args.duration_column,
        event_column=args.event_column,
        time_column=args.time_column,
        component_column=args.component_column,
        cause_column=args.cause_column,
        repair_column=args.repair_column,
        end=args.end,
    )
    if log.durations_s.size == 0:
        raise InputError(f"{args.file}: no lifetimes in the log (fewer than two failures?)")
    if log.events == 0:
        raise InputError(f"{args.file}: every lifetime is censored (no failures): nothing to fit")
    result = fit_log(log)
    if scenario_out is not None:
        fixed = {k: getattr(args, k) for k in ("checkpoint_s", "restart_s", "work_h")}
        data = scenario_from_fit(log, result, name=scenario_out.stem, gpus=args.gpus, **fixed)
        chosen = result.pop("scenario_fit")
        header = [
            f"Written by `ckptsim fit {args.file}`: best of {', '.join(_FAMILY_NAMES)} by AIC "
            f"({chosen['family']}),",
            f"fitted to {result['events']} failures and {result['censored']} censored lifetimes.",
        ]
        for passed in chosen["skipped"]:
            note = f"passed over a better fit no simulation can sample: {passed}"
            header.append(note[0].upper() + note[1:] + ".")
            print(f"warning: --scenario-out {note}", file=sys.stderr)
        missing = [k for k in ("checkpoint_s", "restart_s") if k not in data]
        if missing:
            header.append(
                f"Not given, so ckptsim's defaults (60 s save, 600 s restart): "
                f"{', '.join(missing)}."
            )
        text = _toml(data, header)
        write_atomic(
            scenario_out, lambda tmp: tmp.write_text(text, encoding="utf-8"), "--scenario-out"
        )
        result["scenario"] = data
    if plot is not None:
        _plot(args, log, result, plot)
    if args.json:
        print_json(_strip(result))
    else:
        _print_text(args, result)
        if args.scenario_out:
            out = args.scenario_out
            print(f"\nwrote {out}; next: ckptsim optimize --scenario {out}")
    return 0


def _plot(args, log, result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simulator.fitting.fit import plot_survival
    from simulator.plots import save

    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot_survival(
        log.durations_s,
        log.observed,
        result["fits"],
        ax=ax,
        time_unit_s=_unit_s(args.unit),
        unit=args.unit,
    )
    ax.set_title(f"{Path(args.file).name}: survival, Kaplan-Meier and fits")
    save(fig, path, formats=(path.suffix.lstrip(".").lower(),))  # atomic, closes the figure
