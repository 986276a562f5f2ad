"""Write ``experiments/logs/lanl-system20.csv``, the failure log the README's quick start fits,
and ``experiments/scenarios/lanl-system20-classes.toml``, its class mix.

Run from the repository root:  ``.venv/bin/python -m experiments.example_log``

It is LANL system 20's rows of the committed derived table (``simulator/data/
lanl_failures.csv.gz``; provenance in ``simulator/data/PROVENANCE.md``) in the shape a user's
own log has: one row per failure with its time, the node, the cause and the down time in
minutes. The scenario is what ``ckptsim fit LOG --repair-unit min --scenario-out FILE`` writes
from it (``CLASSES_ARGS``): one failure class per cause, each with its fitted lifetime and its
mean fitted down time as its restart. Rerun it, never edit either file by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

from simulator.fitting import lanl

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "logs" / "lanl-system20.csv"
SCENARIO = ROOT / "experiments" / "scenarios" / "lanl-system20-classes.toml"
SYSTEM = 20
CLASSES_ARGS = ["--repair-unit", "min"]


def main(argv: list[str] | None = None) -> int:
    table = lanl.load_table()
    rows = table[table["system"] == SYSTEM][["start", "node", "cause", "down_min"]].copy()
    rows["node"] = rows["node"].astype(int)
    rows = rows.sort_values(["start", "node"], kind="stable")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(OUT, index=False)
    print(f"wrote {OUT.relative_to(ROOT)} ({len(rows):,} failures)", file=sys.stderr)
    return write_classes()


def write_classes() -> int:
    """The class-mix scenario, by the command a user runs (paths relative to the repository,
    so its header names the committed log)."""
    import contextlib
    import io
    import os

    from simulator.cli import main as cli

    here = Path.cwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            code = cli(["fit", str(OUT.relative_to(ROOT)), *CLASSES_ARGS,
                        "--scenario-out", str(SCENARIO.relative_to(ROOT))])  # fmt: skip
    finally:
        os.chdir(here)
    if code == 0:
        print(f"wrote {SCENARIO.relative_to(ROOT)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
