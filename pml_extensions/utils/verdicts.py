"""Paired comparisons of two variants over seeds (``results.json``'s ``comparisons``) and the verdicts on the claims
they test; the rules: docs/benchmarks.md, "How a claim is judged"; :func:`claim_verdicts` works an example by hand."""

import math
from typing import List, Mapping, Optional, Sequence, Union

from .checks import is_int, is_number
from .paired_stats import bootstrap_difference, holm, paired_difference, paired_t_p_value

#: how tables name the metrics of PML's AccuracyCalculator and of the XML paper's probe
METRIC_NAMES = {
    "mean_average_precision_at_r": "MAP@R",
    "mean_average_precision": "MAP",
    "precision_at_1": "P@1",
    "r_precision": "R-precision",
    "AMI": "AMI",
    "NMI": "NMI",
    "map_unseen": "MAP_x (unseen half)",
    "map_seen": "MAP_c (seen half)",
}
#: the verdict vocabulary (docs/benchmarks.md); the last is followed by " (n seeds)"
VERDICTS = ("shown", "no effect of practical size", "contradicted", "inconclusive")
#: what a claim says about ``variant − baseline``: better, worse, or no different
CLAIMS = ("greater", "less", "on_par")
#: the level of every test behind a verdict (the intervals are 95 %)
ALPHA = 0.05
#: defaults of the paired bootstrap (:func:`~pml_extensions.utils.paired_stats.bootstrap_difference`)
BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 10000, 0


def compare(
    variants: Mapping[str, dict],
    variant: str,
    baseline: str,
    metric: str,
    *,
    per_class: Optional[Mapping] = None,
    smallest_effect: Optional[float] = None,
    claim: str = "greater",
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    bootstrap_seed: int = BOOTSTRAP_SEED,
) -> dict:
    """The paired comparison ``variant − baseline`` on ``metric`` from the ``variants`` of a results dict.

    Args:
        variants: ``results["variants"]``: ``{name: {"per_seed": {seed: {metric: value}}}}``.
        variant, baseline, metric: what is compared.
        per_class: ``{variant: {seed: {metric: {class: [sum, count]}}}}`` (``results["per_class"]``): bootstrap over
            seeds and test classes when both arms have ``metric`` there for every seed.
        smallest_effect: δ (metric units): the comparison becomes a claim with a verdict (:func:`verdict_word`, no
            Holm correction; :func:`claim_verdicts` corrects a table's claims together).
        claim: the claim's direction (:data:`CLAIMS`).
        n_resamples, bootstrap_seed: the bootstrap's number of resamples and numpy seed.

    Returns:
        ``{"variant", "baseline", "metric", "mean_difference", "std", "n", "seeds", "differences", "ci95"}`` (per-seed
        differences in seed order, their mean, sample std and 95 % t interval; ``std`` and ``ci95`` ``None`` for one
        seed); with ``per_class`` or ``smallest_effect`` also ``bootstrap_ci95``, ``bootstrap``, ``p_value_t``,
        ``p_value_bootstrap``; with ``smallest_effect`` also ``claim``, ``smallest_effect``, ``p_value``, ``p_holm``
        and ``verdict``.

    Raises:
        ValueError: an unknown variant (listing the known ones), a metric missing for some seed, seeds that differ
            between the two, a δ that is not a positive number, or an unknown claim.

    Example::

        >>> v = {"a": {"per_seed": {"0": {"m": 11.0}, "1": {"m": 12.0}, "2": {"m": 16.0}}},
        ...      "b": {"per_seed": {"0": {"m": 10.0}, "1": {"m": 10.0}, "2": {"m": 10.0}}}}
        >>> c = compare(v, "a", "b", "m")
        >>> c["differences"], c["mean_difference"], [round(x, 4) for x in c["ci95"]]
        ([1.0, 2.0, 6.0], 3.0, [-3.5724, 9.5724])
        >>> compare(v, "a", "b", "m", smallest_effect=1.0)["verdict"]
        'inconclusive (3 seeds)'
    """
    for name in (variant, baseline):
        if name not in variants:
            raise ValueError(
                f"comparison ({variant!r}, {baseline!r}): unknown variant {name!r}; have {sorted(variants)}"
            )
    if claim not in CLAIMS:
        raise ValueError(f"comparison ({variant!r}, {baseline!r}): claim must be one of {CLAIMS}, got {claim!r}")
    _check_delta(smallest_effect, f"comparison ({variant!r}, {baseline!r}, {metric!r})")
    rows = {}
    for name in (variant, baseline):
        missing = [s for s, row in variants[name]["per_seed"].items() if metric not in row]
        if missing:
            raise ValueError(f"comparison ({variant!r}, {baseline!r}): {name!r} has no {metric!r} for seeds {missing}")
        rows[name] = {s: row[metric] for s, row in variants[name]["per_seed"].items()}
    a, b = rows[variant], rows[baseline]
    entry = {"variant": variant, "baseline": baseline, "metric": metric}
    if len(a) == 1 and set(a) == set(b):
        (s,) = a
        entry.update(mean_difference=a[s] - b[s], std=None, n=1, seeds=[s], differences=[a[s] - b[s]], ci95=None)
    else:
        d = paired_difference(a, b, 0.95)
        entry.update({k: d[k] for k in ("mean_difference", "std", "n", "seeds", "differences")}, ci95=d["ci"])
    classes = _classes_of(per_class, variant, baseline, metric, entry["seeds"])
    if classes is None and smallest_effect is None:
        return entry
    if classes is not None:
        boot = bootstrap_difference(*classes, per_class=True, n_resamples=n_resamples, seed=bootstrap_seed)
    elif entry["n"] >= 2:
        boot = bootstrap_difference(a, b, n_resamples=n_resamples, seed=bootstrap_seed)
    else:
        boot = None
    entry["bootstrap_ci95"] = None if boot is None else boot["ci"]
    keys = ("resampled", "method", "n_resamples", "seed", "n_classes")
    entry["bootstrap"] = None if boot is None else {k: boot[k] for k in keys}
    entry["p_value_t"] = paired_t_p_value(entry["mean_difference"], entry["std"], entry["n"])
    entry["p_value_bootstrap"] = None if boot is None else boot["p_value"]
    if smallest_effect is not None:
        entry.update(claim=claim, smallest_effect=float(smallest_effect), p_value=_p_value(entry))
        entry["p_holm"] = entry["p_value"]
        entry["verdict"] = verdict_word(entry, claim)
    return entry


def _classes_of(per_class, variant, baseline, metric, seeds):
    """Both arms' ``{seed: {class: [sum, count]}}`` on ``metric``, or None when per-class data do not cover them."""
    if not per_class or variant not in per_class or baseline not in per_class:
        return None
    arms = []
    for name in (variant, baseline):
        by_seed = {str(s): rows for s, rows in per_class[name].items()}
        if any(metric not in by_seed.get(s, {}) for s in seeds):
            return None
        arms.append({s: by_seed[s][metric] for s in seeds})
    return tuple(arms)


def _check_delta(delta, where: str) -> None:
    if delta is None:
        return
    if not is_number(delta) or not math.isfinite(delta) or delta <= 0:
        raise ValueError(f"{where}: the smallest effect must be a positive number (metric units), got {delta!r}")


def _interval_text(ci, decimals) -> str:
    return f"[{ci[0]:+.{decimals}f}, {ci[1]:+.{decimals}f}]"


def claim_verdicts(
    comparisons: Sequence[dict],
    claims: Union[str, Sequence[str], None] = None,
    smallest_effects: Union[None, float, Sequence[Optional[float]]] = None,
    alpha: float = ALPHA,
) -> List[str]:
    """The verdicts on several claims of one table, Holm-corrected together (rules: docs/benchmarks.md).

    Args:
        comparisons: items of ``comparisons`` (:func:`compare`).
        claims: one direction for all, one per comparison, or None: each comparison's ``claim`` (else ``"greater"``).
        smallest_effects: δ for all, one per comparison, or None: each comparison's ``smallest_effect``.
        alpha: the family-wise level.

    Returns:
        One word of :data:`VERDICTS` per comparison. A comparison's p-value is its ``p_value``, else the larger of
        ``p_value_t`` and ``p_value_bootstrap``, else its paired t-test's; one without any is read from its interval,
        outside the family.

    Raises:
        ValueError: a list of claims or δ whose length differs from the comparisons', an unknown claim.

    By hand (points; δ = 1; three seeds; differences A: 2, 2.5, 3; B: 0.5, 1, 1.5; C: 0.10, 0.12, 0.14): the t
    intervals m ± 4.3027 · sd / √3 are A [1.258, 3.742], B [−0.242, 2.242], C [0.070, 0.170]; the t-test's
    p = 1 − t / √(t² + 2) is A 0.01307, B 0.07418, C 0.00913 (the bootstrap stays inside the t interval); Holm:
    C 0.0274, A 0.0274, B 0.0742. A is shown, B inconclusive, C within ±1.

    Example::

        >>> arm = lambda *v: {"per_seed": {str(s): {"m": x} for s, x in enumerate(v)}}
        >>> v = {"b": arm(0.0, 0.0, 0.0), "A": arm(2.0, 2.5, 3.0), "B": arm(0.5, 1.0, 1.5), "C": arm(0.10, 0.12, 0.14)}
        >>> cs = [compare(v, name, "b", "m") for name in "ABC"]
        >>> claim_verdicts(cs, smallest_effects=1.0)
        ['shown', 'inconclusive (3 seeds)', 'no effect of practical size']
        >>> [round(x, 3) for x in cs[0]["ci95"]], format_difference(cs[1], digits=3)
        ([1.258, 3.742], '+1.000 [-0.242, +2.242]')
    """
    k = len(comparisons)

    def per_item(value, name):
        if value is None or isinstance(value, (str, int, float)):
            return [value] * k
        value = list(value)
        if len(value) != k:
            raise ValueError(f"{name} has {len(value)} entries for {k} comparisons")
        return value

    claims_list, deltas = per_item(claims, "claims"), per_item(smallest_effects, "smallest_effects")
    adjusted = holm([_p_value(c) for c in comparisons])
    return [
        verdict_word(c, claim or c.get("claim") or "greater", delta, p_holm=p, alpha=alpha)
        for c, claim, delta, p in zip(comparisons, claims_list, deltas, adjusted)
    ]


def _p_value(comparison: dict) -> Optional[float]:
    if comparison.get("p_value") is not None:
        return comparison["p_value"]
    ps = [comparison.get(k) for k in ("p_value_t", "p_value_bootstrap") if comparison.get(k) is not None]
    if ps:
        return max(ps)
    n, std = comparison.get("n"), comparison.get("std")
    if isinstance(n, int) and std is not None and "mean_difference" in comparison:
        return paired_t_p_value(comparison["mean_difference"], std, n)
    return None


def _seed_count(comparison: dict) -> Optional[int]:
    n = comparison.get("n")
    if is_int(n):
        return n
    for key in ("differences", "seeds"):
        if comparison.get(key):
            return len(comparison[key])
    return None


def _inconclusive(comparison: dict) -> str:
    n = _seed_count(comparison)
    return VERDICTS[3] if n is None else f"{VERDICTS[3]} ({n} seed{'s' if n != 1 else ''})"


def verdict_word(
    comparison: dict,
    claim: str = "greater",
    smallest_effect: Optional[float] = None,
    *,
    p_holm: Optional[float] = None,
    alpha: float = ALPHA,
) -> str:
    """The verdict on one claim about ``comparison`` (``variant − baseline``): one of :data:`VERDICTS`, the inconclusive
    one as ``"inconclusive (n seeds)"`` (rules: docs/benchmarks.md).

    Args:
        comparison: an item of ``comparisons`` (:func:`compare`): ``mean_difference`` and ``ci95`` (``None`` or NaN:
            a single seed), and where present ``bootstrap_ci95`` (the envelope of both is read), ``p_holm`` and ``n``
            (else the length of ``differences`` or ``seeds``).
        claim: ``"greater"``, ``"less"`` or ``"on_par"``.
        smallest_effect: δ in the comparison's units; default its ``smallest_effect`` (none: inconclusive).
        p_holm: the claim's Holm-adjusted p-value (:func:`claim_verdicts`); default the comparison's ``p_holm``;
            without one the interval alone decides.
        alpha: the level the adjusted p-value is held to.

    Raises:
        ValueError: an unknown ``claim`` or a δ that is not a positive number.

    Example::

        >>> c = {"mean_difference": 0.12, "ci95": [0.03, 0.22], "n": 20}  # points, the ProxyAnchor cell
        >>> verdict_word(c), verdict_word(c, smallest_effect=1.0), verdict_word(c, smallest_effect=0.1)
        ('inconclusive (20 seeds)', 'no effect of practical size', 'shown')
        >>> verdict_word({"mean_difference": -3.85, "ci95": [-4.27, -3.43], "n": 22}, smallest_effect=0.5)
        'contradicted'
    """
    if claim not in CLAIMS:
        raise ValueError(f"claim must be one of {', '.join(CLAIMS)}, got {claim!r}")
    delta = comparison.get("smallest_effect") if smallest_effect is None else smallest_effect
    _check_delta(delta, "verdict_word")
    ci = _interval(comparison)
    n = _seed_count(comparison)
    if delta is None or ci is None or (n is not None and n < 2):
        return _inconclusive(comparison)
    low, high = ci
    m = comparison["mean_difference"]
    p = comparison.get("p_holm") if p_holm is None else p_holm
    significant = p is None or p < alpha
    above, below = low > 0 and significant, high < 0 and significant
    shown = above and m >= delta if claim == "greater" else below and m <= -delta if claim == "less" else False
    if shown:
        return VERDICTS[0]
    wrong_above, wrong_below = claim in ("less", "on_par") and above, claim in ("greater", "on_par") and below
    if (wrong_above and m >= delta) or (wrong_below and m <= -delta):
        return VERDICTS[2]
    if -delta < low and high < delta:
        return VERDICTS[1]
    return _inconclusive(comparison)


def effect_bound(comparison: dict, scale: float = 1.0) -> Optional[float]:
    """The largest effect the verdict's interval (the envelope of ``ci95`` and ``bootstrap_ci95``) leaves possible:
    ``max(|low|, |high|) · scale`` (metric units times ``scale``, e.g. 100 for points); ``None`` for a single seed.

    Example::

        >>> effect_bound({"ci95": [-0.0016, 0.0062]}, scale=100), effect_bound({"ci95": None})
        (0.62, None)
    """
    ci = _interval(comparison)
    return None if ci is None else max(abs(ci[0]), abs(ci[1])) * scale


def _valid(ci) -> bool:
    return ci is not None and not any(isinstance(v, float) and math.isnan(v) for v in ci)


def _interval(comparison: dict):
    """The envelope of ``ci95`` and ``bootstrap_ci95``, or None for a single seed (``None`` or NaN ends)."""
    if not _valid(comparison.get("ci95")):  # one seed: no t interval (a bootstrap over classes alone is no verdict)
        return None
    cis = [ci for ci in (comparison.get("ci95"), comparison.get("bootstrap_ci95")) if _valid(ci)]
    return [min(ci[0] for ci in cis), max(ci[1] for ci in cis)]


def verdict(comparison: dict, decimals: int = 4) -> str:
    """One line on a comparison whose claim is "variant > baseline" (or its own ``claim``): the difference, its
    intervals, δ and the verdict (:func:`verdict_word`)."""
    c, ci = comparison, comparison["ci95"]
    name = METRIC_NAMES.get(c["metric"], c["metric"])
    diff = f"{c['variant']} − {c['baseline']} {name} {c['mean_difference']:+.{decimals}f}"
    word = verdict_word(comparison, c.get("claim") or "greater")
    if ci is None:
        return f"{diff} (1 seed, no interval): {word}"
    diff += f", 95 % CI {_interval_text(ci, decimals)} over {c['n']} seeds"
    if c.get("bootstrap_ci95") is not None:
        how = (c.get("bootstrap") or {}).get("resampled", "seeds")
        diff += f" (bootstrap over {how} {_interval_text(c['bootstrap_ci95'], decimals)})"
    delta = c.get("smallest_effect")
    if delta is None:
        return f"{diff}: {word} (no smallest effect of interest given)"
    return f"{diff}, smallest effect {delta:g}: {word}"


def format_mean_std(summary: dict, metric: str, digits: int = 2, scale: float = 1.0) -> str:
    """``"mean ± std"`` of one variant's summary (``results["variants"][name]``), times ``scale`` (e.g. 100 for
    percent); ``"mean ± –"`` with a single seed.

    Example::

        >>> format_mean_std({"mean": {"m": 0.5}, "std": {"m": 0.01}}, "m", 1, scale=100)
        '50.0 ± 1.0'
    """
    mean, std = summary["mean"][metric], summary["std"].get(metric)
    return f"{scale * mean:.{digits}f} ± " + ("–" if std is None else f"{scale * std:.{digits}f}")


def format_difference(comparison: dict, digits: int = 2, scale: float = 1.0, interval: str = "ci95") -> str:
    """``"+d [low, high]"`` (the mean paired difference and its 95 % interval, times ``scale``), or ``"+d (1
    seed)"``; ``interval`` names the interval: ``"ci95"`` (Student-t over seeds) or ``"bootstrap_ci95"``.

    Example::

        >>> format_difference({"mean_difference": 0.5, "ci95": [0.25, 0.75]}, 1), format_difference(
        ...     {"mean_difference": -0.5, "ci95": None}, 1)
        ('+0.5 [+0.2, +0.8]', '-0.5 (1 seed)')
    """
    if interval not in ("ci95", "bootstrap_ci95"):
        raise ValueError(f"interval must be 'ci95' or 'bootstrap_ci95', got {interval!r}")
    ci, d = comparison.get(interval), scale * comparison["mean_difference"]
    if not _valid(ci):
        return f"{d:+.{digits}f} (1 seed)"
    return f"{d:+.{digits}f} [{scale * ci[0]:+.{digits}f}, {scale * ci[1]:+.{digits}f}]"


def wins(comparison: dict) -> int:
    """How many seeds have a positive difference (``variant`` above ``baseline``)."""
    return int(sum(d > 0 for d in comparison["differences"]))
