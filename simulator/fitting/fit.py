"""Fitting lifetime distributions to right-censored failure data by maximum likelihood.

A component that is still running (or was retired for another reason) when observation stops
tells us only that its lifetime exceeds the time seen: it is *right-censored*. Its likelihood
term is the survival ``S(t)`` rather than the density ``f(t)``, so the log-likelihood is
``sum(log f(t_i) for failures) + sum(log S(t_j) for censored)``. Dropping the censored units,
or counting their end of observation as a failure, biases the fitted lifetimes short.

``fit_lifetime`` fits one family (exponential in closed form: events / exposure; Weibull and
lognormal by minimising the negative log-likelihood over log-parameters), with 95% confidence
intervals from the observed information (numerical Hessian on the log scale, Wald intervals
mapped back, so they stay positive). ``fit_all`` ranks families by AIC = 2k - 2 log L.
``km_check`` measures each fit against the Kaplan–Meier estimate (scipy.stats.ecdf on the
censored data): the largest gap between the two survival curves and the share of failure
times at which the fit lies inside Kaplan–Meier's 95% band. ``failure_spec`` turns a fit into
the scenario's ``failure`` string (the mean goes in ``gpu_mtbf_h`` or ``mtbf_h``).

``fit_log`` fits a whole ``faillog.FailureLog``: every family that can be fitted (one that
cannot, e.g. a Weibull on failures all of one length, is skipped with the reason), per cause
(a cause with too few failures is skipped, said, and still counts overall) and for repairs.
``extrapolation`` flags a best fit whose mean lies more than ``PLAUSIBLE_FACTOR`` times from
the log's own mean (exposure over failures, the exponential MLE) or past that many times the
longest time observed; ``scenario_from_fit`` then writes the best family whose mean the log
supports, and says which it passed over and why.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import optimize, special, stats

from simulator.errors import InputError
from simulator.model.failures import Exponential, Lifetime, LogNormal, Weibull

__all__ = [
    "FAMILIES",
    "PLAUSIBLE_FACTOR",
    "FitResult",
    "best_fit",
    "cause_classes",
    "describe_extrapolation",
    "extrapolation",
    "failure_spec",
    "fit_all",
    "fit_lifetime",
    "fit_log",
    "fits_table",
    "km_check",
    "plot_survival",
    "scenario_from_fit",
]

FAMILIES = ("exponential", "weibull", "lognormal")
_Z95 = stats.norm.ppf(0.975)
_HOUR = 3600.0
_KM_MIN_AT_RISK = 10


@dataclass(frozen=True, kw_only=True)
class FitResult:
    """One fitted lifetime family."""

    family: str
    """``exponential``, ``weibull`` or ``lognormal``."""
    params: dict[str, float]
    """Fitted parameters: ``mean_s``; ``shape`` and ``scale_s``; or ``sigma`` and ``scale_s``."""
    lifetime: Lifetime
    """The fitted distribution, ready for the simulator."""
    log_likelihood: float
    """Maximised log-likelihood (densities per second)."""
    aic: float
    """Akaike information criterion, 2k - 2 log L (lower is better)."""
    n: int
    """Units observed."""
    n_events: int
    """Units whose observation ended in a failure (the rest are censored)."""
    ci95: dict[str, tuple[float, float]] = field(default_factory=dict)
    """95% confidence interval per parameter, and for ``mean_s``."""

    @property
    def mean_s(self) -> float:
        return self.lifetime.mean_s

    def to_dict(self) -> dict:
        """A JSON-ready summary (the lifetime is described, not serialised)."""
        data = asdict(self)
        data["lifetime"] = self.lifetime.describe()
        data["mean_s"] = self.mean_s
        data["ci95"] = {k: list(v) for k, v in self.ci95.items()}
        return data

    def table(self) -> str:
        """The parameters and their 95% intervals as a Markdown table."""
        rows = ["| parameter | estimate | 95% CI |", "| --- | ---: | ---: |"]
        values = {**self.params, "mean_s": self.mean_s}
        for name, value in values.items():
            lo, hi = self.ci95.get(name, (math.nan, math.nan))
            rows.append(f"| {name} | {value:.4g} | {lo:.4g} – {hi:.4g} |")
        return "\n".join(rows)


# -- input checks --------------------------------------------------------------------------------
def _check(durations_s, observed) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(durations_s, dtype=float).ravel()
    obs = np.asarray(observed).ravel()
    if t.size != obs.size:
        raise InputError(
            f"durations_s and observed differ in length ({t.size} vs {obs.size} units)"
        )
    if t.size == 0:
        raise InputError("durations_s is empty: need at least one unit's time in seconds")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise InputError("every lifetime must be a positive, finite duration")
    if obs.dtype != bool:
        if not np.all(np.isin(obs, (0, 1))):
            raise InputError("observed must be booleans (True = failed, False = censored)")
        obs = obs.astype(bool)
    if not obs.any():
        raise InputError("no failures among the units (all censored): nothing to fit")
    return t, obs


# -- per-family negative log-likelihoods, in units of t_ref ---------------------------------------
def _nll_weibull(theta, u, obs):
    k, lam = np.exp(theta)
    z = u / lam
    zk = z**k
    log_f = np.log(k / lam) + (k - 1.0) * np.log(z) - zk
    return -(np.sum(log_f[obs]) - np.sum(zk[~obs]))


def _nll_lognormal(theta, u, obs):
    sigma, scale = np.exp(theta)
    z = (np.log(u) - np.log(scale)) / sigma
    log_f = stats.norm.logpdf(z) - np.log(sigma * u)
    return -(np.sum(log_f[obs]) + np.sum(stats.norm.logsf(z[~obs])))


def _weibull_mean(theta):
    k, lam = np.exp(theta)
    return lam * special.gamma(1.0 + 1.0 / k)


def _lognormal_mean(theta):
    sigma, scale = np.exp(theta)
    return scale * np.exp(0.5 * sigma * sigma)


def _hessian(f, x, h=1e-4):
    """Central-difference Hessian of a scalar function (a few parameters, so plain loops)."""
    x = np.asarray(x, dtype=float)
    n = x.size
    hess = np.empty((n, n))
    eye = np.eye(n) * h
    for i in range(n):
        for j in range(i, n):
            fpp = f(x + eye[i] + eye[j])
            fpm = f(x + eye[i] - eye[j])
            fmp = f(x - eye[i] + eye[j])
            fmm = f(x - eye[i] - eye[j])
            hess[i, j] = hess[j, i] = (fpp - fpm - fmp + fmm) / (4 * h * h)
    return hess


def _gradient(f, x, h=1e-5):
    x = np.asarray(x, dtype=float)
    return np.array([(f(x + e) - f(x - e)) / (2 * h) for e in np.eye(x.size) * h])


_LOG_MAX = math.log(np.finfo(float).max)


def _log_ci(log_value: float, se: float) -> tuple[float, float]:
    if not math.isfinite(se):
        return (math.nan, math.nan)
    # A band so wide its upper end passes the largest float is unbounded above, not an error.
    lo, hi = log_value - _Z95 * se, log_value + _Z95 * se
    return (math.exp(min(lo, _LOG_MAX)), math.exp(hi) if hi < _LOG_MAX else math.inf)


def _fit_exponential(t, obs) -> FitResult:
    events, exposure = int(obs.sum()), float(t.sum())
    mean = exposure / events
    loglik = -events * math.log(mean) - exposure / mean
    # Observed information of log(mean) is the event count.
    ci = _log_ci(math.log(mean), 1.0 / math.sqrt(events))
    return FitResult(
        family="exponential",
        params={"mean_s": mean},
        lifetime=Exponential(mean),
        log_likelihood=loglik,
        aic=2.0 - 2.0 * loglik,
        n=t.size,
        n_events=events,
        ci95={"mean_s": ci},
    )


_TWO_PARAM = {
    # family: (nll, mean on the t_ref scale, parameter names, factory from (p0, scale_s))
    "weibull": (_nll_weibull, _weibull_mean, ("shape", "scale_s"), Weibull),
    "lognormal": (_nll_lognormal, _lognormal_mean, ("sigma", "scale_s"), LogNormal),
}


def _start(family: str) -> np.ndarray:
    # Near the exponential fit (mean 1 on the t_ref scale): Weibull shape 1 and scale 1;
    # lognormal sigma 1 and scale e^{-1/2}, whose mean is 1.
    return np.array([0.0, 0.0]) if family == "weibull" else np.array([0.0, -0.5])


def _fit_two_param(family, t, obs) -> FitResult:
    if np.unique(t[obs]).size < 2:
        raise InputError(
            f"a {family} fit needs failures at two or more different durations (all failures "
            "in this log lasted the same time)"
        )
    nll, mean_fn, names, factory = _TWO_PARAM[family]
    # Work in units of the exponential mean so both log-parameters start near zero.
    t_ref = t.sum() / obs.sum()
    u = t / t_ref

    def objective(theta):
        # Trial steps far from the optimum overflow to an infinite NLL, which the optimiser
        # simply rejects; the warnings would only be noise.
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            value = nll(theta, u, obs)
        return value if np.isfinite(value) else np.inf

    best = optimize.minimize(objective, _start(family), method="BFGS")
    if not best.success:
        # BFGS stalls on flat or badly scaled likelihoods; polish from where it stopped.
        polished = optimize.minimize(objective, best.x, method="Nelder-Mead")
        best = polished if polished.fun <= best.fun else best
    if not np.isfinite(best.fun) or not np.all(np.isfinite(best.x)):
        raise InputError(f"the {family} fit did not converge on these durations_s")
    theta = best.x
    hess = _hessian(objective, theta)
    try:
        cov = np.linalg.inv(hess)
        se = np.sqrt(np.where(np.diag(cov) > 0, np.diag(cov), np.nan))
    except np.linalg.LinAlgError:
        cov, se = None, np.array([np.nan, np.nan])
    p0, scale_u = np.exp(theta)
    scale_s = scale_u * t_ref

    def log_mean(th):
        try:
            return math.log(mean_fn(th))
        except (OverflowError, ValueError):
            return math.inf

    if cov is not None:
        g = _gradient(log_mean, theta)
        se_mean = math.sqrt(max(float(g @ cov @ g), 0.0))
    else:
        se_mean = math.nan
    try:
        mean_u = float(mean_fn(theta))
        lifetime = factory(float(p0), float(scale_s))
        finite = math.isfinite(mean_u * t_ref) and math.isfinite(lifetime.mean_s)
    except (OverflowError, InputError):
        finite = False
    if not finite:
        raise InputError(
            f"the {family} fit's mean overflows a float on these durations_s (they span too "
            "many orders of magnitude for it)"
        )
    ci = {
        names[0]: _log_ci(theta[0], se[0]),
        names[1]: tuple(float(v * t_ref) for v in _log_ci(theta[1], se[1])),
        "mean_s": tuple(float(v * t_ref) for v in _log_ci(math.log(mean_u), se_mean)),
    }
    # Back to densities per second: each failure's density picks up a factor 1/t_ref.
    loglik = -float(best.fun) - obs.sum() * math.log(t_ref)
    return FitResult(
        family=family,
        params={names[0]: float(p0), names[1]: float(scale_s)},
        lifetime=lifetime,
        log_likelihood=loglik,
        aic=4.0 - 2.0 * loglik,
        n=t.size,
        n_events=int(obs.sum()),
        ci95=ci,
    )


def fit_lifetime(durations_s, observed, family: str) -> FitResult:
    """Maximum-likelihood fit of one family to right-censored lifetimes (seconds).

    ``observed[i]`` is True when unit i failed at ``durations_s[i]``, False when it was still
    alive then (censored).
    """
    if family not in FAMILIES:
        raise InputError(f"unknown lifetime family {family!r}; use one of {', '.join(FAMILIES)}")
    t, obs = _check(durations_s, observed)
    if family == "exponential":
        return _fit_exponential(t, obs)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _fit_two_param(family, t, obs)


def fit_all(durations_s, observed, families=FAMILIES) -> list[FitResult]:
    """Fits of each family, best (lowest AIC) first."""
    return sorted((fit_lifetime(durations_s, observed, f) for f in families), key=lambda r: r.aic)


def best_fit(durations_s, observed, families=FAMILIES) -> FitResult:
    """The family with the lowest AIC."""
    return fit_all(durations_s, observed, families)[0]


def km_check(durations_s, observed, fit: FitResult) -> dict[str, float]:
    """How far a fit's survival curve is from Kaplan–Meier's, at the observed failure times.

    ``max_gap``: the largest |S_KM(t) - S_fit(t)| while 10 or more units are at risk (a
    Kolmogorov-type distance; censoring makes its textbook p-value invalid, so none is given).
    ``in_band``: the share of failure times at which S_fit lies inside Kaplan–Meier's 95%
    pointwise confidence band.
    """
    t, obs = _check(durations_s, observed)
    km = stats.ecdf(stats.CensoredData(uncensored=t[obs], right=t[~obs])).sf
    with warnings.catch_warnings():
        # The band is undefined where KM reaches 0 or 1; those points are skipped below.
        warnings.simplefilter("ignore", RuntimeWarning)
        band = km.confidence_interval(0.95)
    x = km.quantiles
    fitted = np.asarray(fit.lifetime.survival(x), dtype=float)
    # Just before each failure time the KM curve still has its previous value.
    before = np.concatenate(([1.0], km.probabilities[:-1]))
    gap = np.maximum(np.abs(km.probabilities - fitted), np.abs(before - fitted))
    # Past the last few units at risk KM is a step of a few units' worth: noise, not misfit.
    at_risk = t.size - np.searchsorted(np.sort(t), x, side="left")
    gap = gap[at_risk >= min(_KM_MIN_AT_RISK, t.size)]
    lo, hi = band.low.probabilities, band.high.probabilities
    ok = np.isfinite(lo) & np.isfinite(hi)
    inside = (fitted[ok] >= lo[ok] - 1e-12) & (fitted[ok] <= hi[ok] + 1e-12)
    return {
        "max_gap": float(gap.max()),
        "in_band": float(inside.mean()) if inside.size else math.nan,
    }


def failure_spec(fit: FitResult) -> str:
    """The scenario ``failure`` string of a fit: its family and shape (the mean goes apart)."""
    if fit.family == "weibull":
        return f"weibull:shape={fit.params['shape']:.6g}"
    if fit.family == "lognormal":
        return f"lognormal:sigma={fit.params['sigma']:.6g}"
    return "exponential"


def fits_table(results: list[FitResult], time_unit_s: float = _HOUR, unit: str = "h") -> str:
    """A Markdown table comparing fits: parameters with 95% CIs, mean, log L, AIC, ΔAIC."""
    best = min(r.aic for r in results)
    rows = [
        f"| family | parameters (95% CI) | mean, {unit} (95% CI) | log L | AIC | ΔAIC |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for r in results:
        parts = []
        for name, value in r.params.items():
            lo, hi = r.ci95[name]
            if name.endswith("_s"):
                value, lo, hi = value / time_unit_s, lo / time_unit_s, hi / time_unit_s
                name = f"{name[:-2]}_{unit}"
            parts.append(f"{name} = {value:.4g} ({lo:.4g} – {hi:.4g})")
        lo, hi = (v / time_unit_s for v in r.ci95["mean_s"])
        rows.append(
            f"| {r.family} | {'; '.join(parts)} | {r.mean_s / time_unit_s:.4g} "
            f"({lo:.4g} – {hi:.4g}) | {r.log_likelihood:.1f} | {r.aic:.1f} | {r.aic - best:.1f} |"
        )
    return "\n".join(rows)


def plot_survival(
    durations_s,
    observed,
    fits: list[FitResult] = (),
    ax=None,
    time_unit_s: float = 365.25 * 86400,
    unit: str = "years",
    label: str = "Kaplan–Meier",
    color: str = "black",
):
    """Kaplan–Meier survival (with its 95% band) against the fitted survival curves."""
    t, obs = _check(durations_s, observed)
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(7, 4.5))
    data = stats.CensoredData(uncensored=t[obs], right=t[~obs])
    km = stats.ecdf(data).sf
    with warnings.catch_warnings():
        # Undefined where KM reaches 0 or 1 (as in km_check): those points are not drawn.
        warnings.simplefilter("ignore", RuntimeWarning)
        band = km.confidence_interval(0.95)
    x = km.quantiles / time_unit_s
    ax.step(x, km.probabilities, where="post", color=color, lw=1.5, label=label)
    ax.fill_between(
        x, band.low.probabilities, band.high.probabilities, step="post", color=color, alpha=0.2
    )
    grid = np.linspace(0.0, t.max(), 400)
    for fit in fits:
        ax.plot(
            grid / time_unit_s,
            fit.lifetime.survival(grid),
            lw=1.2,
            ls="--",
            label=f"{fit.family} fit",
        )
    ax.set_xlabel(f"service time, {unit}")
    ax.set_ylabel("fraction surviving")
    ax.legend()
    return ax


# -- a whole failure log ----------------------------------------------------------------
PLAUSIBLE_FACTOR = 3.0
"""How far a fitted mean may lie from what the log itself says before it counts as an
extrapolation: more than this many times the log's own mean time between failures (its
exposure over its failures, the exponential fit), or less than its inverse, or more than this
many times the longest time the log observed."""


def extrapolation(fit: FitResult, durations_s, observed) -> dict | None:
    """Why a fit's mean is not one the log supports, or None when it is (see
    ``PLAUSIBLE_FACTOR``): ``reason`` (``rate`` or ``window``), ``mean_s``, ``log_mean_s``
    (exposure / failures), ``ratio`` and ``window_s`` (the longest time observed).

    The exponential fit *is* the log's own rate, so it is checked against the window only.
    """
    t = np.asarray(durations_s, dtype=float)
    obs = np.asarray(observed, dtype=bool)
    events = int(obs.sum())
    if not events:
        return None
    log_mean = float(t.sum()) / events
    window = float(t.max())
    ratio = fit.mean_s / log_mean
    out = {
        "family": fit.family,
        "mean_s": fit.mean_s,
        "log_mean_s": log_mean,
        "events": events,
        "exposure_s": float(t.sum()),
        "ratio": ratio,
        "window_s": window,
    }
    if fit.family != "exponential" and not (
        1 / PLAUSIBLE_FACTOR <= ratio <= PLAUSIBLE_FACTOR
    ):  # fmt: skip
        return {**out, "reason": "rate"}
    if fit.mean_s > PLAUSIBLE_FACTOR * window:
        return {**out, "reason": "window"}
    return None


def describe_extrapolation(x: dict, time_unit_s: float = _HOUR, unit: str = "h") -> str:
    """One line for a person: both numbers, in ``unit``."""
    mean, log_mean = x["mean_s"] / time_unit_s, x["log_mean_s"] / time_unit_s
    if x["reason"] == "rate":
        return (
            f"its mean, {mean:,.4g} {unit}, is {x['ratio']:,.3g}x the log's own "
            f"{log_mean:,.4g} {unit} ({x['events']:,} failures in "
            f"{x['exposure_s'] / time_unit_s:,.4g} {unit} of exposure)"
        )
    text = (
        f"its mean, {mean:,.4g} {unit}, is {x['mean_s'] / x['window_s']:,.3g}x the longest time "
        f"the log observed ({x['window_s'] / time_unit_s:,.4g} {unit})"
    )
    if x["family"] == "exponential":  # the log's own rate; only its shape is assumed
        text += ": the rate is the log's, the constant hazard past what was seen an assumption"
    return text


def _fit_block(durations_s, observed) -> dict:
    """Every family that can be fitted (the others in ``skipped`` with the reason), best
    first, each with its Kaplan-Meier distance; ``extrapolation`` for the best, if it is one."""
    fits, skipped = [], []
    for family in FAMILIES:
        try:
            fits.append(fit_lifetime(durations_s, observed, family))
        except InputError as exc:
            if family == "exponential":  # the log itself is unfit (no failures, ...)
                raise
            skipped.append({"family": family, "reason": str(exc)})
    fits.sort(key=lambda r: r.aic)
    rows = []
    for f in fits:
        rows.append(
            {
                "family": f.family,
                "params": {**f.params},
                "mean_s": f.mean_s,
                "aic": f.aic,
                "log_likelihood": f.log_likelihood,
                "ci95": {k: list(v) for k, v in f.ci95.items()},
                "km": km_check(durations_s, observed, f),
            }
        )
    block = {"fits": fits, "families": rows, "best": fits[0].family}
    if skipped:
        block["skipped_families"] = skipped
    extra = extrapolation(fits[0], durations_s, observed)
    if extra is not None:
        block["extrapolation"] = extra
    return block


def _repair_block(repair_s) -> dict | None:
    r = np.asarray(repair_s, float)
    r = r[np.isfinite(r) & (r > 0)]
    if r.size < 2 or np.unique(r).size < 2:
        return None
    block = _fit_block(r, np.ones(r.size, bool))
    block["events"] = int(r.size)
    return block


MIN_CAUSE_FAILURES = 2
"""A cause with fewer failures gets no fit of its own (it still counts in the overall fit)."""


def fit_log(log) -> dict:
    """Every family fitted to a ``faillog.FailureLog``: the dict ``ckptsim fit --json`` prints
    (with ``fits``, the ``FitResult`` objects, best first), per cause and for repairs too.

    A cause with fewer than ``MIN_CAUSE_FAILURES`` failures, or one no family can be fitted
    to, is left out of the per-cause fits and said in ``causes_skipped``; failures without a
    cause (blank) count in the overall fit only (``blank_causes``). A cause column of which no
    cause can be fitted (one class of one failure, say) is an ``InputError``: the per-cause
    fits it asks for cannot be given."""
    result = {
        "shape": log.shape,
        "columns": {k: str(v) for k, v in (log.columns or {}).items() if v is not None},
        "units": int(log.durations_s.size),
        "events": log.events,
        "censored": log.censored,
    }
    if log.components is not None:
        result["components"] = log.components
    if getattr(log, "notes", ()):
        result["notes"] = list(log.notes)
    block = _fit_block(log.durations_s, log.observed)
    result.update(block)
    if log.repair_s is not None:
        rep = _repair_block(log.repair_s)
        if rep is not None:
            result["repair"] = rep
    if log.causes is not None:
        named = np.array([c is not None for c in log.causes], dtype=bool)
        result["blank_causes"] = int((named == 0)[log.observed].sum())
        names, counts = np.unique(
            np.asarray([c for c in log.causes if c is not None], dtype=str), return_counts=True
        )
        causes, skipped = {}, {}
        for name, count in zip(names.tolist(), counts.tolist(), strict=True):
            if count < MIN_CAUSE_FAILURES:
                skipped[name] = (
                    f"{count} failure{'s' if count != 1 else ''}; a fit of its own needs "
                    f"{MIN_CAUSE_FAILURES} or more"
                )
                continue
            hit = np.asarray([c == name for c in log.causes])
            try:
                sub = _fit_block(log.durations_s, hit)
            except InputError as exc:
                skipped[name] = str(exc)
                continue
            sub["events"] = int(count)
            sub["censored"] = int(hit.size - count)
            if log.repair_s is not None and log.repair_causes is not None:
                rep = _repair_block(log.repair_s[log.repair_causes == name])
                if rep is not None:
                    sub["repair"] = rep
            causes[name] = sub
        if skipped and not causes:  # a cause column, and not one cause it can fit
            first = next(iter(skipped.items()))
            raise InputError(
                f"no cause in the log has a fit of its own (cause {first[0]!r}: {first[1]}"
                + (f"; and {len(skipped) - 1} more" if len(skipped) > 1 else "")
                + "): give --cause-column none to fit the log as a whole"
            )
        result["causes"] = causes
        if skipped:
            result["causes_skipped"] = skipped
    return result


def _simulable(fits, durations_s, observed):
    """The best fit (by AIC) that a simulation can sample and whose mean the data support (the
    exponential fit, the data's own rate, always does), and why each better one was passed
    over."""
    from simulator.model.failures import parse_failure

    skipped = []
    for best in fits:
        try:
            parse_failure(failure_spec(best), best.mean_s)
        except InputError as exc:
            skipped.append(f"no simulation can sample: {failure_spec(best)} ({exc})")
            continue
        extra = extrapolation(best, durations_s, observed)
        if extra is not None and best.family != "exponential":
            skipped.append(
                f"whose mean the log does not support: {failure_spec(best)} "
                f"({describe_extrapolation(extra)})"
            )
            continue
        return best, skipped
    # Only if the exponential fit itself cannot be sampled.
    raise InputError(
        "--scenario-out: no fitted family is one a simulation can sample ("
        + "; ".join(skipped)
        + "); try --failure empirical:FILE with this log instead"
    )


def scenario_from_fit(log, result: dict, *, name: str, gpus: int | None = None, **fixed) -> dict:
    """A scenario mapping from ``fit_log``'s best fit (validated as ``optimize`` would take
    it): ``mtbf_h`` for a system's gaps, else ``gpus`` units of one GPU each at ``gpu_mtbf_h``;
    ``fixed`` (checkpoint_s, restart_s, work_h) are laid over it where not None.

    The family written is the best by AIC that a simulation can sample and whose mean the log
    supports (``extrapolation``: the exponential fit, the log's own rate, always is); each
    better one passed over is named with the reason in ``result["scenario_fit"]``."""
    best, skipped = _simulable(result["fits"], log.durations_s, log.observed)
    result["scenario_fit"] = {"family": best.family, "skipped": [f"fit {p}" for p in skipped]}
    data: dict = {"name": name, "failure": failure_spec(best)}
    mean_h = best.mean_s / 3600.0
    if log.system_gaps:  # the fit is the job's own time between failures
        data["mtbf_h"] = mean_h
    else:
        gpus = gpus or log.components
        if gpus is None:
            raise InputError(
                "--scenario-out from a lifetimes log needs --gpus N, the number of units like "
                "the log's that the job runs on (each a node of one GPU at the fitted mean), "
                "e.g. --scenario-out mine.toml --gpus 1024"
            )
        # Each logged unit fails as a whole, so it is a node of one GPU.
        data.update(gpus=gpus, gpus_per_node=1, gpu_mtbf_h=mean_h)
    rep = result.get("repair")
    if rep is not None:
        r = np.asarray(log.repair_s, float)
        r = r[np.isfinite(r) & (r > 0)]
        chosen, passed = _simulable(rep["fits"], r, np.ones(r.size, bool))
        result["scenario_fit"]["repair_family"] = chosen.family
        result["scenario_fit"]["skipped"] += [f"repair fit {p}" for p in passed]
        data["repair_h"] = chosen.mean_s / 3600.0
        data["repair"] = failure_spec(chosen)
    data.update({k: v for k, v in fixed.items() if v is not None})
    if result.get("causes"):
        # One class per cause: the classes are the failure model, so the scenario's own
        # lifetime fields go (the scenario refuses both), its repair fields stay (spares).
        for key in ("failure", "mtbf_h", "gpu_mtbf_h"):
            data.pop(key, None)
        classes = cause_classes(
            log, result, system=log.system_gaps, restart_given=fixed.get("restart_s") is not None
        )
        data["failure_class"] = [table for table, _ in classes]
        result["scenario_fit"]["class_comments"] = [lines for _, lines in classes]
    from simulator.model.scenario import Scenario

    Scenario.from_mapping(data, source="--scenario-out")  # refuse a file optimize would refuse
    return data


OTHER_CLASS = "other"
"""The class of the failures whose cause has no fit of its own (too few, or blank)."""


def _class_name(cause: str, taken: set[str]) -> str:
    """A cause as a class name: as logged where the scenario takes it, else made one (a name
    may not hold ``=`` or end like a summary column), never one already taken."""
    from simulator.model.tiers import _name

    try:
        name = _name("failure_class", cause)
    except InputError:
        name = "cause_" + "".join(ch if ch.isalnum() else "_" for ch in cause).strip("_")
    base, i = name, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def _one_class(
    name, fits, durations_s, hit, repair_s, *, system: bool, restart_given: bool, rep=None
):
    """A ``[[failure_class]]`` table (and the comment lines that say where each number came
    from) from one cause's fits: its best simulable family at the level the log measured, and
    its mean fitted down time as its restart_s (``rep``: ``fit_log``'s fit of ``repair_s``,
    when it made one)."""
    best, _ = _simulable(fits, durations_s, hit)
    table: dict = {"name": name, "failure": failure_spec(best)}
    table["mtbf_h" if system else "gpu_mtbf_h"] = best.mean_s / 3600.0
    better = [f.family for f in fits[: fits.index(best)]]
    notes = [f"{best.family} fit" + (
        f" (passed over the better by AIC {', '.join(better)}: a mean the log does not support "
        "or a shape no simulation samples; `ckptsim fit` says which)" if better else ""
    )]  # fmt: skip
    if rep is None and repair_s is not None:
        rep = _repair_block(repair_s)
    if rep is not None:
        r = np.asarray(repair_s, float)
        r = r[np.isfinite(r) & (r > 0)]
        chosen, _ = _simulable(rep["fits"], r, np.ones(r.size, bool))
        mean_s = chosen.mean_s
        if restart_given:
            notes.append(
                f"its down time ({r.size:,} logged, {chosen.family} fit, mean {mean_s:,.0f} s) "
                "is not its restart_s: --restart-s gave every class the scenario's"
            )
        else:
            table["restart_s"] = float(mean_s)
            notes.append(
                f"restart_s = the mean of its {chosen.family} fit to its {r.size:,} logged down "
                "times: the time a failed node was down, standing in for the job's restart cost"
            )
    elif repair_s is not None:
        notes.append("too few down times logged for a fit of its own: the scenario's restart_s")
    return table, notes


def cause_classes(
    log, result: dict, *, system: bool, restart_given: bool = False
) -> list[tuple[dict, list[str]]]:
    """One ``[[failure_class]]`` table per cause with a fit of its own in ``fit_log``'s
    ``result`` (its best family whose mean the log supports, as ``gpu_mtbf_h`` per component, or
    ``mtbf_h`` for a system's gaps; ``restart_s`` the mean of its fitted down time, unless
    ``restart_given``), and one class, ``other``, pooling the failures of every cause without a
    fit of its own and those with a blank cause, so the classes' rates add up to the log's.

    Each table comes with the comment lines that say where its numbers came from, the share
    of the log's failures its class holds among them."""
    t = np.asarray(log.durations_s, float)
    causes = np.asarray(log.causes, dtype=object)
    total = int(np.asarray(log.observed, bool).sum())
    rep_causes = None if log.repair_causes is None else np.asarray(log.repair_causes, object)
    taken: set[str] = set()
    out = []
    fitted = list(result["causes"])
    for cause in fitted:
        sub = result["causes"][cause]
        hit = causes == cause
        reps = None if rep_causes is None else log.repair_s[rep_causes == cause]
        table, notes = _one_class(
            _class_name(cause, taken), sub["fits"], t, hit, reps,
            system=system, restart_given=restart_given, rep=sub.get("repair"),
        )  # fmt: skip
        share = f"{sub['events']:,} of {total:,} failures ({100 * sub['events'] / total:.1f} %)"
        label = f"cause {cause!r}" + ("" if table["name"] == cause else f" as {table['name']!r}")
        out.append((table, [f"{label}: {share}, {notes[0]}", *notes[1:]]))
    own = set(fitted)
    rest = np.asarray(log.observed, bool) & ~np.asarray([c in own for c in causes], dtype=bool)
    if rest.any():
        skipped = result.get("causes_skipped", {})
        parts = [f"{k!r}" for k in skipped]
        blank = int(result.get("blank_causes", 0))
        if blank:
            parts.append(f"{blank:,} with a blank cause")
        reps = None
        if rep_causes is not None:
            reps = log.repair_s[~np.asarray([c in own for c in rep_causes], dtype=bool)]
        name = _class_name(OTHER_CLASS, taken | set(fitted))
        table, notes = _one_class(
            name, _fit_block(t, rest)["fits"], t, rest, reps,
            system=system, restart_given=restart_given,
        )  # fmt: skip
        n = int(rest.sum())
        first = (
            f"the failures of causes with no fit of their own, pooled: {n:,} of {total:,} "
            f"({100 * n / total:.1f} %; {', '.join(parts)}), {notes[0]}"
        )
        out.append((table, [first, *notes[1:]]))
    return out
