"""runner/experiment/epoch_loop.py: evaluation, best-epoch selection, patience and resume of one stage."""

import pytest
import torch

from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.experiment.checkpoint import Checkpointer, load_weights
from pml_extensions.runner.experiment.epoch_loop import EpochLoop


class _Trainer:
    """Stands in for a PML trainer: each epoch adds 1 to the model's weight and counts the epochs trained."""

    iterations_per_epoch = 3

    def __init__(self, model, trained):
        self.model, self.trained, self.sampler = model, trained, None

    def train(self, start_epoch, num_epochs):
        with torch.no_grad():
            self.model.weight += 1.0
        self.trained.append(start_epoch)


def _loop(folder, scores, trained, model, **kwargs):
    values = iter(scores)
    kwargs = {"num_epochs": 4, "patience": None, **kwargs}
    loop = EpochLoop(
        Checkpointer(folder, epoch_tables={"accuracies_val"}),
        {"m": model},
        {},
        {},
        primary="p",
        evaluate=lambda epoch: {"val": {"p": next(values)}},
        best_path=folder + "/best.pth",
        log=None,
        **kwargs,
    )
    return loop, (lambda: _Trainer(model, trained))


def _model():
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    return model


def test_the_best_epoch_and_its_weights(tmp_path):
    trained, model = [], _model()
    loop, make = _loop(str(tmp_path), [0.1, 0.4, 0.9, 0.2, 0.3], trained, model)
    assert loop.resume() is None
    best = loop.run(make)
    assert best == {"metric": 0.9, "epoch": 2, "metrics": {"p": 0.9}}
    assert trained == [1, 2, 3, 4]
    assert load_weights(str(tmp_path / "best.pth"))["m"]["weight"].item() == 2.0  # the weights after epoch 2
    rows = Checkpointer(str(tmp_path)).rows("accuracies_val")
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2, 3, 4]


def test_patience_stops_early(tmp_path):
    trained = []
    loop, make = _loop(str(tmp_path), [0.5, 0.9, 0.1, 0.2, 0.3], trained, _model(), patience=1)
    loop.resume()
    assert loop.run(make)["epoch"] == 1
    # stop once epoch - best epoch > patience: epoch 3 (3 - 1 = 2 > 1) is the last trained, epoch 4 never runs
    assert trained == [1, 2, 3]


def test_a_rerun_resumes_after_the_last_committed_epoch(tmp_path):
    trained, model = [], _model()
    loop, make = _loop(str(tmp_path), [0.1, 0.4], trained, model, num_epochs=1)
    loop.resume()
    loop.run(make)
    assert loop.trained
    again, make = _loop(str(tmp_path), [0.3, 0.6, 0.2], trained, _model(), num_epochs=3)
    state = again.resume()
    assert state["epoch"] == 1 and again.best["epoch"] == 1 and again.start_epoch == 2
    assert again.models["m"].weight.item() == 1.0  # the checkpoint's weights, not the fresh model's
    again.run(make)
    assert trained == [1, 2, 3] and again.best["metric"] == 0.6 and again.trained
    done, make = _loop(str(tmp_path), [], trained, _model(), num_epochs=3)
    done.resume()
    assert done.run(make)["metric"] == 0.6 and not done.trained and trained == [1, 2, 3]  # finished: trains nothing


def test_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="^cfg: num_epochs must be a positive integer, got 0"):
        _loop(str(tmp_path), [], [], _model(), num_epochs=0, where="cfg")
    loop = EpochLoop(
        Checkpointer(str(tmp_path)),
        {"m": _model()},
        {},
        {},
        num_epochs=1,
        primary="map",
        evaluate=lambda epoch: {"val": {"p": 1.0}},
        best_path=str(tmp_path / "b.pth"),
        log=None,
        where="config_eval.yaml: hook_container",
    )
    with pytest.raises(ConfigError, match="primary metric 'map' is not computed; available: p"):
        loop.run(lambda: None)


def test_release_workers_shuts_the_trainers_iterator_down_in_this_process():
    """Issue 21, item 8: with dataloader_num_workers > 0 the tester's forked workers inherited the trainer's live
    iterator and printed `AssertionError: can only test a child process` when they collected it."""
    from pml_extensions.runner.experiment.epoch_loop import release_workers

    loader = torch.utils.data.DataLoader(list(range(16)), batch_size=2, num_workers=1)

    class Trainer:  # PML's trainer keeps the epoch's iterator, not exhausted
        dataloader_iter = iter(loader)

    trainer = Trainer()
    next(trainer.dataloader_iter)
    iterator = trainer.dataloader_iter
    workers = list(iterator._workers)
    assert all(w.is_alive() for w in workers)
    release_workers(trainer)
    assert trainer.dataloader_iter is None and iterator._shutdown
    assert not any(w.is_alive() for w in workers)
    release_workers(trainer)  # nothing left: a no-op
