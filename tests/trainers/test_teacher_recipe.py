import unittest

import numpy as np
import torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.losses import TripletMarginLoss
from pytorch_metric_learning.miners import DistanceWeightedMiner
from pytorch_metric_learning.trainers import MetricLossOnly

from pml_extensions.trainers.resolution_distillation_trainer import make_teacher_trainer
from pml_extensions.trunks.retrieval_head import RetrievalHead


class Blobs(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.labels = np.repeat(np.arange(4), 6)
        self.x = torch.rand(24, 3, 8, 8, generator=g) + torch.tensor(self.labels).view(24, 1, 1, 1).float()

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return self.x[i], int(self.labels[i])


class TestTeacherRecipe(unittest.TestCase):
    def test_recipe_uses_pml_classes_and_trains(self):
        torch.manual_seed(0)
        trunk = torch.nn.Conv2d(3, 6, 3, padding=1)
        embedder = RetrievalHead(6, out_dim=4)
        trainer = make_teacher_trainer(
            trunk, embedder, Blobs(), lr=1e-2, iterations_per_epoch=3, data_device=torch.device("cpu")
        )
        self.assertIsInstance(trainer, MetricLossOnly)
        loss = trainer.loss_funcs["metric_loss"]
        self.assertIsInstance(loss, TripletMarginLoss)
        self.assertEqual(loss.margin, 0.7)
        self.assertIsInstance(loss.distance, LpDistance)
        self.assertEqual(loss.distance.power, 2)
        miner = trainer.mining_funcs["tuple_miner"]
        self.assertIsInstance(miner, DistanceWeightedMiner)
        self.assertEqual((miner.cutoff, miner.nonzero_loss_cutoff), (0.5, 1.4))
        self.assertEqual(trainer.batch_size, 8)
        groups = trainer.optimizers["embedder_optimizer"].param_groups
        self.assertEqual(groups[1]["lr"], 0.1)  # GeM p at 10x
        before = trunk.weight.clone()
        trainer.train(1, 1)
        self.assertFalse(torch.equal(before, trunk.weight))

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "labels are required"):
            make_teacher_trainer(torch.nn.Conv2d(3, 6, 1), RetrievalHead(6, 4), [(torch.zeros(3, 4, 4), 0)])
        with self.assertRaisesRegex(ValueError, "images_per_class"):
            make_teacher_trainer(torch.nn.Conv2d(3, 6, 1), RetrievalHead(6, 4), Blobs(), images_per_class=0)
