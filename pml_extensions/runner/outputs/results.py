"""``results.json`` and ``results.md`` of a multi-seed comparison, in one layout for every protocol.

Layout of ``results.json`` (other tools read these keys)::

    {
      "variants": {NAME: {"per_seed": {SEED: {METRIC: value}}, "mean": {METRIC: value}, "std": {METRIC: value}}},
      "comparisons": [{"variant": NAME, "baseline": NAME, "metric": METRIC, "mean_difference": float,
                       "std": float, "n": int, "seeds": [...], "differences": [...], "ci95": [low, high]}],
      ...any extra keys the protocol adds (config, dataset, timings)
    }

Seeds are JSON object keys, hence strings (``"0"``); ``std`` is the sample std over seeds (ddof = 1), ``None`` with a
single seed. ``ci95`` is the 95 % Student-t interval of the paired per-seed difference
(:func:`pml_extensions.utils.paired_stats.paired_difference`); with a single seed it is ``None`` and the markdown says
so.

**Verdicts** (one vocabulary for every table and claim of the package and its benchmarks, :data:`VERDICTS`): a paper's
claim about a paired comparison is read from the comparison's 95 % CI by :func:`verdict_word`:

- ``"reproduced"``: the claim is that the variant is better (``claim="greater"``) or worse (``"less"``) than the
  baseline, and the whole interval lies on that side of 0;
- ``"contradicted"``: the whole interval lies on the other side of 0, or, for a claim of no difference
  (``"on_par"``), the interval excludes 0;
- ``"not shown"``: the interval contains 0 (a directional claim), or there is a single seed (no interval);
- ``"consistent"``: a claim of no difference and an interval that contains 0 (it cannot prove equality: an
  interval wider than the effect the claim rules out shows nothing).

Example::

    >>> from pml_extensions.runner.outputs.results import summarize, render_markdown
    >>> per_seed = {"gap": {0: {"mean_average_precision_at_r": 0.50}, 1: {"mean_average_precision_at_r": 0.49}},
    ...             "xml": {0: {"mean_average_precision_at_r": 0.52}, 1: {"mean_average_precision_at_r": 0.50}}}
    >>> results = summarize(per_seed, comparisons=[("xml", "gap")])
    >>> results["comparisons"][0]["mean_difference"]  # doctest: +ELLIPSIS
    0.015...
    >>> c = compare(results["variants"], "xml", "gap", "mean_average_precision_at_r")
    >>> verdict_word(c), format_difference(c, digits=3, scale=100)
    ('not shown', '+1.500 [-4.853, +7.853]')
"""

import math
import os
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

from ...utils.atomic_io import atomic_write_json, atomic_write_text
from ...utils.paired_stats import mean_std, paired_difference

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
#: the verdict vocabulary (see the module docstring)
VERDICTS = ("reproduced", "contradicted", "not shown", "consistent")
#: what a claim says about ``variant − baseline``: better, worse, or no different
CLAIMS = ("greater", "less", "on_par")


def _seed_key(seed) -> str:
    return str(seed)


def summarize(
    per_seed: Mapping[str, Mapping[object, Mapping[str, float]]],
    comparisons: Iterable[Tuple[str, str]] = (),
    metrics: Sequence[str] = ("mean_average_precision_at_r",),
    extra: Optional[dict] = None,
) -> dict:
    """Build the ``results.json`` dict from per-seed metrics.

    Args:
        per_seed: ``{variant: {seed: {metric: value}}}``; seeds may be ints or strings (stored as strings).
        comparisons: ``(variant, baseline)`` pairs; each is compared on every metric of ``metrics``.
        metrics: metrics for which comparisons are computed (mean/std are computed for every metric present).
        extra: further keys copied into the result (must not be ``variants`` or ``comparisons``).

    Raises:
        ValueError: an unknown variant in ``comparisons``, a metric missing for some seed, seeds that differ
            between a variant and its baseline, or a reserved key in ``extra``.
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
    out = {"variants": variants, "comparisons": []}
    for variant, baseline in comparisons:
        for m in metrics:
            out["comparisons"].append(compare(variants, variant, baseline, m))
    for key, value in (extra or {}).items():
        if key in out:
            raise ValueError(f"extra key {key!r} is reserved")
        out[key] = value
    return out


def compare(variants: Mapping[str, dict], variant: str, baseline: str, metric: str) -> dict:
    """The paired comparison ``variant − baseline`` on ``metric`` from the ``variants`` of a results dict (what
    :func:`summarize` lists under ``comparisons``; also for a claim whose pair is not listed there).

    Returns:
        ``{"variant", "baseline", "metric", "mean_difference", "std", "n", "seeds", "differences", "ci95"}``: the
        per-seed differences in seed order, their mean, sample std (ddof = 1) and 95 % Student-t interval; with a
        single seed ``std`` and ``ci95`` are ``None``.

    Raises:
        ValueError: an unknown variant (the message lists the known ones), a metric missing for some seed, or
            seeds that differ between the two (a paired difference needs the same seeds).

    Example::

        >>> v = summarize({"a": {0: {"m": 11.0}, 1: {"m": 12.0}, 2: {"m": 16.0}},
        ...                "b": {0: {"m": 10.0}, 1: {"m": 10.0}, 2: {"m": 10.0}}})["variants"]
        >>> c = compare(v, "a", "b", "m")
        >>> c["differences"], c["mean_difference"], [round(x, 4) for x in c["ci95"]]
        ([1.0, 2.0, 6.0], 3.0, [-3.5724, 9.5724])
    """
    for name in (variant, baseline):
        if name not in variants:
            raise ValueError(
                f"comparison ({variant!r}, {baseline!r}): unknown variant {name!r}; have {sorted(variants)}"
            )
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
        return entry
    d = paired_difference(a, b, 0.95)
    entry.update(
        mean_difference=d["mean_difference"],
        std=d["std"],
        n=d["n"],
        seeds=d["seeds"],
        differences=d["differences"],
        ci95=d["ci"],
    )
    return entry


def _fmt(value, decimals):
    return "–" if value is None else f"{value:.{decimals}f}"


def render_markdown(results: dict, metrics: Optional[Sequence[str]] = None, header: str = "", decimals: int = 4) -> str:
    """Two tables: per variant mean ± std over seeds (and the per-seed values of the first metric), then each
    comparison with its mean paired difference, 95 % CI and whether the CI excludes 0."""
    variants = results["variants"]
    if metrics is None:
        metrics = sorted({m for v in variants.values() for m in v["mean"]})
    first = metrics[0]
    seeds = sorted({s for v in variants.values() for s in v["per_seed"]}, key=lambda s: (len(s), s))
    lines = [header.rstrip() + "\n"] if header else []
    lines.append(
        "| variant | "
        + " | ".join(f"{METRIC_NAMES.get(m, m)} (mean ± std)" for m in metrics)
        + f" | {METRIC_NAMES.get(first, first)} per seed ({', '.join(seeds)}) |"
    )
    lines.append("|---|" + "---|" * (len(metrics) + 1))
    for name, v in variants.items():
        cells = [f"{_fmt(v['mean'].get(m), decimals)} ± {_fmt(v['std'].get(m), decimals)}" for m in metrics]
        per = ", ".join(_fmt(v["per_seed"][s].get(first), decimals) if s in v["per_seed"] else "–" for s in seeds)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {per} |")
    if results.get("comparisons"):
        lines += [
            "",
            "| comparison (paired by seed) | metric | mean difference | 95 % CI | per-seed differences "
            "| CI excludes 0 |",
            "|---|---|---|---|---|---|",
        ]
        for c in results["comparisons"]:
            ci = c["ci95"]
            ci_text = "n/a (1 seed)" if ci is None else f"[{ci[0]:+.{decimals}f}, {ci[1]:+.{decimals}f}]"
            verdict = "n/a" if ci is None else ("yes" if ci[0] > 0 or ci[1] < 0 else "no")
            diffs = ", ".join(f"{d:+.{decimals}f}" for d in c["differences"])
            lines.append(
                f"| {c['variant']} − {c['baseline']} | {METRIC_NAMES.get(c['metric'], c['metric'])} | "
                f"{c['mean_difference']:+.{decimals}f} | {ci_text} | {diffs} | {verdict} |"
            )
    return "\n".join(lines) + "\n"


def verdict_word(comparison: dict, claim: str = "greater") -> str:
    """The verdict on a claim about ``comparison`` (``variant − baseline``), read from its 95 % CI: one of
    :data:`VERDICTS` (the module docstring says when each applies).

    Args:
        comparison: an item of ``comparisons`` (:func:`compare`); ``ci95`` ``None`` (or NaN) means a single seed.
        claim: ``"greater"`` (the paper says the variant is better), ``"less"`` (worse) or ``"on_par"`` (no
            different).

    Raises:
        ValueError: an unknown ``claim``.

    Example::

        >>> [verdict_word({"ci95": ci}) for ci in ([0.1, 2.0], [-2.0, -0.1], [-0.1, 2.0], None)]
        ['reproduced', 'contradicted', 'not shown', 'not shown']
        >>> verdict_word({"ci95": [-0.1, 2.0]}, "on_par"), verdict_word({"ci95": [-2.0, -0.1]}, "less")
        ('consistent', 'reproduced')
    """
    if claim not in CLAIMS:
        raise ValueError(f"claim must be one of {', '.join(CLAIMS)}, got {claim!r}")
    ci = _interval(comparison)
    if ci is None:
        return "not shown"
    low, high = ci
    if claim == "on_par":
        return "consistent" if low <= 0 <= high else "contradicted"
    above, below = low > 0, high < 0
    if (above and claim == "greater") or (below and claim == "less"):
        return "reproduced"
    if above or below:
        return "contradicted"
    return "not shown"


def effect_bound(comparison: dict, scale: float = 1.0) -> Optional[float]:
    """The largest effect a comparison's 95 % CI leaves possible: ``max(|low|, |high|) · scale`` (in the metric's
    units times ``scale``, e.g. 100 for points), ``None`` without an interval (a single seed). A "not shown"
    verdict (:func:`verdict_word`) is stated as "no effect larger than" this bound.

    Example::

        >>> effect_bound({"ci95": [-0.0016, 0.0062]}, scale=100), effect_bound({"ci95": None})
        (0.62, None)
    """
    ci = _interval(comparison)
    return None if ci is None else max(abs(ci[0]), abs(ci[1])) * scale


def _interval(comparison: dict):
    """The comparison's ``ci95``, or None for a single seed (``None`` or NaN ends)."""
    ci = comparison.get("ci95")
    return None if ci is None or any(isinstance(v, float) and math.isnan(v) for v in ci) else ci


def verdict(comparison: dict, decimals: int = 4) -> str:
    """One line on a comparison whose claim is "variant > baseline": the difference, its interval and the verdict
    (:func:`verdict_word`): reproduced when the 95 % CI of the paired difference lies above 0, contradicted when
    below, not shown when it contains 0 (or with a single seed)."""
    c, ci = comparison, comparison["ci95"]
    name = METRIC_NAMES.get(c["metric"], c["metric"])
    diff = f"{c['variant']} − {c['baseline']} {name} {c['mean_difference']:+.{decimals}f}"
    word = verdict_word(comparison)
    if ci is None:
        return f"{diff} (1 seed, no interval): {word}"
    diff += f", 95 % CI [{ci[0]:+.{decimals}f}, {ci[1]:+.{decimals}f}] over {c['n']} seeds"
    reason = {
        "reproduced": "the interval lies above 0",
        "contradicted": "the interval lies below 0",
        "not shown": "the interval contains 0",
    }[word]
    return f"{diff}: {word}{' at this scale' if word == 'not shown' else ''} ({reason})"


def format_mean_std(summary: dict, metric: str, digits: int = 2, scale: float = 1.0) -> str:
    """``"mean ± std"`` of one variant's summary (``results["variants"][name]``), times ``scale`` (e.g. 100 for
    percent); ``"mean ± –"`` with a single seed.

    Example::

        >>> format_mean_std({"mean": {"m": 0.5}, "std": {"m": 0.01}}, "m", 1, scale=100)
        '50.0 ± 1.0'
    """
    mean, std = summary["mean"][metric], summary["std"].get(metric)
    return f"{scale * mean:.{digits}f} ± " + ("–" if std is None else f"{scale * std:.{digits}f}")


def format_difference(comparison: dict, digits: int = 2, scale: float = 1.0) -> str:
    """``"+d [low, high]"`` (the mean paired difference and its 95 % CI, times ``scale``), or ``"+d (1 seed)"``.

    Example::

        >>> format_difference({"mean_difference": 0.5, "ci95": [0.25, 0.75]}, 1), format_difference(
        ...     {"mean_difference": -0.5, "ci95": None}, 1)
        ('+0.5 [+0.2, +0.8]', '-0.5 (1 seed)')
    """
    ci, d = comparison.get("ci95"), scale * comparison["mean_difference"]
    if ci is None or any(isinstance(v, float) and math.isnan(v) for v in ci):
        return f"{d:+.{digits}f} (1 seed)"
    return f"{d:+.{digits}f} [{scale * ci[0]:+.{digits}f}, {scale * ci[1]:+.{digits}f}]"


def wins(comparison: dict) -> int:
    """How many seeds have a positive difference (``variant`` above ``baseline``)."""
    return int(sum(d > 0 for d in comparison["differences"]))


def write_results(
    folder: str,
    results: dict,
    metrics: Optional[Sequence[str]] = None,
    header: str = "",
    name: str = "results",
    footer: str = "",
    decimals: int = 4,
) -> Tuple[str, str]:
    """Write ``NAME.json`` and ``NAME.md`` (tables with ``decimals`` digits, then ``footer``) into ``folder``
    atomically; return both paths."""
    os.makedirs(folder, exist_ok=True)
    json_path = os.path.join(folder, f"{name}.json")
    md_path = os.path.join(folder, f"{name}.md")
    atomic_write_json(json_path, results)
    md = render_markdown(results, metrics, header, decimals)
    if footer:
        md += "\n" + footer.rstrip() + "\n"
    atomic_write_text(md_path, md)
    return json_path, md_path
