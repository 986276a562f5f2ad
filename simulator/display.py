"""How numbers read in front of a person: money and durations, the same everywhere.

Records and tables keep seconds and dollars as plain floats; these turn one into the text a
reader sees in the CLI's human output, the reports' tables and the figures' axes and legends,
so a figure's number reads exactly as the text's. Dependency-free (no pandas, no numpy), so
the CLI can import it without paying for the analysis stack.
"""

from __future__ import annotations

import math

__all__ = [
    "HUGE_HOURS",
    "HUGE_USD",
    "format_duration",
    "format_hours",
    "format_percent",
    "format_steps",
    "format_usd",
]

# Beyond these, numbers print in scientific notation: 1.8e+296 h, not 300 digits of commas.
HUGE_HOURS = 1e7
HUGE_USD = 1e12


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless n is 1: "1 GPU", "16,384 GPUs", "0 failures"."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def format_usd(usd: float) -> str:
    """Money as a reader writes it: ``$49,820,000``, ``-$3,827``; ``$1.8e+13`` from a trillion
    up (never a 300-digit number); ``> $1e308`` for an unbounded cost, ``—`` for NaN.

    Whole dollars, thousands separated: the one money format of the CLI's human output, the
    reports' tables and the figures' axes and legends, so a figure's number reads as the text's.
    """
    usd = float(usd)
    if math.isnan(usd):
        return "—"
    if math.isinf(usd):
        return "> $1e308" if usd > 0 else "< -$1e308"
    if abs(usd) >= HUGE_USD:
        text = f"${abs(usd):.3g}"
    else:
        text = f"${abs(usd):,.0f}"
    return "-" + text if round(usd) < 0 else text


def format_duration(seconds: float) -> str:
    """A duration in the unit a reader thinks in: ``45 s``, ``18.6 min``, ``1.50 h``, ``2,000 h``;
    ``3e+11 h`` past ten million hours, ``> 1e308 s`` for an unbounded one, ``n/a`` for NaN.

    The one format of the CLI's intervals and the figures' legends (never raw ``interval_s``).
    """
    seconds = float(seconds)
    if not math.isfinite(seconds):
        return "> 1e308 s" if seconds > 0 else "n/a"
    if 0 < abs(seconds) < 1e-3:
        return f"{seconds:.2g} s"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 100 * 3600:
        return f"{seconds / 3600:.2f} h"
    hours = seconds / 3600
    return f"{hours:.3g} h" if hours >= HUGE_HOURS else f"{hours:,.0f} h"


def format_hours(hours: float) -> str:
    """Hours of wall time: ``12.5 h``, ``2,000 h``; ``3e+11 h`` past ten million hours."""
    hours = float(hours)
    if not math.isfinite(hours):
        return "> 1e308 h" if hours > 0 else "n/a"
    if abs(hours) >= HUGE_HOURS:
        return f"{hours:.3g} h"
    return f"{hours:,.1f} h" if abs(hours) < 1000 else f"{hours:,.0f} h"


def format_percent(fraction: float) -> str:
    """A fraction as a percentage with two decimals: ``14.70%``; ``n/a`` when not finite."""
    return f"{100 * fraction:.2f}%" if math.isfinite(fraction) else "n/a"


def format_steps(steps: float) -> str:
    """A number of training steps: ``1,250``; ``< 1`` for a fraction of one."""
    if steps < 1:
        return "< 1"
    return f"{round(steps):,}" if steps < 1e9 else f"{steps:.3g}"
