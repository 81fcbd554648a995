"""Pairing of the template-block benchmark: same seed -> bit-identical shared weights and batches at step
0."""

import importlib.util
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WIDTHS = (4, 4, 8, 8)


@pytest.fixture(scope="module")
def tb():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "template_block", os.path.join(ROOT, "benchmarks", "template_block.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _state(models):
    return {f"{k}.{n}": t for k, m in models.items() for n, t in m.state_dict().items()}


def test_shared_weights_bit_identical_across_variants(tb):
    base = _state(tb.build_models("baseline", 3, WIDTHS, 1, 5))
    for variant in ("block", "aux_only"):
        other = _state(tb.build_models(variant, 3, WIDTHS, 1, 5))
        extra = set(other) - set(base)
        assert extra and all(".layer3.1." in k for k in extra)  # only the inserted block is new
        assert set(base) <= set(other)
        for k, t in base.items():
            assert torch.equal(t, other[k]), (variant, k)
    # another seed gives other weights (the test could fail)
    seed4 = _state(tb.build_models("baseline", 4, WIDTHS, 1, 5))
    assert not torch.equal(seed4["trunk.stem.0.weight"], base["trunk.stem.0.weight"])
    # building does not touch the global RNG
    torch.manual_seed(0)
    a = torch.rand(1)
    torch.manual_seed(0)
    tb.build_models("block", 3, WIDTHS, 1, 5)
    assert torch.equal(torch.rand(1), a)


def test_wider_baseline_has_at_least_the_block_parameters(tb):
    block = tb.count_params(tb.build_models("block", 0, WIDTHS, 1, 5))
    wider = tb.build_models("wider", 0, WIDTHS, 1, 5)
    assert tb.count_params(wider) >= block > tb.count_params(tb.build_models("baseline", 0, WIDTHS, 1, 5))
    assert not any(True for _ in tb.template_matching_blocks(wider["trunk"]))


def test_same_batches_for_the_same_seed(tb):
    ds = torch.utils.data.TensorDataset(torch.arange(50))
    a = [list(tb.make_sampler(ds, 7, 4, 3)) for _ in range(1)][0]
    b = list(tb.make_sampler(ds, 7, 4, 3))
    c = list(tb.make_sampler(ds, 8, 4, 3))
    assert a == b and len(a) == 12 and a != c


def test_unknown_variant_is_named(tb):
    with pytest.raises(ValueError, match="variant"):
        tb.build_models("deeper", 0, WIDTHS, 1, 5)
