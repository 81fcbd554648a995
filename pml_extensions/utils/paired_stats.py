"""Paired statistics over seeds (scipy): Student-t interval, bootstraps over seeds and test classes, Holm's correction
(docs/benchmarks.md, "How a claim is judged")."""

import math
from typing import Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .checks import is_int, is_number


def _check_values(name: str, values: Mapping) -> Dict[Hashable, float]:
    if not isinstance(values, Mapping):
        raise TypeError(f"{name} must be a mapping seed -> value, got {type(values).__name__}")
    out = {}
    for seed, value in values.items():
        if not is_number(value):
            raise TypeError(f"{name}[{seed!r}] must be a number, got {type(value).__name__}")
        if not math.isfinite(float(value)):
            raise ValueError(f"{name}[{seed!r}] must be finite, got {value!r}")
        out[seed] = float(value)
    return out


def _check_confidence(confidence) -> None:
    if not is_number(confidence) or not 0 < confidence < 1:
        raise ValueError(f"confidence must be a number in (0, 1), got {confidence!r}")


def _paired_seeds(a: Mapping, b: Mapping, what: str) -> list:
    """The seeds of ``a`` and ``b`` sorted (by type name, then value); ValueError naming the unmatched ones."""
    only_variant, only_baseline = [s for s in a if s not in b], [s for s in b if s not in a]
    if only_variant or only_baseline:
        raise ValueError(
            f"seeds must match for a {what}: only in variant {only_variant}, only in baseline {only_baseline}"
        )
    return sorted(a, key=lambda s: (str(type(s)), s))


def mean_std(values: Sequence[float]) -> Dict[str, float]:
    """``{"mean", "std" (ddof = 1; None for one value), "n"}`` of per-seed values (ValueError: none, or not finite)."""
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        raise ValueError("values must hold at least one number, got none")
    if not np.isfinite(arr).all():
        raise ValueError(f"values must be finite, got {arr.tolist()}")
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if arr.size > 1 else None, "n": int(arr.size)}


def paired_difference(
    variant: Mapping[Hashable, float], baseline: Mapping[Hashable, float], confidence: float = 0.95
) -> dict:
    """Paired difference ``variant - baseline`` over the seeds both have, with a t confidence interval. Within a
    seed both variants share initial weights and batches, so ``d_s = variant[s] - baseline[s]`` removes what the seed
    alone moves; ``ci = mean(d) ± t_{(1+confidence)/2, n-1} · std(d, ddof=1) / sqrt(n)`` (``scipy.stats.t.ppf``).

    Args:
        variant, baseline: ``{seed: metric value}``, the same seeds (``0`` and ``"0"`` are different keys).
        confidence: level of the interval, in (0, 1). Default 0.95.

    Returns:
        ``{"seeds", "differences", "mean_difference", "std" (ddof = 1), "n", "confidence", "ci": [low, high]}``.

    Raises:
        ValueError: different seeds (named), fewer than 2 seeds, non-finite values, ``confidence`` outside (0, 1).
        TypeError: non-mapping inputs or non-numeric values.

    Example::

        >>> r = paired_difference({0: 0.52, 1: 0.50, 2: 0.55}, {0: 0.50, 1: 0.49, 2: 0.52})
        >>> round(r["mean_difference"], 4), r["seeds"]
        (0.02, [0, 1, 2])
    """
    from scipy import stats

    variant = _check_values("variant", variant)
    baseline = _check_values("baseline", baseline)
    _check_confidence(confidence)
    seeds = _paired_seeds(variant, baseline, "paired difference")
    if len(seeds) < 2:
        raise ValueError(f"a confidence interval needs at least 2 paired seeds, got {len(seeds)} ({seeds})")
    diffs = np.array([variant[s] - baseline[s] for s in seeds], dtype=np.float64)
    n, mean, std = len(diffs), float(diffs.mean()), float(diffs.std(ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
    return {
        "seeds": seeds,
        "differences": diffs.tolist(),
        "mean_difference": mean,
        "std": std,
        "n": n,
        "confidence": float(confidence),
        "ci": [mean - half, mean + half],
    }


#: what :func:`bootstrap_difference` resamples: seeds and test classes (per-class data given), or seeds alone
RESAMPLED = ("seeds and test classes", "seeds")


def _check_per_class(name: str, per_class: Mapping) -> Dict[Hashable, Dict[Hashable, Tuple[float, float]]]:
    """``{seed: {class: (sum, count)}}`` checked: finite sums, positive finite counts, at least one class."""
    if not isinstance(per_class, Mapping):
        raise TypeError(f"{name} must be a mapping seed -> {{class: [sum, count]}}, got {type(per_class).__name__}")
    out = {}
    for seed, classes in per_class.items():
        if not isinstance(classes, Mapping) or not classes:
            raise ValueError(f"{name}[{seed!r}] must be a non-empty mapping class -> [sum, count], got {classes!r}")
        rows = {}
        for c, pair in classes.items():
            if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
                raise ValueError(f"{name}[{seed!r}][{c!r}] must be [sum, count], got {pair!r}")
            total, count = (float(v) for v in _check_values(f"{name}[{seed!r}][{c!r}]", dict(enumerate(pair))).values())
            if count <= 0:
                raise ValueError(f"{name}[{seed!r}][{c!r}]: the count must be positive, got {pair[1]!r}")
            rows[c] = (total, count)
        out[seed] = rows
    return out


def per_class_metric(per_class: Mapping[Hashable, Sequence[float]]) -> float:
    """The metric of one run from ``{class: [sum of the per-query metric, number of queries]}``: ``Σ sum / Σ count``.

    Raises:
        ValueError: an empty mapping, a pair that is not ``[sum, count]``, a non-finite value or a count ≤ 0.

    Example::

        >>> per_class_metric({"a": [1.5, 2], "b": [0.5, 2]})  # four queries scoring 1.0, 0.5, 0.5, 0.0
        0.5
    """
    rows = _check_per_class("per_class", {0: per_class})[0]
    return sum(t for t, _ in rows.values()) / sum(c for _, c in rows.values())


def bootstrap_p_value(distribution: Sequence[float]) -> float:
    """Two-sided p-value of "the difference is 0" from ``B`` bootstrap differences ``d*``: ``min(1, 2 · (min(#{d* ≤ 0},
    #{d* ≥ 0}) + 1) / (B + 1))``, the smallest ``α`` whose ``1 − α`` percentile interval reaches 0 (the Monte Carlo
    p-value, Davison & Hinkley, *Bootstrap Methods and their Application*, 1997, ch. 4).

    Raises:
        ValueError: an empty or non-finite distribution.

    Example::

        >>> bootstrap_p_value([0.5, 1.0, 2.0, -0.5]), bootstrap_p_value([1.0, 2.0, 3.0])
        (0.8, 0.5)
    """
    d = np.asarray(distribution, dtype=np.float64)
    if d.size == 0 or not np.isfinite(d).all():
        raise ValueError(f"distribution must hold finite numbers, got {d.size} values")
    tail = min(int((d <= 0).sum()), int((d >= 0).sum()))
    return float(min(1.0, 2.0 * (tail + 1) / (d.size + 1)))


def paired_t_p_value(mean: float, std: Optional[float], n: int) -> Optional[float]:
    """Two-sided p-value of the paired t-test of "the mean difference is 0", ``2 · P(T_{n−1} ≥ |mean| / (std / √n))``
    (``scipy.stats.t.sf``); ``None`` with fewer than 2 seeds; with ``std = 0``: 1 for a zero mean, else 0.

    Example::

        >>> round(paired_t_p_value(3.0, 7 ** 0.5, 3), 4)  # differences 1, 2, 6
        0.1885
    """
    from scipy import stats

    if n < 2 or std is None:
        return None
    if std == 0:
        return 1.0 if mean == 0 else 0.0
    return float(min(1.0, 2.0 * stats.t.sf(abs(mean) / (std / math.sqrt(n)), n - 1)))


def bootstrap_difference(
    variant: Mapping,
    baseline: Mapping,
    per_class: bool = False,
    confidence: float = 0.95,
    n_resamples: int = 10000,
    seed: int = 0,
    return_distribution: bool = False,
) -> dict:
    """Paired percentile bootstrap interval and p-value of ``variant − baseline``, resampling the seeds and, with
    per-class data, the test classes.

    ``per_class=True``: ``variant`` and ``baseline`` are ``{seed: {class: [sum, count]}}`` (per-class sums of the
    per-query metric, query counts); one resample draws ``n`` seeds ``S*`` and ``m`` classes ``C*`` with replacement
    (numpy ``multinomial`` counts from a ``Generator`` seeded with ``seed``), the same for both arms, and computes
    ``d* = (1/n) Σ_{s ∈ S*} (metric(variant, s, C*) − metric(baseline, s, C*))`` with ``metric(arm, s, C*) =
    Σ_{c ∈ C*} sum / Σ_{c ∈ C*} count``. ``per_class=False``: ``{seed: value}``; ``scipy.stats.bootstrap``
    (``method="percentile"``, the same seeded ``Generator``) resamples the per-seed differences. The interval is the
    ``(1 ± confidence) / 2`` quantiles of the ``d*`` (BCa's jackknife is unstable with 3–20 seeds and undefined for the
    two-way resampling); the p-value is :func:`bootstrap_p_value`'s.

    Args:
        variant, baseline: per-seed data as above, the same seeds (and, per class, the same classes everywhere).
        per_class: whether the values are per-class ``[sum, count]`` pairs.
        confidence: the interval's level, in (0, 1); n_resamples: ``B`` >= 100; seed: numpy's ``Generator`` seed.
        return_distribution: also return the ``B`` resampled differences under ``"distribution"``.

    Returns:
        ``{"mean_difference", "ci": [low, high], "p_value", "resampled": "seeds and test classes" | "seeds", "method":
        "percentile", "n_resamples", "seed", "n_seeds", "n_classes": m or None, "confidence"}``.

    Raises:
        ValueError: different seeds or classes between runs, fewer than 2 seeds without per-class data, bad values,
            ``confidence`` outside (0, 1) or ``n_resamples`` < 100.
        TypeError: non-mapping inputs.

    Example::

        >>> v = {0: {"a": [3.0, 4], "b": [1.0, 4]}, 1: {"a": [2.0, 4], "b": [2.0, 4]}}
        >>> b = {0: {"a": [2.0, 4], "b": [1.0, 4]}, 1: {"a": [2.0, 4], "b": [1.0, 4]}}
        >>> r = bootstrap_difference(v, b, per_class=True, n_resamples=1000)
        >>> r["mean_difference"], r["resampled"], r["n_classes"], r["ci"][0] <= 0.125 <= r["ci"][1]
        (0.125, 'seeds and test classes', 2, True)
    """
    from scipy import stats

    _check_confidence(confidence)
    if not is_int(n_resamples) or n_resamples < 100:
        raise ValueError(f"n_resamples must be an int >= 100, got {n_resamples!r}")
    if not is_int(seed):
        raise ValueError(f"seed must be an int, got {seed!r}")
    check = _check_per_class if per_class else _check_values
    a, b = check("variant", variant), check("baseline", baseline)
    seeds = _paired_seeds(a, b, "paired bootstrap")
    rng = np.random.default_rng(seed)
    alpha = 1.0 - confidence
    out = {"resampled": RESAMPLED[1], "method": "percentile", "n_resamples": n_resamples, "seed": seed}
    if per_class:
        if not seeds:
            raise ValueError("a paired bootstrap needs at least 1 seed, got none")
        classes = sorted(a[seeds[0]], key=lambda c: (str(type(c)), c))
        for arm, data in (("variant", a), ("baseline", b)):
            for s in seeds:
                if set(data[s]) != set(classes):
                    raise ValueError(
                        f"{arm}[{s!r}] has classes {sorted(map(str, data[s]))}, variant[{seeds[0]!r}] has "
                        f"{sorted(map(str, classes))}: every run must be tested on the same classes"
                    )
        sums = np.array([[[x[s][c][0] for c in classes] for s in seeds] for x in (a, b)])  # [2, n, m]
        counts = np.array([[[x[s][c][1] for c in classes] for s in seeds] for x in (a, b)])
        n, m = len(seeds), len(classes)
        observed = sums.sum(2) / counts.sum(2)  # [2, n]
        mean = float((observed[0] - observed[1]).mean())
        parts = []
        for start in range(0, n_resamples, 2048):  # bounded memory: [chunk, m] class counts, [chunk, n] seed counts
            size = min(2048, n_resamples - start)
            class_draws = rng.multinomial(m, np.full(m, 1.0 / m), size=size).astype(np.float64)
            seed_draws = rng.multinomial(n, np.full(n, 1.0 / n), size=size).astype(np.float64)
            metric = np.einsum("bm,anm->abn", class_draws, sums) / np.einsum("bm,anm->abn", class_draws, counts)
            parts.append(((metric[0] - metric[1]) * seed_draws).sum(1) / n)
        distribution = np.concatenate(parts)
        out.update(resampled=RESAMPLED[0], n_classes=m)
    else:
        if len(seeds) < 2:
            raise ValueError(f"a bootstrap over seeds needs at least 2 paired seeds, got {len(seeds)} ({seeds})")
        diffs = np.array([a[s] - b[s] for s in seeds], dtype=np.float64)
        mean, n = float(diffs.mean()), len(seeds)
        res = stats.bootstrap(
            (diffs,), np.mean, n_resamples=n_resamples, method="percentile", confidence_level=confidence, rng=rng
        )
        distribution = np.asarray(res.bootstrap_distribution, dtype=np.float64)
        out["n_classes"] = None
    low, high = np.quantile(distribution, [alpha / 2, 1 - alpha / 2])
    out.update(
        mean_difference=mean,
        ci=[float(low), float(high)],
        p_value=bootstrap_p_value(distribution),
        n_seeds=n,
        confidence=float(confidence),
    )
    if return_distribution:
        out["distribution"] = distribution
    return out


def holm(p_values: Sequence[Optional[float]]) -> List[Optional[float]]:
    """Holm's step-down adjustment of a family's p-values (Holm 1979), in the given order; ``None`` entries stay out of
    the family and stay ``None``.

    With the ``k`` p-values sorted, ``p̃_(i) = max_{j ≤ i} min(1, (k − j + 1) · p_(j))``: rejecting where ``p̃ < α``
    keeps the family-wise error rate at ``α`` under any dependence (scipy has no Holm; statsmodels'
    ``multipletests(method="holm")`` gives the same numbers).

    Raises:
        ValueError: a p-value outside [0, 1] or not a number.

    Example::

        >>> [round(p, 3) for p in holm([0.01, 0.04, 0.03, 0.005])]  # sorted: 0.005·4, 0.01·3, 0.03·2, 0.04·1
        [0.03, 0.06, 0.06, 0.02]
        >>> holm([0.2, None])
        [0.2, None]
    """
    checked = []
    for i, p in enumerate(p_values):
        if p is None:
            continue
        if not is_number(p) or not 0 <= float(p) <= 1:
            raise ValueError(f"p_values[{i}] must be a number in [0, 1], got {p!r}")
        checked.append((float(p), i))
    out: List[Optional[float]] = [None] * len(p_values)
    k, running = len(checked), 0.0
    for rank, (p, i) in enumerate(sorted(checked, key=lambda x: x[0])):
        running = max(running, min(1.0, (k - rank) * p))
        out[i] = running
    return out
