import json
import os
import pickle
import shutil
import tempfile
import unittest

import numpy as np
import torch
from pytorch_metric_learning import samplers
from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester

from pml_extensions.datasets import CachedFeatureDataset, FeatureCache, draw_view

from .cache_testing_utils import TinyImages, tiny_split, train_transform


class TestCachedFeatureDataset(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.mkdtemp()
        _, cls.prefix, cls.rest = tiny_split()
        cls.cache = FeatureCache(
            cls.folder,
            cls.prefix,
            TinyImages(n=9),
            train_transform(),
            num_views=4,
            dtype="float32",
            chunk_size=4,
            dataset_key="tiny",
        )
        cls.cache.build()
        cls.stored = np.load(os.path.join(cls.folder, "features.npy"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.folder, True)

    def _views(self, data):
        return [data.view_of(i) for i in range(len(data))]

    def test_items_are_the_drawn_views(self):
        data = CachedFeatureDataset(self.folder, seed=2)
        self.assertEqual((len(data), data.num_views, data.feature_shape), (9, 4, (4, 8, 8)))
        self.assertEqual(data.labels.tolist(), TinyImages(n=9).labels.tolist())
        data.set_epoch(3)
        for i in range(9):
            features, label = data[i]
            v = draw_view(2, 3, i, 4)
            self.assertEqual(features.dtype, torch.float32)
            self.assertTrue(np.array_equal(features.numpy(), self.stored[i, v]))
            self.assertEqual(label, int(data.labels[i]))
        self.assertEqual(CachedFeatureDataset(self.folder, dtype=torch.float64)[0][0].dtype, torch.float64)

    def test_draws_are_reproducible_resumable_and_differ_across_epochs(self):
        a, b = CachedFeatureDataset(self.folder, seed=1), CachedFeatureDataset(self.folder, seed=1)
        per_epoch = []
        for epoch in range(4):
            a.set_epoch(epoch)
            per_epoch.append(self._views(a))
        b.set_epoch(2)  # a resumed run jumps straight to its epoch
        self.assertEqual(self._views(b), per_epoch[2])
        self.assertEqual(len({tuple(v) for v in per_epoch}), 4)
        self.assertEqual(set(sum(per_epoch, [])), {0, 1, 2, 3})
        self.assertNotEqual(self._views(CachedFeatureDataset(self.folder, seed=2)), per_epoch[0])

    def test_pml_sampler_and_tester_use_it_unchanged(self):
        data = CachedFeatureDataset(self.folder, seed=0)
        sampler = samplers.MPerClassSampler(data.labels, m=2, length_before_new_iter=12)
        batch = next(iter(torch.utils.data.DataLoader(data, batch_size=6, sampler=sampler)))
        self.assertEqual(tuple(batch[0].shape), (6, 4, 8, 8))
        tester = GlobalEmbeddingSpaceTester(
            normalize_embeddings=False, dataloader_num_workers=0, accuracy_calculator=None
        )
        trunk = self.rest.eval()
        embeddings, labels = tester.get_all_embeddings(data, trunk, torch.nn.Identity())
        self.assertEqual(tuple(embeddings.shape), (9, 6))
        with torch.no_grad():
            expected = trunk(torch.stack([data[i][0] for i in range(9)]))
        torch.testing.assert_close(embeddings.cpu(), expected)
        self.assertEqual(labels.squeeze(1).tolist(), data.labels.tolist())

    def test_pickles_without_the_features(self):
        data = CachedFeatureDataset(self.folder, seed=1)
        _ = data[0]
        blob = pickle.dumps(data)
        self.assertLess(len(blob), self.stored.nbytes // 4)
        self.assertTrue(torch.equal(pickle.loads(blob)[5][0], data[5][0]))

    def test_errors(self):
        empty = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, empty, True)
        with self.assertRaisesRegex(FileNotFoundError, r"no feature cache in .* \(no meta.json\)"):
            CachedFeatureDataset(empty)
        with self.assertRaisesRegex(ValueError, "key differs"):
            CachedFeatureDataset(self.folder, key="0" * 64)
        with self.assertRaisesRegex(ValueError, "seed must be an int >= 0"):
            CachedFeatureDataset(self.folder, seed=-3)
        with self.assertRaisesRegex(ValueError, "dtype must be a floating torch dtype"):
            CachedFeatureDataset(self.folder, dtype=torch.int64)
        with open(os.path.join(empty, "meta.json"), "w") as f:
            json.dump({"format": "other/9"}, f)
        with self.assertRaisesRegex(ValueError, r"format 'other/9', expected 'pml_extensions.feature_cache/1'"):
            CachedFeatureDataset(empty)
