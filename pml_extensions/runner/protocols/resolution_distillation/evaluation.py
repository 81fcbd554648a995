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

from typing import Dict

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
