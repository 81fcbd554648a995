"""benchmarks/protocols/template_block/variant.py: pairing by seed (the shared modules bit-identical across variants,
the block drawn from its own stream, the global RNG untouched), the parameter control, the soft maximizers, one-line
errors. (The template-block benchmark's pairing tests, moved here with the code they test.)"""

import copy

import pytest
import torch

from benchmarks.protocols.template_block import variant
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.objects.builder import Builder
from pml_extensions.trunks import template_matching_blocks

WIDTHS = [4, 4, 8, 8]
BASE = {"models": {"trunk": {"SmallResNet": {"in_channels": 1, "widths": WIDTHS}}, "classifier": {"Linear": {}}}}
SAMPLE = torch.zeros(1, 28, 28)


def _cfg(**changes):
    cfg = copy.deepcopy(BASE)
    cfg.update(changes)
    return cfg


def _build(cfg, seed, num_classes=5, soft=None):
    return variant.build_models(Builder(cfg), cfg, seed, num_classes, SAMPLE, soft)


def _state(models):
    return {f"{k}.{n}": t for k, m in models.items() for n, t in m.state_dict().items()}


def test_shared_weights_bit_identical_across_variants():
    base = _state(_build(_cfg(), 3))
    for cfg in (_cfg(template_block={"aux_weight": 0.5}), _cfg(template_block={"mixing": "none"})):
        other = _state(_build(cfg, 3))
        extra = set(other) - set(base)
        assert extra and all(".layer3.1." in k for k in extra)  # only the inserted block is new
        assert set(base) <= set(other)
        for k, t in base.items():
            assert torch.equal(t, other[k]), k
    # another seed gives other weights (the test could fail)
    seed4 = _state(_build(_cfg(), 4))
    assert not torch.equal(seed4["trunk.stem.0.weight"], base["trunk.stem.0.weight"])
    # building does not touch the global RNG
    torch.manual_seed(0)
    a = torch.rand(1)
    torch.manual_seed(0)
    _build(_cfg(template_block={}), 3)
    assert torch.equal(torch.rand(1), a)


def test_classifier_is_filled_and_block_position_is_a_setting():
    models = _build(_cfg(template_block={"after": "layer2"}), 0, num_classes=7)
    assert (models["classifier"].in_features, models["classifier"].out_features) == (8, 7)
    (block,) = template_matching_blocks(models["trunk"])
    assert models["trunk"].layer2[-1] is block and block.num_classes == 7 and block.in_channels == 4
    assert variant.aux_weight(_cfg(template_block={"aux_weight": 0.25})) == 0.25
    assert variant.aux_weight(_cfg()) is None


def test_block_init_is_a_setting_identity_by_default_paper_for_table1():
    """``template_block.init`` goes to the inserter: the default starts the block as the identity (the trunk computes
    what the plain trunk computes), ``init: paper`` keeps the random start of from-scratch training, with the same
    random draws; the Table 1 config's block variants ask for the paper's."""
    x = torch.randn(2, 1, 28, 28)
    plain = _build(_cfg(), 3)["trunk"].eval()
    identity = _build(_cfg(template_block={}), 3)["trunk"].eval()
    paper = _build(_cfg(template_block={"init": "paper"}), 3)["trunk"].eval()
    with torch.no_grad():
        assert torch.equal(identity(x), plain(x)) and not torch.allclose(paper(x), plain(x))
    (a,), (b,) = template_matching_blocks(identity), template_matching_blocks(paper)
    assert torch.equal(a.classifier.weight, b.classifier.weight)  # the same draws: only the start differs
    import yaml

    from benchmarks.protocols import config_path

    with open(f"{config_path('template_block_table1')}/config_general/default.yaml", encoding="utf-8") as f:
        table1 = yaml.safe_load(f)["variants"]
    blocks = {n: v["template_block"] for n, v in table1.items() if v and "template_block" in v}
    assert len(blocks) == 4 and all(b["init"] == "paper" for b in blocks.values())


def test_wider_baseline_has_at_least_the_block_parameters():
    block_cfg = _cfg(template_block={})
    wider_cfg = _cfg(match_parameters={"variant": "block", "widen": "models.trunk.SmallResNet.widths"})
    matched = variant.match_parameters(wider_cfg, block_cfg, 5, SAMPLE)
    block = variant.count_parameters(_build(block_cfg, 0))
    wider = _build(matched, 0)
    assert variant.count_parameters(wider) >= block > variant.count_parameters(_build(_cfg(), 0))
    assert not template_matching_blocks(wider["trunk"])
    value = matched["match_parameters"]["value"]
    # the smallest k/8 widening: one step less does not reach the block's count
    assert value == matched["models"]["trunk"]["SmallResNet"]["widths"] and value != WIDTHS
    k = next(k for k in range(9, 65) if [int(round(v * k / 8)) for v in WIDTHS] == value)
    if k > 9:
        smaller = _cfg(models={**BASE["models"], "trunk": {"SmallResNet": {"in_channels": 1, "widths": [
            int(round(v * (k - 1) / 8)) for v in WIDTHS]}}})  # fmt: skip
        assert variant.count_parameters(_build(smaller, 0)) < block
    deeper = variant.match_parameters(
        _cfg(models={**BASE["models"], "trunk": {"SmallResNet": {"in_channels": 1, "widths": WIDTHS, "blocks": 1}}},
             match_parameters={"variant": "block", "deepen": "models.trunk.SmallResNet.blocks"}),
        block_cfg, 5, SAMPLE,
    )  # fmt: skip
    assert deeper["models"]["trunk"]["SmallResNet"]["blocks"] == 2
    with pytest.raises(ConfigError, match=r"match_parameters: 'models.trunk.ResNet.widths' is not a path"):
        variant.match_parameters(
            _cfg(match_parameters={"variant": "block", "widen": "models.trunk.ResNet.widths"}), block_cfg, 5, SAMPLE
        )


def test_soft_maximizer_variant_and_estimates():
    soft_cfg = _cfg(soft_maximizer={"mixing": "softmax", "estimate_from": ["b"]})
    with pytest.raises(ConfigError, match="soft_maximizer: μ and η are estimated before"):
        _build(soft_cfg, 0)
    models = _build(soft_cfg, 0, soft={"mu": 0.5, "eta": 3.0})
    from pml_extensions.trunks import MarginAugmentedSoftmax

    swapped = [m for m in models["trunk"].modules() if isinstance(m, MarginAugmentedSoftmax)]
    assert len(swapped) == 4 and all(m.mu == 0.5 and m.eta == 3.0 for m in swapped)
    # the convs are the BN-ReLU network's of the same seed
    plain = _build(_cfg(), 0)
    assert torch.equal(models["trunk"].stem[0].weight, plain["trunk"].stem[0].weight)
    batches = variant.probe_batches([(torch.full((1, 28, 28), float(i)), 0) for i in range(5)], 4, 3)
    assert [b.shape[0] for b in batches] == [3, 1] and float(batches[1][0, 0, 0, 0]) == 3.0
    est = variant.soft_estimates([plain["trunk"], _build(_cfg(), 1)["trunk"]], batches, torch.device("cpu"))
    assert est["mu"] == pytest.approx(sum(est["mu_per_model"]) / 2) and len(est["eta_per_model"]) == 2


def test_unknown_trunk_class_is_named():
    cfg = _cfg(models={"trunk": {"SmallResnet": {}}, "classifier": {"Linear": {}}})
    with pytest.raises(ConfigError, match="models.trunk: unknown class 'SmallResnet'"):
        _build(cfg, 0)
