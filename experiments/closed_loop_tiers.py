"""Closed loop with tiers: real runs under a failure mix, two tiers, and the model's prediction.

Runs ``experiments/crashtest/tiers_study.py`` — the closed-loop GPT with a local tier in
``/dev/shm`` and a slowed persistent tier, failed on a seeded clock by process kills, node
losses (the local tier wiped), hangs (SIGSTOP, then a kill after a timeout) and preemptions
(SIGTERM with a grace period), once per checkpoint policy against the same failures — and
writes ``reports/closed-loop-tiers.md`` with its figures. About 30 minutes on 2 otherwise idle
cores (the report states how long it took and the machine's load); ``--quick`` takes a few
minutes; ``--reuse`` re-accounts the runs already in ``--workdir``; ``--render-only`` redraws
the figures from ``reports/data/<report>-runs.json``.

    python experiments/closed_loop_tiers.py [--quick] [--workdir DIR] [--out FILE]
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `experiments` and `simulator` importable
    sys.path.insert(0, str(REPO))

from experiments.crashtest.study_cli import (  # noqa: E402
    CLOCK_FIELDS,
    overrides,
    render_only,
    study_parser,
)
from experiments.crashtest.tiers_report import render_figures, summarise, write_report  # noqa: E402
from experiments.crashtest.tiers_study import TiersConfig, run_tiers_study  # noqa: E402


def config_for(args, workdir: Path) -> TiersConfig:
    base = dict(work_s=25.0, repeats=1, replicas=100) if args.quick else {}
    base = overrides(args, base, (*CLOCK_FIELDS, "grace_s"))
    return TiersConfig(workdir=workdir, **base)


def main(argv=None) -> int:
    p = study_parser(
        __doc__.splitlines()[0],
        REPO / "reports" / "closed-loop-tiers.md",
        quick="one repeat of a short job (minutes)",
        mtbf="mean of the failure clock, every class, s",
        repeats="failure schedules (every policy runs each)",
        epilog="Example: python experiments/closed_loop_tiers.py --quick --workdir /tmp/tiers",
    )
    p.add_argument("--grace-s", type=float, help="preemption grace period, seconds")
    args = p.parse_args(argv)
    if render_only(p, args, render_figures):
        return 0
    if args.reuse and args.workdir is None:
        p.error("--reuse needs --workdir (the runs to re-account)")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="closed-loop-tiers-") as tmp:
        workdir = args.workdir or Path(tmp)
        study = run_tiers_study(
            config_for(args, workdir), progress=lambda m: print(m, flush=True), reuse=args.reuse
        )
    argv_shown = sys.argv[1:] if argv is None else argv
    command = ("python experiments/closed_loop_tiers.py " + shlex.join(argv_shown)).strip()
    elapsed = None if args.reuse else time.monotonic() - t0
    made = workdir / "run.json"  # how the runs were made, for a later --reuse to say
    if not args.reuse and workdir.exists():
        made.write_text(json.dumps({"command": command, "elapsed_s": elapsed}))
    if args.reuse and made.exists():
        first = json.loads(made.read_text())
        command = f"{first['command']}` (re-accounted by `{command}"
        elapsed = first["elapsed_s"]
    out = write_report(study, args.out, args.out.parent / "figures", command=command,
                       elapsed_s=elapsed)  # fmt: skip
    s = summarise(study)
    print(
        f"wrote {out}: replay error (own parameters) max "
        f"{s['df'].own_err.abs().max() * 100:.1f} %; bit-exact {int(s['df'].bit_exact.sum())} "
        f"of {len(s['df'])}; verdicts {s['verdicts']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
