"""benchmarks/protocols/localization/maps.py: same-class neighbours against a brute-force loop, P@1 by hand, the scoring
of maps under both conventions."""

import numpy as np
import pytest
import torch

from benchmarks.protocols.localization import maps


def test_same_class_neighbours_match_a_brute_force_loop():
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(12, 5, generator=g)
    labels = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 1, 0])  # class 3 has one item: its neighbour is of any class
    e = torch.nn.functional.normalize(emb, dim=1)
    sim = (e @ e.t()).numpy()
    want = []
    for i in range(len(labels)):
        cand = [j for j in range(len(labels)) if j != i and labels[j] == labels[i]] or [
            j for j in range(len(labels)) if j != i
        ]
        want.append(max(cand, key=lambda j: sim[i, j]))
    assert maps.same_class_neighbours(emb, labels).tolist() == want


def test_p_at_1_by_hand():
    emb = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.8, 0.3]])
    # nearest by cosine: 0->1 (0.994, same), 1->0 (same), 2->3 (0.351 vs 0.110 to 1: same), 3->1 (0.970 vs 0.937 to 0:
    # other class) -> 3 of 4
    assert maps.p_at_1(emb, np.array([0, 0, 1, 1])) == pytest.approx(75.0)


def test_scores_of_every_method_and_convention():
    # one 8x8 image whose box is its left half; maps: positive on the left half, the right half -1 (signed) / 0 (ReLU)
    m = torch.full((1, 4, 4), -1.0)
    m[:, :, :2] = 1.0
    scores = maps.score_maps({"Decomposition": m, maps.DEMO: m.relu()}, np.array([[0, 0, 4, 8]]), (8, 8))
    assert set(scores) == {"Decomposition [signed]", "Decomposition [ReLU]", maps.DEMO + " [signed]"}
    assert scores["Decomposition [ReLU]"]["best_accuracy"] == 100.0
    assert len(scores["Decomposition [signed]"]["accuracy"]) == len(maps.thresholds())
    assert maps.score_name("Grad-CAM", "ReLU") == "Grad-CAM [ReLU]"


def test_held_out_choice_takes_the_held_out_best_and_reports_the_test_accuracy_there():
    # held-out accuracy peaks at 0.3 and 0.4 (tie: the smaller, 0.3); the test accuracy there is 20, although the test
    # images' own best is 60 (at 0.5)
    c = maps.held_out_choice([10.0, 20.0, 50.0, 50.0, 30.0], [0.0, 10.0, 20.0, 40.0, 60.0], [0.1, 0.2, 0.3, 0.4, 0.5])
    assert c == {"held_out_accuracy": 20.0, "held_out_value": 0.3, "validation_accuracy": 50.0}
    with pytest.raises(ValueError, match="equally long non-empty"):
        maps.held_out_choice([1.0, 2.0], [1.0], [0.1, 0.2])


def test_choose_on_held_out_keeps_the_test_curve_and_adds_the_held_out_threshold():
    grid = maps.thresholds()  # 0.05, 0.10, ..., 0.95
    test = [0.0] * 19
    test[3], test[9] = 25.0, 75.0  # test best 75 at 0.50; 25 at 0.20
    held = [0.0] * 19
    held[3] = 50.0  # the held-out composites pick 0.20
    scores = maps.choose_on_held_out(
        {"Grad-CAM [ReLU]": {"best_accuracy": 75.0, "best_threshold": 0.5, "accuracy": test}},
        {"Grad-CAM [ReLU]": {"best_accuracy": 50.0, "best_threshold": 0.2, "accuracy": held}},
    )
    s = scores["Grad-CAM [ReLU]"]
    assert s["held_out_accuracy"] == 25.0 and s["held_out_threshold"] == pytest.approx(grid[3]) == 0.2
    assert s["best_accuracy"] == 75.0 and s["accuracy"] == test and s["validation_accuracy"] == held


def test_centre_box_side_chosen_on_the_held_out_composites():
    """100 × 100 images, centred boxes of side round(100 f), f = 0.30, 0.35, ..., 1.00. The test box (25, 25, 75, 75)
    (side 50, centred) has IoU > 0.5 with sides 40 (1600 / 2500 = 0.64) to 70 (2500 / 4900 = 0.51), not 35 (0.49) or
    75 (0.44); the test box (0, 0, 10, 10) with none: test accuracy 50 % at f = 0.40-0.70, else 0. The held-out box
    (0, 0, 100, 100) needs side² / 10⁴ > 0.5: sides 75 (0.5625) to 100, not 70 (0.49): the held-out choice is
    f = 0.75, where the test accuracy is 0."""
    from types import SimpleNamespace

    test = SimpleNamespace(boxes=np.array([[25, 25, 75, 75], [0, 0, 10, 10]]))
    held = SimpleNamespace(boxes=np.array([[0, 0, 100, 100]]))
    c = maps.centre_box(test, (100, 100), held)
    assert c["best_accuracy"] == 50.0 and c["best_fraction"] == pytest.approx(0.4)
    assert c["held_out_accuracy"] == 0.0 and c["held_out_fraction"] == 0.75
    assert c["accuracy"] == [0.0, 0.0] + [50.0] * 7 + [0.0] * 6
    assert c["validation_accuracy"] == [0.0] * 9 + [100.0] * 6
    assert "held_out_accuracy" not in maps.centre_box(test, (100, 100))  # no held-out set: the test-picked one only
