"""``ckptsim fit``: fit lifetime models to your own failure log and write a scenario from it.

The log (CSV or Parquet) is read by ``simulator.fitting.faillog`` in either shape (lifetimes, or
failure timestamps); ``simulator.fitting.fit`` fits exponential, Weibull and lognormal lifetimes by
censored maximum likelihood, ranks them by AIC and checks each against Kaplan–Meier. With a
cause column each cause gets its own fit (the cause-specific hazard), and with a repair column
its repair-time distribution. ``--scenario-out`` writes the best fit as a scenario TOML that
``ckptsim optimize --scenario`` and ``ckptsim simulate --scenario`` read; with a cause column
its failure model is one ``[[failure_class]]`` per cause (``fitting.fit.cause_classes``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from simulator.cli.common import nonnegative_float, positive_float, positive_int, print_json
from simulator.display import count
from simulator.errors import InputError

EPILOG = """\
log shapes (columns are found by name, and the output says which it used; a flag names one
when that fails, and --X-column none says there is none):
  lifetimes   one row per unit:    duration,event       (event 1 = failed, 0 = censored)
  timestamps  one row per failure: time[,node][,cause][,repair]
              times are numbers in --unit since the log's start, or dates; with a component
              column a lifetime is the gap between one component's failures (its last gap
              censored at --end), without one the gaps of the whole system.

rules (the same for `simulate --trace` and `--failure empirical:FILE`): a blank time, duration
or flag is refused; a blank cause counts in the overall fit only; a blank component is
refused; rows with the same time (and component) are one failure; lifetimes of 0 are left
out; every merge and leave-out is said in a note.

output: the columns used; each family's parameters with 95% CIs, AIC (lowest is best) and its
distance from Kaplan-Meier; a warning when the best fit's mean lies over 3x from the log's own
(failures / exposure) or past 3x the longest time observed; with --json one object: families
[{family, params, aic, ci95, ...}], best, events, censored (parameters ending in _s are
seconds).

examples:
  ckptsim fit experiments/logs/lanl-system20.csv --repair-unit min
      the log in the repository: node failures with dates, causes and down times in minutes
  ckptsim fit experiments/logs/lanl-system20.csv --repair-unit min --scenario-out m.toml
      one failure class per cause, each restarting in its mean down time; add
      --cause-column none for one fit of the whole log
  ckptsim fit failures.csv --unit h
      numbers in hours, no component column: the scenario gets the system's MTBF (mtbf_h)
  ckptsim fit nodes.parquet --time-column when --component-column node --end 2024-12-31
  ckptsim fit failures.csv --scenario-out mine.toml --checkpoint-s 120 --restart-s 900
  ckptsim optimize --scenario mine.toml
  ckptsim fit lifetimes.csv --scenario-out mine.toml --gpus 1024
      a lifetimes log needs --gpus N: how many units like the log's the job runs on"""

_FAMILY_NAMES = ("exponential", "weibull", "lognormal")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fit",
        help="fit failure models to your own failure log (CSV/Parquet) and write a scenario",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog=EPILOG,
    )
    p.add_argument("file", metavar="FILE", help="failure log, CSV or Parquet")
    cols = p.add_argument_group(
        "columns (found by name when not given; C = none: the log has none)"
    )
    cols.add_argument("--duration-column", metavar="C", help="lifetimes: time to failure/censoring")
    cols.add_argument(
        "--event-column",
        metavar="C",
        help="lifetimes: 1 failed, 0 censored (a column named censored/is_censored: the reverse)",
    )
    cols.add_argument("--time-column", metavar="C", help="timestamps: when each failure happened")
    cols.add_argument("--component-column", metavar="C", help="timestamps: which unit failed")
    cols.add_argument("--cause-column", metavar="C", help="root cause (one fit per cause)")
    cols.add_argument("--repair-column", metavar="C", help="repair/down time of each failure")
    cols.add_argument(
        "--system-column",
        metavar="C",
        help="timestamps: which system (a log of several: components are told apart by it)",
    )
    p.add_argument(
        "--unit",
        choices=("s", "min", "h", "d"),
        default="h",
        help="unit of numeric failure times and durations (the time/duration column; dates "
        "need none), and of the output (default: %(default)s)",
    )
    p.add_argument(
        "--repair-unit",
        choices=("s", "min", "h", "d"),
        help="unit of the repair/down-time column, and of its fits in the output (default: --unit)",
    )
    p.add_argument(
        "--end",
        metavar="T",
        help="end of observation of a log of failure times (a date for dates, a number in "
        "--unit for numbers); default: the last failure",
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--plot", metavar="FILE", help="survival curve (Kaplan-Meier and each fit)")
    out.add_argument(
        "--scenario-out",
        metavar="FILE",
        help="write the best fit whose mean the log supports as a scenario TOML for "
        "optimize/simulate --scenario; with a cause column, one [[failure_class]] per cause "
        "(its own fit; its restart_s the mean of its down-time fit, unless --restart-s), the "
        "causes too rare for a fit pooled as 'other'",
    )
    job = p.add_argument_group("job written into --scenario-out")
    job.add_argument(
        "--gpus",
        type=positive_int,
        metavar="N",
        help="units like the log's in the job (default: the log's component count; a "
        "system-gap log writes the system's mtbf_h and no gpus)",
    )
    job.add_argument(
        "--checkpoint-s", type=positive_float("seconds"), metavar="S", help="save stall, seconds"
    )
    job.add_argument(
        "--restart-s", type=nonnegative_float("seconds"), metavar="S", help="restart time, seconds"
    )
    job.add_argument(
        "--work-h",
        type=positive_float("hours"),
        metavar="H",
        help="failure-free compute, hours (what simulate needs)",
    )
    p.set_defaults(func=run)


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for ch in str(text):
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in "\b\t\n\f\r":
            out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _comment(text: str) -> str:
    """One comment line: a newline or other control character in a file name cannot end it."""
    return "# " + "".join(ch if ch.isprintable() else "?" for ch in str(text))


def _toml(data: dict, header: list[str], comments: list[list[str]] = ()) -> str:
    """A flat scenario mapping as TOML; its ``failure_class`` list as ``[[failure_class]]``
    tables after the plain keys, each under its lines of ``comments``."""
    lines = [_comment(h) for h in _wrap(header)]
    tables = data.get("failure_class", [])
    lines += _keys({k: v for k, v in data.items() if k != "failure_class"})
    for i, table in enumerate(tables):
        lines.append("")
        lines += [_comment(c) for c in _wrap(comments[i] if i < len(comments) else [])]
        lines.append("[[failure_class]]")
        lines += _keys(table)
    return "\n".join(lines) + "\n"


def _wrap(lines: list[str], width: int = 98) -> list[str]:
    """Comment text in lines a reader need not scroll (each given line starts a new one)."""
    import textwrap

    return [
        part
        for line in lines
        for part in (
            textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False) or [""]
        )
    ]


def _keys(data: dict) -> list[str]:
    lines = []
    for key, value in data.items():
        if isinstance(value, str):
            lines.append(f"{key} = {toml_string(value)}")
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, int):
            lines.append(f"{key} = {value}")
        else:
            lines.append(f"{key} = {float(value):.6g}")
    return lines


def _unit_s(unit: str) -> float:
    from simulator.fitting.faillog import UNITS

    return UNITS[unit]


_ROLE_ORDER = ("time", "duration", "event", "component", "system", "cause", "repair")


def columns_line(columns: dict, shape: str) -> str:
    """The columns a log was read with, one line ("-" for a role it has none of)."""
    roles = ("duration", "event", "cause", "repair") if shape == "lifetimes" else (
        "time", "component", "system", "cause", "repair"
    )  # fmt: skip
    shown = [f"{role} {columns[role]!r}" for role in roles if columns.get(role) is not None]
    none = [role for role in roles if columns.get(role) is None and role != "system"]
    text = "columns used: " + ", ".join(shown)
    if none:
        text += f"; none for {', '.join(none)}"
    return text


def _warnings(args, result, notes: list[str]) -> list[str]:
    """The stderr lines of a fit besides the reader's notes: ``notes``, skipped families and
    causes, and best fits that extrapolate past the log."""
    from simulator.fitting.fit import describe_extrapolation

    u, ru = _unit_s(args.unit), _unit_s(args.repair_unit or args.unit)
    lines = [f"note: {n}" for n in notes]
    for where, block in (("", result), *((f"cause {k}: ", v) for k, v in
                                         result.get("causes", {}).items())):  # fmt: skip
        for skip in block.get("skipped_families", []):
            lines.append(f"note: {where}no {skip['family']} fit: {skip['reason']}")
    for name, why in result.get("causes_skipped", {}).items():
        lines.append(f"note: cause {name!r} has no fit of its own ({why}); it counts overall")
    x = result.get("extrapolation")
    if x is not None:
        lines.append(
            f"warning: the best fit ({x['family']}) extrapolates: "
            f"{describe_extrapolation(x, u, args.unit)}"
        )
    far = [
        f"{name} ({sub['extrapolation']['family']}, "
        f"{sub['extrapolation']['mean_s'] / u:,.3g} {args.unit} vs "
        f"{sub['extrapolation']['log_mean_s'] / u:,.3g} {args.unit})"
        for name, sub in result.get("causes", {}).items()
        if "extrapolation" in sub
    ]
    if far:
        lines.append(
            "warning: per-cause best fits whose mean is past 3x the log's own rate or window, "
            f"fitted vs failures/exposure: {'; '.join(far)}"
        )
    rep = result.get("repair", {}).get("extrapolation")
    if rep is not None:
        lines.append(
            f"warning: the best repair fit ({rep['family']}) extrapolates: "
            f"{describe_extrapolation(rep, ru, args.repair_unit or args.unit)}"
        )
    return lines


def _n(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _print_text(args, result) -> None:
    from simulator.fitting.fit import fits_table

    u = _unit_s(args.unit)
    runit = args.repair_unit or args.unit
    ru = _unit_s(runit)
    print(
        f"{args.file}: {_n(result['units'], 'lifetime')} ({result['shape']}), "
        f"{_n(result['events'], 'failure')}, {result['censored']:,} censored"
    )
    print(columns_line(result["columns"], result["shape"]))
    print(fits_table(result["fits"], u, args.unit))
    for row in result["families"]:
        km = row["km"]
        band = (
            f"inside its 95% band at {100 * km['in_band']:.0f}% of failure times"
            if km["in_band"] == km["in_band"]
            else "no 95% band (too few failures)"
        )
        print(f"  {row['family']}: largest gap from Kaplan-Meier {km['max_gap']:.3f}, {band}")
    print(f"best (lowest AIC): {result['best']}")
    if "repair" in result:
        print(f"\nrepair/down time ({result['repair']['events']:,} failures, in {runit}):")
        print(fits_table(result["repair"]["fits"], ru, runit))
    for name, sub in result.get("causes", {}).items():
        print(f"\ncause {name}: {sub['events']:,} failures (others censored), best {sub['best']}")
        print(fits_table(sub["fits"], u, args.unit))
        if "repair" in sub:
            print(f"repair/down time, cause {name} (in {runit}): best {sub['repair']['best']}")
            print(fits_table(sub["repair"]["fits"], ru, runit))


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
    job_flags = [k for k in ("gpus", "checkpoint_s", "restart_s", "work_h") if getattr(args, k)]
    if job_flags and scenario_out is None:
        flag = "--" + job_flags[0].replace("_", "-")
        raise InputError(f"{flag} describes the job written into --scenario-out FILE; give one")
    log = read_failure_log(
        args.file,
        unit=args.unit,
        repair_unit=args.repair_unit,
        duration_column=args.duration_column,
        event_column=args.event_column,
        time_column=args.time_column,
        component_column=args.component_column,
        cause_column=args.cause_column,
        repair_column=args.repair_column,
        system_column=args.system_column,
        end=args.end,
    )
    for note in log.notes:  # before any refusal below: they may be why
        print(f"note: {note}", file=sys.stderr)
    if log.durations_s.size == 0 and log.shape == "lifetimes":
        raise InputError(f"{args.file}: no lifetime longer than 0 in the log: nothing to fit")
    if log.durations_s.size == 0:
        raise InputError(
            f"{args.file}: no lifetimes in the log (a lifetime is the gap between two failures"
            f"{' of one component' if log.components else ''}: fewer than two were logged)"
        )
    if log.events == 0:
        raise InputError(f"{args.file}: every lifetime is censored (no failures): nothing to fit")
    result = fit_log(log)
    notes: list[str] = []
    if args.repair_unit and "repair" not in (log.columns or {}):
        notes.append("--repair-unit is unused: the log has no repair column")
    system_gaps = log.system_gaps
    if scenario_out is not None:
        if system_gaps and args.gpus:
            notes.append(
                f"--gpus {args.gpus} is not written: this log's gaps are the whole system's, so "
                "the scenario has the system's mtbf_h (see the file's header on adding gpus)"
            )
        if not system_gaps and args.gpus is None and log.components:
            notes.append(
                f"the scenario's job has the log's {log.components:,} components (gpus = "
                f"{log.components}); units that never failed are not in a log of failures: "
                "give --gpus N for the job's real size"
            )
        fixed = {k: getattr(args, k) for k in ("checkpoint_s", "restart_s", "work_h")}
        data = scenario_from_fit(log, result, name=scenario_out.stem, gpus=args.gpus, **fixed)
        chosen = result.pop("scenario_fit")
        classes = data.get("failure_class", [])
        if classes:
            header = _class_header(args, result, log, system_gaps)
            notes.append(
                f"--scenario-out: {len(classes)} failure classes, one per cause with a fit of "
                "its own (the others pooled as one, if any); --cause-column none writes one fit "
                "of the whole log instead"
            )
        else:
            header = [
                f"Written by `ckptsim fit {args.file}`: best of {', '.join(_FAMILY_NAMES)} by "
                f"AIC whose mean the log supports ({chosen['family']}),",
                f"fitted to {count(result['events'], 'failure')} and "
                f"{count(result['censored'], 'censored lifetime')}.",
            ]
            for passed in chosen["skipped"]:
                note = f"passed over a better {passed}"
                header.append(note[0].upper() + note[1:] + ".")
                print(f"warning: --scenario-out {note}", file=sys.stderr)
        if system_gaps and data.get("failure", "exponential") != "exponential":
            header += [
                "mtbf_h and failure are the whole system's time between failures: simulated as",
                "one component with this shape while the scenario has no gpus. Setting gpus (a",
                "key, or --gpus, e.g. to price the job) makes failure each GPU's lifetime with",
                "mean mtbf_h x gpus instead: many GPUs failing on their own clocks come at a",
                "nearly constant rate, a different process from the one fitted here.",
            ]
        missing = [k for k in ("checkpoint_s", "restart_s") if k not in data]
        if missing:
            own = " (a class with its own restart_s takes that)" if classes else ""
            header.append(
                f"Not given, so ckptsim's defaults (60 s save, 600 s restart): "
                f"{', '.join(missing)}{own}."
            )
        text = _toml(data, header, chosen.get("class_comments", []))
        write_atomic(
            scenario_out, lambda tmp: tmp.write_text(text, encoding="utf-8"), "--scenario-out"
        )
        result["scenario"] = data
    if notes:
        result["notes"] = [*result.get("notes", []), *notes]
    for line in _warnings(args, result, notes):
        print(line, file=sys.stderr)
    if plot is not None:
        _plot(args, log, result, plot)
    if args.json:
        print_json(_strip(result))
    else:
        _print_text(args, result)
        if args.scenario_out:
            out = args.scenario_out
            print(f"\nwrote {out}; next: ckptsim optimize --scenario {out}")
            hints = ["add --usd-per-gpu-hour P to see it in dollars"]
            if args.work_h is None:
                hints.append(f"ckptsim simulate --scenario {out} --work-h H to simulate a job")
            print(f"  ({'; '.join(hints)})")
    return 0


def _class_header(args, result, log, system_gaps: bool) -> list[str]:
    """The header of a scenario whose failure model is one class per cause."""
    col = result["columns"].get("cause", "cause")
    level = (
        "mtbf_h, the whole system's mean time between its failures"
        if system_gaps
        else "gpu_mtbf_h, one component's mean lifetime (each of the log's components is a "
        "node of one GPU, gpus_per_node = 1)"
    )
    lines = [
        f"Written by `ckptsim fit {args.file}`: one [[failure_class]] per cause in column "
        f"{col!r} with a fit of its own, each the best of {', '.join(_FAMILY_NAMES)} by AIC "
        "whose mean the log supports, fitted to that cause's failures with the gaps other causes "
        f"ended censored (the cause-specific hazard); its lifetime as {level}.",
        f"The log: {result['events']:,} failures and {result['censored']:,} censored lifetimes; "
        "the classes' rates add up to its rate.",
    ]
    if "repair" in (log.columns or {}):
        lines.append(
            "A class's restart_s, where it has one, is the mean of its fitted down time: the "
            "repair time stands in for the restart cost (a job that restarts on a spare node "
            "waits less: set restart_s, or --restart-s)."
        )
    return lines


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
