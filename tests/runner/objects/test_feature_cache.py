"""runner/objects/feature_cache.py: the feature_cache key, the split trunk's rest, the caches of a run."""

import os
import tempfile
import unittest

import numpy as np
import pytest
import torch
import torchvision.transforms as T

from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.objects import feature_cache as fc
from pml_extensions.runner.objects.builder import Builder
from pml_extensions.trunks import HistogramPooling, trunk_body
from tests.datasets.cache_testing_utils import TinyImages
from tests.runner.runner_testing_utils import register_tiny

register_tiny()  # FixedConvNetBody / FixedLinear: weights from their own seed (stand-ins for pretrained weights)

BODY = {"FixedConvNetBody": {"in_channels": 3, "widths": [4, 6], "blocks_per_stage": 1}}


def trunk_spec(pool=None):
    pool = pool or {"HistogramPooling": {"in_channels": 6, "num_prototypes": 4}}
    return {"Sequential": [BODY, pool]}


def config(**cache):
    return {
        "models": {"trunk": trunk_spec(), "embedder": {"Linear": {"in_features": 6, "out_features": 3}}},
        "feature_cache": {"boundary": "0.features.2", "num_views": 2, "dtype": "float32", **cache},
    }


class TestSpec(unittest.TestCase):
    def test_defaults_and_absence(self):
        self.assertIsNone(fc.cache_spec({}))
        spec = fc.cache_spec({"feature_cache": {"boundary": 3}})
        self.assertEqual(
            (spec["boundary"], spec["num_views"], spec["dtype"], spec["derive_from"], spec["folder"]),
            (3, 4, "float16", None, None),
        )

    def test_bad_values_name_the_file_and_key(self):
        src = {"feature_cache": "general.yaml"}
        cases = [
            ({"boundry": "1"}, r"general.yaml: feature_cache.boundry: no such key; did you mean boundary\?"),
            ({"num_views": 2}, r"general.yaml: feature_cache: missing key 'boundary'"),
            ({"boundary": "1", "num_views": 0}, r"feature_cache.num_views: expected an int >= 1, got 0"),
            ({"boundary": "1", "view_seed": -1}, r"feature_cache.view_seed: expected an int >= 0, got -1"),
            ({"boundary": "1", "dtype": "bfloat16"}, r"feature_cache.dtype: expected one of float16, float32"),
            ({"boundary": True}, r"feature_cache.boundary: expected a module path"),
            ({"boundary": "1", "folder": 3}, r"feature_cache.folder: expected a path or null"),
        ]
        for spec, message in cases:
            with self.subTest(spec=spec), self.assertRaisesRegex(ConfigError, message):
                fc.cache_spec({"feature_cache": spec}, src)
        with self.assertRaisesRegex(ConfigError, "expected a mapping"):
            fc.cache_spec({"feature_cache": "0.17"}, src)

    def test_folder(self):
        spec = fc.cache_spec({"feature_cache": {"boundary": "1"}})
        self.assertEqual(fc.cache_folder(spec, "/exp/a"), "/exp/a/feature_cache")
        self.assertEqual(fc.cache_folder(dict(spec, folder="/shared/c"), "/exp/a"), "/shared/c")


class TestSplit(unittest.TestCase):
    def test_rest_keeps_the_trunk_names_and_computes_the_trunk(self):
        trunk = torch.nn.Sequential(_body(), HistogramPooling(6, 4), torch.nn.Identity()).eval()
        frozen = fc.split_trunk_for_cache(trunk, fc.cache_spec({"feature_cache": {"boundary": "0.features.2"}}))
        self.assertIsInstance(frozen.rest, torch.nn.Sequential)
        self.assertEqual([n for n, _ in frozen.rest.named_children()], ["0", "1", "2"])
        full = trunk.state_dict()
        for key, value in frozen.rest.state_dict().items():  # the same names as in the whole trunk
            self.assertTrue(torch.equal(value, full[key]), key)
        self.assertEqual(len(frozen.rest.state_dict()), 1 + 5 + 1)  # conv weight, BN (5 entries), prototypes
        x = torch.randn(2, 3, 8, 8)
        frozen.rest.eval()
        with torch.no_grad():
            torch.testing.assert_close(frozen.rest(frozen.prefix(x)), trunk(x), rtol=0, atol=0)
        # HistogramPooling is a direct child: its body and XMLWrapper's head are found as in the whole trunk
        self.assertEqual(len(trunk_body(frozen.rest, frozen.rest[1])), 1)
        self.assertFalse(any(p.requires_grad for p in frozen.prefix.parameters()))
        self.assertTrue(all(p.requires_grad for p in frozen.rest.parameters()))

    def test_a_whole_child_frozen_and_a_stage_index(self):
        trunk = torch.nn.Sequential(_body(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        frozen = fc.split_trunk_for_cache(trunk, {"boundary": "0", "derive_from": None})
        self.assertEqual([n for n, _ in frozen.rest.named_children()], ["1", "2"])
        last = fc.split_trunk_for_cache(trunk, {"boundary": -1, "derive_from": None})  # trunks.trunk_stages
        self.assertEqual(last.boundary, "0")  # the body's output is the last map before the pooling
        self.assertEqual([n for n, _ in last.rest.named_children()], ["1", "2"])

    def test_derive_from_an_earlier_boundary(self):
        trunk = torch.nn.Sequential(_body(), HistogramPooling(6, 4)).eval()
        frozen = fc.split_trunk_for_cache(trunk, {"boundary": "0.features.5", "derive_from": "0.features.2"})
        self.assertEqual((frozen.boundary, frozen.source_boundary), ("0.features.5", "0.features.2"))
        x = torch.randn(2, 3, 8, 8)
        with torch.no_grad():
            torch.testing.assert_close(frozen.between(frozen.source_prefix(x)), frozen.prefix(x), rtol=0, atol=0)
        with self.assertRaisesRegex(ConfigError, r"where: feature_cache.derive_from: '1' must be a module before"):
            fc.split_trunk_for_cache(trunk, {"boundary": "0.features.2", "derive_from": "1"}, "where: feature_cache")
        with self.assertRaisesRegex(ConfigError, "is the boundary itself"):
            fc.split_trunk_for_cache(trunk, {"boundary": "0.features.2", "derive_from": "0.features.2"})

    def test_a_bad_boundary_is_one_line(self):
        trunk = torch.nn.Sequential(_body(), HistogramPooling(6, 4))
        with self.assertRaisesRegex(ConfigError, r"^c.yaml: feature_cache.boundary: boundary '0.feature.2' is not a"):
            fc.split_trunk_for_cache(trunk, {"boundary": "0.feature.2"}, "c.yaml: feature_cache")
        with self.assertRaisesRegex(ConfigError, r"stage index 7 out of range"):
            fc.split_trunk_for_cache(trunk, {"boundary": 7}, "c.yaml: feature_cache")

    def test_the_builder_returns_the_rest_and_keeps_the_prefix(self):
        b = Builder(config(), log=lambda *a: None)
        models = b.build_models(torch.zeros(4, 4, 4))  # a cached feature: the output of features.2
        self.assertIs(models["trunk"], b.frozen.rest)
        self.assertEqual(b.embedding_size, 3)
        self.assertEqual(tuple(b.frozen.prefix(torch.zeros(1, 3, 8, 8)).shape), (1, 4, 8, 8))
        losses, _ = b.build_losses(models, loss_funcs={"m": {"XMLWrapper": {"loss": {"ContrastiveLoss": {}}}}})
        self.assertIs(losses["m"].histogram_layer, models["trunk"][1])
        optimizers = b.build_optimizers(models, losses, {"trunk_optimizer": {"SGD": {"lr": 0.1}}})
        trained = {id(p) for g in optimizers["trunk_optimizer"].param_groups for p in g["params"]}
        self.assertEqual(trained, {id(p) for p in b.frozen.rest.parameters()})
        self.assertFalse(trained & {id(p) for p in b.frozen.prefix.parameters()})

    def test_a_prefix_that_changes_with_the_seed_is_refused(self):
        cfg = config()
        fc.check_fixed_prefix(lambda: Builder(cfg, log=lambda *a: None), [0], "c.yaml: feature_cache")
        cfg["models"]["trunk"]["Sequential"][0] = {"ConvNetBody": {"in_channels": 3, "widths": [4, 6]}}
        cfg["feature_cache"]["boundary"] = "0.features.2"
        with self.assertRaisesRegex(ConfigError, r"c.yaml: feature_cache: the frozen prefix .* changes with the seed"):
            fc.check_fixed_prefix(lambda: Builder(cfg, log=lambda *a: None), [0], "c.yaml: feature_cache")


def _body():
    from tests.runner.runner_testing_utils import FixedConvNetBody

    return FixedConvNetBody(in_channels=3, widths=[4, 6], blocks_per_stage=1)


class TestCaches(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.images = TinyImages(n=10, classes=2, size=8)
        self.tf = T.Compose([T.RandomResizedCrop(8, scale=(0.5, 1.0)), T.ToTensor()])
        self.logs = []

    def caches(self, **cache):
        b = Builder(config(**cache), log=self.logs.append)
        b.build_models()
        return b, fc.FeatureCaches(b, self.tmp.name, self.logs.append)

    def test_built_once_then_read_and_equal_to_the_prefix(self):
        b, caches = self.caches(chunk_size=4)
        data = caches.dataset("train", b.frozen, self.images, self.tf, 2, seed=3)
        self.assertEqual((len(data), data.num_views, data.feature_shape, data.seed), (10, 2, (4, 8, 8), 3))
        self.assertTrue(os.path.isdir(os.path.join(self.tmp.name, "feature_cache", "0.features.2", "train")))
        self.assertRegex(self.logs[-1], r"feature cache 0.features.2/train: 3 of 3 chunks computed in .* \(new\)")
        self.assertEqual(  # announced before the work starts
            self.logs[-2],
            "feature cache 0.features.2/train: computing the frozen prefix's outputs of 10 images × 2 view(s) in 3 "
            "chunks (once; every variant and seed reads them)",
        )
        from pml_extensions.datasets import SeededViewDataset

        views = SeededViewDataset(self.images, self.tf, num_views=2, seed=3)
        b.frozen.prefix.eval()
        with torch.no_grad():
            for i in (0, 7):
                torch.testing.assert_close(data[i][0], b.frozen.prefix(views[i][0][None])[0], rtol=1e-6, atol=1e-6)
        self.logs.clear()
        b2, again = self.caches(chunk_size=4)  # a second run finds it (no log line: nothing built)
        again.dataset("train", b2.frozen, self.images, self.tf, 2)
        self.assertEqual(self.logs, [])
        other = T.Compose([T.RandomResizedCrop(8, scale=(0.3, 1.0)), T.ToTensor()])
        again.dataset("train", b2.frozen, self.images, other, 2)  # a changed transform rebuilds it in place
        self.assertRegex(self.logs[-1], r"3 of 3 chunks computed .*\(changed: transform\)")

    def test_a_derived_boundary_is_computed_from_the_source_cache(self):
        b, caches = self.caches(boundary="0.features.5", derive_from="0.features.2")
        data = caches.dataset("test", b.frozen, self.images, T.ToTensor(), 1)
        source = os.path.join(self.tmp.name, "feature_cache", "0.features.2", "test")
        self.assertTrue(os.path.exists(os.path.join(source, "meta.json")))
        self.assertEqual(data.folder, os.path.join(self.tmp.name, "feature_cache", "0.features.5", "test"))
        b.frozen.prefix.eval()
        with torch.no_grad():
            expected = b.frozen.prefix(T.ToTensor()(self.images[4][0])[None])[0]
        torch.testing.assert_close(data[4][0], expected, rtol=1e-6, atol=1e-6)

    def test_shards_in_separate_calls_make_the_same_cache(self):
        b, caches = self.caches(chunk_size=3)
        args = ("train", b.frozen, self.images, self.tf, 2)
        folder, done = caches.build(*args, rank=1, world_size=2)
        self.assertFalse(done)
        with self.assertRaisesRegex(ConfigError, "is incomplete"):
            fc.FeatureCaches(b, self.tmp.name).dataset(*args, rank=1, world_size=2)
        self.assertTrue(caches.build(*args, rank=0, world_size=2)[1])  # the last shard completes it
        sharded = np.load(os.path.join(folder, "features.npy"))
        one = os.path.join(self.tmp.name, "one")
        _, whole = self.caches(chunk_size=3, folder=one)
        self.assertTrue(whole.build(*args)[1])
        np.testing.assert_array_equal(np.load(os.path.join(one, "0.features.2", "train", "features.npy")), sharded)

    def test_a_failing_prefix_is_one_line(self):
        b, caches = self.caches()
        with self.assertRaisesRegex(ConfigError, r"feature_cache.train: building the cache in .* failed: RuntimeError"):
            caches.dataset("train", b.frozen, self.images, T.Compose([T.Grayscale(), T.ToTensor()]), 2)

    def test_the_epoch_hook_follows_the_trainer(self):
        b, caches = self.caches()
        data = caches.dataset("train", b.frozen, self.images, self.tf, 2)
        answers = iter([None, False])
        hook = fc.end_of_epoch_hook(data, then=lambda trainer: next(answers))
        trainer = type("T", (), {"epoch": 3})()
        self.assertIs(hook(trainer), True)
        self.assertEqual(data.epoch, 3)
        self.assertIs(hook(trainer), False)  # PML stops on False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_builder_builds_on_the_gpu_and_trains_on_cpu_features(tmp_path):
    b = Builder(config(), device=torch.device("cuda"), log=lambda *a: None)
    b.build_models()
    data = fc.FeatureCaches(b, str(tmp_path)).dataset("test", b.frozen, TinyImages(n=4, size=8), T.ToTensor(), 1)
    x = data[0][0]
    assert x.device.type == "cpu"
    with torch.no_grad():
        expected = b.frozen.prefix(T.ToTensor()(TinyImages(n=4, size=8)[0][0])[None].cuda())[0].cpu()
    torch.testing.assert_close(x, expected, rtol=1e-4, atol=1e-4)


def test_a_derived_boundarys_source_shares_the_direct_cache_key():
    """The features.17 cache of a ``derive_from`` variant is the one a variant frozen up to features.17 uses (one
    build serves both settings; a second key would rebuild the shared folder back and forth)."""
    from pml_extensions.datasets.feature_cache import prefix_digest

    trunk = torch.nn.Sequential(_body(), HistogramPooling(6, 4))
    derived = fc.split_trunk_for_cache(trunk, {"boundary": "0.features.5", "derive_from": "0.features.2"})
    direct = fc.split_trunk_for_cache(trunk, {"boundary": "0.features.2", "derive_from": None})
    assert prefix_digest(derived.source_prefix) == prefix_digest(direct.prefix)


@pytest.mark.slow
def test_torchrun_ranks_build_the_caches_and_train_as_one_process(tmp_path, tiny_mlrc_config, subprocess_env):
    """The tiny MLRC run with a cached fixed prefix, as one process and under torchrun (2 gloo processes, each
    building its shard of the chunks): the same cache bytes and the same loss rows."""
    import subprocess
    import sys

    from pml_extensions.cli.run import main
    from pml_extensions.runner.experiment.checkpoint import Checkpointer
    from tests.runner.protocols.mlrc.test_protocol import CACHED_MODELS
    from tests.runner.runner_testing_utils import RUNNER_TESTS

    with open(os.path.join(tiny_mlrc_config, "config_models", "default.yaml"), "w") as f:
        f.write(CACHED_MODELS)
    script = os.path.join(RUNNER_TESTS, "runner_testing_utils.py")
    args = [tiny_mlrc_config, "--num_training_sets", "1", "--num_epochs_train", "1", "--check_untrained_accuracy"]
    args += ["false", "--feature_cache", "{boundary: '1', num_views: 2, dtype: float32, chunk_size: 8}"]
    runs = {name: tmp_path / name / "cfg" for name in ("one", "two")}
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd = [sys.executable] + launcher + [script] + args + ["--root_experiment_folder", str(tmp_path / "two")]
    proc = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the one-process reference: the same command in this process (the CLI's main, as the script calls it)
    assert main(args + ["--root_experiment_folder", str(tmp_path / "one")]) == 0
    for part in ("train", "eval"):
        a, b = (np.load(runs[n] / "feature_cache" / "1" / part / "features.npy") for n in ("one", "two"))
        np.testing.assert_array_equal(a, b)
    rows = [Checkpointer(str(runs[n] / "fold_0")).rows("loss_histories") for n in ("one", "two")]
    assert [r["~iteration~"] for r in rows[0]] == [r["~iteration~"] for r in rows[1]] == [1, 2, 3, 4]
    for a, b in zip(*rows):
        assert b["total_loss"] == pytest.approx(a["total_loss"], rel=1e-4, abs=1e-6)


def test_subset_key_depends_on_the_indices():
    data = torch.utils.data.TensorDataset(torch.zeros(3, 1))
    data.labels = np.array([0, 1, 1])
    assert fc.subset_key(data, [0, 2]) != fc.subset_key(data, [0, 1])
    assert fc.subset_key(data, [0, 2]) == fc.subset_key(data, [0, 2])
