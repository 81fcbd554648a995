"""``results.json`` and ``results.md`` of a multi-seed comparison, in one layout for every protocol (the keys:
docs/report.md#resultsjson). Each comparison is :func:`pml_extensions.utils.verdicts.compare`'s (the bootstrap and
the verdict rules are there); :func:`summarize` corrects the claims of one result together (Holm).
"""

import math
import os
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ...utils.atomic_io import atomic_write_json, atomic_write_text
from ...utils.paired_stats import holm, mean_std, per_class_metric
from ...utils.verdicts import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, METRIC_NAMES, compare, verdict_word
from .tables import Block, Table, as_blocks, to_json, to_markdown

SmallestEffects = Union[None, float, Mapping[Union[str, Tuple[str, ...]], float]]


def _lookup(table, variant: str, baseline: str, metric: str):
    """``table`` itself, or its value for the most specific key of a comparison (None when none matches)."""
    if not isinstance(table, Mapping):
        return table
    return next((table[k] for k in ((variant, baseline, metric), (variant, baseline), metric) if k in table), None)


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
            metric and the number of queries (a resampled class set has ``Σ sum / Σ count``); such a metric's
            comparisons are bootstrapped over seeds and test classes (others over seeds only).
        smallest_effects: δ of the claims, in the metric's units: one number, or a mapping keyed by ``(variant,
            baseline, metric)``, ``(variant, baseline)`` or ``metric`` (the most specific wins). A comparison with
            a δ is a claim: it gets ``claim``, ``smallest_effect``, ``p_value``, ``p_holm`` (Holm over every claim
            of this result) and ``verdict``.
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
        table = {str(s): {m: float(v) for m, v in row.items()} for s, row in seeds.items()}
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
    boot = {"n_resamples": n_resamples, "bootstrap_seed": bootstrap_seed}
    for variant, baseline in comparisons:
        for m in metrics:
            delta = _lookup(smallest_effects, variant, baseline, m)
            claim = _lookup(claims, variant, baseline, m) or "greater"
            out["comparisons"].append(
                compare(variants, variant, baseline, m, per_class=classes, smallest_effect=delta, claim=claim, **boot)
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
            s = str(seed)
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


def _fmt(value, decimals):
    return "–" if value is None else f"{value:.{decimals}f}"


def _signed(values, decimals) -> str:
    return ", ".join(f"{v:+.{decimals}f}" for v in values)


def _p_text(p) -> str:
    return "–" if p is None else f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


def _metrics(results: dict) -> List[str]:
    return sorted({m for v in results["variants"].values() for m in v["mean"]})


#: the comparison tables' columns that hold numbers (right-aligned in HTML)
_NUMERIC = {"mean difference", "95 % CI", "smallest effect δ", "95 % CI (t, seeds)", "95 % CI (bootstrap)", "p (Holm)"}


def results_tables(
    results: dict, metrics: Optional[Sequence[str]] = None, decimals: Optional[int] = None
) -> List[Table]:
    """The variant table (mean ± std per metric, per-seed values of the first) and the comparison table (with the
    claims' bootstrap, p-values, δ and verdicts) of a :func:`summarize` dict; ``metrics`` and ``decimals`` default to
    ``results["text"]``'s, else every metric and 4.

    Example::

        >>> r = summarize({"a": {0: {"m": 1.0}, 1: {"m": 2.0}}, "b": {0: {"m": 0.5}, 1: {"m": 0.5}}}, [("a", "b")],
        ...               metrics=["m"])
        >>> [t.columns[0] for t in results_tables(r)], results_tables(r, decimals=2)[1].rows[0][:3]
        (['variant', 'comparison (paired by seed)'], ['a − b', 'm', '+1.00'])
    """
    text = results.get("text") or {}
    variants = results["variants"]
    metrics = metrics or text.get("metrics") or _metrics(results)
    decimals = text.get("decimals", 4) if decimals is None else decimals
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
    n_claims = sum("verdict" in c for c in comparisons)
    rows, resampling = [], set()
    for c in comparisons:
        ci, how, delta = c["ci95"], c.get("bootstrap") or {}, c.get("smallest_effect")
        mean = f"{c['mean_difference']:+.{decimals}f}"
        t_ci = "n/a (1 seed)" if ci is None else f"[{_signed(ci, decimals)}]"
        row = {
            "comparison (paired by seed)": f"{c['variant']} − {c['baseline']}",
            "metric": METRIC_NAMES.get(c["metric"], c["metric"]),
        }
        if not n_claims:
            row.update(
                {"mean difference": mean, "95 % CI": t_ci, "per-seed differences": _signed(c["differences"], decimals)}
            )
            row["CI excludes 0"] = "n/a" if ci is None else ("yes" if ci[0] > 0 or ci[1] < 0 else "no")
            rows.append(row)
            continue
        boot = c.get("bootstrap_ci95")
        boot_text = "–" if boot is None else f"[{_signed(boot, decimals)}]"
        if boot is not None and how.get("resampled") != "seeds and test classes":
            boot_text += " (seeds only)"
        if how:
            resampling.add((how.get("n_resamples"), how.get("seed")))
        row["claim"] = {"greater": "greater", "less": "less", "on_par": "on par"}.get(c.get("claim"), "–")
        row["smallest effect δ"] = "–" if delta is None else f"{delta:.{decimals}g}"
        row.update({"mean difference": mean, "95 % CI (t, seeds)": t_ci, "95 % CI (bootstrap)": boot_text})
        row["p (Holm)"] = "–" if c.get("p_value") is None else f"{_p_text(c['p_value'])} ({_p_text(c.get('p_holm'))})"
        row["per-seed differences"] = _signed(c["differences"], decimals)
        rows.append({**row, "verdict": c.get("verdict", "–")})
    columns = list(rows[0])
    table = Table(columns, [list(r.values()) for r in rows], numeric=[c in _NUMERIC for c in columns])
    tables.append(table)
    if not n_claims:
        return tables
    table.notes = [
        "Bootstrap: paired percentile interval resampling seeds and test classes with replacement (seeds only "
        "where marked: no per-class data)"
        + "".join(f", {n} resamples, numpy seed {s}" for n, s in sorted(resampling, key=str))
        + ". p: the larger of the paired t-test's and the bootstrap's two-sided p-values; in parentheses Holm's "
        f"adjustment over the {n_claims} claim{'s' if n_claims != 1 else ''} of this table.",
        "Verdicts read the envelope of both intervals: **shown** (excludes 0 after Holm, mean difference reaches δ "
        "on the claimed side), **no effect of practical size** (inside ±δ), **contradicted** (excludes 0 after Holm, "
        "mean difference reaches δ on the other side), otherwise **inconclusive**.",
    ]
    return tables


def results_blocks(results: dict) -> List[Block]:
    """What ``results.md`` and the report show of a results dict, as blocks (:mod:`.tables`): the header stored in
    ``results["text"]``, :func:`results_tables`, the footer."""
    text = results.get("text") or {}
    return [*as_blocks(text.get("header")), *results_tables(results), *as_blocks(text.get("footer"))]


def render_markdown(
    results: dict,
    metrics: Optional[Sequence[str]] = None,
    header: Union[str, Block, Sequence[Block]] = "",
    decimals: int = 4,
) -> str:
    """``header`` (a paragraph, or blocks of :mod:`.tables`), then :func:`results_tables` as Markdown."""
    return to_markdown([*as_blocks(header), *results_tables(results, metrics, decimals)])


def write_results(
    folder: str,
    results: dict,
    metrics: Optional[Sequence[str]] = None,
    header: Union[str, Block, Sequence[Block]] = "",
    name: str = "results",
    footer: Union[str, Block, Sequence[Block]] = "",
    decimals: int = 4,
) -> Tuple[str, str]:
    """Write ``NAME.json`` (``results`` with ``text``: what ``NAME.md`` is rendered from, so :func:`results_blocks`
    rebuilds it from the file alone) and ``NAME.md`` into ``folder`` atomically; return both paths. ``header`` and
    ``footer``: a paragraph (a string, written as it is) or blocks of :mod:`.tables`."""
    json_path, md_path = os.path.join(folder, f"{name}.json"), os.path.join(folder, f"{name}.md")
    text = {
        "header": to_json(as_blocks(header)),
        "footer": to_json(as_blocks(footer)),
        "metrics": list(metrics or _metrics(results)),
        "decimals": decimals,
    }
    stored = {**results, "text": text}
    atomic_write_json(json_path, stored)
    atomic_write_text(md_path, to_markdown(results_blocks(stored)))
    return json_path, md_path
