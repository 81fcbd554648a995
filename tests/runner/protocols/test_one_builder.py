"""Issue 20, items 2 and 4: every object of every protocol comes from the one Builder.

Tiny runs of the protocols (the package's ``mlrc`` and ``paired``, the plugins of ``benchmarks/protocols``) with
``Builder.build`` (the one construction step) and ``Builder.subset`` (dataset views) recorded: each protocol builds
every role through them, and every object its trainers hold — models, optimizers, losses, miners, schedulers, dataset,
sampler — is one the Builder returned (not a second factory's).
"""

import os

import pytest
import torch
import yaml

from pml_extensions.runner.config.loader import parse_command_line
from pml_extensions.runner.objects.builder import Builder
from pml_extensions.runner.protocols import load_config, run_protocol

#: protocol -> the roles (first component of the Builder's key) its objects must come from
ROLES = {
    "mlrc": {"dataset", "views", "transforms", "models", "loss_funcs", "mining_funcs", "sampler", "optimizers"}
    | {"tester", "trainer"},
    "paired": {"dataset", "views", "transforms", "models", "loss_funcs", "sampler", "optimizers", "tester"}
    | {"trainer"},
    # the paired job under the XML paper's plugin: its prototype figure's post-hoc HistogramPooling too
    "xml_paper": {"dataset", "views", "transforms", "models", "loss_funcs", "sampler", "optimizers", "tester"}
    | {"trainer", "plots"},
    "resolution_distillation": {"datasets", "views", "transforms", "models", "loss_funcs", "mining_funcs", "sampler"}
    | {"optimizers", "lr_schedulers", "tester", "trainer", "student"},
    "template_block": {"dataset", "test_dataset", "views", "transforms", "models", "template_block", "loss_funcs"}
    | {"sampler", "optimizers", "lr_schedulers", "trainer"},
    "localization": {"dataset", "test_dataset", "validation_dataset", "views", "transforms", "models", "frozen_prefix"}
    | {"loss_funcs", "mining_funcs", "sampler", "optimizers", "trainer"},
}


@pytest.fixture
def recorded(monkeypatch):
    """``[(key, object)]`` of every object the Builder builds while the test runs."""
    calls = []
    build, subset = Builder.build, Builder.subset

    def record_build(self, key, spec, **extra):
        obj = build(self, key, spec, **extra)
        calls.append((key, obj))
        return obj

    def record_subset(self, *args, **kwargs):
        obj = subset(self, *args, **kwargs)
        calls.append(("views", obj))
        return obj

    monkeypatch.setattr(Builder, "build", record_build)
    monkeypatch.setattr(Builder, "subset", record_subset)
    return calls


def _small_glyphs(config):
    """``config`` on the glyphs of the DejaVu Sans fonts only (248 of the 682 images of a split: every evaluation
    embeds its whole split; which objects the Builder built does not depend on the size)."""
    from tests.runner.runner_testing_utils import dejavu_fonts

    fonts = dejavu_fonts()
    assert config["dataset"]["name"] == "glyphs" and fonts
    config["dataset"]["kwargs"] = {**config["dataset"].get("kwargs", {}), "font_files": fonts}
    return config


def _config(protocol, tmp_path, request):
    if protocol == "mlrc":
        root = request.getfixturevalue("tiny_mlrc_config")
        argv = ["--num_epochs_train", "1", "--num_training_sets", "1", "--num_training_partitions", "2"]
        argv += ["--mining_funcs", "{tuple_miner: {MultiSimilarityMiner: {}}}"]
        return load_config(root, None, parse_command_line(argv))
    if protocol in ("paired", "xml_paper"):
        from pml_extensions.cli.job import load_job_config

        config, sources = load_job_config(
            ["--num_epochs", "1", "--iterations_per_epoch", "2", "--seeds", "0", "--variants", "contrastive_xml"]
            + ["contrastive_gap", "--device", "cpu"]
        )
        if protocol == "xml_paper":
            config["protocol"] = "benchmarks.protocols.xml_paper"
        return _small_glyphs(config), sources
    if protocol == "template_block":
        from tests.benchmarks.protocols.template_block.tb_testing import tiny_config

        return tiny_config(variants=("baseline", "block"), seeds=(0,))
    request.getfixturevalue("mobilenet_weights")  # skips without the offline ImageNet weights
    if protocol == "localization":
        from tests.benchmarks.protocols.localization.test_protocol import tiny

        config, sources = tiny(tmp_path)
        config["num_epochs"] = 1  # one epoch builds every object
        return config, sources
    root = tmp_path / "res"
    (root / "config_general").mkdir(parents=True)
    from benchmarks.protocols import config_path

    general = yaml.safe_load(
        open(os.path.join(config_path("resolution_distillation"), "config_general", "default.yaml"))
    )
    general.update(
        datasets={"glyphs": {"database_resolution": 32, "query_resolutions": [16], "image_size": 32}},
        seeds=[0],
        teacher_iterations=2,
        student_iterations=2,
        images_per_batch=2,
        num_augmentations=2,
        eval_batch_size=64,
        device="cpu",
        num_workers=0,
        checkpoint_every=0,
        validation=None,
        student_lr_grid=None,
        low_resolution_teacher=False,
        student_variants=[],
    )
    general["models"]["embedder"]["RetrievalHead"]["out_dim"] = 8
    (root / "config_general" / "default.yaml").write_text(yaml.safe_dump(general))
    config, sources = load_config(str(root))
    config["datasets"]["glyphs"]["max_test_per_class"] = 2
    return config, sources


def _unwrap(obj):
    return getattr(obj, "module", obj)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", sorted(ROLES))
def test_every_object_of_a_protocol_comes_from_the_one_builder(protocol, tmp_path, recorded, request):
    config, sources = _config(protocol, tmp_path, request)
    run_protocol(config, str(tmp_path / "exp"), sources, log=lambda *a, **k: None)
    roles = {key.split(".")[0] for key, _ in recorded}
    assert roles >= ROLES[protocol], sorted(ROLES[protocol] - roles)
    built = {id(obj) for _, obj in recorded}
    trainers = [obj for key, obj in recorded if key == "trainer"]
    assert trainers
    for trainer in trainers:
        for group in ("models", "optimizers", "loss_funcs", "mining_funcs", "lr_schedulers"):
            for name, obj in (getattr(trainer, group, None) or {}).items():
                if isinstance(obj, torch.nn.Identity) and group == "models":
                    continue  # a trainer's own default (no embedder)
                assert id(_unwrap(obj)) in built, (protocol, group, name, type(obj).__name__)
        assert id(trainer.dataset) in built, (protocol, type(trainer.dataset).__name__)
        assert trainer.sampler is None or id(trainer.sampler) in built, (protocol, type(trainer.sampler).__name__)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["mlrc", "paired"])
def test_a_cached_run_builds_its_caches_and_datasets_with_the_one_builder(protocol, tmp_path, recorded, request):
    """With ``feature_cache`` the caches (``FeatureCache``) and the datasets the trainers and testers read
    (``CachedFeatureDataset``, then their views) come from the same Builder."""
    from pml_extensions.datasets import CachedFeatureDataset, FeatureCache

    if protocol == "mlrc":
        from tests.runner.protocols.mlrc.test_protocol import CACHED_MODELS

        root = request.getfixturevalue("tiny_mlrc_config")
        with open(os.path.join(root, "config_models", "default.yaml"), "w") as f:
            f.write(CACHED_MODELS)
        argv = ["--num_epochs_train", "1", "--num_training_sets", "1", "--feature_cache", "{boundary: '1'}"]
        argv += ["--mining_funcs", "{tuple_miner: {MultiSimilarityMiner: {}}}"]
        config, sources = load_config(root, None, parse_command_line(argv))
    else:
        from tests.runner.protocols.paired.test_protocol import cached_config

        config, sources = _small_glyphs(cached_config(seeds=[0], num_epochs=1)), {}
    run_protocol(config, str(tmp_path / "exp"), sources, log=lambda *a, **k: None)
    roles = {key.split(".")[0] for key, _ in recorded}
    assert roles >= ROLES[protocol] | {"feature_cache"}, sorted(ROLES[protocol] - roles)
    built = {id(obj) for _, obj in recorded}
    assert any(isinstance(obj, FeatureCache) for _, obj in recorded)
    trainers = [obj for key, obj in recorded if key == "trainer"]
    assert trainers
    for trainer in trainers:
        assert id(trainer.dataset) in built
        assert isinstance(trainer.dataset.dataset, CachedFeatureDataset) and id(trainer.dataset.dataset) in built
        for group in ("models", "optimizers", "loss_funcs"):
            for name, obj in (getattr(trainer, group, None) or {}).items():
                assert id(_unwrap(obj)) in built, (protocol, group, name)
