"""Paired-comparison statistics shared by the benchmarks (issue 10, item 1's results layout).

A comparison is *paired*: variant and baseline ran with the same seed (same initial weights of every shared
module, same batches), so the per-seed difference is the quantity of interest. Its 95 % confidence interval
uses Student's t distribution (``scipy.stats.t``) with n − 1 degrees of freedom, computed by the package's
:mod:`pml_extensions.utils.paired_stats` (this module only adapts it to the benchmarks' layout):

    d_s = variant_s − baseline_s,   mean ± t_{0.975, n−1} · std(d, ddof=1) / √n

The results layout (``variants`` → {name: {``per_seed``: {seed: {metric: value}}, ``mean``, ``std``}} and
``comparisons`` → [{``variant``, ``baseline``, ``metric``, ``mean_difference``, ``ci95``, ...}]) is the one
issue 10 asks every benchmark to write so that other tools can read it.

    >>> paired_difference({0: 2.0, 1: 3.0, 2: 4.0}, {0: 1.0, 1: 1.0, 2: 1.0})["mean_difference"]
    2.0
"""

import math
import os
import sys
from typing import Dict, Iterable, Mapping

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pml_extensions.utils import paired_stats  # noqa: E402


def paired_difference(variant: Mapping, baseline: Mapping, confidence: float = 0.95) -> Dict[str, object]:
    """Mean, std and t confidence interval of the paired per-seed difference ``variant − baseline``, in the
    benchmarks' layout: :func:`pml_extensions.utils.paired_stats.paired_difference` on the variant's seeds, plus
    the one-seed case (a benchmark run with one seed reports its difference with no interval).

    Args:
        variant, baseline: {seed: value} (floats); the seeds of ``variant`` must all be in ``baseline``.
        confidence: two-sided level in (0, 1).

    Returns:
        dict with ``n``, ``seeds``, ``differences`` (per seed), ``mean_difference``, ``std_difference`` (ddof 1),
        ``ci95`` ``[low, high]`` (``[nan, nan]`` when n < 2: no interval from one seed) and ``wins`` (seeds with
        a positive difference).

    Raises:
        ValueError: no seed, a seed of ``variant`` missing from ``baseline``, a non-finite value, or a confidence
            outside (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    seeds = sorted(variant)
    missing = [s for s in seeds if s not in baseline]
    if missing:
        raise ValueError(f"baseline has no value for seed(s) {missing}: a paired difference needs the same seeds")
    if not seeds:
        raise ValueError("variant has no seeds")
    pairs_v, pairs_b = {s: variant[s] for s in seeds}, {s: baseline[s] for s in seeds}
    if len(seeds) == 1:
        d = float(pairs_v[seeds[0]]) - float(pairs_b[seeds[0]])
        if not math.isfinite(d):
            raise ValueError(
                f"variant and baseline values of seed {seeds[0]} must be finite, got "
                f"{pairs_v[seeds[0]]!r} and {pairs_b[seeds[0]]!r}"
            )
        r = {
            "seeds": seeds,
            "differences": [d],
            "mean_difference": d,
            "std": float("nan"),
            "ci": [float("nan"), float("nan")],
        }
    else:
        r = paired_stats.paired_difference(pairs_v, pairs_b, confidence)
    return {
        "n": len(seeds),
        "seeds": r["seeds"],
        "differences": r["differences"],
        "mean_difference": r["mean_difference"],
        "std_difference": r["std"],
        "ci95": r["ci"],
        "wins": int(sum(d > 0 for d in r["differences"])),
    }


def summarize_variants(per_seed: Mapping[str, Mapping]) -> Dict[str, Dict]:
    """``{name: {seed: {metric: value}}}`` → ``{name: {"per_seed", "mean", "std"}}`` (std with ddof 1; 0 for
    one seed)."""
    out = {}
    for name, seeds in per_seed.items():
        metrics = sorted({m for v in seeds.values() for m in v})
        mean, std = {}, {}
        for m in metrics:
            ms = paired_stats.mean_std([float(v[m]) for v in seeds.values() if m in v])
            mean[m], std[m] = ms["mean"], ms["std"] if ms["std"] is not None else 0.0
        out[name] = {"per_seed": {str(s): dict(v) for s, v in seeds.items()}, "mean": mean, "std": std}
    return out


def compare(variants: Mapping[str, Dict], names: Iterable[str], baseline: str, metric: str) -> list:
    """Paired comparisons of each of ``names`` against ``baseline`` on ``metric`` (items of
    ``comparisons``)."""
    base = {s: v[metric] for s, v in variants[baseline]["per_seed"].items()}
    out = []
    for name in names:
        if name == baseline:
            continue
        var = {s: v[metric] for s, v in variants[name]["per_seed"].items()}
        out.append({"variant": name, "baseline": baseline, "metric": metric, **paired_difference(var, base)})
    return out


def fmt_ms(summary: Dict, metric: str, digits: int = 2) -> str:
    """``"mean ± std"`` of one variant summary."""
    return f"{summary['mean'][metric]:.{digits}f} ± {summary['std'][metric]:.{digits}f}"


def fmt_diff(comp: Dict, digits: int = 2) -> str:
    """``"+d [low, high]"`` of one comparison (``"n/a"`` when there is no interval)."""
    lo, hi = comp["ci95"]
    if math.isnan(lo):
        return f"{comp['mean_difference']:+.{digits}f} (1 seed)"
    return f"{comp['mean_difference']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def verdict(comp: Dict, claim: str = "greater") -> str:
    """Whether a paired comparison supports a paper's claim, read from its 95 % CI.

    ``claim="greater"`` (the variant beats the baseline): ``"reproduces"`` when the CI lies above 0,
    ``"opposite"`` when it lies below 0, otherwise ``"not shown (CI includes 0)"``. ``claim="on_par"``:
    ``"consistent (CI includes 0)"`` or ``"differs"``. One seed (no CI): ``"1 seed, no CI"``.

    Raises:
        ValueError: unknown ``claim``.
    """
    if claim not in ("greater", "on_par"):
        raise ValueError(f"claim must be 'greater' or 'on_par', got {claim!r}")
    lo, hi = comp["ci95"]
    if math.isnan(lo):
        return "1 seed, no CI"
    if claim == "on_par":
        return "consistent (CI includes 0)" if lo <= 0 <= hi else "differs"
    if lo > 0:
        return "reproduces"
    if hi < 0:
        return "opposite"
    return "not shown (CI includes 0)"
