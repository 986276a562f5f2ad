"""Closed-loop proof: real training runs with injected failures vs the simulator's prediction.

Runs the study in ``experiments/crashtest/study.py`` — a small GPT trained on the CPU, killed
with SIGKILL on a seeded failure clock, resumed from its checkpoints, once per checkpoint policy
against the same kills — and writes ``reports/closed-loop.md`` with its figures under
``reports/figures/``. About 20 minutes on 2 otherwise idle cores (the report states how long
it took and the machine's load); ``--quick`` is a few minutes; ``--reuse`` re-accounts the runs
already in ``--workdir`` without running anything; ``--render-only`` redraws the figures
from the per-run data the report keeps in ``reports/data/<report>-runs.json``.

    python experiments/closed_loop.py [--quick] [--workdir DIR] [--out reports/closed-loop.md]
"""

from __future__ import annotations

import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `experiments` and `simulator` importable
    sys.path.insert(0, str(REPO))

from experiments.crashtest.report import render_figures, summarise, write_report  # noqa: E402
from experiments.crashtest.study import StudyConfig, run_study  # noqa: E402
from experiments.crashtest.study_cli import (  # noqa: E402
    CLOCK_FIELDS,
    overrides,
    render_only,
    study_parser,
)


def config_for(args, workdir: Path) -> StudyConfig:
    if args.quick:
        base = dict(mtbf_s=60.0, work_s=20.0, repeats=1, multipliers=(4.0,), replicas=500)
    else:
        base = {}  # StudyConfig's defaults: the full study
    base = overrides(args, base, (*CLOCK_FIELDS, "weibull_shape"))
    return StudyConfig(workdir=workdir, **base)


def main(argv=None) -> int:
    p = study_parser(
        __doc__.splitlines()[0],
        REPO / "reports" / "closed-loop.md",
        quick="one repeat, fewer policies (minutes)",
        mtbf="mean of the failure clock, seconds",
        repeats="kill schedules (every policy runs each)",
    )
    p.add_argument("--weibull-shape", type=float, help="Weibull clock of this shape")
    args = p.parse_args(argv)
    if render_only(p, args, render_figures):
        return 0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="closed-loop-") as tmp:
        workdir = args.workdir or Path(tmp)
        cfg = config_for(args, workdir)
        study = run_study(cfg, progress=lambda m: print(m, flush=True), reuse=args.reuse)
    command = "python experiments/closed_loop.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    out = write_report(
        study, args.out, args.out.parent / "figures", command=command.strip(),
        elapsed_s=None if args.reuse else time.monotonic() - t0,
    )  # fmt: skip
    s = summarise(study)
    err = s["df"].own_err.abs().max() * 100
    print(
        f"wrote {out}: replay error (own parameters) max {err:.1f} %; adaptive vs best fixed "
        f"{s['raw']['vs_best'].mean() * 100:+.1f} % measured, "
        f"{s['adj']['vs_best'].mean() * 100:+.1f} % speed-adjusted; vs default "
        f"{s['raw']['vs_default'].mean() * 100:+.1f} % / "
        f"{s['adj']['vs_default'].mean() * 100:+.1f} %"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
