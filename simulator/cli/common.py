"""Pieces shared by the subcommands: one-line errors, scenario flags, JSON output."""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from typing import Any

from simulator.errors import InputError


def fail(message: str, prog: str = "ckptsim") -> int:
    """Print one line for a user's mistake and return the usage-error status (2)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (with a pointer to --help), status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def positive_float(unit: str):
    """An argparse type: a finite positive number, the message naming the unit."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"must be a positive number of {unit}, got {text}")
        return value

    return parse


def nonnegative_float(unit: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"must be a non-negative number of {unit}, got {text}")
        return value

    return parse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text}")
    return value


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text}")
    return value


def seed_int(text: str) -> int:
    """An argparse type for --seed: a whole number >= 0 (what numpy's SeedSequence takes)."""
    return nonnegative_int(text)


def add_workers_flag(group, what: str = "worker processes") -> None:
    """--workers P: processes for the runs (capped at the cores; results do not depend on P)."""
    group.add_argument(
        "--workers",
        type=positive_int,
        metavar="P",
        help=f"{what} (default and most: all cores; the same answer for any P)",
    )


def add_budget_flags(parser: argparse.ArgumentParser) -> None:
    """--max-core-hours and --max-memory-gb: the limits of ``simulator.engines.budget``."""
    from simulator.engines.budget import DEFAULT_MAX_CORE_HOURS

    g = parser.add_argument_group(
        "limits",
        "A run estimated to exceed a limit is refused before it starts, with the estimate\n"
        "(events ~ replicas x (work/MTBF + work/interval) at a measured rate per core;\n"
        "memory ~ per-GPU state and per-replica records); so is a job that makes no headway.",
    )
    g.add_argument(
        "--max-core-hours",
        type=positive_float("hours"),
        metavar="H",
        help=f"most estimated core time (default {DEFAULT_MAX_CORE_HOURS:g} h)",
    )
    g.add_argument(
        "--max-memory-gb",
        type=positive_float("GB"),
        metavar="GB",
        help="most memory the run may need (default: half of what is available now)",
    )


def enforce_budget(args: argparse.Namespace, est, workers: int = 1) -> None:
    """Refuse (one line) a run whose estimate ``est`` exceeds the command's limits."""
    from simulator.engines.budget import DEFAULT_MAX_CORE_HOURS, check

    gb = getattr(args, "max_memory_gb", None)
    check(
        est,
        max_core_hours=(
            DEFAULT_MAX_CORE_HOURS if args.max_core_hours is None else args.max_core_hours
        ),
        max_memory_bytes=None if gb is None else gb * 1e9,
        workers=workers,
    )


def workers_for(args: argparse.Namespace, tasks: int, prog: str) -> int:
    """--workers capped at the cores here (and the tasks), with a note when it was cut."""
    from simulator.engines.workers import available_cores, worker_count

    requested = getattr(args, "workers", None)
    n = worker_count(requested, tasks)
    if requested is not None and requested > available_cores():
        print(
            f"note: {prog}: --workers {requested} is more than the {available_cores()} cores "
            f"here; using {n}",
            file=sys.stderr,
        )
    return n


def output_path(args: argparse.Namespace, suffixes, flag: str = "--out"):
    """The --out path, checked before any work (``simulator.outfile.check_output``)."""
    from simulator.outfile import check_output

    value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
    return None if value is None else check_output(value, flag, suffixes)


def add_scenario_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that override fields of the scenario (a preset name or a TOML file)."""
    g = parser.add_argument_group(
        "scenario",
        # Line breaks by hand: the commands keep their descriptions' layout (RawDescription).
        "Flags override the scenario file's fields; a file's [[tier]] and [[failure_class]]\n"
        "tables set their own saves and failures, which the flags do not reach (refused).\n"
        "Without --scenario, flags alone describe the job (unset fields take the defaults:\n"
        "60 s saves, 10 min restarts); with neither, the embedded default preset (Llama 3\n"
        "405B on 16,384 GPUs) is used.",
    )
    g.add_argument(
        "--scenario",
        metavar="FILE|PRESET",
        help=(
            "TOML scenario file, or a preset: llama3, llama3-mix, llama3-tiers, opt175b, "
            "bloom176b, titan, titan-record"
        ),
    )
    g.add_argument("--gpus", type=positive_int, metavar="N", help="GPUs in the job")
    g.add_argument("--gpus-per-node", type=positive_int, metavar="G", help="GPUs per node")
    mtbf = g.add_mutually_exclusive_group()
    mtbf.add_argument(
        "--mtbf-h",
        type=positive_float("hours"),
        metavar="H",
        help="system mean time between failures, hours",
    )
    mtbf.add_argument(
        "--gpu-mtbf-h",
        type=positive_float("hours"),
        metavar="H",
        help="per-GPU mean time between failures, hours (needs --gpus)",
    )
    g.add_argument(
        "--failure",
        metavar="DIST",
        help="per-GPU lifetimes: exponential | weibull:shape=K | lognormal:sigma=S | "
        "empirical:FILE (the Kaplan-Meier shape of a failure log that `ckptsim fit` reads, "
        "rescaled to the MTBF given)",
    )
    g.add_argument(
        "--checkpoint-s",
        type=positive_float("seconds"),
        metavar="S",
        help="training stall of one save, seconds (δ)",
    )
    g.add_argument(
        "--restart-s",
        type=nonnegative_float("seconds"),
        metavar="S",
        help="time from failure to training again, seconds (R)",
    )
    g.add_argument(
        "--work-h",
        type=positive_float("hours"),
        metavar="H",
        help="failure-free compute the job needs, hours",
    )
    g.add_argument(
        "--usd-per-gpu-hour",
        type=nonnegative_float("US dollars"),
        metavar="USD",
        help="price of one GPU-hour, US dollars",
    )
    _add_model_flags(parser)


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    """The rest of the model: one flag per Scenario field, for every command that uses it."""
    m = parser.add_argument_group(
        "cluster and storage model",
        "Unset, these take the defaults of Daly's model: no node-level failures, no detection\n"
        "or warm-up time, a spare always free, synchronous saves of --checkpoint-s seconds.",
    )
    m.add_argument(
        "--node-mtbf-h",
        type=positive_float("hours"),
        metavar="H",
        help="per-node MTBF of node-level failures (host, NIC, power), hours; on top of the "
        "GPUs' failures (needs --gpus)",
    )
    m.add_argument(
        "--detection-s",
        type=nonnegative_float("seconds"),
        metavar="S",
        help="time until a failure is noticed, seconds (added to R)",
    )
    m.add_argument(
        "--warmup-s",
        type=nonnegative_float("seconds"),
        metavar="S",
        help="time after loading until full speed, seconds (added to R)",
    )
    m.add_argument(
        "--spares",
        type=nonnegative_int,
        metavar="K",
        help="spare nodes, a count (default: one always free; needs --repair-h)",
    )
    m.add_argument(
        "--repair-h",
        type=positive_float("hours"),
        metavar="H",
        help="mean time to repair a failed node, hours",
    )
    m.add_argument(
        "--repair",
        metavar="DIST",
        help="repair times: exponential (default) | weibull:shape=K | lognormal:sigma=S",
    )
    m.add_argument(
        "--staging-s",
        type=positive_float("seconds"),
        metavar="S",
        help="save asynchronously: training stalls S seconds, the write (--checkpoint-s) "
        "runs behind",
    )
    m.add_argument(
        "--component-age",
        choices=("stationary", "new"),
        help="GPU and node ages at the start: long in service (default) or all new",
    )
    m.add_argument(
        "--checkpoint-bytes",
        type=positive_float("bytes"),
        metavar="B",
        help="size of one complete checkpoint, bytes (e.g. 5.67e12); with a bandwidth it "
        "sets the write and load times",
    )
    m.add_argument(
        "--write-bytes-per-s-per-node",
        type=positive_float("bytes per second"),
        metavar="B",
        help="write bandwidth of one node to shared storage, bytes per second",
    )
    m.add_argument(
        "--storage-bytes-per-s",
        type=positive_float("bytes per second"),
        metavar="B",
        help="aggregate write bandwidth cap of the shared storage, bytes per second",
    )
    m.add_argument(
        "--writer-nodes",
        type=positive_int,
        metavar="N",
        help="nodes that write shards at once, a count (default: every node of the job)",
    )
    m.add_argument(
        "--read-bytes-per-s",
        type=positive_float("bytes per second"),
        metavar="B",
        help="aggregate bandwidth of a restart's checkpoint load, bytes per second",
    )
    m.add_argument(
        "--usd-per-gb-month",
        type=nonnegative_float("US dollars"),
        metavar="USD",
        help="storage price, US dollars per GB (1e9 bytes) per month",
    )
    m.add_argument(
        "--checkpoints-retained",
        type=positive_int,
        metavar="K",
        help="checkpoints kept on storage at once, a count (storage cost)",
    )


@functools.cache
def scenario_flags() -> tuple[str, ...]:
    """Scenario fields that :func:`add_scenario_flags` declares, each as ``--field-name``.

    Read off the declarations themselves, so a new flag is one ``add_argument`` call.
    """
    parser = argparse.ArgumentParser(add_help=False)
    add_scenario_flags(parser)
    return tuple(a.dest for a in parser._actions if a.dest != "scenario")


def _overrides(args: argparse.Namespace, extra: dict[str, Any] | None) -> dict[str, Any]:
    overrides = {k: getattr(args, k, None) for k in scenario_flags()}
    # A staging copy is what an asynchronous save stalls for: giving it means "save async".
    if overrides["staging_s"] is not None:
        overrides["async_checkpoint"] = True
    overrides.update(extra or {})
    return overrides


def uses_default_preset(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> bool:
    """True when neither --scenario nor any scenario flag was given."""
    if getattr(args, "scenario", None):
        return False
    return all(v is None for v in _overrides(args, extra).values())


def _refuse_save_flags_over_tiers(
    base, overrides: dict[str, Any], let_through: dict[str, Any] | None = None
) -> None:
    """The save flags describe the scenario's own save; a file's [[tier]] tables each have
    their own, which the flags would silently not reach (``scenario.OWN_SAVE_FIELDS``, the
    rule the file's own fields follow). ``--checkpoint-bytes`` is not one: beside tiers it is
    the size of one checkpoint, as in the file.

    ``let_through`` names fields (its keys) a caller applies to a tier itself (``optimize
    --profile`` takes ``--storage-bytes-per-s`` as the profiled tier's cap): beside [[tier]]
    tables each one given is taken off ``overrides`` into ``let_through`` instead of refused.
    """
    from simulator.model.scenario import OWN_SAVE_FIELDS

    if not base.tiers or base.tiers[0].implicit:
        return  # the scenario's own save: the flags reach it as ever
    for k in let_through or {}:
        if overrides.get(k) is not None:
            let_through[k] = overrides.pop(k)
    # async_checkpoint is no flag: --staging-s sets it, and names it.
    given = [k for k in OWN_SAVE_FIELDS if k != "async_checkpoint" and overrides.get(k) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise InputError(
            f"{flag} does not reach the scenario's [[tier]] tables ("
            + ", ".join(t.name for t in base.tiers)
            + "): each tier sets its own save and restore costs; edit them in the file"
        )


def _refuse_flags_over_classes(base, overrides: dict[str, Any]) -> None:
    """A file's [[failure_class]] tables each set their lifetime family and detection time
    (and may set their restart), which the scenario-wide flags would silently not reach."""
    classes = base.failure_classes
    if not classes:
        return
    fields = ["failure", "detection_s", "mtbf_h", "gpu_mtbf_h", "node_mtbf_h"]
    if all(c.restart_s is not None for c in classes):
        fields.append("restart_s")
    given = [k for k in fields if overrides.get(k) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        what = " failure rate" if "mtbf" in given[0] else ""
        raise InputError(
            f"{flag} does not reach the scenario's [[failure_class]] tables ("
            + ", ".join(c.name for c in classes)
            + f"): each class sets its own{what}; edit them in the file"
        )


def refuse_tiers(scenario, command: str) -> None:
    """One line for a command that does not model [[tier]] or [[failure_class]] tables yet."""
    if scenario.tiers or scenario.failure_classes:
        raise InputError(
            f"[[tier]] and [[failure_class]] tables are not modelled by {command} yet; use "
            "`ckptsim optimize --scenario FILE` (every tier's interval) or `ckptsim simulate "
            "--scenario FILE --tier-interval-s NAME=SECONDS`"
        )


def scenario_from_args(
    args: argparse.Namespace,
    extra: dict[str, Any] | None = None,
    let_through: dict[str, Any] | None = None,
):
    """The scenario named by --scenario (if any) with flags laid over it.

    Without --scenario the flags alone describe the job; with no flag at all, the embedded
    default preset (``simulator.model.scenario.DEFAULT_PRESET``) is the job. Beside a file's
    [[tier]] tables, the save flags named in ``let_through`` are put there, not refused
    (``_refuse_save_flags_over_tiers``).
    """
    from simulator.model.scenario import DEFAULT_PRESET, Scenario, load_scenario

    overrides = _overrides(args, extra)
    # Name fields as flags where the user typed them, or (without a file) could have.
    from_file = bool(getattr(args, "scenario", None))
    flags = [
        k
        for k, v in overrides.items()
        if (v is not None or not from_file) and k != "async_checkpoint"
    ]
    try:
        if getattr(args, "scenario", None):
            base = load_scenario(args.scenario)
            _refuse_save_flags_over_tiers(base, overrides, let_through)
            _refuse_flags_over_classes(base, overrides)
            scenario = base.with_overrides(
                **_small_job_fits_one_node(overrides, base.gpus_per_node)
            )
        elif uses_default_preset(args, extra):
            scenario = load_scenario(DEFAULT_PRESET)
        else:
            given = {k: v for k, v in overrides.items() if v is not None}
            if "gpu_mtbf_h" in given and "gpus" not in given:
                raise InputError(
                    "--gpu-mtbf-h (per-GPU MTBF, hours) needs --gpus N to scale to the job"
                )
            given = _small_job_fits_one_node(given, Scenario.gpus_per_node)
            scenario = Scenario(name="command-line", **given)
    except InputError as exc:
        raise InputError(as_flags(str(exc), flags)) from None
    _say_empirical_notes(scenario)
    return scenario


def _say_empirical_notes(scenario) -> None:
    """The notes of the failure logs an ``empirical:FILE`` spec reads, on stderr, once: the
    rows the shared reader merged or left out are said here as ``ckptsim fit`` says them."""
    from simulator.model.failures import empirical_notes

    specs = [scenario.failure, scenario.repair]
    for c in scenario.failure_classes:
        specs += [c.failure, c.detection]
    try:
        notes = empirical_notes(specs)
    except InputError:
        return  # the scenario's own validation reports a bad log, in one line
    for note in notes:
        print(f"note: {note}", file=sys.stderr)


def as_flags(message: str, fields) -> str:
    """``message`` with each scenario field in ``fields`` named as the flag the user typed
    (``gpus_per_node`` -> ``--gpus-per-node``); fields from a file keep their TOML names."""
    import re

    # "failure" is also a plain word in messages ("failure distribution 'x'", which quote
    # the spec the user typed anyway).
    for field in sorted(set(fields) - {"failure"}, key=len, reverse=True):
        flag = "--" + field.replace("_", "-")
        message = re.sub(rf"(?<![-\w]){re.escape(field)}(?!\w)", flag, message)
    return message


def require_failure_rate(scenario) -> None:
    """Refuse, in one line naming the flags, a job with no failure rate to optimise against."""
    if not scenario.has_mtbf:
        raise InputError(
            "no failure rate: give --mtbf-h HOURS (system MTBF), or --gpus N with "
            "--gpu-mtbf-h HOURS, or a --scenario (file with mtbf_h or gpu_mtbf_h, or a preset)"
        )


def require_work(scenario, purpose: str = "simulating a job") -> None:
    """Refuse, in one line, to simulate a job whose length (work_h) is unknown."""
    if scenario.work_h is None:
        raise InputError(f"{purpose} needs --work-h HOURS (failure-free compute)")


def _small_job_fits_one_node(overrides: dict[str, Any], gpus_per_node: int) -> dict[str, Any]:
    """``--gpus 4`` alone means one 4-GPU node, not an error about an 8-GPU default node."""
    gpus = overrides.get("gpus")
    if gpus is not None and overrides.get("gpus_per_node") is None and gpus < gpus_per_node:
        return {**overrides, "gpus_per_node": gpus}
    return overrides


def print_json(obj: dict[str, Any]) -> None:
    """One JSON object on stdout; NaN/inf become null so any JSON parser reads it."""

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        if hasattr(x, "item"):
            return clean(x.item())
        return x

    json.dump(clean(obj), sys.stdout, indent=2)
    sys.stdout.write("\n")


def require(condition: bool, message: str) -> None:
    if not condition:
        raise InputError(message)
