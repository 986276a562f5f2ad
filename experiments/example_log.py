"""Write ``experiments/logs/lanl-system20.csv``: the failure log the README's quick start fits.

Run from the repository root:  ``.venv/bin/python -m experiments.example_log``

It is LANL system 20's rows of the committed derived table (``simulator/data/
lanl_failures.csv.gz``; provenance in ``simulator/data/PROVENANCE.md``) in the shape a user's
own log has: one row per failure with its time, the node, the cause and the down time in
minutes. Rerun it, never edit the file by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

from simulator.fitting import lanl

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "logs" / "lanl-system20.csv"
SYSTEM = 20


def main(argv: list[str] | None = None) -> int:
    table = lanl.load_table()
    rows = table[table["system"] == SYSTEM][["start", "node", "cause", "down_min"]].copy()
    rows["node"] = rows["node"].astype(int)
    rows = rows.sort_values(["start", "node"], kind="stable")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(OUT, index=False)
    print(f"wrote {OUT.relative_to(ROOT)} ({len(rows):,} failures)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
