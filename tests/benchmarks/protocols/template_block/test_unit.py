"""benchmarks/protocols/template_block/unit.py: what makes a resumed unit equal an uninterrupted one — the sampler of
epoch e continues one seeded stream, the one-cycle schedule is replayed to the unit's iteration — and the trainer
choice."""

import pytest
import torch

from benchmarks.protocols.template_block import unit
from pml_extensions.runner.objects.builder import Builder

CFG = {"sampler": {"RandomSampler": {"replacement": True}}, "batch_size": 3, "iterations_per_epoch": 4}


def test_sampler_of_epoch_e_continues_one_seeded_stream():
    data = torch.utils.data.TensorDataset(torch.arange(50))
    b = Builder(CFG)
    epochs = [list(unit.make_sampler(b, CFG, data, 7, e)) for e in (1, 2, 3)]
    # one sampler whose generator keeps running gives the same indices epoch after epoch (the old driver's stream)
    stream = torch.utils.data.RandomSampler(data, True, 12, generator=torch.Generator().manual_seed(7))
    assert epochs == [list(stream) for _ in range(3)]
    assert all(len(e) == 12 for e in epochs) and epochs[0] != epochs[1]
    assert list(unit.make_sampler(b, CFG, data, 8, 1)) != epochs[0]  # another seed, other batches
    assert unit.make_sampler(b, {**CFG, "sampler": None}, data, 7, 1) is None


def test_pml_sampler_comes_from_the_builder():
    cfg = {**CFG, "sampler": {"MPerClassSampler": {"m": 2}}, "batch_size": 4}
    view = type("View", (), {"labels": [0, 0, 1, 1, 2, 2]})()
    s = unit.make_sampler(Builder(cfg), cfg, view, 0, 1)
    assert type(s).__name__ == "MPerClassSampler" and len(s) == 16  # one epoch: 4 iterations x batch 4


def test_schedules_are_replayed_to_the_iteration():
    cfg = {"lr_schedulers": {"trunk_scheduler_by_iteration": {"OneCycleLR": {}}}}

    def opt():
        return {"trunk_optimizer": torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.01)}

    live = opt()
    (sched,) = unit.make_schedulers(Builder(cfg), cfg, live, 20, 0).values()
    assert sched.total_steps == 20 and live["trunk_optimizer"].param_groups[0]["max_lr"] == 0.01
    for _ in range(7):
        live["trunk_optimizer"].step()
        sched.step()
    replayed = opt()
    unit.make_schedulers(Builder(cfg), cfg, replayed, 20, 7)
    for key in ("lr", "betas"):
        assert replayed["trunk_optimizer"].param_groups[0][key] == live["trunk_optimizer"].param_groups[0][key]


def test_trainer_with_a_block_is_the_template_matching_trainer():
    cfg = {"batch_size": 8, "iterations_per_epoch": 3}
    assert unit.trainer_spec(Builder(cfg), cfg, "classification") == {
        "TrainWithClassifier": {"batch_size": 8, "iterations_per_epoch": 3, "dataloader_num_workers": 0}
    }
    spec = unit.trainer_spec(Builder(cfg), {**cfg, "template_block": {"aux_weight": 0.25}}, "metric_learning")
    assert spec == {
        "TemplateMatchingTrainer": {
            "batch_size": 8,
            "iterations_per_epoch": 3,
            "dataloader_num_workers": 0,
            "aux_weight": 0.25,
        }
    }


@pytest.mark.parametrize(
    "task, metric", [("classification", "accuracy"), ("metric_learning", "mean_average_precision_at_r")]
)
def test_primary_metric(task, metric):
    assert unit.primary_metric(task) == metric


def test_classification_accuracy_counts_argmax_hits():
    trunk = torch.nn.Flatten()
    classifier = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        classifier.weight.copy_(torch.eye(2))
    data = [(torch.tensor([1.0, 0.0]), 0), (torch.tensor([0.0, 1.0]), 1), (torch.tensor([2.0, 1.0]), 1)]
    models = {"trunk": trunk, "embedder": torch.nn.Identity(), "classifier": classifier}
    assert unit.classification_accuracy(models, data, torch.device("cpu"), batch_size=2) == pytest.approx(200 / 3)
