"""The paper-layout output of the resolution-distillation protocol (RAML, Suma & Tolias, WACV 2023): Table 2 blocks,
Tables 3-4 ablations, the asymmetric-vs-iterations curve and the selection on validation classes as markdown, the
paired comparisons of the paper's claims, and Fig. 4's performance against query FLOPs, all from the protocol's
per-seed rows (:mod:`.evaluation`).

This formatting is the paper's, so it stays beside the protocol for now; moving the paper tables out of the package
goes with the benchmarks (issue 20, item 4).
"""

from typing import Dict, List, Optional

import numpy as np

from .evaluation import METRICS, PRIMARY  # noqa: F401  (PRIMARY and METRICS name the columns of every table)

#: Table 2 blocks in the paper's order: (1) symmetric baselines, (2) naive asymmetric, (3) distilled asymmetric,
#: (4) distilled student symmetric
TABLE2_SETUPS = (
    "low_resolution_teacher_symmetric",
    "teacher_symmetric",
    "teacher_asymmetric",
    "teacher_student_asymmetric",
    "student_symmetric",
)


# ---------------------------------------------------------------------------------------------- result tables
def variant_name(dataset: str, resolution: int, setup: str, student_variant: Optional[str] = None) -> str:
    """``"glyphs/24px/teacher_student_asymmetric"`` (+ ``"/<student variant>"`` for an ablation)."""
    name = f"{dataset}/{resolution}px/{setup}"
    return name if student_variant in (None, "full") else f"{name}/{student_variant}"


def per_seed_table(rows: List[dict]) -> Dict[str, Dict[int, Dict[str, float]]]:
    """``{variant name: {seed: {metric: value}}}`` from the protocol's rows (each row one setup of one seed)."""
    out: Dict[str, Dict[int, Dict[str, float]]] = {}
    for r in rows:
        name = variant_name(r["dataset"], r["query_resolution"], r["setup"], r.get("student_variant"))
        out.setdefault(name, {})[int(r["seed"])] = {k: float(r[k]) for k in METRICS}
    return out


def default_comparisons(rows: List[dict]) -> List[tuple]:
    """The paired comparisons of the paper's claims, on the variants present in ``rows``:

    - Table 2, per dataset and query resolution: the distilled asymmetric setup against the naive asymmetric
      (teacher on small queries), the low-resolution teacher, the student symmetric and the teacher symmetric;
    - Tables 3-4: every ablated student's asymmetric setup against the full student's.
    """
    names = set(per_seed_table(rows))
    out = []
    groups = sorted({(r["dataset"], r["query_resolution"], r["database_resolution"]) for r in rows})
    for dataset, q, db in groups:
        if q == db:
            continue
        asym = variant_name(dataset, q, "teacher_student_asymmetric")
        for base in (
            variant_name(dataset, q, "teacher_asymmetric"),
            variant_name(dataset, q, "low_resolution_teacher_symmetric"),
            variant_name(dataset, q, "student_symmetric"),
            variant_name(dataset, db, "teacher_symmetric"),
        ):
            if asym in names and base in names:
                out.append((asym, base))
    for r in rows:
        v = r.get("student_variant")
        if v not in (None, "full") and r["setup"] == "teacher_student_asymmetric":
            pair = (
                variant_name(r["dataset"], r["query_resolution"], r["setup"], v),
                variant_name(r["dataset"], r["query_resolution"], r["setup"]),
            )
            if pair[1] in names and pair not in out:
                out.append(pair)
    return out


def _pm(mean, std):
    return "–" if mean is None else f"{100 * mean:.2f}" + ("" if std is None else f" ± {100 * std:.2f}")


def _ci(c):
    if c is None:
        return "–"
    if c["ci95"] is None:
        return f"{100 * c['mean_difference']:+.2f} (1 seed)"
    lo, hi = c["ci95"]
    return f"{100 * c['mean_difference']:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]"


def markdown_tables(results: dict) -> str:
    """Paper-layout markdown: Table 2 (setups × query resolutions, MAP@R and mAP mean ± std over seeds, query
    MFLOPs), Tables 3-4 (ablated students against the full one, paired difference and 95 % CI of MAP@R) and the
    asymmetric-vs-iterations curve. Values in %."""
    variants, rows = results["variants"], results.get("rows", [])
    comps = {(c["variant"], c["baseline"]): c for c in results["comparisons"] if c["metric"] == PRIMARY}
    seeds = sorted({int(s) for v in variants.values() for s in v["per_seed"]})
    flops = {}
    for r in rows:
        flops[variant_name(r["dataset"], r["query_resolution"], r["setup"], r.get("student_variant"))] = r[
            "query_flops"
        ]
    lines = [
        f"Seeds: {', '.join(map(str, seeds))}; values in % (mean ± std over seeds); Δ = paired difference of "
        "MAP@R with its 95 % CI (Student t over seeds).",
        "",
    ]
    for dataset in sorted({r["dataset"] for r in rows}):
        db = max(r["database_resolution"] for r in rows if r["dataset"] == dataset)
        qs = sorted({r["query_resolution"] for r in rows if r["dataset"] == dataset and r["query_resolution"] != db})
        lines += [f"**Table 2 ({dataset}, database {db} px)**", ""]
        head = "| block | setup | " + " | ".join(
            f"{q} px MAP@R | {q} px mAP (trapezoid) | {q} px query MFLOPs" for q in qs
        )
        lines += [head + " |", "|---|---|" + "---|" * (3 * len(qs))]
        blocks = {
            "low_resolution_teacher_symmetric": "1 symmetric",
            "teacher_symmetric": "1 symmetric",
            "teacher_asymmetric": "2 naive asymmetric",
            "teacher_student_asymmetric": "3 distilled asymmetric",
            "student_symmetric": "4 distilled symmetric",
        }
        for setup in TABLE2_SETUPS:
            cells = []
            for q in qs:
                name = variant_name(dataset, db if setup == "teacher_symmetric" else q, setup)
                v = variants.get(name)
                if v is None:
                    cells += ["–", "–", "–"]
                    continue
                cells += [
                    _pm(v["mean"].get(PRIMARY), v["std"].get(PRIMARY)),
                    _pm(
                        v["mean"].get("mean_average_precision_trapezoidal"),
                        v["std"].get("mean_average_precision_trapezoidal"),
                    ),
                    f"{flops.get(name, 0) / 1e6:.1f}",
                ]
            label = f"{setup} ({db} px)" if setup == "teacher_symmetric" else setup
            lines.append(f"| {blocks[setup]} | {label} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "| comparison (MAP@R) | " + " | ".join(f"Δ at {q} px" for q in qs) + " |",
            "|---|" + "---|" * len(qs),
        ]
        for base, label in (
            ("teacher_asymmetric", "distilled asym. − naive asym. (teacher on small queries)"),
            ("low_resolution_teacher_symmetric", "distilled asym. − low-resolution teacher sym."),
            ("student_symmetric", "distilled asym. − student sym."),
            ("teacher_symmetric", f"distilled asym. − teacher sym. ({db} px)"),
        ):
            cells = []
            for q in qs:
                b = variant_name(dataset, db if base == "teacher_symmetric" else q, base)
                cells.append(_ci(comps.get((variant_name(dataset, q, "teacher_student_asymmetric"), b))))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
        ablated = sorted(
            {
                (r["query_resolution"], r["student_variant"])
                for r in rows
                if r["dataset"] == dataset and r.get("student_variant") not in (None, "full")
            }
        )
        if ablated:
            lines += [
                f"**Tables 3-4 ({dataset}): students distilled at {ablated[0][0]} px, asymmetric MAP@R**",
                "",
                "| student | asymmetric MAP@R | student symmetric MAP@R | Δ asym. vs full student |",
                "|---|---|---|---|",
            ]
            q = ablated[0][0]
            for v in ["full"] + [a for _, a in ablated]:
                asym = variants.get(variant_name(dataset, q, "teacher_student_asymmetric", v), {})
                sym = variants.get(variant_name(dataset, q, "student_symmetric", v), {})
                delta = (
                    "–"
                    if v == "full"
                    else _ci(
                        comps.get(
                            (
                                variant_name(dataset, q, "teacher_student_asymmetric", v),
                                variant_name(dataset, q, "teacher_student_asymmetric"),
                            )
                        )
                    )
                )
                lines.append(
                    f"| {v} | {_pm(asym.get('mean', {}).get(PRIMARY), asym.get('std', {}).get(PRIMARY))} | "
                    f"{_pm(sym.get('mean', {}).get(PRIMARY), sym.get('std', {}).get(PRIMARY))} | {delta} |"
                )
            lines.append("")
    for (dataset, q), points in sorted(_curve_points(results.get("curve", [])).items()):
        lines += [f"**Asymmetric vs symmetric MAP@R along the student's training ({dataset}, {q} px queries)**", ""]
        total = (results.get("config") or {}).get("student_iterations")
        if total:
            lines += [
                f"One one-cycle schedule of {total} iterations (the learning rate peaks at 30 % and decays to "
                "about 0 at the end), test classes, the full student"
                + (
                    " of the chosen learning rate; Table 2 scores its best validation checkpoint, which may be an "
                    "earlier row."
                    if results.get("selection")
                    else "."
                ),
                "",
            ]
        lines += [
            "| student iterations | teacher_student_asymmetric | student_symmetric | asym. − sym. |",
            "|---|---|---|---|",
        ]
        for it in sorted(points):
            a, s = points[it].get("teacher_student_asymmetric", []), points[it].get("student_symmetric", [])
            diff = [x - y for x, y in zip(a, s)]
            lines.append(f"| {it} | {_pm(*_mean_std(a))} | {_pm(*_mean_std(s))} | {_pm(*_mean_std(diff))} |")
        lines.append("")
    lines += _selection_lines(results.get("selection", []))
    return "\n".join(lines).rstrip() + "\n"


def _selection_lines(selection: List[dict]) -> List[str]:
    """The validation-based choices: per (dataset, seed) the learning rate grid's validation asymmetric MAP@R and
    the chosen rate, and per student the selected iteration."""
    if not selection:
        return []
    grid = [s for s in selection if s["student_variant"] == "lr_grid"]
    students = [s for s in selection if s["student_variant"] != "lr_grid"]
    lines = ["**Selection on the validation classes** (held out from the training classes; asymmetric MAP@R)", ""]
    if grid:
        rates = list(grid[0]["validation_by_lr"])
        lines += [
            f"Student learning rate, full student at {grid[0]['query_resolution']} px:",
            "",
            "| dataset | seed | " + " | ".join(f"lr {r}" for r in rates) + " | chosen |",
            "|---|---|" + "---|" * (len(rates) + 1),
        ]
        for g in grid:
            cells = [_pm(g["validation_by_lr"].get(r), None) for r in rates]
            lines.append(f"| {g['dataset']} | {g['seed']} | " + " | ".join(cells) + f" | {g['lr']:g} |")
        lines.append("")
    if students:
        lines += [
            "| dataset | query px | student | selected iteration per seed | validation MAP@R per seed |",
            "|---|---|---|---|---|",
        ]
        keys = sorted(
            {(s["dataset"], s["query_resolution"], s["student_variant"]) for s in students},
            key=lambda k: (k[0], k[1], k[2] != "full", k[2]),
        )
        for key in keys:
            mine = sorted(
                (s for s in students if (s["dataset"], s["query_resolution"], s["student_variant"]) == key),
                key=lambda s: s["seed"],
            )
            lines.append(
                f"| {key[0]} | {key[1]} | {key[2]} | "
                + ", ".join(str(s["iteration"]) for s in mine)
                + " | "
                + ", ".join(f"{100 * s['validation']:.2f}" for s in mine)
                + " |"
            )
        lines.append("")
    return lines


def _mean_std(values):
    if not values:
        return None, None
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), (float(v.std(ddof=1)) if len(v) > 1 else None)


def _curve_points(curve: List[dict]) -> dict:
    out: dict = {}
    for p in curve:
        out.setdefault((p["dataset"], p["query_resolution"]), {}).setdefault(p["iteration"], {}).setdefault(
            p["setup"], []
        ).append(p[PRIMARY])
    return out


def plot_performance_vs_flops(results: dict, path: str):
    """Fig. 4 style: MAP@R (mean over seeds) against query MFLOPs, one panel per dataset, one line per setup.
    Atomic write."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ....utils.atomic_io import atomic_savefig

    rows = [r for r in results.get("rows", []) if r.get("student_variant") in (None, "full")]
    datasets = sorted({r["dataset"] for r in rows}) or ["-"]
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4.2), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        for setup, marker in zip(TABLE2_SETUPS, "vos^D"):
            pts = {}
            for r in rows:
                if r["dataset"] == dataset and r["setup"] == setup:
                    pts.setdefault(r["query_flops"], []).append(r[PRIMARY])
            if pts:
                xs = sorted(pts)
                ax.plot([x / 1e6 for x in xs], [100 * np.mean(pts[x]) for x in xs], marker=marker, label=setup)
        ax.set_xlabel("query MFLOPs per image (torch flop counter)")
        ax.set_ylabel("MAP@R (%)")
        ax.set_title(dataset)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        atomic_savefig(fig, path, dpi=110)
    finally:
        plt.close(fig)
