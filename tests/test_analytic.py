"""Closed forms against Daly (FGCS 2006), Table 1: δ = 5 min, R = 10 min."""

import pytest

from simulator import analytic

MIN = 60.0


# The paper rounds to the digits shown, so each value must agree to half its last digit.
@pytest.mark.parametrize(
    ("mtbf_min", "published_min", "half_digit"),
    [(24 * 60, 117, 0.5), (6 * 60, 57, 0.5), (15, 9.1, 0.05)],
)
def test_daly_higher_order_matches_published_table(mtbf_min, published_min, half_digit):
    tau = analytic.daly_interval(5 * MIN, mtbf_min * MIN) / MIN
    assert tau == pytest.approx(published_min, abs=half_digit)
