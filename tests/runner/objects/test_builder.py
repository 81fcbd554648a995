"""runner/objects/builder.py: lower-case model functions with filled num_classes (template_block's paper placement),
prototype_init from data, the testers PB's keys describe, and the objects of every other role."""

import pytest
import torch

from pml_extensions.runner.config.loader import find_config
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.objects.builder import Builder, build_tester
from pml_extensions.runner.protocols import load_config
from pml_extensions.trunks import HistogramPooling, find_histogram_layers, template_matching_blocks


def test_template_block_config_puts_the_block_between_the_last_two_stages():
    cfg, sources = load_config(find_config("template_block"))
    cfg["models"]["trunk"][0]["template_matching_trunk"]["model"] = {"mobilenet_v2_imagenet": {"pretrained": False}}
    builder = Builder(cfg, sources)
    torch.manual_seed(0)
    models = builder.build_models(torch.zeros(3, 64, 64), num_classes=7)
    body = models["trunk"][0]
    kinds = [type(m).__name__ for m in body]
    # torchvision MobileNetV2.features: 18 stages + final conv; the block goes before the last stride-2 stage (14)
    assert kinds.index("TemplateMatchingBlock") == 14 and len(kinds) == 20
    assert body[15].conv[1][0].stride == (2, 2)  # the last down-sampling stage follows the block
    (block,) = template_matching_blocks(models["trunk"])
    assert block.num_classes == 7  # filled per fold from the fold's training classes
    assert builder.embedding_size == 128
    with torch.no_grad():
        assert models["trunk"](torch.zeros(2, 3, 64, 64)).shape == (2, 1280)


def test_a_plain_mapping_is_not_a_model_function():
    b = Builder({})
    assert b._function_spec({"layer_sizes": [128]}) is None
    assert b._function_spec({"mobilenet_v2_imagenet": {"pretrained": False}})[0] == "mobilenet_v2_imagenet"
    assert b._function_spec({"Flatten": {}}) is None


class _Images(torch.utils.data.Dataset):
    def __init__(self, n=12):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 3, 4, 4, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i % 3


def _models():
    torch.manual_seed(0)
    trunk = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 1), HistogramPooling(5, 6), torch.nn.Flatten())
    return {"trunk": trunk, "embedder": torch.nn.Identity()}


def test_prototype_init_kcenter_picks_local_features_of_the_body():
    models = _models()
    data = _Images()
    builder = Builder({"prototype_init": {"method": "kcenter", "num_batches": 2, "batch_size": 4}, "seed": 3})
    assert builder.init_from_data(models, data) is True
    pool = find_histogram_layers(models["trunk"])[0]
    # the same two shuffled batches the builder drew (generator seeded with the config's seed)
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        feats = torch.cat([pool.local_features(models["trunk"][0](x)) for (x, _), _ in zip(loader, range(2))])
    protos = pool.prototypes.detach()
    dists = torch.cdist(protos.double(), feats.double())
    assert dists.min(dim=1).values.max().item() < 1e-6  # every prototype is one of the 32 local features
    assert len({int(i) for i in dists.argmin(dim=1)}) == 6  # ... six different ones


def test_prototype_init_absent_unknown_keys_and_missing_layer():
    assert Builder({}).init_from_data(_models(), _Images()) is False
    with pytest.raises(ConfigError, match=r"prototype_init: unknown keys \['metod'\]"):
        Builder({"prototype_init": {"metod": "kmeans"}}).init_from_data(_models(), _Images())
    with pytest.raises(ConfigError, match="exactly one HistogramPooling"):
        Builder({"prototype_init": {"method": "kmeans"}}).init_from_data(
            {"trunk": torch.nn.Sequential(torch.nn.Flatten())}, _Images()
        )
    with pytest.raises(ConfigError, match="method must be one of"):
        Builder({"prototype_init": {"method": "kmedians"}}).init_from_data(_models(), _Images())


def test_template_block_quick_variant_puts_the_block_before_the_last_stage():
    root = find_config("template_block")
    cfg, sources = load_config(root, {"config_models": ["default", "quick"]})
    builder = Builder(cfg, sources)
    torch.manual_seed(0)
    trunk = builder.build_models(torch.zeros(1, 32, 32), num_classes=5)["trunk"]
    kinds = [type(m).__name__ for m in trunk]
    assert kinds == ["ConvNetBody", "TemplateMatchingBlock", "MaxPool2d", "ConvNetBody", "AdaptiveAvgPool2d", "Flatten"]
    assert trunk[1].num_classes == 5 and trunk[3].out_channels == 64
    with torch.no_grad():  # the 64-channel last stage runs on the block's output at stride 4, as ConvNetBody's did
        assert trunk[:4](torch.zeros(2, 1, 32, 32)).shape == (2, 64, 8, 8)


def _tester_cfg(**kwargs):
    return {"tester": {"GlobalEmbeddingSpaceTester": kwargs}}


class _Points(torch.utils.data.Dataset):
    """4 points on a line, labels [0, 0, 1, 1]: nearest neighbours are hand-checkable."""

    x = torch.tensor([[0.0, 1.0], [0.1, 1.0], [1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1])

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def test_accuracy_calculator_include_computes_only_p_at_1():
    calc = {"AccuracyCalculator": {"include": ["precision_at_1"], "k": 1}}
    tester = build_tester(_tester_cfg(accuracy_calculator=calc, normalize_embeddings=False), torch.device("cpu"))
    emb, labels = tester.get_all_embeddings(_Points(), torch.nn.Identity())
    acc = tester.accuracy_calculator.get_accuracy(emb, labels[:, 0])
    # neighbours (L2, self excluded): 0->1 (same), 1->0 (same), 2->1 (other), 3->1 (other): P@1 = 2/4
    assert acc == {"precision_at_1": 0.5}


def test_pml_tester_and_calculator_run_on_the_blocked_engine():
    """GlobalEmbeddingSpaceTester / AccuracyCalculator become their sharded, blocked-engine subclasses (same
    arguments, same numbers as PML's classes); sharded=False keeps PML's classes."""
    from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    from pml_extensions.knn import ChunkedAccuracyCalculator
    from pml_extensions.testers import ShardedGlobalEmbeddingSpaceTester

    calc = {"AccuracyCalculator": {"include": ["precision_at_1", "mean_average_precision_at_r"], "k": "max_bin_count"}}
    ours = build_tester(_tester_cfg(accuracy_calculator=calc, normalize_embeddings=False), torch.device("cpu"))
    stock = build_tester(
        _tester_cfg(accuracy_calculator=calc, normalize_embeddings=False), torch.device("cpu"), sharded=False
    )
    assert (
        type(ours) is ShardedGlobalEmbeddingSpaceTester and type(ours.accuracy_calculator) is ChunkedAccuracyCalculator
    )
    assert type(stock) is GlobalEmbeddingSpaceTester and type(stock.accuracy_calculator) is AccuracyCalculator
    emb, labels = ours.get_all_embeddings(_Points(), torch.nn.Identity())
    a = ours.accuracy_calculator.get_accuracy(emb, labels[:, 0])
    b = stock.accuracy_calculator.get_accuracy(emb, labels[:, 0])
    assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-6 for k in a)
    assert a["precision_at_1"] == 0.5


def test_tester_arguments_reach_pml():
    t = build_tester(
        _tester_cfg(
            normalize_embeddings=False,
            use_trunk_output=True,
            batch_size=3,
            pca=1,
            dataloader_num_workers=0,
            label_hierarchy_level=0,
        ),
        torch.device("cpu"),
    )
    assert (t.normalize_embeddings, t.use_trunk_output, t.batch_size, t.pca, t.dataloader_num_workers) == (
        False,
        True,
        3,
        1,
        0,
    )
    emb, _ = t.get_all_embeddings(_Points(), torch.nn.Identity(), torch.nn.Linear(2, 7))
    assert emb.shape == (4, 1)  # trunk output (2-D) reduced by PCA to 1, the embedder is not used


class _Labelled(torch.utils.data.Dataset):
    """Takes ``split`` and ``transform`` like the package's datasets: 6 items, labels 0, 0, 1, 1, 2, 2."""

    def __init__(self, split="train", transform=None):
        self.split, self.transform, self.labels = split, transform, [0, 0, 1, 1, 2, 2]

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.full((1, 2, 2), float(i)), self.labels[i]


def test_datasets_by_class_by_name_and_as_a_plain_name(monkeypatch):
    from pml_extensions.runner.config.registry import register

    register(_Labelled, role="dataset", name="Labelled")
    ds = Builder({"dataset": {"Labelled": {}}}).build_dataset("test", transform="T")
    assert (type(ds).__name__, ds.split, ds.transform) == ("_Labelled", "test", "T")
    import pml_extensions.datasets as datasets

    calls = []
    monkeypatch.setattr(datasets, "get_dataset", lambda **kw: calls.append(kw) or "built")
    assert Builder({"dataset": "glyphs"}).build_dataset() == "built"
    assert Builder({"dataset": {"name": "glyphs", "kwargs": {"image_size": 8}}, "dataset_root": None}).build_dataset(
        "train", transform="T"
    )
    assert calls == [
        {"name": "glyphs", "split": "all", "root": None, "transform": None},
        {"name": "glyphs", "split": "train", "root": None, "image_size": 8, "transform": "T"},
    ]
    with pytest.raises(ConfigError, match=r"unknown keys \['size'\]; a dataset by name has name, root, kwargs"):
        Builder({"dataset": {"name": "glyphs", "size": 3}}).build_dataset()


def test_models_without_a_sample_and_an_embedder_that_pools():
    b = Builder({"models": {"trunk": {"Conv2d": {"in_channels": 1, "out_channels": 3, "kernel_size": 1}}}})
    models = b.build_models()
    assert b.embedding_size is None and isinstance(models["embedder"], torch.nn.Identity)
    with pytest.raises(ConfigError, match=r"the trunk must output \[N, D\] vectors.*got shape \(1, 3, 4, 4\)"):
        b.build_models(torch.zeros(1, 4, 4))
    pooled = Builder(
        {
            "models": {
                "trunk": {"Conv2d": {"in_channels": 1, "out_channels": 3, "kernel_size": 1}},
                "embedder": {"RetrievalHead": {"in_channels": 3, "out_dim": 5}},
            }
        }
    )
    pooled.build_models(torch.zeros(1, 4, 4))
    assert pooled.embedding_size == 5  # a map is fine when the embedder pools it
    wrong = Builder(
        {"models": {"trunk": {"Flatten": {}}, "embedder": {"Linear": {"in_features": 3, "out_features": 2}}}}
    )
    with pytest.raises(ConfigError, match=r"models.embedder: does not take the trunk's \[N, 16\] output"):
        wrong.build_models(torch.zeros(1, 4, 4))


def test_before_is_called_before_each_model():
    order = []
    spec = {"trunk": {"Flatten": {}}, "embedder": {"Identity": {}}, "head": {"Identity": {}}}
    Builder({"models": spec}).build_models(before=order.append)
    assert order == ["trunk", "embedder", "head"]


def test_optimizer_groups():
    from pml_extensions.trunks import HistogramPooling

    trunk = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), HistogramPooling(4, 5))
    b = Builder({})
    opt = b.build_optimizers({"trunk": trunk}, {}, spec={"trunk_optimizer": {"Adam": {"lr": 0.1, "prototype_lr": 0.5}}})
    plain, protos = opt["trunk_optimizer"].param_groups
    assert protos["params"] == [trunk[1].prototype_conv.weight] and protos["lr"] == 0.5 and plain["lr"] == 0.1
    assert len(plain["params"]) == 2  # the conv's weight and bias
    for bad, message in [
        ({"param_groups": [{"lr": 1}]}, r"param_groups\[0\]: expected \{modules: ClassName"),
        ({"param_groups": [{"modules": "Conv2d", "lr_multiplier": 2}]}, "lr_multiplier needs the optimizer's lr"),
    ]:
        with pytest.raises(ConfigError, match=message):
            b.build_optimizers({"trunk": trunk}, {}, spec={"trunk_optimizer": {"SGD": dict(bad, momentum=0.0)}})
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    notes = []
    assert (
        Builder({}, log=notes.append).build_optimizers({"trunk": frozen}, {}, {"trunk_optimizer": {"SGD": {"lr": 1}}})
        == {}
    )
    assert notes == ["note: trunk_optimizer skipped: trunk has no trainable parameters"]


def test_schedulers_need_an_optimizer_of_their_model():
    opt = {"trunk_optimizer": torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.5)}
    (s,) = Builder({}).build_lr_schedulers(opt, {"trunk_scheduler_by_epoch": {"StepLR": {"step_size": 2}}}).values()
    assert type(s).__name__ == "StepLR" and s.step_size == 2
    with pytest.raises(ConfigError, match="expected <model>_scheduler_by_<iteration|epoch|plateau> for one of"):
        Builder({}).build_lr_schedulers(opt, {"head_scheduler_by_epoch": {"StepLR": {"step_size": 2}}})


def test_sampler_fills_and_asserts():
    b = Builder({"sampler": {"MPerClassSampler": {"m": 2}}, "trainer": {"MetricLossOnly": {"iterations_per_epoch": 3}}})
    labels = [c for c in range(10) for _ in range(2)]  # 10 classes x 2: passes of up to 20 indices
    sampler = b.build_sampler(labels, 4)
    assert (sampler.m_per_class, sampler.batch_size, len(sampler)) == (2, 4, 12)  # 3 iterations x batch 4
    assert len(b.build_sampler(labels, 4, iterations_per_epoch=1)) == 4
    with pytest.raises(
        ConfigError, match=r"sampler.MPerClassSampler: .*\(the labels hold 2 classes; batch_size is 6\)"
    ):
        Builder({"sampler": {"MPerClassSampler": {"m": 2}}}).build_sampler([0, 0, 1, 1], 6)
    assert Builder({}).build_sampler([0, 1], 2) is None


def test_tester_takes_the_flat_forms_accuracy_calculator_and_trainer_defaults():
    calc = {"AccuracyCalculator": {"include": ["precision_at_1"], "k": 1}}
    b = Builder({"tester": {"GlobalEmbeddingSpaceTester": {"batch_size": 7}}, "accuracy_calculator": calc})
    tester = b.build_tester()
    assert tester.batch_size == 7 and tester.accuracy_calculator.get_curr_metrics() == ["precision_at_1"]
    default = Builder({"accuracy_calculator": calc}).build_tester()  # no tester key: the default tester takes it
    assert default.accuracy_calculator.get_curr_metrics() == ["precision_at_1"] and default.accuracy_calculator.k == 1
    trainer = Builder({}).build_trainer(
        {"MetricLossOnly": {"batch_size": 2}},
        models={"trunk": torch.nn.Identity(), "embedder": torch.nn.Identity()},
        optimizers={},
        loss_funcs={"metric_loss": torch.nn.Identity()},
        dataset=[],
    )
    assert type(trainer).__name__ == "MetricLossOnly" and trainer.batch_size == 2


def test_subset_views_take_the_datasets_labels():
    view = Builder({}).subset(_Labelled(), [1, 4], transform=lambda x: x + 1)
    assert view.labels.tolist() == [0, 2] and view[1][0][0, 0, 0].item() == 5.0


def test_a_frozen_trunk_gets_our_note_not_pmls_missing_optimizer_line(caplog):
    """PML logs 'optimizers is missing "trunk_optimizer"' for a model without optimizer; the builder gives a frozen
    model none on purpose and says so once."""
    import logging

    import torch

    from pml_extensions.runner.objects.builder import Builder

    notes = []
    b = Builder(
        {
            "models": {"trunk": {"Linear": {"in_features": 3, "out_features": 2}}},
            "optimizers": {"trunk_optimizer": {"SGD": {"lr": 0.1}}},
            "loss_funcs": {"metric_loss": {"ContrastiveLoss": {}}},
        },
        log=notes.append,
    )
    models = b.build_models()
    models["trunk"].requires_grad_(False)
    losses, _ = b.build_losses(models)
    optimizers = b.build_optimizers(models, losses)
    data = torch.utils.data.TensorDataset(torch.zeros(4, 3), torch.tensor([0, 0, 1, 1]))
    with caplog.at_level(logging.WARNING, logger="PML"):
        b.build_trainer(models=models, optimizers=optimizers, loss_funcs=losses, batch_size=2, dataset=data)
    assert notes == ["note: trunk_optimizer skipped: trunk has no trainable parameters"]
    assert not [r for r in caplog.records if "trunk_optimizer" in r.getMessage()]
    assert 'optimizers is missing "embedder_optimizer"' not in caplog.text  # the embedder (Identity) has no parameters
