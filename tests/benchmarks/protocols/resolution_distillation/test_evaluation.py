"""benchmarks/protocols/resolution_distillation/evaluation.py: the setups a tester measures become the protocol's
rows."""

from benchmarks.protocols.resolution_distillation.evaluation import (
    METRICS,
    PRIMARY,
    evaluate_rows,
    metrics_of,
)

ACC = {
    "mean_average_precision_at_r_level0": 0.25,
    "mean_average_precision_level0": 0.5,
    "mean_average_precision_trapezoidal_level0": 0.625,
    "recall_at_1_level0": 0.75,
    "precision_at_1_level0": 0.9,  # not one of the protocol's metrics: left out
}


class _Tester:
    """Records what it was asked and answers like AsymmetricTester.evaluate_setups."""

    def __init__(self):
        self.calls = []

    def evaluate_setups(self, make_dataset_dict, teacher, student, q, db, teacher_resolution, setups):
        self.calls.append((q, db, teacher_resolution, setups))
        return {
            s: {
                "query_resolution": q,
                "reference_resolution": db,
                "query_flops": 1.5e6 + i,
                "accuracies": {"test": ACC},
            }
            for i, s in enumerate(setups)
        }


def test_metrics_of_reads_the_level0_keys():
    assert metrics_of(ACC) == {
        "mean_average_precision_at_r": 0.25,
        "mean_average_precision": 0.5,
        "mean_average_precision_trapezoidal": 0.625,
        "recall_at_1": 0.75,
    }
    assert PRIMARY in METRICS


def test_one_row_per_setup_with_its_fields():
    tester = _Tester()
    rows = evaluate_rows(
        tester,
        None,
        "teacher",
        "student",
        16,
        32,
        ("teacher_symmetric", "teacher_asymmetric"),
        {"dataset": "glyphs", "seed": 1},
        teacher_resolution=16,
        rename={"teacher_symmetric": "low_resolution_teacher_symmetric"},
    )
    assert tester.calls == [(16, 32, 16, ("teacher_symmetric", "teacher_asymmetric"))]
    assert [r["setup"] for r in rows] == ["low_resolution_teacher_symmetric", "teacher_asymmetric"]
    assert rows[1] == {
        "dataset": "glyphs",
        "seed": 1,
        "setup": "teacher_asymmetric",
        "query_resolution": 16,
        "database_resolution": 32,
        "reference_resolution": 32,
        "query_flops": 1500001,
        **metrics_of(ACC),
    }
