"""runner/protocols/paired/unit.py: one (variant, seed) unit: pairing by seed, selection on validation."""

import tempfile
import unittest
from unittest import mock

import pytest
import torch

from pml_extensions.cli.job import load_job_config
from pml_extensions.runner.protocols.paired import unit as train


def tiny_config(**overrides):
    cfg, _ = load_job_config(["--num_epochs", "1", "--iterations_per_epoch", "2", "--seeds", "0"])
    cfg.update(overrides)
    return cfg


def variant(cfg, name):
    from pml_extensions.runner.config.loader import variant_configs

    return variant_configs(cfg)[name]


class TestPairing(unittest.TestCase):
    def capture_step0(self, vcfg, seed):
        """Train 1 epoch x 2 iterations and record, at the first get_batch (step 0, before any update), the batch and
        the weights of the trunk body, the histogram layer (if any) and the embedder."""
        from pml_extensions.trainers import MetricLossOnly

        seen = {}
        original = MetricLossOnly.get_batch

        def get_batch(trainer):
            batch = original(trainer)
            if not seen:
                trunk = trainer.models["trunk"]
                seen["body"] = {k: v.clone() for k, v in trunk[0].state_dict().items()}
                seen["embedder"] = {k: v.clone() for k, v in trainer.models["embedder"].state_dict().items()}
                seen["trunk"] = {k: v.clone() for k, v in trunk.state_dict().items()}
                seen["data"], seen["labels"] = batch[0].clone(), batch[1].clone()
            return batch

        with tempfile.TemporaryDirectory() as d, mock.patch.object(MetricLossOnly, "get_batch", get_batch):
            train.train_and_select("v", vcfg, seed, d, torch.device("cpu"), log=lambda *a: None)
        return seen

    def assert_same(self, a, b):
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            self.assertTrue(torch.equal(a[k], b[k]), k)

    @pytest.mark.slow  # over 3 s on 2 cores: tox runs it, -m 'not slow' leaves it out
    def test_shared_weights_and_batches_identical_at_step0(self):
        cfg = tiny_config()
        gap = self.capture_step0(variant(cfg, "contrastive_gap"), 0)
        xml = self.capture_step0(variant(cfg, "contrastive_xml"), 0)
        control = self.capture_step0(variant(cfg, "contrastive_xml_lambda0"), 0)
        for other in (xml, control):
            self.assert_same(gap["body"], other["body"])
            self.assert_same(gap["embedder"], other["embedder"])
            self.assertTrue(torch.equal(gap["labels"], other["labels"]))
            self.assertTrue(torch.equal(gap["data"], other["data"]))  # same augmentation draws too
        self.assert_same(xml["trunk"], control["trunk"])  # the control has the same prototypes as well
        # another seed changes the start (the test can fail)
        xml1 = self.capture_step0(variant(cfg, "contrastive_xml"), 1)
        self.assertFalse(torch.equal(xml["embedder"]["weight"], xml1["embedder"]["weight"]))

    def test_proxy_anchor_variants_share_proxies(self):
        cfg = tiny_config()
        a = train.build_models(variant(cfg, "proxy_anchor_gap"), 0, torch.device("cpu"))
        b = train.build_models({**variant(cfg, "proxy_anchor_xml"), "prototype_init": None}, 0, torch.device("cpu"))
        self.assertTrue(
            torch.equal(a["loss_funcs"]["metric_loss"].proxies, b["loss_funcs"]["metric_loss"].loss.proxies)
        )


class TestSelection(unittest.TestCase):
    def test_selection_never_reads_the_test_split(self):
        import pml_extensions.datasets as datasets

        real = datasets.get_dataset

        def guarded(name, split="train", *a, **k):
            if split == "test":
                raise AssertionError("the test split was read during training/selection")
            return real(name, split, *a, **k)

        cfg = variant(tiny_config(), "contrastive_xml")
        with tempfile.TemporaryDirectory() as d, mock.patch.object(datasets, "get_dataset", guarded):
            r = train.train_and_select("v", cfg, 0, d, torch.device("cpu"), log=lambda *a: None)
        self.assertEqual([h["epoch"] for h in r["history"]], [0, 1])
        self.assertIn(r["best_epoch"], (0, 1))
        # the guard is effective: evaluate() does read the test split
        with mock.patch.object(datasets, "get_dataset", guarded), self.assertRaisesRegex(AssertionError, "test split"):
            train.evaluate(cfg, r["models"], torch.device("cpu"))

    def test_validation_split_is_class_disjoint_and_seeded(self):
        labels = [c for c in range(8) for _ in range(3)]
        tr, va, val_classes = train.validation_split(labels, 0.25, seed=0)
        self.assertEqual(len(val_classes), 2)
        self.assertFalse(set(labels[i] for i in tr) & set(labels[i] for i in va))
        self.assertEqual(sorted(list(tr) + list(va)), list(range(24)))
        self.assertEqual(val_classes, train.validation_split(labels, 0.25, seed=0)[2])
        with self.assertRaisesRegex(Exception, "class_fraction"):
            train.validation_split(labels, 1.5, seed=0)
        with self.assertRaisesRegex(Exception, "each side needs at least 2"):
            train.validation_split([0, 1, 2], 0.25, seed=0)


def test_load_models_builds_no_losses(tmp_path):
    """A ProxyAnchorLoss left to get num_classes and embedding_size from the run (as the xml_cached configs do)
    cannot be built without them; loading a unit's weights needs no loss."""
    cfg = variant(tiny_config(), "proxy_anchor_gap")
    cfg["loss_funcs"] = {"metric_loss": {"ProxyAnchorLoss": {"margin": 0.1, "alpha": 32}}}
    with pytest.raises(Exception, match="num_classes"):
        train.build_models({**cfg, "prototype_init": None}, 0, torch.device("cpu"))
    models = train.build_models(cfg, 3, torch.device("cpu"), losses=False)
    assert models["loss_funcs"] == {} and models["frozen"] is None
    torch.save({k: models[k].state_dict() for k in ("trunk", "embedder")}, str(tmp_path / "best_models.pth"))
    loaded = train.load_models(cfg, str(tmp_path), torch.device("cpu"))
    assert torch.equal(loaded["embedder"].weight, models["embedder"].weight)


@pytest.mark.slow  # trains a unit (3 s)
def test_a_tables_validation_rows_validate_and_every_train_row_trains(tmp_path):
    """OML's split column with validation and test rows: the unit validates on the validation rows' classes (not on
    classes drawn from the train rows) and trains on all 12 train classes; the test rows stay unread."""
    import numpy as np

    from pml_extensions.runner.objects.builder import Builder
    from tests.runner.protocols.paired.test_protocol import _csv_with_validation_rows

    cfg = variant(_csv_with_validation_rows(tmp_path), "contrastive_xml")
    splits, sampled = [], []
    real_load, real_sampler = train.load_split, Builder.build_sampler

    def load_split(cfg, split, *a, **k):
        splits.append(split)
        return real_load(cfg, split, *a, **k)

    def build_sampler(self, labels, *a, **k):
        sampled.append(sorted(set(np.asarray(labels).tolist())))
        return real_sampler(self, labels, *a, **k)

    with mock.patch.object(train, "load_split", load_split), mock.patch.object(Builder, "build_sampler", build_sampler):
        r = train.train_and_select("v", cfg, 0, str(tmp_path / "unit"), torch.device("cpu"), log=lambda *a: None)
    assert splits == ["train", "train", "validation"] and [h["epoch"] for h in r["history"]] == [0, 1]
    assert r["validation_rows"] and r["num_train_classes"] == 12 and r["num_val_classes"] == 2  # the header says so
    names = sorted(f"Class {c} / é" for c in range(16))  # the labels index the sorted class names
    assert sampled[0] == [names.index(f"Class {c} / é") for c in sorted(range(12), key=str)]  # all 12, no val class


def test_the_units_metrics_are_the_protocols():
    from pml_extensions.runner.protocols.paired.protocol import METRICS

    assert train.METRICS == METRICS == ("mean_average_precision_at_r", "precision_at_1", "r_precision")
