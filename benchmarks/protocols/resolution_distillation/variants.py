"""The resolution-distillation protocol's variants and comparisons: each row (one setup of one seed,
:mod:`.evaluation`) is named ``<dataset>/<query px>/<setup>[/<student variant>]``, and the paired comparisons of the
paper's claims (RAML, Suma & Tolias, WACV 2023, Table 2 and Tables 3-4) are listed for
:func:`pml_extensions.runner.outputs.results.summarize`.

The paper-layout tables of these results live beside the benchmarks (``benchmarks/resolution_distillation.py``); the
protocol writes the generic ``results.md``.

Example::

    >>> variant_name("glyphs", 24, "teacher_student_asymmetric", "loss_abs_only")
    'glyphs/24px/teacher_student_asymmetric/loss_abs_only'
"""

from typing import Dict, List, Optional

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
