"""Failure models: how long a component (a GPU or a node) lives before it fails.

A lifetime distribution answers the questions a checkpoint model asks of it: the mean time to
failure, the chance of surviving to age ``t`` (``survival``), the instantaneous failure rate at
that age (``hazard``), and samples drawn with a ``numpy.random.Generator`` that the caller owns.
All times are seconds.

From one component to a cluster of ``n``
----------------------------------------
For exponential lifetimes the two cluster views agree: the time to the first failure of ``n``
fresh components is exponential with mean ``mean / n``, and so is every later gap, because a
replaced component is indistinguishable from the ones that kept running (no memory).

For Weibull (or lognormal) lifetimes they differ. The *first* failure of ``n`` fresh Weibull(k)
components is Weibull(k) with scale ``scale * n**(-1/k)`` (``first_failure``); with ``k < 1``
that is far sooner than ``mean / n`` because young parts fail most. After a failure only the
replaced component is new while the others keep their age, so the cluster's failure process is
a superposition of ``n`` renewal processes, not one renewal process. Over a long run it settles
to ``n / mean`` failures per second (renewal theorem; ``long_run_rate``), which is why
``system_mtbf_s`` is ``mean / n`` for every family, while the gap after a restart is not drawn
from one fixed distribution.

What real GPUs do
-----------------
Studies of time between node failures in HPC systems often report a decreasing hazard
(Weibull ``k < 1``; Schroeder & Gibson, DSN 2006), but the per-GPU lifetimes of the Titan trace
(18,688 K20X GPUs, Ostrouchov et al., SC '20; ``simulator.fitting.titan``, ``reports/titan-fit.md``)
show the opposite: fitted with censoring, service time to the first DBE/OTB event is Weibull
with shape about 2.7 (wear-out), beating exponential by thousands of AIC points. Then
``first_failure`` of a fresh machine is weeks, far *later* than ``mean / n`` (hours): how old
the GPUs are matters as much as how many there are.
"""

from __future__ import annotations

import functools
import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from simulator.errors import InputError

__all__ = [
    "Empirical",
    "Exponential",
    "Lifetime",
    "LogNormal",
    "MinOf",
    "Weibull",
    "empirical_notes",
    "empirical_path",
    "first_failure",
    "load_empirical",
    "long_run_rate",
    "parse_failure",
    "system_mtbf_s",
]


def _positive(name: str, value: float, unit: str | None = "s") -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        what = f"a positive number of {unit}" if unit else "a positive number"
        raise InputError(f"{name} must be {what}, got {value!r}")
    return value


class Lifetime(ABC):
    """A component lifetime distribution (seconds)."""

    family: str

    @property
    @abstractmethod
    def mean_s(self) -> float:
        """Mean time to failure, seconds."""

    @abstractmethod
    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...] | None = None):
        """Draw lifetimes (seconds) with the caller's generator."""

    @abstractmethod
    def survival(self, t_s):
        """P(lifetime > t)."""

    @abstractmethod
    def with_mean(self, mean_s: float) -> Lifetime:
        """The same shape rescaled to a new mean."""

    def cdf(self, t_s):
        """P(lifetime <= t)."""
        return 1.0 - self.survival(t_s)

    def pdf(self, t_s):
        return self._frozen().pdf(np.asarray(t_s, dtype=float))

    def hazard(self, t_s):
        """Instantaneous failure rate at age t, per second: pdf / survival."""
        t = np.asarray(t_s, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.exp(self._frozen().logpdf(t) - self._frozen().logsf(t))

    def ppf(self, q):
        return self._frozen().ppf(q)

    def residual_sample(self, rng: np.random.Generator, age_s, size=None):
        """Remaining life of components that have already survived ``age_s`` seconds."""
        age = np.asarray(age_s, dtype=float)
        u = rng.random(size if size is not None else age.shape)
        # Inverse transform on the conditional survival S(age + x) / S(age) = u.
        logsf = self._frozen().logsf(age) + np.log(u)
        return np.maximum(self._frozen().isf(np.exp(logsf)) - age, 0.0)

    def _frozen(self):
        raise NotImplementedError(f"{type(self).__name__} has no scipy form")

    def describe(self) -> str:
        return f"{self.family}(mean={self.mean_s / 3600:.4g} h)"


@dataclass(frozen=True)
class Exponential(Lifetime):
    """Memoryless lifetimes: constant hazard 1/mean."""

    mean: float
    family: str = field(default="exponential", init=False)

    def __post_init__(self):
        _positive("exponential mean", self.mean)

    @property
    def mean_s(self) -> float:
        return float(self.mean)

    def sample(self, rng, size=None):
        return rng.exponential(self.mean, size)

    def survival(self, t_s):
        return np.exp(-np.maximum(np.asarray(t_s, dtype=float), 0.0) / self.mean)

    def hazard(self, t_s):
        return np.full_like(np.asarray(t_s, dtype=float), 1.0 / self.mean)

    def residual_sample(self, rng, age_s, size=None):
        shape = size if size is not None else np.shape(age_s)
        return rng.exponential(self.mean, shape)

    def with_mean(self, mean_s):
        return Exponential(mean_s)

    def _frozen(self):
        from scipy import stats  # lazy: keeps `ckptsim --help` and simulator imports fast

        return stats.expon(scale=self.mean)


@dataclass(frozen=True)
class Weibull(Lifetime):
    """Weibull(shape k, scale λ): hazard (k/λ)(t/λ)^(k-1); k < 1 is infant mortality."""

    shape: float
    scale: float
    family: str = field(default="weibull", init=False)

    def __post_init__(self):
        _positive("weibull shape", self.shape, None)
        _positive("weibull scale", self.scale)

    @classmethod
    def from_mean(cls, mean_s: float, shape: float) -> Weibull:
        _positive("weibull shape", shape, None)
        return cls(shape, _positive("mean", mean_s) / math.gamma(1.0 + 1.0 / shape))

    @property
    def mean_s(self) -> float:
        return float(self.scale * math.gamma(1.0 + 1.0 / self.shape))

    def sample(self, rng, size=None):
        return self.scale * rng.weibull(self.shape, size)

    def survival(self, t_s):
        t = np.maximum(np.asarray(t_s, dtype=float), 0.0)
        return np.exp(-((t / self.scale) ** self.shape))

    def hazard(self, t_s):
        t = np.asarray(t_s, dtype=float)
        with np.errstate(divide="ignore"):
            return (self.shape / self.scale) * (t / self.scale) ** (self.shape - 1.0)

    def residual_sample(self, rng, age_s, size=None):
        age = np.asarray(age_s, dtype=float)
        e = rng.exponential(1.0, size if size is not None else age.shape)
        # Cumulative hazard H(t) = (t/λ)^k; remaining life solves H(age + x) = H(age) + E.
        return self.scale * ((age / self.scale) ** self.shape + e) ** (1.0 / self.shape) - age

    def with_mean(self, mean_s):
        return Weibull.from_mean(mean_s, self.shape)

    def _frozen(self):
        from scipy import stats  # lazy: keeps `ckptsim --help` and simulator imports fast

        return stats.weibull_min(self.shape, scale=self.scale)

    def describe(self) -> str:
        return f"weibull(shape={self.shape:.3g}, mean={self.mean_s / 3600:.4g} h)"


@dataclass(frozen=True)
class LogNormal(Lifetime):
    """Lognormal: log-lifetime is normal with standard deviation ``sigma`` around log(scale)."""

    sigma: float
    scale: float
    family: str = field(default="lognormal", init=False)

    def __post_init__(self):
        _positive("lognormal sigma", self.sigma, None)
        _positive("lognormal scale", self.scale)

    @classmethod
    def from_mean(cls, mean_s: float, sigma: float) -> LogNormal:
        _positive("lognormal sigma", sigma, None)
        return cls(sigma, _positive("mean", mean_s) * math.exp(-0.5 * sigma * sigma))

    @property
    def mean_s(self) -> float:
        return float(self.scale * math.exp(0.5 * self.sigma**2))

    def sample(self, rng, size=None):
        return rng.lognormal(math.log(self.scale), self.sigma, size)

    def survival(self, t_s):
        return self._frozen().sf(np.asarray(t_s, dtype=float))

    def with_mean(self, mean_s):
        return LogNormal.from_mean(mean_s, self.sigma)

    def _frozen(self):
        from scipy import stats  # lazy: keeps `ckptsim --help` and simulator imports fast

        return stats.lognorm(self.sigma, scale=self.scale)

    def describe(self) -> str:
        return f"lognormal(sigma={self.sigma:.3g}, mean={self.mean_s / 3600:.4g} h)"


class Empirical(Lifetime):
    """Lifetimes drawn from observed ones, right-censored or not: the Kaplan–Meier estimate.

    ``samples_s`` are the observed lifetimes and ``observed`` says which ended in a failure
    (default: all); censored ones (still alive when the log ended) count through the
    Kaplan–Meier estimate (``scipy.stats.ecdf``), so a log whose long-lived parts are censored
    does not make lifetimes look shorter than they are. Without censoring this is plain
    resampling of the data. Kaplan–Meier says nothing beyond the longest time observed: when
    survival there is ``S > 0`` (the longest was censored), that mass gets an exponential tail
    beyond it, with the constant-hazard estimate of the whole log as its mean (exposure over
    failures) — an assumption, stated here because it sets the mean.
    """

    family = "empirical"

    def __init__(self, samples_s, observed=None):
        x = np.asarray(samples_s, dtype=float).ravel()
        obs = np.ones(x.size, bool) if observed is None else np.asarray(observed, bool).ravel()
        if x.size == 0 or obs.shape != x.shape or not np.all(np.isfinite(x)) or x.min() < 0:
            raise InputError("empirical lifetimes need at least one finite, non-negative sample")
        if not obs.any():
            raise InputError("empirical lifetimes need at least one observed failure")
        from scipy import stats

        sf = stats.ecdf(stats.CensoredData(uncensored=x[obs], right=x[~obs])).sf
        keep = np.isin(sf.quantiles, x[obs])  # the times where survival drops
        times, after = sf.quantiles[keep], sf.probabilities[keep]
        jumps = -np.diff(np.concatenate(([1.0], after)))
        self._init(times, jumps, float(after[-1]), float(x.max()), float(x.sum() / obs.sum()))
        self.n = int(x.size)

    def _init(self, times, probs, tail_mass, tail_start_s, tail_mean_s):
        self.times = np.asarray(times, dtype=float)
        self.probs = np.asarray(probs, dtype=float)
        self.tail_mass = max(float(tail_mass), 0.0)
        self.tail_start_s = float(tail_start_s)
        self.tail_mean_s = float(tail_mean_s)
        self._cum = np.cumsum(self.probs)

    def __repr__(self):
        return f"Empirical(n={self.n}, mean_s={self.mean_s:.6g}, tail_mass={self.tail_mass:.3g})"

    @property
    def mean_s(self) -> float:
        tail = self.tail_mass * (self.tail_start_s + self.tail_mean_s)
        return float(self.probs @ self.times + tail)

    def ppf(self, q):
        q = np.asarray(q, dtype=float)
        body = 1.0 - self.tail_mass
        idx = np.minimum(np.searchsorted(self._cum, q, side="left"), self.times.size - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            beyond = (1.0 - q) / max(self.tail_mass, 1e-300)
            tail = self.tail_start_s - self.tail_mean_s * np.log(np.clip(beyond, 1e-300, 1.0))
        return np.where(q <= body, self.times[idx], tail)

    def sample(self, rng, size=None):
        return self.ppf(rng.random(size))

    def survival(self, t_s):
        t = np.asarray(t_s, dtype=float)
        dropped = np.concatenate(([0.0], self._cum))[np.searchsorted(self.times, t, "right")]
        inside = 1.0 - dropped
        tail = self.tail_mass * np.exp(-np.maximum(t - self.tail_start_s, 0.0) / self.tail_mean_s)
        return np.where(t <= self.tail_start_s, inside, tail)

    def pdf(self, t_s):
        # A weighted histogram of the failure times (Kaplan–Meier has no smooth density), plus
        # the exponential tail's density beyond the longest time observed.
        t = np.asarray(t_s, dtype=float)
        hist, edges = np.histogram(self.times, bins="auto", weights=self.probs)
        width = np.diff(edges)
        dens = np.where(width > 0, hist / np.where(width > 0, width, 1.0), 0.0)
        idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, dens.size - 1)
        inside = (t >= edges[0]) & (t <= edges[-1])
        tail = (
            self.tail_mass / self.tail_mean_s * np.exp(-(t - self.tail_start_s) / self.tail_mean_s)
        )
        return np.where(inside, dens[idx], 0.0) + np.where(t > self.tail_start_s, tail, 0.0)

    def hazard(self, t_s):
        with np.errstate(divide="ignore", invalid="ignore"):
            s = self.survival(t_s)
            return np.where(s > 0, self.pdf(t_s) / np.where(s > 0, s, 1.0), np.inf)

    def residual_sample(self, rng, age_s, size=None):
        # Inverse transform on S(age + x) / S(age) = u, through the quantile function.
        age = np.asarray(age_s, dtype=float)
        u = rng.random(size if size is not None else age.shape)
        q = 1.0 - u * self.survival(age)
        return np.maximum(self.ppf(q) - age, 0.0)

    def length_biased_sample(self, rng, size=None):
        """Lifetimes drawn with density x·f(x)/mean: the one in service at a random moment."""
        body = self.probs * self.times
        tail_weight = self.tail_mass * (self.tail_start_s + self.tail_mean_s)
        total = body.sum() + tail_weight
        u = rng.random(size) * total
        idx = np.minimum(np.searchsorted(np.cumsum(body), u, side="right"), self.times.size - 1)
        # Beyond the longest time: (t0 + X) biased by its length is t0 + Exp(θ) with weight
        # t0/(t0 + θ), else t0 + Gamma(2, θ).
        t0, theta = self.tail_start_s, self.tail_mean_s
        gamma_shape = np.where(rng.random(size) < t0 / (t0 + theta), 1.0, 2.0)
        tail = t0 + rng.gamma(gamma_shape, theta)
        return np.where(u < body.sum(), self.times[idx], tail)

    def with_mean(self, mean_s):
        k = _positive("mean", mean_s) / self.mean_s
        out = object.__new__(Empirical)
        out._init(
            self.times * k, self.probs, self.tail_mass, self.tail_start_s * k, self.tail_mean_s * k
        )
        out.n = self.n
        return out

    def describe(self) -> str:
        return f"empirical(n={self.n}, mean={self.mean_s / 3600:.4g} h)"


class MinOf(Lifetime):
    """Time to the first failure among ``n`` fresh, independent components."""

    def __init__(self, component: Lifetime, n: int):
        self.component, self.n = component, _count(n)
        self.family = f"min{self.n}({component.family})"

    def survival(self, t_s):
        return self.component.survival(t_s) ** self.n

    def hazard(self, t_s):
        return self.n * self.component.hazard(t_s)

    def pdf(self, t_s):
        return self.hazard(t_s) * self.survival(t_s)

    def ppf(self, q):
        # S_min(t) = S(t)^n  =>  t = S^-1((1-q)^(1/n)), computed without losing 1 - tiny.
        return self.component.ppf(-np.expm1(np.log1p(-np.asarray(q, dtype=float)) / self.n))

    def sample(self, rng, size=None):
        return self.ppf(rng.random(size))

    @property
    def mean_s(self) -> float:
        from scipy import integrate

        upper = float(self.ppf(1 - 1e-12))
        value, _ = integrate.quad(lambda t: float(self.survival(t)), 0.0, upper, limit=200)
        return value

    def residual_sample(self, rng, age_s, size=None):
        # All n survived age a; the remaining time x to the first of them failing satisfies
        # S(a + x) / S(a) = U^(1/n) for one uniform U (the n residual survivals multiply).
        age = np.asarray(age_s, dtype=float)
        u = rng.random(size if size is not None else age.shape)
        frozen = self.component._frozen()
        logsf = frozen.logsf(age) + np.log(u) / self.n
        return np.maximum(frozen.isf(np.exp(logsf)) - age, 0.0)

    def with_mean(self, mean_s):
        raise NotImplementedError("rescale the component instead")


def _count(n) -> int:
    try:
        ok = not isinstance(n, bool) and int(n) == n and int(n) >= 1
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise InputError(f"component count must be a whole number >= 1, got {n!r}")
    return int(n)


def first_failure(component: Lifetime, n: int) -> Lifetime:
    """Distribution of the time to the first failure among ``n`` fresh components."""
    n = _count(n)
    if isinstance(component, Exponential):
        return Exponential(component.mean / n)
    if isinstance(component, Weibull):
        return Weibull(component.shape, component.scale * n ** (-1.0 / component.shape))
    return MinOf(component, n)


def long_run_rate(component: Lifetime, n: int) -> float:
    """Failures per second of ``n`` components, each replaced on failure, over a long run."""
    return _count(n) / component.mean_s


def system_mtbf_s(component: Lifetime, n: int) -> float:
    """Long-run mean time between failures of a cluster of ``n`` components (seconds)."""
    return component.mean_s / _count(n)


_SPEC = re.compile(r"^\s*(?P<family>[a-z]+)\s*(?::(?P<params>.*))?$")
_FAMILIES = {"exponential": (), "weibull": ("shape",), "lognormal": ("sigma",)}

SHAPE_RANGE = {"shape": (0.05, 20.0), "sigma": (0.01, 5.0)}
"""Accepted values of a spec's shape parameter (``parse_failure``), and why:

- Weibull ``shape`` in [0.05, 20]. The mean is scale·Γ(1 + 1/k): Γ overflows a float below
  k ≈ 0.0058, and already at k = 0.05 the mean is ~10^21 times the median, so it rests on
  lifetimes no finite simulation samples — the MTBF the user gives would not be the failure
  rate the simulation sees. Above 20 the lifetime's coefficient of variation is under 6%
  (near-deterministic); fitted shapes of real hardware lie in 0.3-3 (Schroeder & Gibson
  2006: 0.7-0.8; Titan GPUs: 2.7).
- lognormal ``sigma`` in [0.01, 5]. The median is mean·exp(-σ²/2): at σ = 5 it is already
  1/270,000 of the mean (the same problem as a tiny Weibull shape) and at σ ≈ 38.6 it
  underflows to zero; below 0.01 lifetimes are deterministic to 1%.
"""

_RANGE_REASON = {
    "shape": "below 0.05 the mean rests on lifetimes no simulation samples, above 20 "
    "lifetimes are all but fixed",
    "sigma": "above 5 the mean rests on lifetimes no simulation samples, below 0.01 "
    "lifetimes are all but fixed",
}


def empirical_path(spec) -> str | None:
    """The log an ``empirical:FILE`` spec names ("" when it names none); None for any other
    spec. The one reading of the spec: ``parse_failure`` and scenario files share it."""
    head, _, rest = str(spec).strip().partition(":")
    return rest.strip() if head.strip().lower() == "empirical" else None


def load_empirical(path: str) -> Empirical:
    """The lifetimes of the failure log at ``path`` (read once per version of the file)."""
    import os

    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(
            f"empirical:{path}: cannot read the failure log ({exc.strerror})"
        ) from None
    return _load_empirical(os.path.realpath(path), st.st_mtime_ns, st.st_size, path)


@functools.lru_cache(maxsize=8)
def _load_empirical(real: str, mtime_ns: int, size: int, shown: str) -> Empirical:
    from simulator.fitting.faillog import read_failure_log

    try:
        log = read_failure_log(real)
    except InputError as exc:
        hint = ""
        if "-column" in str(exc):  # the column flags are fit's and --trace's, not --failure's
            hint = (
                "; empirical:FILE reads the columns `ckptsim fit` recognises by name: rename "
                "them, or fit the log with `ckptsim fit FILE --scenario-out`"
            )
        raise InputError(f"empirical:{shown}: {exc}{hint}") from None
    if log.durations_s.size == 0 or not log.observed.any():
        raise InputError(f"empirical:{shown}: the log holds no failed lifetimes to draw from")
    life = Empirical(log.durations_s, log.observed)
    if not life.mean_s > 0:
        raise InputError(f"empirical:{shown}: every lifetime in the log is 0")
    life.notes = tuple(log.notes)  # what the reader merged or left out, for the CLI to say
    return life


def empirical_notes(specs) -> list[str]:
    """The reader's notes (rows merged or left out, ...) of each ``empirical:FILE`` among
    ``specs``, once per file, each prefixed with its spec: what a command says before it uses
    the logs."""
    out, seen = [], set()
    for spec in specs:
        path = empirical_path(spec) if isinstance(spec, str) else None
        if path and path not in seen:
            seen.add(path)
            out += [f"empirical:{path}: {n}" for n in getattr(load_empirical(path), "notes", ())]
    return out


def parse_failure(spec: str, mean_s: float) -> Lifetime:
    """``exponential``, ``weibull:shape=K``, ``lognormal:sigma=S`` or ``empirical:FILE`` with
    the given mean (s).

    Each parameter is given once and must lie in ``SHAPE_RANGE``. ``empirical:FILE`` takes the
    shape of a failure log's lifetimes (either shape ``ckptsim fit`` reads; censored ones count
    through Kaplan–Meier, see :class:`Empirical`) and rescales it to the mean, as the other
    families take the mean from the scenario: the log says how lifetimes are spread, the
    scenario how long they are.
    """
    path = empirical_path(spec)
    if path is not None:
        if not path:
            raise InputError("empirical lifetimes need a failure log: empirical:FILE")
        return load_empirical(path).with_mean(_positive("MTBF", mean_s))
    m = _SPEC.match(str(spec).lower())
    family = m.group("family") if m else None
    if family not in _FAMILIES:
        raise InputError(
            f"unknown failure distribution {spec!r}; use exponential, weibull:shape=K, "
            "lognormal:sigma=S or empirical:FILE"
        )
    params: dict[str, float] = {}
    for part in filter(None, (m.group("params") or "").split(",")):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in _FAMILIES[family]:
            raise InputError(f"failure distribution {spec!r}: unexpected parameter {part!r}")
        if key in params:
            raise InputError(f"failure distribution {spec!r}: {key} is given twice; give it once")
        try:
            params[key] = float(value)
        except ValueError:
            raise InputError(f"failure distribution {spec!r}: {key} must be a number") from None
        low, high = SHAPE_RANGE[key]
        if not low <= params[key] <= high:  # also refuses nan
            raise InputError(
                f"failure distribution {spec!r}: {key} must be between {low:g} and {high:g} "
                f"(got {value.strip()}): {_RANGE_REASON[key]}"
            )
    missing = [k for k in _FAMILIES[family] if k not in params]
    if missing:
        raise InputError(f"failure distribution {spec!r} needs {missing[0]}=VALUE")
    if family == "exponential":
        return Exponential(_positive("MTBF", mean_s))
    if family == "weibull":
        return Weibull.from_mean(mean_s, params["shape"])
    return LogNormal.from_mean(mean_s, params["sigma"])
