"""What a resolution-distillation stage measures: the four setups of Table 2 as rows of metrics.

A row is one setup (``teacher_symmetric``, ``teacher_asymmetric``, ``teacher_student_asymmetric``,
``student_symmetric``, ``low_resolution_teacher_symmetric``) of one (dataset, seed, student variant) with its query
and reference resolutions, the query's FLOPs (torch's flop counter) and :data:`METRICS`, measured by
:meth:`pml_extensions.testers.AsymmetricTester.evaluate_setups` on the test classes (or the validation classes
while selecting).

Example::

    >>> metrics_of({"mean_average_precision_at_r_level0": 0.5, "mean_average_precision_level0": 0.6,
    ...             "mean_average_precision_trapezoidal_level0": 0.7, "recall_at_1_level0": 0.8})["recall_at_1"]
    0.8
"""

from typing import Dict, List

#: metric key in results.json -> (PML accuracy key, label in the tables)
METRICS = {
    "mean_average_precision_at_r": ("mean_average_precision_at_r_level0", "MAP@R"),
    "mean_average_precision": ("mean_average_precision_level0", "mAP (PML)"),
    "mean_average_precision_trapezoidal": ("mean_average_precision_trapezoidal_level0", "mAP (trapezoid)"),
    "recall_at_1": ("recall_at_1_level0", "R@1"),
}
PRIMARY = "mean_average_precision_at_r"


def metrics_of(accuracies: dict) -> Dict[str, float]:
    """``{metric key: value}`` from a tester's ``accuracies[split]`` dict (PML ``*_level0`` keys)."""
    return {key: float(accuracies[pml_key]) for key, (pml_key, _) in METRICS.items()}


def evaluate_rows(
    tester, make_dataset_dict, teacher, student, q, db, setups, fields, teacher_resolution=None, rename=None
):
    """Rows ``fields + {setup, resolutions, query_flops, metrics}``, one per setup, on the one split of
    ``make_dataset_dict(resolution)`` (the test classes, or the validation classes during selection)."""
    out = tester.evaluate_setups(make_dataset_dict, teacher, student, q, db, teacher_resolution, setups=setups)
    rows = []
    for setup, res in out.items():
        row = dict(
            fields,
            setup=(rename or {}).get(setup, setup),
            query_resolution=res["query_resolution"],
            database_resolution=db,
            reference_resolution=res["reference_resolution"],
            query_flops=int(res["query_flops"]),
        )
        (split,) = res["accuracies"]
        row.update(metrics_of(res["accuracies"][split]))
        rows.append(row)
    return rows


def save_retrieval(exp, ctx, teacher, stage: str, q: int, n_queries: int = 4, k: int = 5) -> None:
    """Retrieval examples for report.html (:mod:`pml_extensions.runner.outputs.retrieval`), the distilled
    asymmetric setup of Table 2 block 3: seeded test queries embedded at ``q`` px by the student of ``stage`` (its
    selected weights, ``models.pth``; same architecture as the teacher), the test images at the database resolution
    by the teacher, each query's own image left out."""
    import copy
    import os

    from pml_extensions.runner.experiment.checkpoint import load_weights
    from pml_extensions.runner.outputs.retrieval import dataset_image, embed, save_retrieval_examples

    path = os.path.join(exp.stage_folder(stage), "models.pth")
    if not os.path.isfile(path):
        return
    weights = load_weights(path, exp.device)
    student = copy.deepcopy(teacher[0]), copy.deepcopy(teacher[1])
    student[0].load_state_dict(weights["trunk"])
    student[1].load_state_dict(weights["embedder"])
    queries = ctx["make_dataset_dict"](q)["test"]
    references = ctx["make_dataset_dict"](ctx["db"])["test"]
    save_retrieval_examples(
        exp.folder,
        f"{ctx['dataset']}_seed_{ctx['seed']}",
        embed(*student, queries, exp.device),
        queries.labels,
        lambda i: dataset_image(queries, i),
        reference_embeddings=embed(*teacher, references, exp.device),
        reference_labels=references.labels,
        n_queries=n_queries,
        k=k,
        seed=ctx["seed"],
        class_names=getattr(queries.dataset, "classes", None),
        note=f"`{ctx['dataset']}`, seed {ctx['seed']}: queries at {q} px by the distilled student ({stage}), the test "
        f"images at {ctx['db']} px by the teacher (teacher_student_asymmetric).",
    )


def _percent(value) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def selection_lines(selection: List[dict]) -> List[str]:
    """The validation-based choices: per (dataset, seed) the learning rate grid's validation asymmetric MAP@R and
    the chosen rate, and per student the selected iteration (Markdown lines; ``results.md`` of the protocol and the
    benchmark's paper layout end with them). Scores in percent with two decimals; ``–`` for a rate not tried.

    Example::

        >>> sel = [{"student_variant": "full", "dataset": "glyphs", "query_resolution": 16, "seed": 0,
        ...         "iteration": 4, "validation": 0.25}]
        >>> selection_lines(sel)[4]
        '| glyphs | 16 | full | 4 | 25.00 |'
    """
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
            cells = [_percent(g["validation_by_lr"].get(r)) for r in rates]
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
