"""explain/diagnostics.py: collapsed embeddings and coarse maps, one line each."""

import math

import pytest
import torch

from pml_extensions.explain.diagnostics import (
    coarse_map_warning,
    collapse_warning,
    mean_pairwise_cosine,
    size_for_cells,
)


def test_mean_pairwise_cosine_is_the_brute_force_mean_over_distinct_pairs():
    e = torch.randn(7, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    e[3] = 0  # a zero row: cosine 0 with every other
    u = torch.nn.functional.normalize(e, dim=1)
    brute = [float(u[i] @ u[j]) for i in range(7) for j in range(7) if i != j]
    assert mean_pairwise_cosine(e) == pytest.approx(sum(brute) / len(brute), abs=1e-14)
    assert mean_pairwise_cosine(torch.tensor([[1.0, 0.0], [-2.0, 0.0]])) == -1.0
    with pytest.raises(ValueError, match=r"embeddings must be \[N, D\] with N >= 2"):
        mean_pairwise_cosine(torch.ones(1, 3))


def test_collapse_warning_only_above_the_threshold():
    near = torch.tensor([[1.0, 0.0], [1.0, 0.01], [1.0, -0.01]])  # cosines 0.99995, 0.99995, 0.9998
    assert collapse_warning(near) is not None and collapse_warning(near, threshold=0.99995) is None
    assert collapse_warning(torch.eye(3)) is None
    assert collapse_warning(torch.ones(1, 3)) is None  # one image: nothing to compare


def test_collapse_warning_tells_a_tie_from_a_narrow_cone_that_still_ranks():
    tie = collapse_warning(torch.tensor([[1.0, 0.0], [1.0, 0.01], [1.0, -0.01]]))  # both cosines 1 / sqrt(1.0001)
    assert tie.startswith("warning: the embeddings have collapsed: mean pairwise cosine 0.999900 over the 3 ")
    assert "(the query's cosines span 0.0e+00), so the ranking is a tie and the maps explain nothing" in tie
    # cosines to the query 1 / sqrt(1.0001) and 1 / sqrt(1.0004): span 1.49994e-4, an order the maps' model keeps
    cone = collapse_warning(torch.tensor([[1.0, 0.0], [1.0, 0.01], [1.0, 0.02]], dtype=torch.float64))
    assert cone == (
        "warning: the embeddings lie in a narrow cone: mean pairwise cosine 0.999900 over the 3 explained images "
        "(> 0.999): what every image shares dominates each similarity and each map, so the maps differ little "
        "between references (the query's cosines span 1.5e-04, which still ranks them)"
    )


def test_size_for_cells_checks_the_model_and_steps_one_stride():
    assert size_for_cells(lambda s: (s - 8) // 8 + 1, 32, 4) == 56  # a kernel-8 stride-8 conv: 7 cells at 56
    assert size_for_cells(lambda s: s // 32 - 1, 96, 3) == 256  # 224 gives 6: one stride more
    assert size_for_cells(lambda s: 1, 96, 1, tries=3) is None


def test_coarse_map_warning_names_the_shorter_side():
    stride32 = lambda side: math.ceil(side / 32)  # noqa: E731
    assert coarse_map_warning((224, 224), (7, 7), stride32) is None
    assert coarse_map_warning((96, 160), (3, 5), stride32) == (
        "warning: the explained map is 3 × 5 cells for 96 × 160 px images (one cell per 32 px): the maps are "
        "near-uniform; --image-size 224 gives at least 7 × 7"
    )
    assert coarse_map_warning((96, 96), (3, 3)).endswith("--image-size 224 gives at least 7 × 7")  # no probe
    assert coarse_map_warning((96, 96), (3, 3), lambda s: 1).endswith("; a larger --image-size")
