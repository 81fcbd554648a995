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
