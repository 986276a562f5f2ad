"""Closed-form checkpoint intervals and expected wall time for exponential failures.

Notation (all seconds, all functions vectorised over numpy arrays):
``delta`` — checkpoint cost δ (the training stall of one save), ``mtbf`` — system mean time
between failures M, ``restart`` — restart cost R, ``tau`` — compute time between saves τ,
``solve`` — failure-free solve time Ts.

Sources:
- J. W. Young, "A first order approximation to the optimum checkpoint interval",
  CACM 17(9), 1974: τ = sqrt(2 δ M).
- J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
  Future Generation Computer Systems 22(3), 2006: the first-order τ = sqrt(2 δ (M + R)), the
  higher-order τ below, and the expected wall time T_w, whose exact minimiser in τ is
  τ* = M · (1 + W₀(−e^(−1 − δ/M))) with W₀ the principal branch of Lambert's W.
"""

from __future__ import annotations

import numpy as np
from scipy.special import lambertw

__all__ = [
    "daly_first_order_interval",
    "daly_interval",
    "daly_wall_time",
    "optimal_interval",
    "refreshed_age_s",
    "refreshed_interval",
    "refreshed_saves_per_s",
    "tier_first_order",
    "waste_fraction",
    "young_interval",
]


def _arrays(*values):
    out = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in values))
    return out if len(out) > 1 else out[0]


def _scalar_or_array(x):
    return x.item() if np.ndim(x) == 0 else x


def young_interval(delta, mtbf):
    """Young (1974): τ = sqrt(2 δ M)."""
    delta, mtbf = _arrays(delta, mtbf)
    return _scalar_or_array(np.sqrt(2.0 * delta * mtbf))


def daly_first_order_interval(delta, mtbf, restart):
    """Daly's first-order estimate: τ = sqrt(2 δ (M + R))."""
    delta, mtbf, restart = _arrays(delta, mtbf, restart)
    return _scalar_or_array(np.sqrt(2.0 * delta * (mtbf + restart)))


def daly_interval(delta, mtbf):
    """Daly (2006) higher-order estimate, eq. (37).

    τ = sqrt(2 δ M)·[1 + (1/3)·sqrt(δ/2M) + (1/9)·(δ/2M)] − δ for δ < 2M, and τ = M otherwise.
    """
    delta, mtbf = _arrays(delta, mtbf)
    x = delta / (2.0 * mtbf)
    series = np.sqrt(2.0 * delta * mtbf) * (1.0 + np.sqrt(x) / 3.0 + x / 9.0) - delta
    return _scalar_or_array(np.where(delta < 2.0 * mtbf, series, mtbf))


def daly_wall_time(tau, delta, mtbf, restart, solve):
    """Daly's expected wall time: T_w = M·e^(R/M)·(e^((τ+δ)/M) − 1)·Ts/τ.

    Exact for exponential failures that may strike during compute, checkpoint and restart,
    with the last segment counted as a full τ.
    """
    tau, delta, mtbf, restart, solve = _arrays(tau, delta, mtbf, restart, solve)
    # expm1 keeps precision when τ + δ << M (the usual regime on large clusters). When
    # (τ + δ)/M passes ~700 the expected wall time is +inf, which is the right limit.
    with np.errstate(over="ignore"):
        wall = mtbf * np.exp(restart / mtbf) * np.expm1((tau + delta) / mtbf) * solve / tau
    return _scalar_or_array(wall)


def optimal_interval(delta, mtbf):
    """The exact minimiser of ``daly_wall_time`` over τ: M·(1 + W₀(−e^(−1−δ/M))).

    Setting dT_w/dτ = 0 gives e^((τ+δ)/M)·(1 − τ/M) = 1; with u = 1 − τ/M this is
    −u·e^(−u) = −e^(−1−δ/M), so −u is Lambert's W₀ of the right-hand side. R only scales
    T_w, so it does not move the optimum.
    """
    delta, mtbf = _arrays(delta, mtbf)
    return _scalar_or_array(mtbf * _optimal_fraction(delta / mtbf))


def _optimal_fraction(x):
    """τ*/M as a function of x = δ/M: the root a ∈ (0, 1) of −a − ln(1 − a) = x.

    For δ << M the Lambert-W argument sits next to the branch point −1/e, where 1 + W₀ is
    a difference of nearly equal numbers and loses about log10(M/δ) digits (relative error
    ~1e-5 at δ/M = 1e-12). So the W₀ value (or, very near the branch point, its series) is
    only the start: two Newton steps on the well-conditioned equation above restore full
    precision.
    """
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a = 1.0 + lambertw(-np.exp(-1.0 - x), 0).real
        # Series of 1 + W₀ about the branch point in p = sqrt(2(1 + e·z)) (Corless et al. 1996).
        p = np.sqrt(-2.0 * np.expm1(-x))
        series = p * (1.0 + p * (-1.0 / 3.0 + p * (11.0 / 72.0 - p * 43.0 / 540.0)))
        a = np.where(x < 1e-4, series, a)
        # Newton only where a stays well inside (0, 1); for x >= 1 W₀ is far from its branch
        # point and already exact, while 1 − a underflows as x grows.
        refine = (x > 0) & (x < 1.0)
        for _ in range(2):
            a_in = np.clip(a, 1e-300, 0.9)
            step = (_phi(a_in) - x) * (1.0 - a_in) / a_in  # φ'(a) = a / (1 − a)
            a = np.where(refine, a_in - step, a)
    return a


def _phi(a):
    """−a − ln(1 − a) = Σ_{k≥2} aᵏ/k, summed as a series for small a to avoid cancellation."""
    direct = -a - np.log1p(-a)
    small = np.minimum(a, 0.1)
    # Horner form of a²·Σ_{k=2}^{21} a^(k−2)/k; the first dropped term is below 1e-20 relative.
    acc = np.zeros_like(small)
    for k in range(21, 1, -1):
        acc = acc * small + 1.0 / k
    return np.where(a < 0.1, small * small * acc, direct)


def waste_fraction(tau, delta, mtbf, restart):
    """Fraction of wall time not spent on useful work: 1 − Ts / T_w (independent of Ts)."""
    wall_per_work = daly_wall_time(tau, delta, mtbf, restart, 1.0)
    return _scalar_or_array(1.0 - 1.0 / np.asarray(wall_per_work))


def tier_first_order(costs_s, rates_per_s, restart_cost_per_s=0.0):
    """First-order optimum of k checkpoint tiers: (intervals τℓ, waste fraction).

    Benoit, Cavelan, Le Fèvre, Robert, Sun, "Towards optimal multi-level checkpointing",
    IEEE TC 66(7), 2017; Di, Robert, Vivien, Cappello, "Toward an optimal online checkpoint
    solution under a two-level HPC checkpoint model", IEEE TPDS 28(1), 2017.
    ``costs_s[ℓ]`` is Cℓ, the training stall of one save to tier ℓ; ``rates_per_s[ℓ]`` is λℓ,
    the rate of the failures for which ℓ is the cheapest tier that survives them. Tier ℓ is
    saved every τℓ = sqrt(2 Cℓ / λℓ) seconds of compute (infinite when λℓ = 0: only the job's
    final save goes there), and the waste is Σℓ sqrt(2 λℓ Cℓ) plus ``restart_cost_per_s``
    (Σ_c λ_c · recovery_c: detection, restart, restore), as a fraction of wall time.

    Assumptions (why it is first order): failures are Poisson (exponential) with Cℓ ≪ 1/λℓ
    and recovery ≪ 1/λ, so at most one failure strikes a period and none strikes a save or a
    recovery; a failure loses on average half the period of the tier it needs; the tiers'
    periods are far apart, so the restore points that costlier tiers add for a cheaper tier's
    failures (a costlier save also serves them) are neglected, as is the cost of saves that
    fall together; saves are blocking (an async save counts its stall, its write is assumed to
    finish before the next failure). Second-order terms are O(λℓ Cℓ).
    """
    costs, rates = _arrays(costs_s, rates_per_s)
    if np.any(~np.isfinite(costs) | (costs <= 0)) or np.any(~np.isfinite(rates) | (rates < 0)):
        from simulator.errors import InputError

        raise InputError(
            f"tier costs must be positive seconds and rates non-negative per second, "
            f"got {costs.tolist()!r} and {rates.tolist()!r}"
        )
    with np.errstate(divide="ignore"):
        tau = np.sqrt(2.0 * costs / rates)
    waste = float(np.sum(np.sqrt(2.0 * rates * costs)) + float(restart_cost_per_s))
    return tau, waste


# A tier that also gets a copy at Poisson times of rate ρ, each restarting its interval (a
# just-in-time save written into it after another class's failure, ``model.tiers.refreshed_by``):
# the gaps between its copies are X = min(τ, E), E ~ Exp(ρ). With ρ = 0 these are the plain
# first-order terms (τ/2, 1/τ, Young); with τ = inf only the refreshes give copies.


def refreshed_age_s(tau, refresh):
    """Expected work since the tier's newest copy when a failure strikes, seconds:
    E[X²] / (2 E[X]) = (1 − x/(eˣ − 1)) / ρ with x = ρτ (τ/2 when ρ = 0, 1/ρ when τ = inf)."""
    tau, rho = _arrays(tau, refresh)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        x = rho * tau
        # 1 − x/(eˣ − 1) = x/2 − x²/12 + x⁴/720 − …: its series where the difference cancels.
        small = x * (0.5 - x * (1.0 / 12.0 - x * x / 720.0))
        share = np.where(x < 1e-3, small, 1.0 - x / np.expm1(x))
        out = np.where(rho > 0, np.where(np.isinf(tau), 1.0 / rho, share / rho), tau / 2.0)
    return _scalar_or_array(out)


def refreshed_saves_per_s(tau, refresh):
    """Scheduled saves per second of compute: P(E > τ) / E[X] = ρ / (e^(ρτ) − 1) (1/τ when
    ρ = 0; none when τ = inf)."""
    tau, rho = _arrays(tau, refresh)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.where(rho > 0, rho / np.expm1(rho * tau), 1.0 / tau)
    return _scalar_or_array(out)


def refreshed_interval(cost_s, rate_per_s, refresh):
    """First-order optimum interval of a refreshed tier: the τ minimising
    C·ρ/(e^(ρτ) − 1) + λ·age(τ, ρ), its stalls (``refreshed_saves_per_s``) and the work its
    failures lose (``refreshed_age_s``), C the save stall and λ the rate of the failures that
    roll back to it. Setting the derivative to zero gives e^x·(1 + a − x) = 1 for x = ρτ and
    a = Cρ²/λ: Daly's equation (``optimal_interval``) for x − a at δ/M = a, so
    τ = (a + τ*/M(a)) / ρ. As ρ → 0 this is Young's sqrt(2C/λ); with λ = 0, inf."""
    cost, rate, rho = _arrays(cost_s, rate_per_s, refresh)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = cost * rho * rho / rate
        out = np.where(rho > 0, (a + _optimal_fraction(a)) / rho, np.sqrt(2.0 * cost / rate))
        out = np.where(rate > 0, out, np.inf)
    return _scalar_or_array(out)
