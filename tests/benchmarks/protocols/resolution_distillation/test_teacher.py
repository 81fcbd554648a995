"""benchmarks/protocols/resolution_distillation/teacher.py: a teacher stage trains the config's network with the recipe,
saves models.pth, and a finished stage is loaded, not retrained."""

import os

import pytest
import torch

from benchmarks.protocols.resolution_distillation import recipe
from benchmarks.protocols.resolution_distillation.chunks import finish
from benchmarks.protocols.resolution_distillation.teacher import teacher_stage
from pml_extensions.runner.experiment.checkpoint import load_weights
from pml_extensions.runner.experiment.folder import Experiment
from pml_extensions.runner.objects.builder import Builder

JOB = {
    "models": {
        "trunk": {"mobilenet_v2_features": {"pretrained": True}},
        "embedder": {"RetrievalHead": {"in_channels": 1280, "out_dim": 8}},
    },
    "teacher_iterations": 2,
    "teacher_classes_per_batch": 2,
    "teacher_lr": 1e-3,
    "checkpoint_every": 1,
    "num_workers": 0,
}


@pytest.mark.usefixtures("mobilenet_weights")
def test_teacher_trains_saves_and_loads(tmp_path):
    exp = Experiment(str(tmp_path / "exp"), {"device": "cpu", "seed": None}, log=lambda *a, **k: None)
    builder = Builder(JOB)
    train, _ = recipe.load_dataset("glyphs", {"image_size": 32}, builder)
    ctx = {"seed": 0, "builder": builder, "train_set": train, "dcfg": {"crop_scale": (0.5, 1.0)}}
    torch.manual_seed(0)
    untrained = builder.build_models(spec=JOB["models"])["embedder"].state_dict()
    trunk, embedder = teacher_stage(exp, "teacher", ctx, 16, JOB)
    assert not trunk.training and not embedder.training
    saved = load_weights(os.path.join(exp.stage_folder("teacher"), "models.pth"))
    assert all(torch.equal(v, saved["embedder"][k]) for k, v in embedder.state_dict().items())
    assert not torch.equal(saved["embedder"]["whiten.weight"], untrained["whiten.weight"])  # it trained
    rows = exp.checkpointer("teacher").rows("loss_histories")
    assert [int(r["~iteration~"]) for r in rows] == [1, 2]
    # a finished stage is loaded from its models.pth (here doctored, so loading is visible), never retrained
    saved["embedder"]["whiten.bias"] += 1.0
    torch.save(saved, os.path.join(exp.stage_folder("teacher"), "models.pth"))
    finish(exp, "teacher", {"rows": []})
    _, again = teacher_stage(exp, "teacher", ctx, 16, JOB)
    assert torch.equal(again.whiten.bias, saved["embedder"]["whiten.bias"])
    assert len(exp.checkpointer("teacher").rows("loss_histories")) == 2
