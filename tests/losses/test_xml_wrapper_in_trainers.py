"""XMLWrapper + HistogramPooling inside PML's trainers, unchanged, with record-keeper logging."""

import csv
import glob
import os
import tempfile
import unittest

import numpy as np
import record_keeper
import torch
from pytorch_metric_learning import samplers
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import logging_presets

from pml_extensions import losses, trainers
from tests.testing_utils import tiny_trunk


class _TensorDataset(torch.utils.data.Dataset):
    def __init__(self, n=48, classes=6, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.labels = np.arange(n) % classes
        self.images = (
            torch.randn(n, 3, 8, 8, generator=g)
            + torch.as_tensor(self.labels, dtype=torch.float32)[:, None, None, None]
        )

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])


def _record_keeper(folder):
    writer = record_keeper.RecordWriter(
        folder=folder, global_db_path=os.path.join(folder, "db.sqlite"), experiment_name="t", is_new_experiment=True
    )
    return record_keeper.RecordKeeper(
        record_writer=writer, attributes_to_search_for=c_f.list_of_recordable_attributes_list_names()
    )


class TestXMLInTrainers(unittest.TestCase):
    def _models(self):
        trunk, pool = tiny_trunk(3, 8, 4)
        embedder = torch.nn.Linear(8, 4)
        opts = {
            "trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.1),
            "embedder_optimizer": torch.optim.SGD(embedder.parameters(), lr=0.1),
        }
        return trunk, pool, embedder, opts

    def test_metric_loss_only_trains_prototypes_and_logs_xml_loss(self):
        trunk, pool, embedder, opts = self._models()
        before = pool.prototype_conv.weight.detach().clone()
        dataset = _TensorDataset()
        loss = losses.XMLWrapper(losses.ContrastiveLoss(), xml_weight=1.0, histogram_layer=pool)
        with tempfile.TemporaryDirectory() as tmp:
            rk = _record_keeper(tmp)
            hooks = logging_presets.HookContainer(rk, log_freq=1)
            trainer = trainers.MetricLossOnly(
                models={"trunk": trunk, "embedder": embedder},
                optimizers=opts,
                batch_size=12,
                loss_funcs={"metric_loss": loss},
                dataset=dataset,
                iterations_per_epoch=3,
                sampler=samplers.MPerClassSampler(dataset.labels, m=2, batch_size=12, length_before_new_iter=36),
                data_device=torch.device("cpu"),
                end_of_iteration_hook=hooks.end_of_iteration_hook,
                dataloader_num_workers=0,
            )
            trainer.train(num_epochs=1)
            rk.save_records()
            files = glob.glob(os.path.join(tmp, "metric_loss_XMLWrapper.csv"))
            self.assertEqual(len(files), 1, os.listdir(tmp))
            with open(files[0]) as f:
                rows = list(csv.DictReader(f))
        self.assertEqual(len(rows), 3)
        self.assertTrue(all(float(r["xml_loss"]) > 0 for r in rows))
        self.assertIn("inner_loss", rows[0])
        self.assertFalse(torch.equal(before, pool.prototype_conv.weight))

    def test_train_with_classifier(self):
        trunk, pool, embedder, opts = self._models()
        classifier = torch.nn.Linear(4, 6)
        opts["classifier_optimizer"] = torch.optim.SGD(classifier.parameters(), lr=0.1)
        dataset = _TensorDataset()
        loss = losses.XMLWrapper(losses.MultiSimilarityLoss(), xml_weight=0.5, histogram_layer=pool)
        trainer = trainers.TrainWithClassifier(
            models={"trunk": trunk, "embedder": embedder, "classifier": classifier},
            optimizers=opts,
            batch_size=12,
            loss_funcs={"metric_loss": loss, "classifier_loss": torch.nn.CrossEntropyLoss()},
            loss_weights={"metric_loss": 1.0, "classifier_loss": 0.5},
            dataset=dataset,
            iterations_per_epoch=2,
            sampler=samplers.MPerClassSampler(dataset.labels, m=2, batch_size=12, length_before_new_iter=24),
            data_device=torch.device("cpu"),
            dataloader_num_workers=0,
        )
        trainer.train(num_epochs=1)
        self.assertTrue(np.isfinite(float(trainer.losses["total_loss"])))
        self.assertGreater(float(loss.xml_loss), 0)

    def test_plain_training_loop(self):
        trunk, pool, embedder, _ = self._models()
        dataset = _TensorDataset()
        loss = losses.XMLWrapper(losses.TripletMarginLoss(margin=0.2), xml_weight=0.5, histogram_layer=pool)
        params = list(trunk.parameters()) + list(embedder.parameters())
        opt = torch.optim.Adam(params, lr=1e-2)
        images, labels = dataset.images[:12], torch.as_tensor(dataset.labels[:12])
        values = []
        for _ in range(5):
            opt.zero_grad()
            out = loss(embedder(trunk(images)), labels)
            out.backward()
            opt.step()
            values.append(float(out))
        self.assertTrue(all(np.isfinite(values)))
        self.assertLess(values[-1], values[0])
