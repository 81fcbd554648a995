"""A resumable epoch loop around a PML trainer, shared by the protocols: per epoch it trains, evaluates, keeps the best
epoch's weights and commits the checkpoint (a rerun after SIGKILL resumes after the last committed epoch)."""

import math
from typing import Any, Callable, Dict, Optional

import torch

from ...utils.atomic_io import atomic_torch_save
from ...utils.checks import is_int
from .. import errors
from ..errors import ConfigError
from . import distributed as dist_utils
from .checkpoint import Checkpointer, restore_training_state, training_state


def release_workers(trainer) -> None:
    """Shut down ``trainer``'s unfinished ``dataloader_iter`` workers, so the tester's ``DataLoader`` forks no copy of
    them (whose ``__del__`` prints ``AssertionError: can only test a child process``)."""
    iterator, trainer.dataloader_iter = getattr(trainer, "dataloader_iter", None), None
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()


class EpochLoop:
    """Resumable training + selection of one stage: ``evaluate(epoch) -> {split: {metric: value}}`` every
    ``save_interval`` epochs (epoch 0 too with ``check_untrained``), each split logged to ``accuracies_<split>`` (the
    checkpointer's ``epoch_tables``); the best ``"val"`` ``primary`` epoch's weights saved to ``best_path``; stops
    after ``num_epochs``, or when ``epoch - best_epoch > patience``. :attr:`best`: ``{"metric", "epoch", "metrics"}``;
    :attr:`trained`: whether :meth:`run` trained an epoch (a resumed finished stage trains none).
    """

    def __init__(
        self,
        ckpt: Checkpointer,
        models: Dict[str, torch.nn.Module],
        optimizers: Dict[str, Any],
        loss_funcs: Dict[str, torch.nn.Module],
        *,
        num_epochs: int,
        primary: str,
        evaluate: Callable[[int], Dict[str, Dict[str, float]]],
        best_path: str,
        patience: Optional[int] = None,
        save_interval: int = 1,
        check_untrained: bool = True,
        log: Optional[Callable[..., None]] = print,
        name: str = "",
        where: str = "config",
    ):
        if not is_int(num_epochs) or num_epochs < 1:
            raise ConfigError(f"{where}: num_epochs must be a positive integer, got {num_epochs!r}")
        self.ckpt, self.models, self.optimizers, self.loss_funcs = ckpt, models, optimizers, loss_funcs
        self.num_epochs, self.primary, self.evaluate, self.best_path = num_epochs, primary, evaluate, best_path
        self.patience = None if patience is None else int(patience)
        self.save_interval = max(1, int(save_interval))
        self.check_untrained = bool(check_untrained)
        self.log = log if log and dist_utils.is_main() else (lambda *a, **k: None)
        self.name, self.where = name, where
        self.best = {"metric": -math.inf, "epoch": -1, "metrics": {}}
        self.start_epoch, self.finished, self.fresh = 1, False, True
        self.trained = False

    def _stopped(self, epoch: int) -> bool:
        return epoch >= self.num_epochs or (self.patience is not None and epoch - self.best["epoch"] > self.patience)

    def resume(self) -> Optional[Dict[str, Any]]:
        """Load the stage's checkpoint into the objects (RNGs included); returns the state or ``None``."""
        # rank 0 alone truncates the logs; every rank reads the checkpoint before any rank may write the next one
        # (without the barrier a late rank could read the checkpoint an early rank just committed and skip ahead)
        state = self.ckpt.resume() if dist_utils.is_main() else self.ckpt.load_state()
        dist_utils.barrier()
        if state is None:
            return None
        restore_training_state(state, self.models, self.optimizers, self.loss_funcs)
        self.best = {
            "metric": float(state["best_metric"]),
            "epoch": int(state["best_epoch"]),
            "metrics": dict(state.get("best_metrics", {})),
        }
        self.start_epoch, self.finished, self.fresh = state["epoch"] + 1, self._stopped(state["epoch"]), False
        self.log(
            f"{self.name}: resuming after epoch {state['epoch']} "
            f"(best {self.best['metric']:.4f} at {self.best['epoch']})"
        )
        return state

    def end_of_iteration(self, trainer) -> None:
        """PML ``end_of_iteration_hook``: logs the losses and the loss modules' recordable attributes."""
        if not dist_utils.is_main():
            return
        gi = trainer.get_global_iteration() + 1
        w = dist_utils.world_size()  # DistributedLossWrapper returns world_size x the loss (PML's convention)
        rk = self.ckpt.record_keeper
        rk.update_records({"loss_histories": {k: v / w for k, v in trainer.loss_tracker.losses.items()}}, gi)
        rk.update_records(
            {k: dist_utils.unwrap(v) for k, v in self.loss_funcs.items()}, gi, recursive_types=[torch.nn.Module]
        )

    def _validate(self, epoch: int) -> None:
        results = self.evaluate(epoch)
        acc = results["val"]
        if self.primary not in acc:
            raise ConfigError(
                f"{self.where}: primary metric {self.primary!r} is not computed; available: {', '.join(acc)}"
            )
        if dist_utils.is_main():
            for split, metrics in results.items():
                self.ckpt.record_keeper.update_records({f"accuracies_{split}": dict(metrics, epoch=epoch)}, epoch)
        improved = acc[self.primary] > self.best["metric"]
        if improved:
            metrics = {k: float(v) for k, v in acc.items()}
            self.best.update(metric=metrics[self.primary], epoch=epoch, metrics=metrics)
            if dist_utils.is_main():
                weights = {k: dist_utils.unwrap(m).state_dict() for k, m in self.models.items()}
                atomic_torch_save(weights, self.best_path)
        self.log(
            f"{self.name} epoch {epoch}{' (untrained)' if epoch == 0 else ''}: val {self.primary}="
            f"{acc[self.primary]:.4f}" + (" (best)" if improved else "")
        )

    def _commit(self, epoch: int, global_iteration: int, finished: bool) -> None:
        if dist_utils.is_main():
            best = {f"best_{k}": v for k, v in self.best.items()}  # best_metric, best_epoch, best_metrics
            state = training_state(epoch, global_iteration, self.models, self.optimizers, self.loss_funcs, **best)
            self.ckpt.commit(dict(state, finished=finished))
        dist_utils.barrier()

    def run(self, make_trainer: Callable[[], Any], new_sampler: Optional[Callable[[], Any]] = None) -> Dict[str, Any]:
        """Train the remaining epochs (``make_trainer()``, called only when there are some, with
        ``end_of_iteration_hook=loop.end_of_iteration``; a fresh ``new_sampler()`` each epoch); returns :attr:`best`."""
        errors.at(self.name, 0)
        if self.fresh:
            if self.check_untrained:
                self._validate(0)
            self._commit(0, 0, False)
            self.fresh = False
        if self.finished or self.start_epoch > self.num_epochs:
            return self.best
        trainer = make_trainer()
        self.trained = True
        for epoch in range(self.start_epoch, self.num_epochs + 1):
            errors.at(self.name, epoch)  # what an interrupt reports ("interrupted at fold 1, epoch 3")
            if new_sampler is not None:
                trainer.sampler = new_sampler()
            trainer.train(start_epoch=epoch, num_epochs=epoch)
            release_workers(trainer)
            if epoch % self.save_interval == 0 or epoch == self.num_epochs:
                self._validate(epoch)
            stop = self._stopped(epoch)
            self._commit(epoch, trainer.iterations_per_epoch * epoch, stop)
            if stop:
                break
        self.finished = True
        return self.best
