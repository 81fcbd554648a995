"""benchmarks/protocols/resolution_distillation/recipe.py: the paper's objects as specs, built by the one Builder into
exactly the objects the recipe names (Suma & Tolias, WACV 2023, Sec. 5)."""

import numpy as np
import pytest
import torch
from PIL import Image

from benchmarks.protocols.resolution_distillation import recipe
from pml_extensions.runner.objects.builder import Builder
from pml_extensions.trunks import RetrievalHead


def test_eval_transform_resizes_by_8_7_then_crops():
    t = recipe.eval_transform(28)
    names = [type(s).__name__ for s in t.transforms]
    assert names == ["Resize", "CenterCrop", "ToTensor", "Normalize"]
    assert t.transforms[0].size == 32 and t.transforms[1].size == (28, 28)  # round(28 * 8 / 7) = 32
    assert tuple(t(Image.new("RGB", (64, 40))).shape) == (3, 28, 28)


def test_train_transform_draws_from_the_global_rng():
    import numpy as np

    image = Image.fromarray((np.random.default_rng(0).random((40, 40, 3)) * 255).astype(np.uint8))
    t = recipe.train_transform(16, (0.5, 1.0))
    assert [type(s).__name__ for s in t.transforms] == [
        "RandomResizedCrop",
        "RandomHorizontalFlip",
        "ToTensor",
        "Normalize",
    ]
    assert t.transforms[0].scale == (0.5, 1.0) and t.transforms[0].size == (16, 16)
    torch.manual_seed(3)
    a = t(image)
    torch.manual_seed(3)
    b = t(image)
    torch.manual_seed(4)
    c = t(image)
    assert tuple(a.shape) == (3, 16, 16) and torch.equal(a, b) and not torch.equal(a, c)


def test_optimizers_give_gem_p_ten_times_the_rate_and_no_decay():
    head = RetrievalHead(4, 3)
    optimizers = Builder({}).build_optimizers(
        {"trunk": torch.nn.Linear(2, 4), "embedder": head}, {}, spec=recipe.optimizer_specs(1e-4)
    )
    trunk_groups = optimizers["trunk_optimizer"].param_groups
    assert len(trunk_groups) == 1 and trunk_groups[0]["lr"] == 1e-4 and trunk_groups[0]["weight_decay"] == 1e-6
    plain, gem = optimizers["embedder_optimizer"].param_groups
    assert type(optimizers["embedder_optimizer"]).__name__ == "AdamW"
    assert [p.shape for p in plain["params"]] == [torch.Size([3, 4]), torch.Size([3])]
    assert gem["params"] == [head.pool.p] and gem["lr"] == pytest.approx(1e-3) and gem["weight_decay"] == 0.0


def test_schedulers_span_the_student_iterations_from_the_optimizer_rates():
    model = RetrievalHead(4, 3)
    b = Builder({})
    optimizers = b.build_optimizers({"embedder": model}, {}, spec=recipe.optimizer_specs(1e-4, names=("embedder",)))
    ((name, scheduler),) = b.build_lr_schedulers(optimizers, recipe.scheduler_specs(optimizers, 10)).items()
    assert name == "embedder_scheduler_by_iteration" and scheduler.total_steps == 10
    assert [g["max_lr"] for g in optimizers["embedder_optimizer"].param_groups] == [1e-4, pytest.approx(1e-3)]
    assert [g["initial_lr"] for g in optimizers["embedder_optimizer"].param_groups] == [1e-5, pytest.approx(1e-4)]


def test_teacher_loss_and_miner():
    b = Builder({})
    losses, miners = b.build_losses(
        {"trunk": torch.nn.Identity(), "embedder": torch.nn.Identity()},
        loss_funcs=recipe.TEACHER_LOSS,
        mining_funcs=recipe.TEACHER_MINER,
    )
    loss, miner = losses["metric_loss"], miners["tuple_miner"]
    assert type(loss).__name__ == "TripletMarginLoss" and loss.margin == 0.7 and loss.distance.power == 2
    assert type(miner).__name__ == "DistanceWeightedMiner" and (miner.cutoff, miner.nonzero_loss_cutoff) == (0.5, 1.4)


def test_datasets_by_name_and_pretrained():
    assert recipe.dataset_spec("glyphs", {"image_size": 32}) == {
        "name": "glyphs",
        "kwargs": {"image_size": 32, "source": "matplotlib"},
    }
    assert recipe.dataset_spec("cub", {"root": "/x"}) == {"name": "cub", "root": "/x"}
    with pytest.raises(ValueError, match="unknown dataset 'mnist'"):
        recipe.dataset_spec("mnist", {})
    models = {"trunk": {"mobilenet_v2_features": {"pretrained": True}}, "embedder": {"RetrievalHead": {}}}
    assert recipe.with_pretrained(models, False)["trunk"] == {"mobilenet_v2_features": {"pretrained": False}}
    assert models["trunk"]["mobilenet_v2_features"]["pretrained"] is True  # a copy
    assert recipe.with_pretrained({"trunk": {"Flatten": None}}, False) == {"trunk": {"Flatten": None}}


def test_the_tester_computes_the_protocol_metrics():
    tester = Builder({}).build_tester(recipe.tester_spec(8, 0), sharded=False)
    assert type(tester).__name__ == "AsymmetricTester" and tester.batch_size == 8 and tester.distributed is False
    assert set(tester.accuracy_calculator.get_curr_metrics()) == set(recipe.METRICS)


def test_eval_transform_size():
    from PIL import Image as _Image

    assert tuple(recipe.eval_transform(24)(_Image.new("RGB", (50, 30))).shape) == (3, 24, 24)


def test_unknown_dataset():
    with pytest.raises(ValueError, match="unknown dataset 'mnist'"):
        recipe.load_dataset("mnist", {})


def test_cap_per_class():
    labels = np.array([0] * 5 + [1] * 2 + [2] * 4)
    idx = recipe.cap_per_class(labels, 3, seed=0)
    assert np.bincount(labels[idx]).tolist() == [3, 2, 3]
    assert np.array_equal(idx, recipe.cap_per_class(labels, 3, seed=0))
    assert len(recipe.cap_per_class(labels, None)) == 11


def test_capped_draw_hand_checked():
    # label 0 has 3 items and a cap of 2: numpy's seeded choice keeps two of them, label 1 (one item) stays
    rng = np.random.default_rng(0)
    kept0 = sorted(rng.choice(np.array([0, 1, 2]), 2, replace=False).tolist())
    assert recipe.cap_per_class([0, 0, 0, 1], 2, seed=0).tolist() == kept0 + [3]
