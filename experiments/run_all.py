"""Regenerate every report in reports/ (``make reports``): each study in turn."""

from __future__ import annotations

import importlib
import sys
import time

# bench_checkpoint (~9 min of disk writes), closed_loop (~20 min of real training) and
# closed_loop_tiers (~35 min) are run on their own: `python -m experiments.bench_checkpoint`,
# `python -m experiments.closed_loop`, `python -m experiments.closed_loop_tiers`.
STUDIES = (
    "titan_fit",
    "lanl_fit",
    "example_log",
    "daly_validation",
    "llama3_scale",
    "llama3_calibration",
    "presets_check",
    "titan_trace",
    "async_vs_sync",
    "tiers",
    "scaling",
    "age_aware",
    "sweep_benchmark",
    "precision_quality",
)


def main(argv: list[str] | None = None) -> int:
    names = argv if argv else list(STUDIES)
    unknown = [n for n in names if n not in STUDIES]
    if unknown:
        print(
            f"run_all: error: unknown study {unknown[0]!r} ({', '.join(STUDIES)})", file=sys.stderr
        )
        return 2
    for name in names:
        start = time.perf_counter()
        print(f"== {name}", flush=True)
        importlib.import_module(f"experiments.{name}").main()
        print(f"== {name} done in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
