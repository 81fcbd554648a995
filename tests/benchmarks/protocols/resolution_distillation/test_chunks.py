"""benchmarks/protocols/resolution_distillation/chunks.py: a stage trains in checkpointed chunks, resumes after the last
committed one, and ends with result.json and no training checkpoint."""

import json
import os

import torch

from benchmarks.protocols.resolution_distillation.chunks import Chunks, finish
from pml_extensions.runner.experiment.folder import Experiment

QUIET = dict(log=lambda *a, **k: None)


class _Trainer:
    """One SGD step per iteration on ``loss = -w`` (lr 1: w grows by 1 per iteration), calling the chunk hooks as a
    PML trainer does."""

    def __init__(self, model, optimizer, chunks, stop_after=None):
        self.model, self.optimizer, self.chunks, self.stop_after = model, optimizer, chunks, stop_after
        self.sampler, self.data_pass, self.dataloader, self.iteration = None, 0, [0], 0

    def get_global_iteration(self):
        return self.iteration

    def train(self, start_epoch, num_epochs):
        for epoch in range(start_epoch, num_epochs + 1):
            self.epoch = epoch
            for _ in range(self.iterations_per_epoch):
                self.optimizer.zero_grad()
                loss = -self.model.weight.sum()
                loss.backward()
                self.optimizer.step()
                self.losses = {"total_loss": loss.detach()}
                self.chunks.end_of_iteration_hook(self)
                self.iteration += 1
            self.chunks.end_of_epoch_hook(self)
            if epoch == self.stop_after:
                return  # killed after this chunk's checkpoint


def _stage(exp, stop_after=None):
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    chunks = Chunks(exp, "stage", {"m": model}, {"m_optimizer": optimizer}, {}, total=4, chunk=2)
    trainer = _Trainer(model, optimizer, chunks, stop_after)
    return model, chunks, trainer


def test_a_killed_stage_resumes_after_its_last_chunk(tmp_path):
    exp = Experiment(str(tmp_path / "exp"), {"device": "cpu", "seed": None}, **QUIET)
    model, chunks, trainer = _stage(exp, stop_after=1)
    chunks.train(trainer, chunks.resume(trainer))
    assert model.weight.item() == 2.0  # chunk 1: two iterations
    model, chunks, trainer = _stage(exp)
    start = chunks.resume(trainer)
    assert start == 2 and model.weight.item() == 2.0  # the checkpoint's weights, not the fresh zeros
    trainer.iteration = 2
    chunks.train(trainer, start)
    assert model.weight.item() == 4.0
    rows = chunks.ck.rows("loss_histories")
    assert [int(r["~iteration~"]) for r in rows] == [1, 2, 3, 4]  # every iteration logged once
    assert [float(r["total_loss"]) for r in rows] == [0.0, -1.0, -2.0, -3.0]


def test_finish_keeps_the_result_and_drops_the_checkpoint(tmp_path):
    exp = Experiment(str(tmp_path / "exp"), {"device": "cpu", "seed": None}, **QUIET)
    model, chunks, trainer = _stage(exp)
    chunks.train(trainer, chunks.resume(trainer))
    folder = exp.stage_folder("stage")
    assert os.path.exists(os.path.join(folder, "checkpoint.pth"))
    assert finish(exp, "stage", {"rows": [1]}) == {"rows": [1]}
    assert not os.path.exists(os.path.join(folder, "checkpoint.pth"))
    assert json.load(open(os.path.join(folder, "result.json"))) == {"rows": [1]}
    assert exp.stage_result("stage") == {"rows": [1]}
