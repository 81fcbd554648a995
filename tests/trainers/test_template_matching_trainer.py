"""Tests for TemplateMatchingTrainer: L = (1 − λ)·main + λ·aux (paper Sec. 3.3, Eq. 3.1)."""

import unittest

import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning.utils import logging_presets
from record_keeper import RecordKeeper
from torchvision.models.resnet import BasicBlock

from pml_extensions.losses.patch_classification_loss import PatchClassificationLoss
from pml_extensions.trainers.template_matching_trainer import TemplateMatchingTrainer
from pml_extensions.trunks.template_matching_inserter import (
    insert_template_matching,
    template_matching_blocks,
)


class TinyResNet(torch.nn.Module):
    """ResNet-style: stem + layer1..layer4 of torchvision BasicBlocks (widths 4, 8, 8, 16), GAP -> [B, 16]."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
        self.layer1 = torch.nn.Sequential(BasicBlock(4, 4))

        def down(i, o):
            return torch.nn.Sequential(torch.nn.Conv2d(i, o, 1, stride=2), torch.nn.BatchNorm2d(o))

        self.layer2 = torch.nn.Sequential(BasicBlock(4, 8, stride=2, downsample=down(4, 8)))
        self.layer3 = torch.nn.Sequential(BasicBlock(8, 8))
        self.layer4 = torch.nn.Sequential(BasicBlock(8, 16, stride=2, downsample=down(8, 16)))

    def forward(self, x):
        x = self.layer4(self.layer3(self.layer2(self.layer1(self.stem(x)))))
        return x.mean(dim=(2, 3))


class FakeWriter:
    """Stands in for a tensorboard SummaryWriter: keeps the tags record-keeper writes."""

    def __init__(self):
        self.scalars = {}

    def add_scalar(self, tag, value, iteration):
        self.scalars.setdefault(tag, []).append(float(value))


def make_data(n=12, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = torch.arange(n) % classes
    return torch.utils.data.TensorDataset(x, y)


def make_trainer(aux_weight=0.5, metric=False, lr=0.0, hooks=None, **kw):
    trunk = insert_template_matching(TinyResNet(), num_classes=3)
    models = {"trunk": trunk}
    loss_funcs = {}
    if metric:
        models["embedder"] = torch.nn.Linear(16, 4)
        loss_funcs["metric_loss"] = pml_losses.ContrastiveLoss()
    else:
        models["classifier"] = torch.nn.Linear(16, 3)
        loss_funcs["classifier_loss"] = torch.nn.CrossEntropyLoss()
    optimizers = {f"{k}_optimizer": torch.optim.SGD(v.parameters(), lr=lr) for k, v in models.items()}
    trainer = TemplateMatchingTrainer(
        models=models,
        optimizers=optimizers,
        batch_size=12,
        loss_funcs=loss_funcs,
        dataset=make_data(),
        data_device=torch.device("cpu"),
        dataloader_num_workers=0,
        aux_weight=aux_weight,
        **(hooks or {}),
        **kw,
    )
    return trainer


class TestTemplateMatchingTrainer(unittest.TestCase):
    def test_total_is_convex_mix_with_classifier(self):
        trainer = make_trainer(aux_weight=0.5)
        self.assertEqual(trainer.loss_weights, {"classifier_loss": 0.5, "template_aux_loss": 0.5})
        trainer.train(num_epochs=1)  # one iteration: the whole 12-sample dataset is one batch, lr = 0
        # recompute by hand on the same batch (train mode; BN uses batch statistics, so the order does not
        # matter)
        data = make_data()
        x, y = data.tensors
        trunk, classifier = trainer.models["trunk"], trainer.models["classifier"]
        trunk.train()
        logits = classifier(trunk(x))
        main = torch.nn.functional.cross_entropy(logits, y)
        aux = PatchClassificationLoss()(template_matching_blocks(trunk)[0].last_class_scores, y)
        # re-run one iteration and read the tracker (train() zeroes the losses at the end of the epoch)
        trainer.forward_and_backward()
        got = trainer.loss_tracker.losses
        self.assertAlmostEqual(float(got["classifier_loss"]), 0.5 * float(main), places=5)
        self.assertAlmostEqual(float(got["template_aux_loss"]), 0.5 * float(aux), places=5)
        self.assertAlmostEqual(float(got["total_loss"]), 0.5 * float(main) + 0.5 * float(aux), places=5)

    def test_lambda_weights_and_user_weights(self):
        trainer = make_trainer(aux_weight=0.2, loss_weights={"classifier_loss": 2.0})
        self.assertAlmostEqual(trainer.loss_weights["classifier_loss"], 1.6)
        self.assertAlmostEqual(trainer.loss_weights["template_aux_loss"], 0.2)
        trainer = make_trainer(aux_weight=0.0)
        trainer.initialize_dataloader()
        trainer.epoch, trainer.iteration = 1, 0
        trainer.forward_and_backward()
        self.assertEqual(trainer.losses["template_aux_loss"], 0)
        self.assertEqual(trainer.losses["total_loss"].item(), trainer.losses["classifier_loss"].item())

    def test_metric_loss_dml_and_record_keeper(self):
        writer = FakeWriter()
        hooks = logging_presets.HookContainer(RecordKeeper(tensorboard_writer=writer), log_freq=1, save_models=False)
        trainer = make_trainer(metric=True, lr=0.01, hooks={"end_of_iteration_hook": hooks.end_of_iteration_hook})
        block = template_matching_blocks(trainer.models["trunk"])[0]
        before = block.classifier.weight.detach().clone()
        trainer.train(num_epochs=2)
        self.assertFalse(torch.equal(before, block.classifier.weight.detach()))
        for name in ("metric_loss", "template_aux_loss", "total_loss"):
            self.assertIn(f"loss_histories/{name}", writer.scalars)
            self.assertEqual(len(writer.scalars[f"loss_histories/{name}"]), 2)
        self.assertGreater(writer.scalars["loss_histories/template_aux_loss"][0], 0)

    def test_freeze_trunk_batchnorm_keeps_block_bn_training(self):
        for freeze_block, expected in ((False, True), (True, False)):
            trainer = make_trainer(freeze_trunk_batchnorm=True, freeze_block_batchnorm=freeze_block)
            trainer.set_to_train()
            trunk = trainer.models["trunk"]
            self.assertFalse(trunk.stem[1].training)  # the trunk's own BN is frozen
            self.assertEqual(template_matching_blocks(trunk)[0].mixer[0].training, expected)

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "aux_weight"):
            make_trainer(aux_weight=1.5)
        with self.assertRaisesRegex(ValueError, "metric_loss"):
            make_trainer(loss_weights={"metric_loss": 1.0})  # the classifier trainer has no metric loss
        with self.assertRaisesRegex(ValueError, "TemplateMatchingBlock"):
            TemplateMatchingTrainer(
                models={"trunk": TinyResNet()},
                optimizers={},
                batch_size=4,
                loss_funcs={"metric_loss": pml_losses.ContrastiveLoss()},
                dataset=make_data(),
                dataloader_num_workers=0,
            )
        # labels outside the block's training classes (metric loss: only the aux loss needs class indices)
        trainer = make_trainer(metric=True)
        bad = torch.utils.data.TensorDataset(torch.randn(12, 1, 8, 8), torch.tensor([0, 1, 2, 5] * 3))
        trainer.dataset = bad
        with self.assertRaisesRegex(ValueError, r"\[0, 3\)"):
            trainer.train(num_epochs=1)
