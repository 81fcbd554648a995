"""``results.json`` and ``results.md`` of a multi-seed comparison, in one layout for every protocol, and the verdicts
on the claims they test.

Layout of ``results.json`` (other tools read these keys)::

    {
      "variants": {NAME: {"per_seed": {SEED: {METRIC: value}}, "mean": {METRIC: value}, "std": {METRIC: value}}},
      "comparisons": [{"variant": NAME, "baseline": NAME, "metric": METRIC, "mean_difference": float,
                       "std": float, "n": int, "seeds": [...], "differences": [...], "ci95": [low, high],
                       # a claim (a smallest effect was given) or per-class data, also:
                       "bootstrap_ci95": [low, high], "bootstrap": {"resampled", "method", "n_resamples", "seed",
                       "n_classes"}, "p_value_t": float, "p_value_bootstrap": float,
                       # a claim, also:
                       "claim": "greater" | "less" | "on_par", "smallest_effect": δ, "p_value": float,
                       "p_holm": float, "verdict": str}],
      "per_class": {NAME: {SEED: {METRIC: {CLASS: [sum, count]}}}},      # when given: recompute the bootstrap
      "text": {"header": [blocks], "footer": [blocks], "metrics": [...], "decimals": int},   # by write_results
      ...any extra keys the protocol adds (config, dataset, timings)
    }

Seeds are JSON object keys, hence strings (``"0"``); ``std`` is the sample std over seeds (ddof = 1), ``None`` with a
single seed. ``ci95`` is the 95 % Student-t interval of the paired per-seed difference
(:func:`pml_extensions.utils.paired_stats.paired_difference`; ``None`` with a single seed); ``bootstrap_ci95`` the
95 % percentile interval of a paired bootstrap over seeds *and* test classes when per-class data were given, over
seeds only otherwise (``bootstrap.resampled`` says which; :func:`~pml_extensions.utils.paired_stats.
bootstrap_difference`, 10 000 resamples, numpy seed 0 by default). ``text`` holds what :func:`write_results` was
given to write around the tables (blocks of :mod:`.tables`), so ``results.md`` and the report are rebuilt from this
file alone (:func:`results_blocks`).

**Claims and verdicts** (one vocabulary for every table and claim of the package and its benchmarks). A claim is a
paired comparison ``variant − baseline`` with a direction (``"greater"``: the paper says the variant is better;
``"less"``: worse; ``"on_par"``: no different) and its **smallest effect of interest** δ > 0, in the metric's units
(e.g. 0.01 for 1 MAP@R point when MAP@R is stored as a fraction). The verdict reads:

- the **interval** I = [low, high]: the envelope of the comparison's 95 % intervals, the t interval over seeds and
  the bootstrap interval (the verdict concludes only what both support: with 3 seeds the percentile bootstrap is
  too narrow, with many seeds the t interval ignores the test classes);
- the **p-value** p: the larger of the paired t-test's and the bootstrap's two-sided p-values of "the difference is
  0" (each the smallest α at which its own 1 − α interval reaches 0), and its **Holm-adjusted** value p̃ over the
  claims of one table (:func:`~pml_extensions.utils.paired_stats.holm`; one claim: p̃ = p);
- the mean difference m.

With α = 0.05, for a ``"greater"`` claim ("less" is its mirror image, every sign flipped):

1. **"shown"**: low > 0 and p̃ < α (the interval excludes 0 after Holm's correction), and m ≥ δ (the effect reaches
   the smallest effect: the estimate is of practical size, not only an interval that touches δ);
2. **"contradicted"**: high < 0 and p̃ < α, and m ≤ −δ;
3. **"no effect of practical size"**: −δ < low and high < δ (the interval lies within ±δ);
4. otherwise **"inconclusive (n seeds)"** with n the number of seeds (``"inconclusive (1 seed)"``).

A single seed (no t interval) is always inconclusive. For ``"on_par"`` rule 1 does not apply (no side is claimed;
rule 3 is the verdict that supports it) and rule 2 reads either side (low > 0 and m ≥ δ, or high < 0 and m ≤ −δ, with
p̃ < α). Without δ the verdict is "inconclusive (n seeds)": no interval can show an effect of practical size when
none is stated. Where only an interval is known (no p-value: a comparison with ``ci95`` alone) the interval decides
alone. A 0.1-point effect is therefore never "shown" under δ = 1 point, however many seeds make its interval narrow.

Hand-checked example (points; δ = 1; three seeds; differences A: 2, 2.5, 3; B: 0.5, 1, 1.5; C: 0.10, 0.12, 0.14).
The t intervals are m ± 4.3027 · sd / √3: A [1.258, 3.742], B [−0.242, 2.242], C [0.070, 0.170]; with 2 degrees of
freedom the two-sided t-test p is 1 − t / √(t² + 2): A t = 8.660, p = 0.01307; B t = 3.464, p = 0.07418; C t =
10.392, p = 0.00913 (the bootstrap over seeds stays inside [min, max] of the differences, so the t interval is the
envelope and the t p-value the larger one). Holm: C 3 · 0.00913 = 0.0274, A max(2 · 0.01307, 0.0274) = 0.0274, B
max(0.0742, 0.0274) = 0.0742. A: shown (low > 0, p̃ < 0.05, m = 2.5 ≥ 1); B: the interval contains 0 and reaches
past 1: inconclusive; C: within ±1: no effect of practical size, although it excludes 0::

    >>> per_seed = {"b": {s: {"m": 0.0} for s in range(3)},
    ...             "A": {0: {"m": 2.0}, 1: {"m": 2.5}, 2: {"m": 3.0}},
    ...             "B": {0: {"m": 0.5}, 1: {"m": 1.0}, 2: {"m": 1.5}},
    ...             "C": {0: {"m": 0.10}, 1: {"m": 0.12}, 2: {"m": 0.14}}}
    >>> r = summarize(per_seed, [("A", "b"), ("B", "b"), ("C", "b")], metrics=["m"], smallest_effects={"m": 1.0})
    >>> [c["verdict"] for c in r["comparisons"]]
    ['shown', 'inconclusive (3 seeds)', 'no effect of practical size']
    >>> [round(c["p_holm"], 4) for c in r["comparisons"]], [round(x, 3) for x in r["comparisons"][0]["ci95"]]
    ([0.0274, 0.0742, 0.0274], [1.258, 3.742])

The older statistics (no claim) stay as they were::

    >>> c = compare(r["variants"], "B", "b", "m")
    >>> verdict_word(c), verdict_word(c, smallest_effect=1.0), format_difference(c, digits=3)
    ('inconclusive (3 seeds)', 'inconclusive (3 seeds)', '+1.000 [-0.242, +2.242]')
"""

import math
import os
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ...utils.atomic_io import atomic_write_json, atomic_write_text
from ...utils.paired_stats import (
    bootstrap_difference,
    holm,
    mean_std,
    paired_difference,
    paired_t_p_value,
    per_class_metric,
)
from .tables import Block, Table, as_blocks, from_json, to_json, to_markdown

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
#: the verdict vocabulary (see the module docstring); the last is followed by " (n seeds)"
VERDICTS = ("shown", "no effect of practical size", "contradicted", "inconclusive")
#: what a claim says about ``variant − baseline``: better, worse, or no different
CLAIMS = ("greater", "less", "on_par")
#: the level of every test behind a verdict (the intervals are 95 %)
ALPHA = 0.05
#: defaults of the paired bootstrap (:func:`~pml_extensions.utils.paired_stats.bootstrap_difference`)
BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 10000, 0

SmallestEffects = Union[None, float, Mapping[Union[str, Tuple[str, ...]], float]]


def _seed_key(seed) -> str:
    return str(seed)


def _lookup(table, variant: str, baseline: str, metric: str):
    """``table``'s value for a comparison: a plain value, or a mapping keyed by ``(variant, baseline, metric)``,
    ``(variant, baseline)`` or ``metric`` (the most specific key wins); None when none matches."""
    if table is None or not isinstance(table, Mapping):
        return table
    for key in ((variant, baseline, metric), (variant, baseline), metric):
        if key in table:
            return table[key]
    return None


def summarize(
    per_seed: Mapping[str, Mapping[object, Mapping[str, float]]],
    comparisons: Iterable[Tuple[str, str]] = (),
    metrics: Sequence[str] = ("mean_average_precision_at_r",),
    extra: Optional[dict] = None,
    *,
    per_class: Optional[Mapping[str, Mapping[object, Mapping[str, Mapping[object, Sequence[float]]]]]] = None,
    smallest_effects: SmallestEffects = None,
    claims: Union[None, str, Mapping] = None,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    bootstrap_seed: int = BOOTSTRAP_SEED,
) -> dict:
    """Build the ``results.json`` dict from per-seed metrics.

    Args:
        per_seed: ``{variant: {seed: {metric: value}}}``; seeds may be ints or strings (stored as strings).
        comparisons: ``(variant, baseline)`` pairs; each is compared on every metric of ``metrics``.
        metrics: metrics for which comparisons are computed (mean/std are computed for every metric present).
        extra: further keys copied into the result (must not be ``variants``, ``comparisons``, ``per_class``).
        per_class: ``{variant: {seed: {metric: {class: [sum, count]}}}}``: per test class the sum of the per-query
            (per-image) metric and the number of queries (images), so a resampled class set has the metric
            ``Σ sum / Σ count``; the comparisons of a metric given here are bootstrapped over seeds and test classes
            (others over seeds only). Stored in the result under ``per_class``.
        smallest_effects: δ of the claims, in the metric's units: one number for every comparison, or a mapping
            keyed by ``(variant, baseline, metric)``, ``(variant, baseline)`` or ``metric`` (the most specific key
            wins). A comparison with a δ is a claim: it gets ``claim``, ``smallest_effect``, ``p_value``,
            ``p_holm`` (Holm over every claim of this result) and ``verdict`` (the module docstring).
        claims: the claims' directions (:data:`CLAIMS`): one for all, or a mapping keyed like ``smallest_effects``;
            ``"greater"`` where none is given.
        n_resamples, bootstrap_seed: the bootstrap's number of resamples and numpy seed.

    Raises:
        ValueError: an unknown variant in ``comparisons``, a metric missing for some seed, seeds that differ
            between a variant and its baseline, a reserved key in ``extra``, per-class data whose metric differs
            from ``per_seed``'s (Σ sum / Σ count over all classes, relative tolerance 1e-5) or that lacks a seed, a
            δ that is not a positive number, or an unknown claim.
    """
    variants: Dict[str, dict] = {}
    for name, seeds in per_seed.items():
        if not seeds:
            raise ValueError(f"per_seed[{name!r}] holds no seeds")
        table = {_seed_key(s): {m: float(v) for m, v in row.items()} for s, row in seeds.items()}
        names = sorted({m for row in table.values() for m in row})
        mean, std = {}, {}
        for m in names:
            missing = [s for s, row in table.items() if m not in row]
            if missing:
                raise ValueError(f"per_seed[{name!r}]: metric {m!r} missing for seeds {missing}")
            summary = mean_std([row[m] for row in table.values()])
            mean[m], std[m] = summary["mean"], summary["std"]
        variants[name] = {"per_seed": table, "mean": mean, "std": std}
    classes = _per_class(per_class, variants) if per_class is not None else None
    out = {"variants": variants, "comparisons": []}
    for variant, baseline in comparisons:
        for m in metrics:
            delta = _lookup(smallest_effects, variant, baseline, m)
            claim = _lookup(claims, variant, baseline, m) or "greater"
            out["comparisons"].append(
                compare(
                    variants,
                    variant,
                    baseline,
                    m,
                    per_class=classes,
                    smallest_effect=delta,
                    claim=claim,
                    n_resamples=n_resamples,
                    bootstrap_seed=bootstrap_seed,
                )
            )
    claimed = [c for c in out["comparisons"] if "verdict" in c]
    for c, p in zip(claimed, holm([c["p_value"] for c in claimed])):  # one family: every claim of this result
        c["p_holm"] = p
        c["verdict"] = verdict_word(c, c["claim"])
    if classes is not None:
        out["per_class"] = classes
    for key, value in (extra or {}).items():
        if key in out or key == "per_class":
            raise ValueError(f"extra key {key!r} is reserved")
        out[key] = value
    return out


def _per_class(per_class, variants) -> Dict[str, Dict[str, Dict[str, Dict[str, List[float]]]]]:
    """``per_class`` with string seeds and classes, checked against the per-seed metrics it must reproduce."""
    out: Dict[str, Dict[str, Dict[str, Dict[str, List[float]]]]] = {}
    for name, seeds in per_class.items():
        if name not in variants:
            raise ValueError(f"per_class: unknown variant {name!r}; have {sorted(variants)}")
        out[name] = {}
        for seed, by_metric in seeds.items():
            s = _seed_key(seed)
            if s not in variants[name]["per_seed"]:
                raise ValueError(f"per_class[{name!r}]: seed {s!r} is not in per_seed[{name!r}]")
            out[name][s] = {}
            for m, rows in by_metric.items():
                value = per_class_metric(rows)
                seeded = variants[name]["per_seed"][s].get(m)
                if seeded is None or not math.isclose(value, seeded, rel_tol=1e-5, abs_tol=1e-9):
                    raise ValueError(
                        f"per_class[{name!r}][{s!r}][{m!r}]: Σ sum / Σ count = {value!r}, but per_seed has {seeded!r}"
                    )
                out[name][s][m] = {str(c): [float(pair[0]), float(pair[1])] for c, pair in rows.items()}
    return out


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
    """The paired comparison ``variant − baseline`` on ``metric`` from the ``variants`` of a results dict (what
    :func:`summarize` lists under ``comparisons``; also for a claim whose pair is not listed there).

    Args:
        variants: ``results["variants"]``.
        variant, baseline, metric: what is compared.
        per_class: ``{variant: {seed: {metric: {class: [sum, count]}}}}`` (``results["per_class"]``): bootstrap
            over seeds and test classes when both arms have ``metric`` there for every seed.
        smallest_effect: δ (metric units): the comparison becomes a claim with a verdict (:func:`verdict_word`, one
            claim: no Holm correction; :func:`summarize` corrects a table's claims together).
        claim: the claim's direction (:data:`CLAIMS`).
        n_resamples, bootstrap_seed: the bootstrap's number of resamples and numpy seed.

    Returns:
        ``{"variant", "baseline", "metric", "mean_difference", "std", "n", "seeds", "differences", "ci95"}``: the
        per-seed differences in seed order, their mean, sample std (ddof = 1) and 95 % Student-t interval; with a
        single seed ``std`` and ``ci95`` are ``None``. With ``per_class`` or ``smallest_effect`` also the
        bootstrap's ``bootstrap_ci95``, ``bootstrap`` (how it resampled), ``p_value_t``, ``p_value_bootstrap``;
        with ``smallest_effect`` also ``claim``, ``smallest_effect``, ``p_value``, ``p_holm`` and ``verdict`` (the
        module docstring).

    Raises:
        ValueError: an unknown variant (the message lists the known ones), a metric missing for some seed, seeds
            that differ between the two (a paired difference needs the same seeds), a δ that is not a positive
            number, or an unknown claim.

    Example::

        >>> v = summarize({"a": {0: {"m": 11.0}, 1: {"m": 12.0}, 2: {"m": 16.0}},
        ...                "b": {0: {"m": 10.0}, 1: {"m": 10.0}, 2: {"m": 10.0}}})["variants"]
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
        entry.update(
            mean_difference=d["mean_difference"],
            std=d["std"],
            n=d["n"],
            seeds=d["seeds"],
            differences=d["differences"],
            ci95=d["ci"],
        )
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
    entry["bootstrap"] = None if boot is None else {k: boot[k] for k in ("resampled", "method", "n_resamples", "seed")}
    if boot is not None:
        entry["bootstrap"]["n_classes"] = boot["n_classes"]
    entry["p_value_t"] = paired_t_p_value(entry["mean_difference"], entry["std"], entry["n"])
    entry["p_value_bootstrap"] = None if boot is None else boot["p_value"]
    if smallest_effect is not None:
        ps = [p for p in (entry["p_value_t"], entry["p_value_bootstrap"]) if p is not None]
        entry.update(claim=claim, smallest_effect=float(smallest_effect), p_value=max(ps) if ps else None)
        entry["p_holm"] = entry["p_value"]
        entry["verdict"] = verdict_word(entry, claim)
    return entry


def _classes_of(per_class, variant, baseline, metric, seeds):
    """``({seed: {class: [sum, count]}}, ...)`` of both arms on ``metric``, or None when per-class data do not cover
    them (then the bootstrap runs over seeds alone)."""
    if not per_class or variant not in per_class or baseline not in per_class:
        return None
    arms = []
    for name in (variant, baseline):
        by_seed = {_seed_key(s): rows for s, rows in per_class[name].items()}
        if any(metric not in by_seed.get(s, {}) for s in seeds):
            return None
        arms.append({s: by_seed[s][metric] for s in seeds})
    return tuple(arms)


def _check_delta(delta, where: str) -> None:
    if delta is None:
        return
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not math.isfinite(delta) or delta <= 0:
        raise ValueError(f"{where}: the smallest effect must be a positive number (metric units), got {delta!r}")


def _fmt(value, decimals):
    return "–" if value is None else f"{value:.{decimals}f}"


def _interval_text(ci, decimals) -> str:
    return f"[{ci[0]:+.{decimals}f}, {ci[1]:+.{decimals}f}]"


def _p_text(p) -> str:
    return "–" if p is None else f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


def results_tables(
    results: dict, metrics: Optional[Sequence[str]] = None, decimals: Optional[int] = None
) -> List[Table]:
    """The tables of a results dict (:mod:`.tables`): per variant mean ± std over seeds (and the per-seed values of
    the first metric), then each comparison with its mean paired difference, its 95 % t interval and whether it
    excludes 0 — or, when the comparisons are claims, also the bootstrap interval, the p-values (raw and
    Holm-adjusted), δ and the verdict, with note lines that say how they were computed.

    Args:
        results: a :func:`summarize` dict (or a ``results.json`` read back).
        metrics: the variant table's columns; default ``results["text"]["metrics"]``, else every metric present.
        decimals: digits of every number; default ``results["text"]["decimals"]``, else 4.

    Example::

        >>> r = summarize({"a": {0: {"m": 1.0}, 1: {"m": 2.0}}, "b": {0: {"m": 0.5}, 1: {"m": 0.5}}}, [("a", "b")],
        ...               metrics=["m"])
        >>> [t.columns[0] for t in results_tables(r)], results_tables(r, decimals=2)[1].rows[0][:3]
        (['variant', 'comparison (paired by seed)'], ['a − b', 'm', '+1.00'])
    """
    text = results.get("text") or {}
    variants = results["variants"]
    if metrics is None:
        metrics = text.get("metrics") or sorted({m for v in variants.values() for m in v["mean"]})
    if decimals is None:
        decimals = text.get("decimals", 4)
    first = metrics[0]
    seeds = sorted({s for v in variants.values() for s in v["per_seed"]}, key=lambda s: (len(s), s))
    rows = []
    for name, v in variants.items():
        cells = [f"{_fmt(v['mean'].get(m), decimals)} ± {_fmt(v['std'].get(m), decimals)}" for m in metrics]
        per = ", ".join(_fmt(v["per_seed"][s].get(first), decimals) if s in v["per_seed"] else "–" for s in seeds)
        rows.append([name, *cells, per])
    tables = [
        Table(
            ["variant", *[f"{METRIC_NAMES.get(m, m)} (mean ± std)" for m in metrics]]
            + [f"{METRIC_NAMES.get(first, first)} per seed ({', '.join(seeds)})"],
            rows,
            numeric=[False] + [True] * len(metrics) + [False],
        )
    ]
    comparisons = results.get("comparisons") or []
    if not comparisons:
        return tables
    claims = any("verdict" in c for c in comparisons)
    if not claims:
        rows = []
        for c in comparisons:
            ci = c["ci95"]
            rows.append(
                [
                    f"{c['variant']} − {c['baseline']}",
                    METRIC_NAMES.get(c["metric"], c["metric"]),
                    f"{c['mean_difference']:+.{decimals}f}",
                    "n/a (1 seed)" if ci is None else _interval_text(ci, decimals),
                    ", ".join(f"{d:+.{decimals}f}" for d in c["differences"]),
                    "n/a" if ci is None else ("yes" if ci[0] > 0 or ci[1] < 0 else "no"),
                ]
            )
        columns = ["comparison (paired by seed)", "metric", "mean difference", "95 % CI", "per-seed differences"]
        tables.append(Table(columns + ["CI excludes 0"], rows, numeric=[False, False, True, True, False, False]))
        return tables
    rows, resampling = [], set()
    for c in comparisons:
        ci, boot = c["ci95"], c.get("bootstrap_ci95")
        how = c.get("bootstrap") or {}
        boot_text = "–" if boot is None else _interval_text(boot, decimals)
        if boot is not None and how.get("resampled") != "seeds and test classes":
            boot_text += " (seeds only)"
        if how:
            resampling.add((how.get("n_resamples"), how.get("seed")))
        delta = c.get("smallest_effect")
        p = "–" if c.get("p_value") is None else f"{_p_text(c['p_value'])} ({_p_text(c.get('p_holm'))})"
        rows.append(
            [
                f"{c['variant']} − {c['baseline']}",
                METRIC_NAMES.get(c["metric"], c["metric"]),
                {"greater": "greater", "less": "less", "on_par": "on par"}.get(c.get("claim"), "–"),
                "–" if delta is None else f"{delta:.{decimals}g}",
                f"{c['mean_difference']:+.{decimals}f}",
                "n/a (1 seed)" if ci is None else _interval_text(ci, decimals),
                boot_text,
                p,
                ", ".join(f"{d:+.{decimals}f}" for d in c["differences"]),
                c.get("verdict", "–"),
            ]
        )
    columns = [
        "comparison (paired by seed)",
        "metric",
        "claim",
        "smallest effect δ",
        "mean difference",
        "95 % CI (t, seeds)",
        "95 % CI (bootstrap)",
        "p (Holm)",
        "per-seed differences",
        "verdict",
    ]
    n_claims = sum("verdict" in c for c in comparisons)
    notes = [
        "Bootstrap: paired percentile interval resampling seeds and test classes with replacement (seeds only "
        "where marked: no per-class data)"
        + "".join(f", {n} resamples, numpy seed {s}" for n, s in sorted(resampling, key=str))
        + ". p: the larger of the paired t-test's and the bootstrap's two-sided p-values; in parentheses Holm's "
        f"adjustment over the {n_claims} claim{'s' if n_claims != 1 else ''} of this table.",
        "Verdicts read the envelope of both intervals: **shown** (excludes 0 after Holm, mean difference reaches δ "
        "on the claimed side), **no effect of practical size** (inside ±δ), **contradicted** (excludes 0 after Holm, "
        "mean difference reaches δ on the other side), otherwise **inconclusive**.",
    ]
    numeric = [False, False, False, True, True, True, True, True, False, False]
    tables.append(Table(columns, rows, numeric=numeric, notes=notes))
    return tables


def results_blocks(results: dict) -> List[Block]:
    """What ``results.md`` and the report show of a results dict, as blocks (:mod:`.tables`): the header stored in
    ``results["text"]``, :func:`results_tables`, the footer."""
    text = results.get("text") or {}
    return [*from_json(text.get("header")), *results_tables(results), *from_json(text.get("footer"))]


def render_markdown(
    results: dict,
    metrics: Optional[Sequence[str]] = None,
    header: Union[str, Block, Sequence[Block]] = "",
    decimals: int = 4,
) -> str:
    """``header`` (a paragraph, or blocks of :mod:`.tables`), then :func:`results_tables` as Markdown."""
    return to_markdown([*as_blocks(header), *results_tables(results, metrics, decimals)])


def claim_verdicts(
    comparisons: Sequence[dict],
    claims: Union[str, Sequence[str], None] = None,
    smallest_effects: Union[None, float, Sequence[Optional[float]]] = None,
    alpha: float = ALPHA,
) -> List[str]:
    """The verdicts on several claims of one table, Holm-corrected together (the module docstring gives the rules).

    Args:
        comparisons: items of ``comparisons`` (:func:`compare`).
        claims: one direction for all, one per comparison, or None: each comparison's ``claim`` (else ``"greater"``).
        smallest_effects: δ for all, one per comparison, or None: each comparison's ``smallest_effect``.
        alpha: the family-wise level.

    Returns:
        One word of :data:`VERDICTS` per comparison (the inconclusive one with its seed count). The p-value of a
        comparison is its ``p_value``, else the larger of ``p_value_t`` and ``p_value_bootstrap``, else its paired
        t-test's from ``mean_difference``, ``std`` and ``n``; a comparison without one (``ci95`` alone) is read
        from its interval, outside the family.

    Raises:
        ValueError: a list of claims or δ whose length differs from the comparisons', an unknown claim.

    Example::

        >>> c = [{"mean_difference": 2.5, "std": 0.5, "n": 3, "ci95": [1.258, 3.742]},
        ...      {"mean_difference": 0.12, "std": 0.02, "n": 3, "ci95": [0.070, 0.170]}]
        >>> claim_verdicts(c, smallest_effects=1.0)  # t-test p 0.0131, 0.0091; Holm 0.0183, 0.0183
        ['shown', 'no effect of practical size']
    """
    k = len(comparisons)

    def per_item(value, name):
        if value is None or isinstance(value, (str, int, float)):
            return [value] * k
        value = list(value)
        if len(value) != k:
            raise ValueError(f"{name} has {len(value)} entries for {k} comparisons")
        return value

    claims_list = per_item(claims, "claims")
    deltas = per_item(smallest_effects, "smallest_effects")
    ps = [_p_value(c) for c in comparisons]
    adjusted = holm(ps)
    words = []
    for c, claim, delta, p in zip(comparisons, claims_list, deltas, adjusted):
        claim = claim or c.get("claim") or "greater"
        words.append(verdict_word(c, claim, delta, p_holm=p, alpha=alpha))
    return words


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
    if isinstance(n, int) and not isinstance(n, bool):
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
    """The verdict on one claim about ``comparison`` (``variant − baseline``): one of :data:`VERDICTS`, the
    inconclusive one as ``"inconclusive (n seeds)"`` (the module docstring gives the rules).

    Args:
        comparison: an item of ``comparisons`` (:func:`compare`): ``mean_difference`` and ``ci95`` (``None`` or NaN:
            a single seed), and where present ``bootstrap_ci95`` (the verdict reads the envelope of both),
            ``p_holm`` and ``n`` (else the length of ``differences`` or ``seeds``; the seed count is left out of
            the inconclusive word when none of them is there).
        claim: ``"greater"`` (the paper says the variant is better), ``"less"`` (worse) or ``"on_par"`` (no
            different).
        smallest_effect: δ, in the comparison's units; default the comparison's ``smallest_effect``. Without one
            the verdict is inconclusive.
        p_holm: the Holm-adjusted p-value of this claim in its table (:func:`claim_verdicts`); default the
            comparison's ``p_holm``; without one the interval alone decides whether 0 is excluded.
        alpha: the level the adjusted p-value is held to.

    Raises:
        ValueError: an unknown ``claim`` or a δ that is not a positive number.

    Example::

        >>> c = {"mean_difference": 0.12, "ci95": [0.03, 0.22], "n": 20}  # points, the ProxyAnchor cell
        >>> verdict_word(c), verdict_word(c, smallest_effect=1.0), verdict_word(c, smallest_effect=0.1)
        ('inconclusive (20 seeds)', 'no effect of practical size', 'shown')
        >>> verdict_word({"mean_difference": -0.76, "ci95": [-15.89, 14.36], "n": 3}, smallest_effect=1.0)
        'inconclusive (3 seeds)'
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
    """The largest effect a comparison's 95 % interval leaves possible: ``max(|low|, |high|) · scale`` (in the
    metric's units times ``scale``, e.g. 100 for points) of the interval the verdict reads (the envelope of
    ``ci95`` and ``bootstrap_ci95``), ``None`` without an interval (a single seed).

    Example::

        >>> effect_bound({"ci95": [-0.0016, 0.0062]}, scale=100), effect_bound({"ci95": None})
        (0.62, None)
    """
    ci = _interval(comparison)
    return None if ci is None else max(abs(ci[0]), abs(ci[1])) * scale


def _valid(ci) -> bool:
    return ci is not None and not any(isinstance(v, float) and math.isnan(v) for v in ci)


def _interval(comparison: dict):
    """The envelope of the comparison's ``ci95`` and ``bootstrap_ci95``, or None for a single seed (``None`` or NaN
    ends)."""
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


def write_results(
    folder: str,
    results: dict,
    metrics: Optional[Sequence[str]] = None,
    header: Union[str, Block, Sequence[Block]] = "",
    name: str = "results",
    footer: Union[str, Block, Sequence[Block]] = "",
    decimals: int = 4,
) -> Tuple[str, str]:
    """Write ``NAME.json`` and ``NAME.md`` into ``folder`` atomically; return both paths.

    ``NAME.json`` is ``results`` with ``text`` set to what the Markdown is rendered from (``header`` and ``footer``
    as blocks, ``metrics``, ``decimals``: :func:`results_blocks` rebuilds the document from the file alone; the
    caller's dict is not changed); ``NAME.md`` is that document: ``header``, the tables with ``decimals`` digits,
    ``footer``. ``header`` and ``footer`` are paragraphs (a string, written as it is) or blocks of :mod:`.tables`.
    """
    os.makedirs(folder, exist_ok=True)
    json_path = os.path.join(folder, f"{name}.json")
    md_path = os.path.join(folder, f"{name}.md")
    if metrics is None:
        metrics = sorted({m for v in results["variants"].values() for m in v["mean"]})
    text = {
        "header": to_json(as_blocks(header)),
        "footer": to_json(as_blocks(footer)),
        "metrics": list(metrics),
        "decimals": decimals,
    }
    stored = {**results, "text": text}
    atomic_write_json(json_path, stored)
    atomic_write_text(md_path, to_markdown(results_blocks(stored)))
    return json_path, md_path
