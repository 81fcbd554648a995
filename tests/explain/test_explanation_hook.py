import gc
import os
import tempfile
import unittest
from unittest import mock

import numpy as np
import pytest
import record_keeper
import torch
from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.utils.logging_presets import HookContainer

from pml_extensions.explain import overlay
from pml_extensions.explain.explanation_hook import ExplanationHook, dataset_class_names
from tests.explain.explain_testing_utils import hook_count, make_model, rss_bytes, training_flags


def empty_file(fig, path, **kwargs):
    """Stands in for ``overlay.atomic_savefig`` where figure files are counted, not read: no PNG is encoded."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    open(path, "wb").close()


class TinySet(torch.utils.data.Dataset):
    """8 images [3, 20, 24] of 2 classes with a bright square whose box is known."""

    def __init__(self, as_pil=False):
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(8, 3, 20, 24, generator=g, dtype=torch.float64) * 0.2
        self.boxes = np.zeros((8, 4), dtype=np.int64)
        for n in range(8):
            y, x = 2 + n, 3 + 2 * n % 10
            self.images[n, :, y : y + 8, x : x + 10] += 1.0
            self.boxes[n] = (x, y, x + 10, y + 8)
        self.labels = np.array([0, 1] * 4)
        self.as_pil = as_pil

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if self.as_pil:
            return "not a tensor", int(self.labels[i])
        return self.images[i], int(self.labels[i])


class FakeTester:
    def __init__(self, embeddings, labels, epoch=3):
        self.embeddings_and_labels = {"val": (embeddings, labels)}
        self.all_accuracies = {"val": {"epoch": epoch}}


class TestExplanationHook(unittest.TestCase):
    def setUp(self):
        self.trunk, self.emb = make_model("gap", size=(20, 24))
        self.ds = TinySet()
        with torch.no_grad():
            self.embeddings = self.emb.eval()(self.trunk.eval()(self.ds.images))
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def test_with_pml_tester_and_hook_container(self):
        writer = record_keeper.RecordWriter(folder=os.path.join(self.tmp.name, "logs"))
        keeper = record_keeper.RecordKeeper(record_writer=writer)
        container = HookContainer(keeper, primary_metric="precision_at_1", validation_split_name="val")
        out = os.path.join(self.tmp.name, "maps")
        hook = ExplanationHook(
            self.trunk,
            self.emb,
            {"val": self.ds},
            out,
            hook_container=container,
            n_queries=2,
            k=2,
            mean=None,
            std=None,
        )
        tester = GlobalEmbeddingSpaceTester(
            end_of_testing_hook=hook,
            dataloader_num_workers=0,
            batch_size=8,
            accuracy_calculator=AccuracyCalculator(include=("precision_at_1",), k=2),
        )
        self.trunk.train()
        with mock.patch.object(overlay, "atomic_savefig", empty_file):
            tester.test({"val": self.ds}, 1, self.trunk, self.emb)  # the PNGs' files are counted, not read
        files = sorted(os.listdir(out))
        self.assertEqual(len([f for f in files if f.endswith(".png")]), 2)
        self.assertEqual(len([f for f in files if f.endswith(".pt")]), 2)
        saved = torch.load(os.path.join(out, [f for f in files if f.endswith(".pt")][0]))
        self.assertEqual(tuple(saved["decomposition_query"].shape), (2, 20, 24))
        self.assertEqual(tuple(saved["point_specific"].shape), (2, 20, 24))
        records = writer.records
        group = [g for g in records if "explanations_val" in g]
        self.assertTrue(group, f"no explanations group in {list(records)}")
        self.assertIn("localization_accuracy", records[group[0]])
        self.assertTrue(any("precision_at_1" in series for g in records.values() for series in g))  # accuracies kept
        self.assertEqual(hook_count(self.trunk, self.emb), 0)

    def test_localization_uses_dataset_boxes(self):
        hook = ExplanationHook(
            self.trunk,
            self.emb,
            {"val": self.ds},
            self.tmp.name,
            n_queries=8,
            k=1,
            save_png=False,
            save_tensors=False,
        )
        res = hook.explain(FakeTester(self.embeddings, torch.tensor(self.ds.labels)))
        self.assertIn("localization_accuracy", res)
        self.assertTrue(0.0 <= res["localization_accuracy"] <= 1.0)

    @pytest.mark.slow  # over 3 s on 2 cores: tox runs it, -m 'not slow' leaves it out
    def test_figures_mark_same_and_other_class_with_true_rank_and_cosine(self):
        # issue 23 item 3: each neighbour is marked with the tester's labels; titles carry the rank and the cosine
        titles = {}

        def record(fig, path, **kwargs):  # the titles only: no assertion reads the PNG, so none is encoded
            titles[os.path.basename(path)] = [ax.get_title() for ax in fig.axes if ax.get_label() != "<colorbar>"]

        hook = ExplanationHook(
            self.trunk, self.emb, {"val": self.ds}, self.tmp.name, n_queries=3, k=3, save_tensors=False, mean=None
        )
        labels = torch.tensor(self.ds.labels)[:, None]  # PML testers give [N, 1] labels
        with mock.patch.object(overlay, "atomic_savefig", record):
            hook.explain(FakeTester(self.embeddings, labels))
        queries = hook.last_maps["query_indices"].tolist()
        self.assertEqual(len(titles), 3)
        marks = set()
        for n, q in enumerate(queries):
            row_titles = titles[f"val_epoch3_query{q}.png"]
            cols = len(row_titles) // 3  # 3 rows: query, retrieved, the maps
            self.assertEqual(row_titles[0], f"query\nclass {self.ds.labels[q]}")
            cosines = overlay.format_cosines(hook.last_maps["similarity"][n].tolist())
            for m, j in enumerate(hook.last_maps["reference_indices"][n].tolist()):
                same = self.ds.labels[j] == self.ds.labels[q]
                expected = (
                    f"rank {m + 1} · cos {cosines[m]}\nclass {self.ds.labels[j]} · {'same' if same else 'other'} class"
                )
                self.assertEqual(row_titles[m * cols + 1], expected)
                marks.add(same)
        self.assertEqual(marks, {True, False})  # both marks occur in this test

    def test_hooks_gone_after_exception_and_errors(self):
        flags = training_flags(self.trunk, self.emb)
        hook = ExplanationHook(self.trunk, self.emb, {"val": TinySet(as_pil=True)}, self.tmp.name, k=2)
        with self.assertRaisesRegex(ValueError, "image tensors"):
            hook(FakeTester(self.embeddings, torch.tensor(self.ds.labels)))
        self.assertEqual(hook_count(self.trunk, self.emb), 0)
        self.assertEqual(training_flags(self.trunk, self.emb), flags)
        big_k = ExplanationHook(self.trunk, self.emb, {"val": self.ds}, self.tmp.name, k=8)
        with self.assertRaisesRegex(ValueError, "larger than the reference set"):
            big_k(FakeTester(self.embeddings, torch.tensor(self.ds.labels)))
        with self.assertRaisesRegex(ValueError, "split"):
            ExplanationHook(self.trunk, self.emb, {"val": self.ds}, self.tmp.name, split_name="test")(
                FakeTester(self.embeddings, torch.tensor(self.ds.labels))
            )
        with self.assertRaisesRegex(ValueError, "k must"):
            ExplanationHook(self.trunk, self.emb, {"val": self.ds}, self.tmp.name, k=0)
        self.assertEqual(hook_count(self.trunk, self.emb), 0)

    @pytest.mark.slow  # over 3 s on 2 cores: tox runs it, -m 'not slow' leaves it out
    def test_no_memory_growth_over_200_calls(self):
        hook = ExplanationHook(self.trunk, self.emb, {"val": self.ds}, self.tmp.name, n_queries=1, k=2, save_png=False)
        tester = FakeTester(self.embeddings, torch.tensor(self.ds.labels))
        for _ in range(20):
            hook(tester)
        gc.collect()
        before = rss_bytes()
        for _ in range(200):
            hook(tester)
        gc.collect()
        grown = rss_bytes() - before
        self.assertLess(grown, 16 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 200 calls")
        self.assertEqual(hook_count(self.trunk, self.emb), 0)


if __name__ == "__main__":
    unittest.main()


def test_class_names_and_the_tested_epoch_name_the_figures(tmp_path):
    """A model tested after training is called with epoch 0: ``epoch`` names the files after the selected one; the
    dataset's ``classes`` (a wrapper's too) name the classes as written."""
    trunk, emb = make_model("gap", size=(20, 24))
    ds = TinySet()
    ds.classes = ["T-Shirts / Tops", "Mützen"]
    wrapped = type(
        "Wrapped", (torch.utils.data.Dataset,), {"__len__": lambda s: 8, "__getitem__": lambda s, i: ds[i]}
    )()
    wrapped.dataset = ds
    with torch.no_grad():
        embeddings = emb.eval()(trunk.eval()(ds.images))
    titles = {}

    def record(fig, path, **kwargs):  # the titles only: no assertion reads the PNG, so none is encoded
        titles[os.path.basename(path)] = [ax.get_title() for ax in fig.axes if ax.get_label() != "<colorbar>"]

    hook = ExplanationHook(trunk, emb, {"val": wrapped}, str(tmp_path), n_queries=1, k=1, save_tensors=False, epoch=7)
    with mock.patch.object(overlay, "atomic_savefig", record):
        hook.explain(FakeTester(embeddings, torch.tensor(ds.labels)[:, None], epoch=0))
    (name,) = titles
    q = int(hook.last_maps["query_indices"][0])
    j = int(hook.last_maps["reference_indices"][0, 0])
    assert name == f"val_epoch7_query{q}.png"
    assert titles[name][0] == f"query\nclass {ds.classes[ds.labels[q]]}"
    assert f"class {ds.classes[ds.labels[j]]} · " in titles[name][1]
    named = ExplanationHook(trunk, emb, {"val": ds}, str(tmp_path), class_names=["a", "b"], save_tensors=False)
    assert named._names("val") == ["a", "b"]


def test_dataset_class_names_reads_a_wrapped_dataset():
    wrapper = type("Wrapper", (), {"dataset": type("Data", (), {"classes": ["T-Shirts / Tops", "Mützen"]})()})()
    assert dataset_class_names(wrapper) == ["T-Shirts / Tops", "Mützen"]
