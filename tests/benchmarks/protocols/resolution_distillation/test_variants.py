"""benchmarks/protocols/resolution_distillation/variants.py: the variants' names and the comparisons of the paper's
claims, on hand-made rows (their paper-layout tables: tests/benchmarks/test_resolution_distillation_tables.py)."""

from benchmarks.protocols.resolution_distillation import variants as parts
from pml_extensions.runner.outputs.results import summarize

KEYS = list(parts.METRICS)


def row(setup, q, seed, value, variant=None, db=64):
    return {
        "dataset": "glyphs",
        "setup": setup,
        "query_resolution": q,
        "database_resolution": db,
        "reference_resolution": db,
        "seed": seed,
        "student_variant": variant,
        "query_flops": 2e6 if q < db else 8e6,
        **{k: value for k in KEYS},
    }


def hand_rows():
    rows = []
    # seed: (teacher sym, teacher asym, low-res sym, distilled asym, student sym, abs-only asym)
    for seed, (ts, ta, lr, da, ss, ab) in {
        0: (0.5, 0.1, 0.3, 0.30, 0.32, 0.25),
        1: (0.6, 0.2, 0.3, 0.40, 0.40, 0.30),
        2: (0.7, 0.3, 0.4, 0.50, 0.51, 0.50),
    }.items():
        rows += [
            row("teacher_symmetric", 64, seed, ts),
            row("teacher_asymmetric", 24, seed, ta),
            row("low_resolution_teacher_symmetric", 24, seed, lr),
            row("teacher_student_asymmetric", 24, seed, da, "full"),
            row("student_symmetric", 24, seed, ss, "full"),
            row("teacher_student_asymmetric", 24, seed, ab, "loss_abs_only"),
            row("student_symmetric", 24, seed, ab, "loss_abs_only"),
        ]
    return rows


def test_per_seed_and_comparisons():
    rows = hand_rows()
    table = parts.per_seed_table(rows)
    assert table["glyphs/24px/teacher_student_asymmetric"][1]["mean_average_precision_at_r"] == 0.40
    assert table["glyphs/24px/teacher_student_asymmetric/loss_abs_only"][2]["recall_at_1"] == 0.50
    comps = parts.default_comparisons(rows)
    asym = "glyphs/24px/teacher_student_asymmetric"
    assert comps == [
        (asym, "glyphs/24px/teacher_asymmetric"),
        (asym, "glyphs/24px/low_resolution_teacher_symmetric"),
        (asym, "glyphs/24px/student_symmetric"),
        (asym, "glyphs/64px/teacher_symmetric"),
        (asym + "/loss_abs_only", asym),
    ]
    results = summarize(table, comps, metrics=(parts.PRIMARY,), extra={"rows": rows, "curve": []})
    c = results["comparisons"][0]  # distilled − naive: differences 0.2, 0.2, 0.2
    assert abs(c["mean_difference"] - 0.2) < 1e-7
    assert abs(c["ci95"][0] - 0.2) < 1e-7 and abs(c["ci95"][1] - 0.2) < 1e-7
