"""Paired comparison of two variants over seeds: mean, std and a Student-t confidence interval (scipy).

Each variant is trained once per seed; within a seed both variants share initial weights and batches (the runner's
protocols guarantee it), so the per-seed DIFFERENCE ``variant[s] - baseline[s]`` removes what the seed alone
moves. The interval is the t interval of the mean of those differences::

    d_s = variant[s] - baseline[s]           for every seed s present in both
    mean = (1/n) Σ d_s,   std = sqrt(Σ (d_s - mean)² / (n - 1))
    ci = mean ± t_{(1+confidence)/2, n-1} · std / sqrt(n)         (scipy.stats.t.ppf)

Example::

    >>> from pml_extensions.utils.paired_stats import paired_difference
    >>> r = paired_difference({0: 0.52, 1: 0.50, 2: 0.55}, {0: 0.50, 1: 0.49, 2: 0.52})
    >>> round(r["mean_difference"], 4), r["seeds"]
    (0.02, [0, 1, 2])
"""

import math
from typing import Dict, Hashable, Mapping, Sequence

import numpy as np


def _check_values(name: str, values: Mapping) -> Dict[Hashable, float]:
    if not isinstance(values, Mapping):
        raise TypeError(f"{name} must be a mapping seed -> value, got {type(values).__name__}")
    out = {}
    for seed, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            raise TypeError(f"{name}[{seed!r}] must be a number, got {type(value).__name__}")
        if not math.isfinite(float(value)):
            raise ValueError(f"{name}[{seed!r}] must be finite, got {value!r}")
        out[seed] = float(value)
    return out


def mean_std(values: Sequence[float]) -> Dict[str, float]:
    """Mean and sample standard deviation (ddof = 1) of a list of per-seed values.

    Args:
        values: one number per seed (at least one).

    Returns:
        ``{"mean": float, "std": float or None, "n": int}``; ``std`` is ``None`` for a single value (undefined
        with ddof = 1, reported as missing rather than as 0 or NaN).

    Raises:
        ValueError: on an empty list or a non-finite value.
    """
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        raise ValueError("values must hold at least one number, got none")
    if not np.isfinite(arr).all():
        raise ValueError(f"values must be finite, got {arr.tolist()}")
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if arr.size > 1 else None, "n": int(arr.size)}


def paired_difference(
    variant: Mapping[Hashable, float], baseline: Mapping[Hashable, float], confidence: float = 0.95
) -> dict:
    """Paired difference ``variant - baseline`` over the seeds both have, with a t confidence interval.

    Args:
        variant: ``{seed: metric value}`` of the variant.
        baseline: ``{seed: metric value}`` of the baseline, the same seeds (keys compared with ``==``; ``0`` and
            ``"0"`` are different keys, so use one type).
        confidence: level of the interval, in (0, 1). Default 0.95.

    Returns:
        ``{"seeds": [...], "differences": [...], "mean_difference": float, "std": float, "n": int,
        "confidence": float, "ci": [low, high]}``; ``std`` is the sample std (ddof = 1) of the differences. When
        all differences are equal the interval is ``[mean, mean]``.

    Raises:
        ValueError: when the two mappings do not hold the same seeds (the unmatched seeds are named), when fewer
            than 2 seeds are shared (no interval exists), on non-finite values, or ``confidence`` outside (0, 1).
        TypeError: on non-mapping inputs or non-numeric values.
    """
    from scipy import stats

    variant = _check_values("variant", variant)
    baseline = _check_values("baseline", baseline)
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"confidence must be a number in (0, 1), got {confidence!r}")
    only_variant = [s for s in variant if s not in baseline]
    only_baseline = [s for s in baseline if s not in variant]
    if only_variant or only_baseline:
        raise ValueError(
            f"seeds must match for a paired difference: only in variant {only_variant}, only in baseline "
            f"{only_baseline}"
        )
    seeds = sorted(variant, key=lambda s: (str(type(s)), s))
    if len(seeds) < 2:
        raise ValueError(f"a confidence interval needs at least 2 paired seeds, got {len(seeds)} ({seeds})")
    diffs = np.array([variant[s] - baseline[s] for s in seeds], dtype=np.float64)
    n = len(diffs)
    mean = float(diffs.mean())
    std = float(diffs.std(ddof=1))
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
