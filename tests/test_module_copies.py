"""Copies of trained modules (issue 22, item 3).

After a forward pass with gradients (and its backward), every trunk component, every loss and the state of each
trainer must survive ``copy.deepcopy``, ``pickle``, ``torch.save``/``torch.load`` of the whole object,
``torch.optim.swa_utils.AveragedModel`` (EMA/SWA) and a ``state_dict`` round trip into a freshly built twin. The
copy computes what the original computes; the tensors a module keeps from its last forward pass
(``HistogramPooling.last_histograms``/``last_pooled``, ``TemplateMatchingBlock.last_class_scores``/``last_mixing``)
are not part of a copy.

The class-level guard, :func:`graph_holders`, walks every submodule's attributes after the backward pass: a tensor
that carries an autograd graph (``grad_fn``) outside parameters and buffers must be declared in the class's
``_last_outputs`` (what ``pml_extensions.trunks._last_outputs`` leaves out of copies); an undeclared one would
break ``copy.deepcopy`` ("Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol").
"""

import copy
import io
import pickle
import unittest

import pytest
import torch
import torchvision
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners
from pytorch_metric_learning.trainers import MetricLossOnly
from torch.optim.swa_utils import AveragedModel

from pml_extensions import trunks
from pml_extensions.losses import PatchClassificationLoss, ResolutionDistillationLoss, XMLWrapper
from pml_extensions.utils import DistributedLossWrapper


def graph_holders(module):
    """``[(qualified name, attribute)]`` of the tensors with an autograd graph kept as plain attributes (also inside
    lists, tuples and dicts) of ``module`` and its submodules, except those its class declares in ``_last_outputs``."""
    found = []
    for name, m in module.named_modules():
        declared = set(getattr(type(m), "_last_outputs", ()))
        for attr, value in vars(m).items():
            if attr in ("_parameters", "_buffers", "_modules") or attr in declared:
                continue
            values = list(value.values()) if isinstance(value, dict) else value
            values = values if isinstance(values, (list, tuple)) else [values]
            if any(torch.is_tensor(v) and v.grad_fn is not None for v in values):
                found.append((name or type(m).__name__, attr))
    return found


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def cached_outputs(module):
    """``{qualified name.attribute: value}`` of the declared last outputs in ``module``."""
    return {
        f"{name}.{attr}": getattr(m, attr)
        for name, m in module.named_modules()
        for attr in getattr(type(m), "_last_outputs", ())
    }


def saved_and_loaded(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def through_a_file(state_dict):
    """``state_dict`` written with ``torch.save`` and read back with ``weights_only=True``, as a checkpoint is."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def load_state(twin, source):
    """``twin.load_state_dict`` of ``source``'s state dict through a file, plus the recordable attributes of each
    submodule, as ``runner.checkpoint`` restores them (PML keeps CrossBatchMemory's ``queue_idx`` out of its state
    dict)."""
    twin.load_state_dict(through_a_file(source.state_dict()))
    for (_, a), (_, b) in zip(source.named_modules(), twin.named_modules()):
        for attr in getattr(a, "_record_these", ()) or ():
            setattr(b, attr, copy.deepcopy(getattr(a, attr)))


COPIES = {
    "copy.deepcopy": copy.deepcopy,
    "pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
    "torch.save/torch.load": saved_and_loaded,
}


# name -> (build(seed) -> module, run(module) -> output): the run has gradients on; its output is backpropagated
def _trunk_case(build, shape):
    return build, lambda m: m(rand(*shape, seed=1).requires_grad_())


TRUNK_COMPONENTS = {
    "ConvNetBody": _trunk_case(lambda s: torch.manual_seed(s) and trunks.ConvNetBody(3, (4, 6), 1), (2, 3, 8, 8)),
    "GeMPooling": _trunk_case(lambda s: trunks.GeMPooling(p=2.0 + s), (2, 3, 4, 4)),
    "HistogramPooling": _trunk_case(lambda s: trunks.HistogramPooling(6, 4, seed=s), (2, 6, 4, 4)),
    "MarginAugmentedSoftmax": _trunk_case(lambda s: trunks.MarginAugmentedSoftmax(mu=0.5), (2, 3, 4, 4)),
    "PerturbedMaximizer": _trunk_case(lambda s: trunks.PerturbedMaximizer(num_samples=7, seed=s), (2, 3, 4, 4)),
    "RetrievalHead": _trunk_case(lambda s: torch.manual_seed(s) and trunks.RetrievalHead(6, 5), (2, 6, 4, 4)),
    "MobileNetV2Features": _trunk_case(
        lambda s: torch.manual_seed(s) and trunks.MobileNetV2Features(pretrained=False), (2, 3, 32, 32)
    ),
    "ResNet18 with a template-matching block": _trunk_case(
        lambda s: (
            torch.manual_seed(s)
            and trunks.template_matching_trunk(torchvision.models.resnet18(num_classes=4), num_classes=4)
        ),
        (2, 3, 32, 32),
    ),
    "soft-maximizer ResNet18 (perturbed)": _trunk_case(
        lambda s: (
            torch.manual_seed(s)
            and trunks.soft_maximizer_swap(
                torchvision.models.resnet18(num_classes=4), "perturbed", num_samples=5, seed=s
            )
        ),
        (2, 3, 32, 32),
    ),
    "XML trunk (Sequential with HistogramPooling)": _trunk_case(
        lambda s: (
            torch.manual_seed(s)
            and torch.nn.Sequential(torch.nn.Conv2d(3, 6, 1), trunks.HistogramPooling(6, 4, seed=s))
        ),
        (2, 3, 4, 4),
    ),
}
for _mixing in ("bn_relu", "softmax", "perturbed", "none"):
    for _combine in ("add", "concat"):
        TRUNK_COMPONENTS[f"TemplateMatchingBlock({_mixing}, {_combine})"] = _trunk_case(
            lambda s, m=_mixing, c=_combine: (
                torch.manual_seed(s) and trunks.TemplateMatchingBlock(6, 3, mixing=m, combine=c, num_samples=5, seed=s)
            ),
            (2, 6, 4, 4),
        )

LABELS = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
INNER_LOSSES = {
    "ContrastiveLoss": lambda s: pml_losses.ContrastiveLoss(pos_margin=0.0, neg_margin=1.0),
    "ProxyAnchorLoss": lambda s: torch.manual_seed(s) and pml_losses.ProxyAnchorLoss(4, 5, margin=0.1, alpha=32),
    "MultiSimilarityLoss": lambda s: pml_losses.MultiSimilarityLoss(),
    "TripletMarginLoss": lambda s: pml_losses.TripletMarginLoss(margin=0.1),
    "CrossBatchMemory(ContrastiveLoss)": lambda s: pml_losses.CrossBatchMemory(
        pml_losses.ContrastiveLoss(), 5, memory_size=16
    ),
}


class _XMLCase(torch.nn.Module):
    """A trunk, an embedder and an XMLWrapper attached to them, as a trainer holds them: one module to copy."""

    def __init__(self, inner, target, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.trunk = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 1), trunks.HistogramPooling(6, 4, seed=seed))
        self.embedder = torch.nn.Linear(6, 5)
        self.loss = XMLWrapper(inner, xml_weight=1.0, target=target, seed=seed).attach(self.trunk)
        if target == "pooled":
            self.loss.attach(self.trunk, self.embedder)

    def forward(self, images, labels):
        return self.loss(self.embedder(self.trunk(images)), labels)


LOSSES = {
    "PatchClassificationLoss": (
        lambda s: PatchClassificationLoss(),
        lambda m: m(rand(2, 3, 4, 4, seed=1).requires_grad_(), torch.tensor([0, 2])),
    ),
    "ResolutionDistillationLoss": (
        lambda s: ResolutionDistillationLoss(),
        lambda m: m(rand(6, 5, seed=1).requires_grad_(), torch.tensor([0, 0, 0, 1, 1, 1]), ref_emb=rand(6, 5, seed=2)),
    ),
    "DistributedLossWrapper(XMLWrapper)": (
        lambda s: _XMLCase(DistributedLossWrapper(pml_losses.ContrastiveLoss()), "embeddings", s),
        lambda m: m(rand(8, 3, 4, 4, seed=1), LABELS),
    ),
}
for _name, _inner in INNER_LOSSES.items():
    for _target in ("embeddings", "pooled"):
        LOSSES[f"XMLWrapper({_name}, target={_target})"] = (
            lambda s, i=_inner, t=_target: _XMLCase(i(s), t, s),
            lambda m: m(rand(8, 3, 4, 4, seed=1), LABELS),
        )


def _trained(build, run, seed=0):
    module = build(seed)
    out = run(module)
    out.sum().backward()
    return module


class CopyChecks(unittest.TestCase):
    def assert_same_state(self, a, b):
        sa, sb = a.state_dict(), b.state_dict()
        self.assertEqual(list(sa), list(sb))
        for key in sa:
            self.assertTrue(torch.equal(sa[key], sb[key]), key)
            if sa[key].numel():
                self.assertNotEqual(sa[key].data_ptr(), sb[key].data_ptr(), f"{key} is shared, not copied")

    def assert_copies(self, name, build, run):
        module = _trained(build, run)
        self.assertEqual(graph_holders(module), [], f"{name} keeps tensors with a graph outside _last_outputs")
        for how, copier in COPIES.items():
            with self.subTest(module=name, copy=how):
                twin = copier(module)
                self.assert_same_state(module, twin)
                for key, value in cached_outputs(twin).items():
                    self.assertIsNone(value, f"{key} was copied")
                # the original keeps its cache (a loss may still read it)
                for key, value in cached_outputs(module).items():
                    if key.endswith(("last_histograms", "last_class_scores")):
                        self.assertIsNotNone(value, f"{key} was dropped from the original")
                self.assert_same_output(twin, build, run)
        with self.subTest(module=name, copy="AveragedModel"):
            averaged = AveragedModel(module)
            averaged.update_parameters(module)
            self.assertEqual(int(averaged.n_averaged), 1)
            self.assert_same_state(module, averaged.module)
        with self.subTest(module=name, copy="state_dict round trip"):
            twin = build(1)  # other initial weights
            load_state(twin, module)
            self.assert_same_state(module, twin)
            self.assert_same_output(twin, build, run)

    def assert_same_output(self, twin, build, run):
        """``twin`` computes what a module built and trained the same way (a fresh reference, so no pass of the
        checks before changes its running statistics, memory or queue position) computes."""
        reference = _trained(build, run)
        for m in (reference, twin):  # the perturbed maximizers and the class split draw from private generators
            for sub in m.modules():
                if isinstance(sub, trunks.PerturbedMaximizer):
                    sub.reset_generator(0)
                if isinstance(sub, XMLWrapper):
                    sub.generator.manual_seed(0)
        with torch.no_grad():
            torch.testing.assert_close(run(twin), run(reference), rtol=0, atol=0)


class TestTrunkComponentCopies(CopyChecks):
    @pytest.mark.slow  # over 3 s on 2 cores: tox runs it, -m 'not slow' leaves it out
    def test_every_component(self):
        for name, (build, run) in TRUNK_COMPONENTS.items():
            self.assert_copies(name, build, run)


class TestLossCopies(CopyChecks):
    def test_every_loss(self):
        for name, (build, run) in LOSSES.items():
            self.assert_copies(name, build, run)

    def test_a_copy_of_the_whole_setup_keeps_the_loss_on_the_copied_trunk(self):
        # XMLWrapper reads the trunk's HistogramPooling (and, for target="pooled", the embedder) without owning
        # them: copied together, the copied loss reads the copied trunk
        for target in ("embeddings", "pooled"):
            build, run = LOSSES[f"XMLWrapper(ContrastiveLoss, target={target})"]
            case = _trained(build, run)
            for how, copier in COPIES.items():
                with self.subTest(target=target, copy=how):
                    twin = copier(case)
                    self.assertIs(twin.loss.histogram_layer, twin.trunk[1])
                    if target == "pooled":
                        self.assertIs(twin.loss.head[-1], twin.embedder)
                    self.assertIsNone(twin.trunk[1].last_histograms)
                    self.assert_same_output(twin, build, run)


def one_step(trainer, batch):
    """PML's forward_and_backward on a given batch, then the per-iteration schedulers."""
    trainer.zero_losses()
    trainer.zero_grad()
    trainer.update_loss_weights()
    trainer.calculate_loss(batch)
    trainer.loss_tracker.update(trainer.loss_weights)
    trainer.backward()
    trainer.clip_gradients()
    trainer.step_optimizers()
    trainer.step_lr_schedulers(end_of_epoch=False)


def trainer_state(trainer):
    """What a checkpoint of a PML trainer holds."""
    return {k: getattr(trainer, k) for k in ("models", "loss_funcs", "optimizers", "lr_schedulers")}


def template_matching_trainer(seed):
    from tests.trainers.test_template_matching_trainer import make_trainer

    torch.manual_seed(seed)
    trainer = make_trainer(metric=True, lr=0.1, mining_funcs={"tuple_miner": pml_miners.MultiSimilarityMiner()})
    batch = (rand(6, 1, 8, 8, seed=5), torch.tensor([0, 0, 1, 1, 2, 2]))
    return trainer, batch


def resolution_distillation_trainer(seed):
    from tests.trainers.test_resolution_distillation_trainer import make

    trainer = make(iterations_per_epoch=3)
    trainer.initialize_dataloader()  # builds the default one-cycle schedulers
    batch = ((rand(6, 3, 8, 8, seed=5), rand(6, 3, 16, 16, seed=6), torch.tensor([0, 0, 0, 1, 1, 1])),)
    return trainer, batch + (torch.tensor([0, 0, 0, 1, 1, 1]),)


def xml_trainer(seed):
    torch.manual_seed(seed)
    trunk = torch.nn.Sequential(trunks.ConvNetBody(3, (6,), 1), trunks.HistogramPooling(6, 4, seed=seed))
    embedder = torch.nn.Linear(6, 5)
    loss = XMLWrapper(pml_losses.ProxyAnchorLoss(4, 5), xml_weight=1.0, target="pooled", seed=seed).attach(trunk)
    loss.attach(trunk, embedder)
    models = {"trunk": trunk, "embedder": embedder}
    params = [*trunk.parameters(), *embedder.parameters(), *loss.parameters()]
    optimizers = {"trunk_optimizer": torch.optim.Adam(params, lr=0.01)}
    schedulers = {"trunk_scheduler_by_iteration": torch.optim.lr_scheduler.StepLR(optimizers["trunk_optimizer"], 1)}
    trainer = MetricLossOnly(
        models=models,
        optimizers=optimizers,
        batch_size=8,
        loss_funcs={"metric_loss": loss},
        dataset=None,
        lr_schedulers=schedulers,
        data_device=torch.device("cpu"),
    )
    return trainer, (rand(8, 3, 8, 8, seed=5), LABELS)


TRAINERS = {
    "TemplateMatchingTrainer": template_matching_trainer,
    "ResolutionDistillationTrainer": resolution_distillation_trainer,
    "MetricLossOnly with XMLWrapper(ProxyAnchorLoss)": xml_trainer,
}


class TestTrainerStateCopies(unittest.TestCase):
    """After one training step: the trainer's models, losses, optimizers and schedulers copy, and their state
    dicts, loaded into a freshly built trainer, make the next step identical."""

    def test_every_trainer(self):
        for name, make in TRAINERS.items():
            trainer, batch = make(0)
            one_step(trainer, batch)
            state = trainer_state(trainer)
            for key in ("models", "loss_funcs"):
                for part, module in state[key].items():
                    self.assertEqual(graph_holders(module), [], f"{name}: {key}[{part}]")
            for how, copier in COPIES.items():
                with self.subTest(trainer=name, copy=how):
                    twin = copier(state)
                    for part, module in state["models"].items():
                        torch.testing.assert_close(twin["models"][part].state_dict(), module.state_dict())
                        for key, value in cached_outputs(twin["models"][part]).items():
                            self.assertIsNone(value, f"{part}.{key} was copied")
                    for part, optimizer in state["optimizers"].items():
                        self.assertEqual(len(twin["optimizers"][part].state), len(optimizer.state))
            with self.subTest(trainer=name, copy="AveragedModel"):
                AveragedModel(trainer.models["trunk"]).update_parameters(trainer.models["trunk"])
            with self.subTest(trainer=name, copy="state_dict round trip"):
                fresh, _ = make(1)
                for key in ("models", "loss_funcs"):
                    for part, obj in getattr(trainer, key).items():
                        load_state(getattr(fresh, key)[part], obj)
                for key in ("optimizers", "lr_schedulers"):
                    for part, obj in getattr(trainer, key).items():
                        getattr(fresh, key)[part].load_state_dict(through_a_file(obj.state_dict()))
                if isinstance(trainer, type(fresh)) and hasattr(trainer, "data_pass"):
                    fresh.data_pass = trainer.data_pass
                for t in (trainer, fresh):
                    for loss in t.loss_funcs.values():
                        for sub in loss.modules():
                            if isinstance(sub, XMLWrapper):
                                sub.generator.manual_seed(3)
                one_step(trainer, batch)
                one_step(fresh, batch)
                for part, module in trainer.models.items():
                    torch.testing.assert_close(fresh.models[part].state_dict(), module.state_dict(), rtol=0, atol=0)
                for part, scheduler in trainer.lr_schedulers.items():
                    self.assertEqual(fresh.lr_schedulers[part].get_last_lr(), scheduler.get_last_lr())


if __name__ == "__main__":
    unittest.main()
