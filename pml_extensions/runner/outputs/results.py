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
so. Example::

    >>> from pml_extensions.runner.outputs.results import summarize, render_markdown
    >>> per_seed = {"gap": {0: {"mean_average_precision_at_r": 0.50}, 1: {"mean_average_precision_at_r": 0.49}},
    ...             "xml": {0: {"mean_average_precision_at_r": 0.52}, 1: {"mean_average_precision_at_r": 0.50}}}
    >>> results = summarize(per_seed, comparisons=[("xml", "gap")])
    >>> results["comparisons"][0]["mean_difference"]  # doctest: +ELLIPSIS
    0.015...
"""

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
        for name in (variant, baseline):
            if name not in variants:
                raise ValueError(
                    f"comparison ({variant!r}, {baseline!r}): unknown variant {name!r}; have {sorted(variants)}"
                )
        for m in metrics:
            a = {s: row[m] for s, row in variants[variant]["per_seed"].items()}
            b = {s: row[m] for s, row in variants[baseline]["per_seed"].items()}
            entry = {"variant": variant, "baseline": baseline, "metric": m}
            if len(a) == 1 and set(a) == set(b):
                (s,) = a
                entry.update(
                    mean_difference=a[s] - b[s], std=None, n=1, seeds=[s], differences=[a[s] - b[s]], ci95=None
                )
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
            out["comparisons"].append(entry)
    for key, value in (extra or {}).items():
        if key in out:
            raise ValueError(f"extra key {key!r} is reserved")
        out[key] = value
    return out


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


def verdict(comparison: dict, decimals: int = 4) -> str:
    """One line on a comparison whose claim is "variant > baseline": reproduced when the 95 % CI of the paired
    difference lies above 0, contradicted when below, not shown when it contains 0 (or with a single seed)."""
    c, ci = comparison, comparison["ci95"]
    name = METRIC_NAMES.get(c["metric"], c["metric"])
    diff = f"{c['variant']} − {c['baseline']} {name} {c['mean_difference']:+.{decimals}f}"
    if ci is None:
        return f"{diff} (1 seed, no interval): not shown"
    diff += f", 95 % CI [{ci[0]:+.{decimals}f}, {ci[1]:+.{decimals}f}] over {c['n']} seeds"
    if ci[0] > 0:
        return f"{diff}: reproduced (the interval lies above 0)"
    if ci[1] < 0:
        return f"{diff}: contradicted (the interval lies below 0)"
    return f"{diff}: not shown at this scale (the interval contains 0)"


def write_results(
    folder: str,
    results: dict,
    metrics: Optional[Sequence[str]] = None,
    header: str = "",
    name: str = "results",
    footer: str = "",
) -> Tuple[str, str]:
    """Write ``NAME.json`` and ``NAME.md`` (tables, then ``footer``) into ``folder`` atomically; return both paths."""
    os.makedirs(folder, exist_ok=True)
    json_path = os.path.join(folder, f"{name}.json")
    md_path = os.path.join(folder, f"{name}.md")
    atomic_write_json(json_path, results)
    md = render_markdown(results, metrics, header)
    if footer:
        md += "\n" + footer.rstrip() + "\n"
    atomic_write_text(md_path, md)
    return json_path, md_path
