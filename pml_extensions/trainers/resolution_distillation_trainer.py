"""Teacher-student trainer for resolution-asymmetric distillation (RAML) on PML's ``MetricLossOnly``, and RAML's
teacher recipe with PML's own classes (docs/methods/resolution_distillation.md)."""

from typing import Dict, Optional

import torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.losses import TripletMarginLoss
from pytorch_metric_learning.miners import DistanceWeightedMiner
from pytorch_metric_learning.samplers import MPerClassSampler
from pytorch_metric_learning.trainers import MetricLossOnly
from pytorch_metric_learning.utils import common_functions as c_f

from ..datasets.coupled_augmentation_dataset import CoupledAugmentationDataset
from ..losses.resolution_distillation_loss import ResolutionDistillationLoss
from ..trunks.gem_pooling import GeMPooling
from ..utils.checks import is_int
from ._pinned_memory import _PinnedMemoryMixin, to_data_device


def gem_parameters(*modules: torch.nn.Module) -> list:
    """The exponents ``p`` of every trainable :class:`GeMPooling` inside ``modules``."""
    gems = [m for module in modules for m in module.modules() if isinstance(m, GeMPooling)]
    return [m.p for m in gems if isinstance(m.p, torch.nn.Parameter)]


def make_optimizers(
    trunk: torch.nn.Module,
    embedder: Optional[torch.nn.Module] = None,
    lr: float = 1.1e-4,
    weight_decay: float = 1e-6,
    gem_lr_multiplier: float = 10.0,
) -> Dict[str, torch.optim.Optimizer]:
    """RAML's optimisers ``{"trunk_optimizer", "embedder_optimizer" (when ``embedder`` has parameters)}``: AdamW (lr,
    weight_decay) with GeM p in its own group (lr × gem_lr_multiplier, no decay); frozen parameters left out. Defaults
    from the paper and its code.

    Raises:
        ValueError: on a non-positive lr or multiplier, negative weight decay, or no trainable parameter at all.
    """
    if not lr > 0 or not gem_lr_multiplier > 0 or not weight_decay >= 0:
        raise ValueError(
            f"need lr > 0, gem_lr_multiplier > 0, weight_decay >= 0; "
            f"got {lr!r}, {gem_lr_multiplier!r}, {weight_decay!r}"
        )
    gem = {id(p) for p in gem_parameters(*[m for m in (trunk, embedder) if m is not None])}
    optimizers = {}
    for name, model in (("trunk", trunk), ("embedder", embedder)):
        if model is None:
            continue
        params = [p for p in model.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if id(p) not in gem], "lr": lr, "weight_decay": weight_decay},
            {"params": [p for p in params if id(p) in gem], "lr": lr * gem_lr_multiplier, "weight_decay": 0.0},
        ]
        groups = [g for g in groups if g["params"]]
        if groups:
            optimizers[f"{name}_optimizer"] = torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    if not optimizers:
        raise ValueError("no trainable parameters in trunk/embedder")
    return optimizers


def set_batchnorm_eval(module: torch.nn.Module):
    """Put every BatchNorm layer of ``module`` in eval mode (running statistics frozen)."""
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()


class ResolutionDistillationTrainer(_PinnedMemoryMixin, MetricLossOnly):
    """Distil a small-resolution student (``trunk``/``embedder``) from a frozen teacher (``teacher_trunk``/
    ``teacher_embedder``) without labels, optionally beside a labelled metric loss.

    Source: Suma & Tolias, WACV 2023, Sec. 4-5; from ``pavelsuma/raml``: BatchNorm in eval mode (``train.py``), GeM p
    at 10× the learning rate without weight decay, weight decay 1e-6, ``OneCycleLR(div_factor=10)``
    (``modelhelpers.py``). Deviation: the teacher runs under ``torch.no_grad`` (the code builds a graph through it).

    ``models``: ``trunk`` and ``teacher_trunk`` (required), ``embedder``, ``teacher_embedder`` (default ``Identity``).
    ``loss_funcs``: ``distillation_loss`` (default ``ResolutionDistillationLoss()``) and optional ``metric_loss`` (a PML
    loss on the student embeddings and CLASS labels, mined by ``tuple_miner``; weights from ``loss_weights``).
    ``dataset``: a :class:`CoupledAugmentationDataset`, or anything whose ``collate_fn`` (default
    ``CoupledAugmentationDataset.collate``) yields ``((student_images, teacher_images, class_labels), image_ids)``.

    Per step: ``distillation_loss(student, image_ids, ref_emb=teacher)``, the teacher embedding the large images under
    ``torch.no_grad`` in eval mode (frozen, never zeroed or stepped). Fresh coupled augmentations on every pass:
    ``dataset.set_epoch(epoch)`` at each epoch and :meth:`start_new_pass` whenever the DataLoader runs out;
    ``new_pass_each_epoch=True`` also starts one every epoch, so an epoch's batches depend only on (seed, pass), as a
    resumed run needs (restore ``trainer.data_pass``). The DataLoader shuffles with a generator seeded by
    ``dataset.seed`` (else the global RNG, as PML). Without ``optimizers``/``lr_schedulers``: :func:`make_optimizers`
    and ``OneCycleLR(max_lr=group lr, div_factor)`` per optimiser, stepped every iteration of the ``train`` call.

    Keyword-only args: ``init_student_from_teacher`` (False: the ImageNet-init ablation), ``freeze_batchnorm`` (the
    student's BatchNorm in eval mode), ``new_pass_each_epoch``, ``lr`` (paper: 1.1e-4), ``weight_decay``,
    ``gem_lr_multiplier``, ``one_cycle_div_factor``; the rest as PML's trainers.

    Raises:
        ValueError: ``models`` without ``trunk``/``teacher_trunk`` modules; a student module that is (or shares
            parameters with) the teacher's; different architectures with ``init_student_from_teacher``; a
            ``subset_batch_miner`` (the batch holds two resolutions).
    """

    def __init__(
        self,
        models,
        optimizers=None,
        batch_size=8,
        loss_funcs=None,
        dataset=None,
        *args,
        init_student_from_teacher: bool = True,
        freeze_batchnorm: bool = True,
        new_pass_each_epoch: bool = False,
        lr: float = 1.1e-4,
        weight_decay: float = 1e-6,
        gem_lr_multiplier: float = 10.0,
        one_cycle_div_factor: float = 10.0,
        **kwargs,
    ):
        if not isinstance(models, dict) or not all(
            isinstance(models.get(k), torch.nn.Module) for k in ("trunk", "teacher_trunk")
        ):
            raise ValueError("models must be a dict with modules under 'trunk' (student) and 'teacher_trunk'")
        if loss_funcs is None:
            loss_funcs = {"distillation_loss": ResolutionDistillationLoss()}
        self.init_student_from_teacher = init_student_from_teacher
        self.freeze_batchnorm = freeze_batchnorm
        self.new_pass_each_epoch = bool(new_pass_each_epoch)
        self.data_pass = 0
        self.default_one_cycle = optimizers is None and kwargs.get("lr_schedulers") is None
        self.one_cycle_div_factor = one_cycle_div_factor
        if kwargs.get("collate_fn") is None:
            kwargs["collate_fn"] = CoupledAugmentationDataset.collate
        models.setdefault("teacher_embedder", torch.nn.Identity())
        models.setdefault("embedder", torch.nn.Identity())
        pairs = (("trunk", "teacher_trunk"), ("embedder", "teacher_embedder"))
        for student, teacher in pairs:
            s, t = models[student], models[teacher]
            if s is t and any(True for _ in s.parameters()):
                raise ValueError(
                    f"models[{student!r}] and models[{teacher!r}] are one object; the teacher is frozen, so pass the "
                    "student a copy (e.g. copy.deepcopy(teacher); init_student_from_teacher=True copies its weights)"
                )
            shared = {id(p) for p in s.parameters()} & {id(p) for p in t.parameters()}
            if s is not t and shared:
                raise ValueError(
                    f"models[{student!r}] and models[{teacher!r}] share {len(shared)} parameter tensor(s); the "
                    "teacher is frozen, so the student needs its own copy (e.g. copy.deepcopy(teacher))"
                )
        for student, teacher in pairs if init_student_from_teacher else ():
            try:
                models[student].load_state_dict(models[teacher].state_dict())
            except RuntimeError as e:
                raise ValueError(
                    f"cannot initialise the student's {student} from the teacher's (different architectures); "
                    f"pass init_student_from_teacher=False. {e}"
                ) from e
        for key in ("teacher_trunk", "teacher_embedder"):
            models[key].requires_grad_(False).eval()
        if optimizers is None:
            optimizers = make_optimizers(models["trunk"], models["embedder"], lr, weight_decay, gem_lr_multiplier)
        super().__init__(models, optimizers, batch_size, loss_funcs, dataset, *args, **kwargs)
        if "subset_batch_miner" in self.mining_funcs:
            raise ValueError("subset_batch_miner is not supported by ResolutionDistillationTrainer")

    def modify_schema(self):
        self.schema["models"].keys = ["trunk", "embedder", "teacher_trunk", "teacher_embedder"]
        self.schema["models"].essential = ["trunk", "teacher_trunk"]
        self.schema["models"].important = ["embedder"]
        self.schema["loss_funcs"].keys = ["distillation_loss", "metric_loss"]
        self.schema["loss_funcs"].essential = ["distillation_loss"]
        self.schema["loss_funcs"].important = []
        self.schema["optimizers"].important = ["trunk_optimizer"]

    def teacher_modules(self):
        return [self.models["teacher_trunk"], self.models["teacher_embedder"]]

    def set_to_train(self):
        super().set_to_train()
        epoch = getattr(self, "epoch", None)
        if epoch is not None and hasattr(self.dataset, "set_epoch"):
            # fresh coupled augmentations every epoch (workers pick it up when the iterator is re-created)
            self.dataset.set_epoch(epoch)
            if self.new_pass_each_epoch:
                self.start_new_pass()
        for m in self.teacher_modules():
            m.eval().requires_grad_(False)
        if self.freeze_batchnorm:
            set_batchnorm_eval(self.models["trunk"])
            set_batchnorm_eval(self.models["embedder"])

    def _select_pass(self):
        for obj in (self.dataset, self.sampler):
            if hasattr(obj, "set_pass"):
                obj.set_pass(self.data_pass)

    def start_new_pass(self):
        """Pass ``data_pass + 1``: fresh augmentation draws (and sampler order) and a new DataLoader iterator."""
        self.data_pass += 1
        self._select_pass()
        self.dataloader_iter = iter(self.dataloader)

    def get_batch(self):
        try:
            curr_batch = next(self.dataloader_iter)
        except StopIteration:
            self.start_new_pass()
            curr_batch = next(self.dataloader_iter)
        data, labels = self.data_and_label_getter(curr_batch)
        labels = c_f.process_label(labels, self.label_hierarchy_level, self.label_mapper)
        return self.maybe_do_batch_mining(data, labels)

    def zero_grad(self):
        for k, v in self.models.items():
            if not k.startswith("teacher_"):
                v.zero_grad()
        for v in self.optimizers.values():
            v.zero_grad()

    def compute_teacher_embeddings(self, data: torch.Tensor) -> torch.Tensor:
        """Teacher embeddings [N, D] of the large images, without autograd graph (no_grad, eval mode)."""
        teacher_trunk, teacher_embedder = self.teacher_modules()
        teacher_trunk.eval()
        teacher_embedder.eval()
        with torch.no_grad():
            return teacher_embedder(teacher_trunk(to_data_device(data, self.data_device, self.dtype)))

    def calculate_loss(self, curr_batch):
        data, image_ids = curr_batch
        if not isinstance(data, (tuple, list)) or len(data) != 3:
            raise ValueError(
                "a batch must be ((student_images, teacher_images, class_labels), image_ids); use "
                "CoupledAugmentationDataset.collate as collate_fn"
            )
        student_images, teacher_images, class_labels = data
        embeddings = self.compute_embeddings(student_images)
        teacher_embeddings = self.compute_teacher_embeddings(teacher_images)
        image_ids = c_f.to_device(image_ids, embeddings)
        self.losses["distillation_loss"] = self.loss_funcs["distillation_loss"](
            embeddings, image_ids, ref_emb=teacher_embeddings
        )
        if "metric_loss" in self.loss_funcs and self.loss_weights.get("metric_loss", 0) > 0:
            class_labels = c_f.to_device(class_labels, embeddings)
            indices_tuple = self.maybe_mine_embeddings(embeddings, class_labels)
            self.losses["metric_loss"] = self.loss_funcs["metric_loss"](embeddings, class_labels, indices_tuple)

    def train(self, start_epoch=1, num_epochs=1):
        self._num_epochs_to_run = num_epochs - start_epoch + 1
        return super().train(start_epoch=start_epoch, num_epochs=num_epochs)

    def initialize_dataloader(self):
        self._select_pass()
        if isinstance(self.sampler, torch.utils.data.BatchSampler):
            super().initialize_dataloader()
        else:  # PML's loader, but shuffling and base seed come from a private generator seeded by the dataset's seed
            seed = getattr(self.dataset, "seed", None)
            if seed is None:  # as PML: from the global RNG
                seed = int(torch.randint(2**31 - 1, ()).item())
            self.dataloader = torch.utils.data.DataLoader(
                self.dataset,
                batch_size=int(self.batch_size),
                sampler=self.sampler,
                drop_last=True,
                num_workers=self.dataloader_num_workers,
                collate_fn=self.collate_fn,
                shuffle=self.sampler is None,
                pin_memory=self._pins(),  # pinned host batches for a CUDA data device
                generator=torch.Generator().manual_seed(int(seed)),
            )
            if not self.iterations_per_epoch:
                self.iterations_per_epoch = len(self.dataloader)
            self.dataloader_iter = iter(self.dataloader)
        if self.default_one_cycle and not self.lr_schedulers:
            total = self.iterations_per_epoch * max(1, getattr(self, "_num_epochs_to_run", 1))
            for name, optimizer in self.optimizers.items():
                model = c_f.regex_replace("_optimizer$", "", name)
                self.lr_schedulers[f"{model}_scheduler_by_iteration"] = torch.optim.lr_scheduler.OneCycleLR(
                    optimizer,
                    max_lr=[g["lr"] for g in optimizer.param_groups],
                    total_steps=total,
                    div_factor=self.one_cycle_div_factor,
                )


def make_teacher_trainer(
    trunk: torch.nn.Module,
    embedder: torch.nn.Module,
    dataset,
    labels=None,
    lr: float = 1e-4,
    margin: float = 0.7,
    images_per_class: int = 4,
    classes_per_batch: int = 2,
    weight_decay: float = 1e-6,
    iterations_per_epoch: Optional[int] = None,
    data_device=None,
    dataloader_num_workers: int = 0,
    **kwargs,
) -> MetricLossOnly:
    """A PML ``MetricLossOnly`` configured as RAML's teacher recipe (not yet trained: call ``.train(1, epochs)``).

    Source: Suma & Tolias, WACV 2023, Sec. 5 ("Teacher networks are trained with triplet loss and distance weighted
    negative mining [Wu et al. 2017]"); margin 0.7 on squared L2, batches of 2 classes × 4 images, distances clamped at
    0.5 from ``pavelsuma/raml`` (``lib/cli.py``, ``lib/datasets/traindataset.py``). Deviation: PML's
    ``DistanceWeightedMiner`` draws one weighted negative per anchor-positive pair inside the batch (the code draws 4
    negatives per anchor from a 20k-image pool re-embedded every epoch); larger batches (``classes_per_batch``) make the
    pool larger.

    Loss ``TripletMarginLoss(margin, distance=LpDistance(power=2))`` (squared Euclidean on L2-normalised embeddings),
    miner ``DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)``, sampler ``MPerClassSampler(labels,
    m=images_per_class)`` with ``classes_per_batch × images_per_class`` images per batch, :func:`make_optimizers`.
    ``dataset`` yields ``(image tensor, class label)``; ``labels`` default to ``dataset.labels``; extra kwargs go to
    ``MetricLossOnly``. ValueError: no labels, or a size that is not positive.
    """
    if labels is None:
        labels = getattr(dataset, "labels", None)
    if labels is None:
        raise ValueError("labels are required (dataset has no .labels)")
    for name, v in (("images_per_class", images_per_class), ("classes_per_batch", classes_per_batch)):
        if not is_int(v) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    batch_size = images_per_class * classes_per_batch
    sampler = MPerClassSampler(labels, m=images_per_class, batch_size=batch_size, length_before_new_iter=len(labels))
    return MetricLossOnly(
        models={"trunk": trunk, "embedder": embedder},
        optimizers=make_optimizers(trunk, embedder, lr=lr, weight_decay=weight_decay),
        batch_size=batch_size,
        loss_funcs={"metric_loss": TripletMarginLoss(margin=margin, distance=LpDistance(power=2))},
        mining_funcs={"tuple_miner": DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)},
        dataset=dataset,
        sampler=sampler,
        iterations_per_epoch=iterations_per_epoch,
        data_device=data_device,
        dataloader_num_workers=dataloader_num_workers,
        **kwargs,
    )
