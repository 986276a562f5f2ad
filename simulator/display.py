"""How numbers read in front of a person: money and durations, the same everywhere.

Records and tables keep seconds and dollars as plain floats; these turn one into the text a
reader sees in the CLI's human output, the reports' tables and the figures' axes and legends,
so a figure's number reads exactly as the text's. Dependency-free (no pandas, no numpy), so
the CLI can import it without paying for the analysis stack.
"""

from __future__ import annotations

import math

__all__ = ["format_duration", "format_usd"]


def format_usd(usd: float) -> str:
    """Money as a reader writes it: ``$49,820,000``, ``-$3,827``; ``inf`` and ``—`` (NaN).

    Whole dollars, thousands separated: the one money format of the CLI's human output, the
    reports' tables and the figures' axes and legends, so a figure's number reads as the text's.
    """
    usd = float(usd)
    if math.isnan(usd):
        return "—"
    if math.isinf(usd):
        return "inf" if usd > 0 else "-inf"
    text = f"${abs(usd):,.0f}"
    return "-" + text if round(usd) < 0 else text


def format_duration(seconds: float) -> str:
    """A duration in the unit a reader thinks in: ``45 s``, ``18.6 min``, ``1.50 h``, ``2,000 h``.

    The one format of the CLI's intervals and the figures' legends (never raw ``interval_s``).
    """
    seconds = float(seconds)
    if not math.isfinite(seconds):
        return "inf"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 100 * 3600:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 3600:,.0f} h"
