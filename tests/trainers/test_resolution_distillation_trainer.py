import os
import tempfile
import unittest

import numpy as np
import record_keeper
import torch
from PIL import Image
from pytorch_metric_learning.losses import TripletMarginLoss
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils.logging_presets import HookContainer

from pml_extensions.datasets.coupled_augmentation_dataset import CoupledAugmentationDataset
from pml_extensions.losses.resolution_distillation_loss import ResolutionDistillationLoss
from pml_extensions.testers.asymmetric_tester import AsymmetricTester
from pml_extensions.trainers.resolution_distillation_trainer import (
    ResolutionDistillationTrainer,
    make_optimizers,
)
from pml_extensions.trunks.retrieval_head import RetrievalHead

CPU = torch.device("cpu")


def backbone(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU())


def head(seed):
    torch.manual_seed(seed)
    return RetrievalHead(4, out_dim=8)


class Pictures(torch.utils.data.Dataset):
    def __init__(self, n=6):
        rng = np.random.default_rng(0)
        self.images = [Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)) for _ in range(n)]
        self.labels = np.arange(n) % 2

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])


def make(loss_funcs=False, **kw):
    teacher_trunk, teacher_embedder = backbone(0), head(0)
    # make the teacher's BN statistics non-trivial
    with torch.no_grad():
        teacher_trunk[1].running_mean.uniform_(-0.5, 0.5)
        teacher_trunk[1].running_var.uniform_(0.5, 1.5)
    models = {
        "trunk": backbone(1),
        "embedder": head(1),
        "teacher_trunk": teacher_trunk,
        "teacher_embedder": teacher_embedder,
    }
    dataset = CoupledAugmentationDataset(Pictures(), query_size=8, database_size=16, num_augmentations=3, seed=0)
    loss_funcs = loss_funcs if loss_funcs is not False else {"distillation_loss": ResolutionDistillationLoss()}
    args = dict(
        batch_size=2,
        dataset=dataset,
        data_device=CPU,
        dataloader_num_workers=0,
        iterations_per_epoch=2,
        lr=1e-2,
    )
    args.update(kw)
    return ResolutionDistillationTrainer(models, None, loss_funcs=loss_funcs, **args)


class TestResolutionDistillationTrainer(unittest.TestCase):
    def test_student_initialised_from_teacher(self):
        trainer = make()
        t = trainer.models["teacher_trunk"].state_dict()
        for k, v in trainer.models["trunk"].state_dict().items():
            self.assertTrue(torch.equal(v, t[k]), k)
        self.assertTrue(
            torch.equal(trainer.models["embedder"].whiten.weight, trainer.models["teacher_embedder"].whiten.weight)
        )
        trainer = make(init_student_from_teacher=False)
        self.assertFalse(torch.equal(trainer.models["trunk"][0].weight, trainer.models["teacher_trunk"][0].weight))

    def test_teacher_frozen_and_without_graph(self):
        trainer = make()
        teacher = [trainer.models["teacher_trunk"], trainer.models["teacher_embedder"]]
        before = [{k: v.clone() for k, v in m.state_dict().items()} for m in teacher]
        # a pre-existing .grad on a teacher parameter must survive the step untouched
        marker = torch.full_like(teacher[0][0].weight, 7.0)
        teacher[0][0].weight.grad = marker.clone()
        seen = []
        hooks = [
            m.register_forward_hook(
                lambda mod, i, o: seen.append((mod.training, torch.is_grad_enabled(), o.requires_grad))
            )
            for m in teacher
        ]
        student_before = trainer.models["trunk"][0].weight.clone()
        student_bn_mean = trainer.models["trunk"][1].running_mean.clone()
        bn_modes = []
        bn_hook = trainer.models["trunk"][1].register_forward_hook(lambda mod, i, o: bn_modes.append(mod.training))
        trainer.train(1, 1)
        for h in hooks + [bn_hook]:
            h.remove()
        for m, b in zip(teacher, before):
            for k, v in m.state_dict().items():
                self.assertTrue(torch.equal(v, b[k]), k)
            for p in m.parameters():
                self.assertFalse(p.requires_grad)
        self.assertTrue(torch.equal(teacher[0][0].weight.grad, marker))
        self.assertTrue(all(g is None for g in [p.grad for p in teacher[1].parameters()]))
        self.assertEqual(len(seen), 4)  # 2 iterations x (trunk, embedder)
        self.assertTrue(all(mode is False and grad is False and req is False for mode, grad, req in seen))
        # the student moved, its BatchNorm stayed in eval mode with frozen statistics
        self.assertFalse(torch.equal(trainer.models["trunk"][0].weight, student_before))
        self.assertEqual(bn_modes, [False, False])
        self.assertTrue(torch.equal(trainer.models["trunk"][1].running_mean, student_bn_mean))
        out = trainer.compute_teacher_embeddings(torch.rand(2, 3, 16, 16))
        self.assertFalse(out.requires_grad)
        self.assertIsNone(out.grad_fn)

    def test_gem_group_and_one_cycle(self):
        trunk, embedder = backbone(0), head(0)
        opts = make_optimizers(trunk, embedder, lr=1e-3, weight_decay=1e-6)
        groups = opts["embedder_optimizer"].param_groups
        self.assertIsInstance(opts["trunk_optimizer"], torch.optim.AdamW)
        self.assertEqual([(g["lr"], g["weight_decay"]) for g in groups], [(1e-3, 1e-6), (1e-2, 0.0)])
        self.assertIs(groups[1]["params"][0], embedder.pool.p)
        trainer = make(lr=1e-3)
        trainer.train(1, 2)
        self.assertEqual(trainer.dataset.epoch, 2)  # fresh augmentation draws per epoch
        schedulers = trainer.lr_schedulers
        self.assertEqual(set(schedulers), {"trunk_scheduler_by_iteration", "embedder_scheduler_by_iteration"})
        sched = schedulers["embedder_scheduler_by_iteration"]
        self.assertIsInstance(sched, torch.optim.lr_scheduler.OneCycleLR)
        self.assertEqual(sched.total_steps, 4)
        self.assertEqual([g["max_lr"] for g in sched.optimizer.param_groups], [1e-3, 1e-2])
        with self.assertRaisesRegex(ValueError, "lr > 0"):
            make_optimizers(trunk, embedder, lr=0)

    def test_optional_metric_loss_and_record_keeper(self):
        with tempfile.TemporaryDirectory() as tmp:
            rk = record_keeper.RecordKeeper(
                record_writer=record_keeper.RecordWriter(tmp),
                attributes_to_search_for=c_f.list_of_recordable_attributes_list_names(),
            )
            hooks = HookContainer(rk, primary_metric="mean_average_precision_at_r")
            loss_funcs = {
                "distillation_loss": ResolutionDistillationLoss(),
                "metric_loss": TripletMarginLoss(margin=0.1),
            }
            trainer = make(
                loss_funcs=loss_funcs,
                loss_weights={"distillation_loss": 1.0, "metric_loss": 0.5},
                end_of_iteration_hook=hooks.end_of_iteration_hook,
            )
            trainer.train(1, 1)
            rk.save_records()
            files = os.listdir(tmp)
            self.assertTrue(any("loss_histories" in f for f in files), files)
            content = open(os.path.join(tmp, [f for f in files if "loss_histories" in f][0])).read()
            self.assertIn("distillation_loss", content)
            self.assertIn("metric_loss", content)
            name = [f for f in files if "ResolutionDistillationLoss" in f]
            self.assertTrue(name, files)
            header = "".join(open(os.path.join(tmp, f)).readline() for f in name)
            for term in ("abs_loss", "rel_ts_loss", "rel_ss_loss", "lambda_ts"):
                self.assertIn(term, header)

    def test_bad_input(self):
        models = {
            "trunk": backbone(0),
            "embedder": head(0),
            "teacher_trunk": torch.nn.Conv2d(3, 5, 1),
            "teacher_embedder": head(0),
        }
        with self.assertRaisesRegex(ValueError, "different architectures"):
            ResolutionDistillationTrainer(
                models,
                None,
                2,
                {"distillation_loss": ResolutionDistillationLoss()},
                dataset=None,
                data_device=CPU,
            )
        trainer = make()
        with self.assertRaisesRegex(ValueError, "CoupledAugmentationDataset.collate"):
            trainer.calculate_loss((torch.rand(2, 3, 8, 8), torch.arange(2)))

    def test_the_student_must_not_be_the_teacher(self):
        # issue 22: the same module as trunk and teacher_trunk was refused with "no trainable parameters in
        # trunk/embedder" (freezing the teacher froze the student), which did not say that the two are one object
        trunk = backbone(0)
        with self.assertRaisesRegex(ValueError, r"^models\['trunk'\] and models\['teacher_trunk'\] are one object"):
            ResolutionDistillationTrainer({"trunk": trunk, "teacher_trunk": trunk}, None, dataset=None)
        self.assertTrue(all(p.requires_grad for p in trunk.parameters()))  # refused before freezing anything
        embedder = head(0)
        models = {
            "trunk": backbone(0),
            "teacher_trunk": backbone(1),
            "embedder": embedder,
            "teacher_embedder": embedder,
        }
        with self.assertRaisesRegex(ValueError, r"models\['embedder'\] and models\['teacher_embedder'\] are one"):
            ResolutionDistillationTrainer(models, None, dataset=None)
        # a teacher built around the student shares its 4 parameters (conv weight and bias, BN weight and bias)
        models = {"trunk": trunk, "teacher_trunk": torch.nn.Sequential(trunk, torch.nn.ReLU())}
        with self.assertRaisesRegex(ValueError, "share 4 parameter tensor"):
            ResolutionDistillationTrainer(models, None, dataset=None)
        # shared parameter-free modules are harmless
        identity = torch.nn.Identity()
        models = {
            "trunk": backbone(0),
            "teacher_trunk": backbone(1),
            "embedder": identity,
            "teacher_embedder": identity,
        }
        ResolutionDistillationTrainer(models, None, dataset=None, data_device=CPU)

    def test_missing_teacher_and_default_loss(self):
        with self.assertRaisesRegex(ValueError, "teacher_trunk"):
            ResolutionDistillationTrainer({"trunk": backbone(0)}, None, 2, None, dataset=None, data_device=CPU)
        trainer = make(loss_funcs=None)
        self.assertIsInstance(trainer.loss_funcs["distillation_loss"], ResolutionDistillationLoss)

    def test_hook_container_validates_asymmetric_setup(self):
        class Resized(torch.utils.data.Dataset):
            def __init__(self, size):
                self.base, self.size = Pictures(), size

            def __len__(self):
                return len(self.base)

            def __getitem__(self, i):
                img, label = self.base[i]
                x = torch.from_numpy(np.asarray(img.resize((self.size, self.size)), dtype=np.float32) / 255)
                return x.permute(2, 0, 1), label

        with tempfile.TemporaryDirectory() as tmp:
            rk = record_keeper.RecordKeeper(
                record_writer=record_keeper.RecordWriter(tmp),
                attributes_to_search_for=c_f.list_of_recordable_attributes_list_names(),
            )
            hooks = HookContainer(rk, primary_metric="mean_average_precision_at_r", validation_split_name="val")
            trainer = make()
            tester = AsymmetricTester(
                data_device=CPU,
                dataloader_num_workers=0,
                end_of_testing_hook=hooks.end_of_testing_hook,
                reference_trunk_model=trainer.models["teacher_trunk"],
                reference_embedder_model=trainer.models["teacher_embedder"],
                reference_dataset_dict={"val": Resized(16)},
            )
            trainer.end_of_epoch_hook = hooks.end_of_epoch_hook(tester, {"val": Resized(8)}, os.path.join(tmp, "m"))
            trainer.train(1, 1)
            best_epoch, best = hooks.get_best_epoch_and_accuracy(tester, "val")
            self.assertEqual(best_epoch, 1)
            self.assertAlmostEqual(best, tester.all_accuracies["val"]["mean_average_precision_at_r_level0"])
            self.assertIn("mean_average_precision_trapezoidal_level0", tester.all_accuracies["val"])


class RecordingCoupled(CoupledAugmentationDataset):
    """Remembers the (pass, index, crop boxes, λ) of every item it serves."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.served = []

    def __getitem__(self, index):
        image, _ = self.dataset[index]
        params = self.draw_params(index, *image.size)
        self.served.append(
            (self.data_pass, int(index), tuple((p["student"]["crop"], round(p["lam"], 8)) for p in params))
        )
        return super().__getitem__(index)


class TestFreshDrawsEveryPass(unittest.TestCase):
    def run_trainer(self, iterations, **kw):
        trainer = make(iterations_per_epoch=iterations, **kw)
        trainer.dataset = RecordingCoupled(Pictures(4), query_size=8, database_size=16, num_augmentations=3, seed=0)
        trainer.train(1, 1)
        return trainer

    def test_second_pass_draws_differ(self):
        # 4 images, batch 2, 6 iterations = three passes in ONE epoch (the case)
        trainer = self.run_trainer(6)
        served = trainer.dataset.served
        self.assertEqual(len(served), 12)
        self.assertEqual(sorted({p for p, _, _ in served}), [0, 1, 2])
        self.assertEqual(trainer.data_pass, 2)
        by_pass = {}
        for p, i, draws in served:
            by_pass.setdefault(i, {})[p] = draws
        for i, passes in by_pass.items():
            self.assertEqual(sorted(passes), [0, 1, 2], i)  # each image exactly once per pass
            self.assertNotEqual(passes[0], passes[1], i)
            self.assertNotEqual(passes[1], passes[2], i)

    def test_same_seed_same_stream_and_global_rng_untouched(self):
        trainer = make(iterations_per_epoch=6)
        trainer.dataset = RecordingCoupled(Pictures(4), query_size=8, database_size=16, num_augmentations=3, seed=0)
        torch.manual_seed(7)
        state = torch.get_rng_state()
        trainer.train(1, 1)  # shuffling and draws come from private generators
        self.assertTrue(torch.equal(state, torch.get_rng_state()))
        self.assertEqual(trainer.dataset.served, self.run_trainer(6).dataset.served)

    def test_new_pass_each_epoch(self):
        trainer = make(iterations_per_epoch=1, new_pass_each_epoch=True)
        trainer.dataset = RecordingCoupled(Pictures(4), query_size=8, database_size=16, num_augmentations=3, seed=0)
        trainer.train(1, 3)
        self.assertEqual(trainer.data_pass, 3)
        self.assertEqual([p for p, _, _ in trainer.dataset.served], [1, 1, 2, 2, 3, 3])
