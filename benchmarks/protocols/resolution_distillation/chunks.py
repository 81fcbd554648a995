"""One stage's checkpointed training in chunks, and its end: the resume rules of the resolution protocol.

A stage (a teacher, a student) trains in chunks ("epochs") of ``checkpoint_every`` iterations: after every chunk the
log rows and a checkpoint are committed (:class:`pml_extensions.runner.experiment.checkpoint.Checkpointer`), the next
chunk's batches are reseeded from (seed, chunk) when the stage asks for it, and a killed stage resumes from its last
chunk. :func:`finish` marks a stage done (``result.json``) and drops its training checkpoint.
"""

import os
from typing import Any, Dict

import torch
from pytorch_metric_learning.samplers import MPerClassSampler

from pml_extensions.runner.experiment.checkpoint import restore_training_state, training_state


def finish(exp, stage, result):
    """Mark ``stage`` finished and drop its training checkpoint (its logs, result and models.pth stay)."""
    exp.finish_stage(stage, result, rank_local=True)  # each stage belongs to the one rank running its seed
    path = os.path.join(exp.stage_folder(stage), "checkpoint.pth")
    if os.path.exists(path):
        os.remove(path)
    return result


class Chunks:
    """Checkpointed training of one stage in chunks ("epochs") of ``chunk`` iterations: commits a checkpoint and
    the buffered log rows after every chunk, reseeds the next chunk's batches from (seed, chunk) when ``reseed`` is
    given, and resumes a killed stage (the protocol's module docstring tells the rules)."""

    def __init__(self, exp, stage, models, optimizers, schedulers, total, chunk, reseed=None, on_chunk=None):
        self.ck = exp.checkpointer(stage, epoch_tables={"accuracies"})
        self.models, self.optimizers, self.schedulers = models, optimizers, schedulers
        self.chunk = chunk or total
        self.num_chunks = max(1, total // self.chunk) if total else 0
        self.reseed, self.on_chunk = reseed, on_chunk
        self.extra: Dict[str, Any] = {}

    def resume(self, trainer=None) -> int:
        state = self.ck.resume()
        if state is None:
            return 1
        restore_training_state(state, self.models, self.optimizers)
        for k, s in self.schedulers.items():
            s.load_state_dict(state["schedulers"][k])
        if trainer is not None and hasattr(trainer, "data_pass"):
            trainer.data_pass = int(state["data_pass"])
        self.extra = dict(state.get("extra", {}))
        if trainer is not None and "sampler_labels" in self.extra:
            # PML's MPerClassSampler shuffles its public label list in place from one pass to the next
            trainer.sampler.labels = list(self.extra["sampler_labels"])
        return int(state["epoch"]) + 1

    def end_of_iteration_hook(self, trainer):
        losses = {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in trainer.losses.items()}
        self.ck.record_keeper.update_records({"loss_histories": losses}, trainer.get_global_iteration() + 1)

    def end_of_epoch_hook(self, trainer):
        if self.on_chunk is not None:
            self.on_chunk(trainer, self)
        if isinstance(trainer.sampler, MPerClassSampler):
            self.extra["sampler_labels"] = [int(x) for x in trainer.sampler.labels]
        state = training_state(
            trainer.epoch,
            trainer.epoch * self.chunk,
            self.models,
            self.optimizers,
            schedulers={k: s.state_dict() for k, s in self.schedulers.items()},
            data_pass=int(getattr(trainer, "data_pass", 0)),
            extra=self.extra,
        )
        self.ck.commit(state)
        if self.reseed is not None and trainer.epoch < self.num_chunks:
            self.reseed(trainer.epoch + 1)
            trainer.dataloader_iter = iter(trainer.dataloader)  # the next chunk's batches from (seed, chunk) only
        return True

    def train(self, trainer, start):
        if start > self.num_chunks:
            return
        trainer.iterations_per_epoch = self.chunk
        if self.reseed is not None:
            self.reseed(start)
        trainer.train(start, self.num_chunks)
