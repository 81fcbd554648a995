import copy
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import samplers, trainers
from pytorch_metric_learning.utils import common_functions as c_f

from pml_extensions.datasets import FeatureCache, OpenClipArt, SeededViewDataset
from pml_extensions.datasets.open_clip_art import OPENCLIPART_ROOT
from pml_extensions.trunks import FrozenPrefix, mobilenet_v2_features, split_trunk

from .cache_testing_utils import TinyImages, tiny_split, train_transform, write_pngs


def _tmp(test):
    """A temporary folder removed at the end of ``test``."""
    folder = tempfile.mkdtemp()
    test.addCleanup(shutil.rmtree, folder, True)
    return folder


def _file_bytes(folder):
    with open(os.path.join(folder, "features.npy"), "rb") as f:
        return f.read()


class TestCachedValues(unittest.TestCase):
    def _expected(self, prefix, views, num_items, chunk_size):
        """The prefix's output on the same transformed views, batched as the build batches them (one batch per
        chunk here), in eval mode."""
        out = []
        prefix.eval()
        with torch.no_grad():
            for start in range(0, num_items, chunk_size):
                stop = min(start + chunk_size, num_items)
                batch = torch.stack([views.view(i, v) for i in range(start, stop) for v in range(views.num_views)])
                out.append(prefix(batch).view(stop - start, views.num_views, *prefix(batch[:1]).shape[1:]))
        return torch.cat(out)

    def test_float32_features_equal_the_prefix_output_on_the_same_views(self):
        _, prefix, _ = tiny_split()
        data, tf = TinyImages(n=11), train_transform()
        folder = _tmp(self)
        cache = FeatureCache(
            folder, prefix, data, tf, num_views=3, dtype="float32", chunk_size=4, batch_size=12, dataset_key="tiny"
        )
        prefix.train()
        self.assertTrue(cache.build())
        self.assertTrue(prefix.training and prefix.get_submodule("1").training)  # the caller's mode is restored
        stored = torch.from_numpy(np.load(os.path.join(folder, "features.npy")))
        self.assertEqual(tuple(stored.shape), (11, 3, 4, 8, 8))
        expected = self._expected(prefix, SeededViewDataset(data, tf, num_views=3), 11, 4)
        self.assertTrue(torch.equal(stored, expected))
        # the views differ from each other (they are augmentations, not copies)
        self.assertFalse(torch.equal(stored[:, 0], stored[:, 1]))
        # per image (another batch size) the outputs agree to float32 precision
        single = prefix(SeededViewDataset(data, tf, num_views=3).view(5, 2).unsqueeze(0))[0]
        torch.testing.assert_close(stored[5, 2], single, rtol=1e-6, atol=1e-6)

    def test_float16_features_are_the_float32_output_rounded(self):
        _, prefix, _ = tiny_split()
        data, tf = TinyImages(n=6), train_transform()
        folder = _tmp(self)
        cache = FeatureCache(
            folder, prefix, data, tf, num_views=2, dtype="float16", chunk_size=3, batch_size=6, dataset_key="tiny"
        )
        cache.build()
        stored = torch.from_numpy(np.load(os.path.join(folder, "features.npy")))
        self.assertEqual(stored.dtype, torch.float16)
        expected = self._expected(prefix, SeededViewDataset(data, tf, num_views=2), 6, 3)
        self.assertTrue(torch.equal(stored, expected.half()))
        rel = ((stored.float() - expected).abs() / expected.abs().clamp_min(1e-3)).max().item()
        self.assertLessEqual(rel, 2.0**-11)  # float16 round-to-nearest: half an ulp, 2^-11 relative
        self.assertGreater(rel, 0.0)
        self.assertEqual(cache.size_bytes(), os.path.getsize(os.path.join(folder, "features.npy")))

    def test_global_random_states_are_untouched(self):
        _, prefix, _ = tiny_split()
        folder = _tmp(self)
        torch_state, py_state, np_state = torch.get_rng_state(), random.getstate(), np.random.get_state()
        FeatureCache(folder, prefix, TinyImages(n=4), train_transform(), num_views=2, dataset_key="tiny").build()
        self.assertTrue(torch.equal(torch_state, torch.get_rng_state()))
        self.assertEqual(py_state, random.getstate())
        self.assertTrue(np.array_equal(np_state[1], np.random.get_state()[1]))

    def test_dataloader_workers_give_the_same_bytes(self):
        _, prefix, _ = tiny_split()
        a, b = _tmp(self), _tmp(self)
        kw = dict(num_views=2, dtype="float32", chunk_size=4, batch_size=8, dataset_key="tiny")
        FeatureCache(a, prefix, TinyImages(n=8), train_transform(), **kw).build()
        FeatureCache(b, prefix, TinyImages(n=8), train_transform(), num_workers=2, **kw).build()
        self.assertEqual(_file_bytes(a), _file_bytes(b))


class TestTrainingOnTheCache(unittest.TestCase):
    def _train(self, trunk, dataset, seed=3, epochs=3):
        embedder = torch.nn.Linear(6, 4).double()
        with torch.no_grad():
            embedder.weight.copy_(torch.linspace(-1, 1, 24, dtype=torch.float64).view(4, 6))
            embedder.bias.zero_()
        trunk_params = [p for p in trunk.parameters() if p.requires_grad]
        models = {"trunk": trunk, "embedder": embedder}
        optimizers = {
            "trunk_optimizer": torch.optim.SGD(trunk_params, lr=0.5),
            "embedder_optimizer": torch.optim.SGD(embedder.parameters(), lr=0.5),
        }
        saved = c_f.NUMPY_RANDOM
        c_f.NUMPY_RANDOM = np.random.RandomState(seed)  # MPerClassSampler: the same batches in both runs
        try:
            trainer = trainers.MetricLossOnly(
                models,
                optimizers,
                batch_size=6,
                loss_funcs={"metric_loss": pml_losses.ContrastiveLoss()},
                dataset=dataset,
                sampler=samplers.MPerClassSampler(dataset.labels, m=2, length_before_new_iter=12),
                iterations_per_epoch=2,
                dataloader_num_workers=0,
                data_device=torch.device("cpu"),
                dtype=torch.float64,
                end_of_epoch_hook=lambda t: dataset.set_epoch(t.epoch),
            )
            trainer.train(num_epochs=epochs)
        finally:
            c_f.NUMPY_RANDOM = saved
        return embedder

    def test_rest_on_cache_equals_full_model_with_frozen_prefix(self):
        data, tf = TinyImages(n=12), train_transform()
        model_a, prefix_a, rest_a = tiny_split(dtype=torch.float64)
        model_b = copy.deepcopy(model_a)
        prefix_b, rest_b = split_trunk(model_b, "2")
        rest_init = copy.deepcopy(rest_a.state_dict())
        prefix_init = copy.deepcopy(prefix_b.state_dict())
        folder = _tmp(self)
        cache = FeatureCache(
            folder, prefix_a, data, tf, num_views=3, dtype="float64", chunk_size=5, batch_size=4, dataset_key="tiny"
        )
        self.assertTrue(cache.build())
        cached = cache.open(seed=3, dtype=torch.float64)
        emb_a = self._train(rest_a, cached)
        full = torch.nn.Sequential(FrozenPrefix(prefix_b), rest_b)
        emb_b = self._train(full, SeededViewDataset(data, tf, num_views=3, seed=3))
        self.assertEqual(cached.epoch, 3)
        changed = 0
        for name, a in rest_a.state_dict().items():
            b = rest_b.state_dict()[name]
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
            changed += not torch.equal(a, rest_init[name])
        self.assertGreaterEqual(changed, 4)  # conv weight/bias, BN weight/bias/running stats moved
        torch.testing.assert_close(emb_a.weight, emb_b.weight, rtol=1e-10, atol=1e-12)
        for name, t in prefix_b.state_dict().items():  # the frozen prefix (BN statistics included) did not move
            self.assertTrue(torch.equal(t, prefix_init[name]), name)


class TestKeyAndRebuild(unittest.TestCase):
    def _cache(self, folder, prefix, data, tf=None, **kw):
        kw.setdefault("dataset_key", None if hasattr(data, "paths") else "tiny")
        return FeatureCache(
            folder, prefix, data, tf or train_transform(), num_views=2, dtype="float32", chunk_size=3, **kw
        )

    def test_unchanged_inputs_reuse_and_changed_inputs_rebuild(self):
        _, prefix, _ = tiny_split()
        folder = _tmp(self)
        data = write_pngs(_tmp(self))
        first = self._cache(folder, prefix, data)
        first.build()
        self.assertEqual(first.last_build["rebuilt"], "new")
        self.assertEqual(first.last_build["chunks_computed"], 2)
        before = _file_bytes(folder)
        st = os.stat(data.paths[2])  # a file rewritten in place: same name, new mtime
        os.utime(data.paths[2], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        again = self._cache(folder, prefix, data)
        again.build()
        self.assertEqual(again.last_build["rebuilt"], "changed: dataset")
        same = self._cache(folder, prefix, data)
        same.build()
        self.assertEqual((same.last_build["rebuilt"], same.last_build["chunks_computed"]), (None, 0))
        self.assertEqual(_file_bytes(folder), before)

        with torch.no_grad():
            prefix.get_submodule("0").weight[0, 0, 0, 0] += 0.5
        weights = self._cache(folder, prefix, data)
        weights.build()
        self.assertEqual(weights.last_build["rebuilt"], "changed: prefix")
        self.assertNotEqual(_file_bytes(folder), before)

        tf = self._cache(folder, prefix, data, train_transform(scale=(0.6, 1.0)))
        tf.build()
        self.assertEqual(tf.last_build["rebuilt"], "changed: transform")

        fewer = write_pngs(os.path.dirname(data.paths[0]), n=6)
        fewer.paths, fewer.labels = fewer.paths[:5], fewer.labels[:5]
        files = self._cache(folder, prefix, fewer, train_transform(scale=(0.6, 1.0)))
        files.build()
        self.assertEqual(files.last_build["rebuilt"], "changed: dataset")
        self.assertEqual(files.open().labels.tolist(), [0, 1, 0, 1, 0])

    def test_dataset_without_paths_is_keyed_by_its_items(self):
        _, prefix, _ = tiny_split()
        a = self._cache(_tmp(self), prefix, TinyImages(n=4, seed=0), dataset_key=None)
        b = self._cache(_tmp(self), prefix, TinyImages(n=4, seed=1), dataset_key=None)
        c = self._cache(_tmp(self), prefix, TinyImages(n=4, seed=0), dataset_key=None)
        self.assertNotEqual(a.key_parts["dataset"], b.key_parts["dataset"])
        self.assertEqual(a.key, c.key)


class _Boom(Exception):
    pass


class TestResume(unittest.TestCase):
    def test_interrupted_build_resumes_with_identical_bytes(self):
        _, prefix, _ = tiny_split()
        data = TinyImages(n=10)
        kw = dict(num_views=2, dtype="float16", chunk_size=4, batch_size=4, dataset_key="tiny")
        reference = _tmp(self)
        FeatureCache(reference, prefix, data, train_transform(), **kw).build()
        folder = _tmp(self)
        calls = []

        def fail_on_third_batch(module, inputs, output):
            calls.append(1)
            if len(calls) == 4:  # 1 probe forward, then chunk 0's two batches, then the first of chunk 1
                raise _Boom()

        handle = prefix.register_forward_hook(fail_on_third_batch)
        cache = FeatureCache(folder, prefix, data, train_transform(), **kw)
        with self.assertRaises(_Boom):
            cache.build()
        handle.remove()
        self.assertEqual(cache.chunks_done(), [0])
        self.assertFalse(cache.complete)
        with self.assertRaisesRegex(ValueError, r"incomplete \(1 of 3 chunks\)"):
            cache.open()
        resumed = FeatureCache(folder, prefix, data, train_transform(), **kw)
        self.assertTrue(resumed.build())
        self.assertEqual((resumed.last_build["rebuilt"], resumed.last_build["chunks_computed"]), (None, 2))
        self.assertEqual(_file_bytes(folder), _file_bytes(reference))


class TestShards(unittest.TestCase):
    def test_two_rank_build_equals_one_process(self):
        _, prefix, _ = tiny_split()
        data = TinyImages(n=10)
        kw = dict(num_views=3, dtype="float32", chunk_size=3, batch_size=5, dataset_key="tiny")
        single = _tmp(self)
        FeatureCache(single, prefix, data, train_transform(), **kw).build()
        for order in ((0, 1), (1, 0)):
            folder = _tmp(self)
            first = FeatureCache(folder, prefix, data, train_transform(), **kw)
            self.assertFalse(first.build(rank=order[0], world_size=2))
            self.assertEqual(first.chunks_done(), [c for c in range(4) if c % 2 == order[0]])
            self.assertTrue(FeatureCache(folder, prefix, data, train_transform(), **kw).build(order[1], 2))
            self.assertEqual(_file_bytes(folder), _file_bytes(single))


class TestErrors(unittest.TestCase):
    def test_one_line_errors(self):
        _, prefix, _ = tiny_split()
        folder = _tmp(self)
        data, tf = TinyImages(n=4), train_transform()
        cases = [
            (dict(dtype="bfloat16"), ValueError, "dtype must be one of"),
            (dict(num_views=0), ValueError, "num_views must be an int >= 1"),
            (dict(chunk_size=-1), ValueError, "chunk_size must be an int >= 1"),
            (dict(transform=T.Lambda(lambda x: x)), ValueError, "pass transform_key"),
            (dict(dataset=torch.utils.data.TensorDataset(torch.zeros(2))), ValueError, "must have a labels array"),
            (dict(prefix=torch.nn.Flatten()), ValueError, "no floating parameter"),
            (dict(prefix="conv"), TypeError, "prefix must be a torch.nn.Module"),
        ]
        for change, error, message in cases:
            kw = dict(folder=folder, prefix=prefix, dataset=data, transform=tf, dataset_key="tiny")
            kw.update(change)
            with self.subTest(change=list(change)), self.assertRaisesRegex(error, message) as ctx:
                FeatureCache(**kw)
            self.assertNotIn("\n", str(ctx.exception))
        cache = FeatureCache(folder, prefix, data, tf, dataset_key="tiny")
        for args, message in (((2, 2), r"rank must be in \[0, world_size=2\)"), ((0, None), "give both")):
            with self.assertRaisesRegex(ValueError, message):
                cache.build(*args)

    def test_float16_overflow_names_the_chunk_and_the_fix(self):
        prefix = torch.nn.Conv2d(3, 2, 1)
        with torch.no_grad():
            prefix.weight.fill_(1e5)
        cache = FeatureCache(_tmp(self), prefix, TinyImages(n=4), T.ToTensor(), dataset_key="tiny", chunk_size=2)
        with self.assertRaisesRegex(ValueError, r"chunk 0 \(items 0-1\) is not finite .*use dtype='float32'"):
            cache.build()

    def test_missing_file_of_the_list(self):
        data = write_pngs(_tmp(self), n=2)
        data.paths[1] += ".gone"
        with self.assertRaisesRegex(FileNotFoundError, r"lists a missing file .*01.png.gone"):
            _ = FeatureCache(_tmp(self), torch.nn.Conv2d(3, 2, 1), data, T.ToTensor()).key


class TestDerivedCache(unittest.TestCase):
    """A derived cache: a further frozen module applied once to every stored view of a finished cache."""

    def _source(self, dtype="float16", seed=0):
        model, prefix, _ = tiny_split(seed)
        source = FeatureCache(
            _tmp(self),
            prefix,
            TinyImages(n=7),
            train_transform(),
            num_views=3,
            view_seed=5,
            dtype=dtype,
            chunk_size=3,
            dataset_key="tiny",
        )
        self.assertTrue(source.build())
        return model, source

    def test_views_are_the_module_applied_to_the_stored_views(self):
        model, source = self._source("float16")
        middle = split_trunk(model, "5")[0]  # the prefix up to "5" ...
        middle = split_trunk(middle, "2")[1]  # ... minus the prefix up to "2": modules 3-5
        stored = source.open().features
        derived = FeatureCache(_tmp(self), middle, source.open(), None, dtype="float64", chunk_size=2)
        self.assertEqual((derived.num_views, derived.view_seed), (3, 5))
        self.assertTrue(derived.build())
        out = derived.open().features
        self.assertEqual(out.shape, (7, 3, 6, 4, 4))
        middle.eval()
        with torch.no_grad():  # the float16 values themselves are the input (cast to the module's float32)
            expected = middle(torch.from_numpy(np.array(stored)).flatten(0, 1).float()).view(7, 3, 6, 4, 4)
        np.testing.assert_array_equal(out, expected.double().numpy())
        np.testing.assert_array_equal(np.load(os.path.join(derived.folder, "labels.npy")), source.open().labels)

    def test_a_rebuilt_source_rebuilds_the_derived_cache(self):
        _, source = self._source()
        module = torch.nn.Conv2d(4, 2, 1)
        derived = FeatureCache(_tmp(self), module, source.open(), None)
        self.assertTrue(derived.build())
        self.assertEqual(derived.last_build["rebuilt"], "new")
        again = FeatureCache(derived.folder, module, source.open(), None)
        self.assertTrue(again.build())
        self.assertEqual((again.last_build["rebuilt"], again.last_build["chunks_computed"]), (None, 0))
        _, other_prefix, _ = tiny_split(seed=1)
        rebuilt = FeatureCache(
            source.folder,
            other_prefix,
            TinyImages(n=7),
            train_transform(),
            num_views=3,
            view_seed=5,
            chunk_size=3,
            dataset_key="tiny",
        )
        self.assertTrue(rebuilt.build())  # the source, rebuilt with other weights, has another key
        derived_again = FeatureCache(derived.folder, module, rebuilt.open(), None)
        self.assertTrue(derived_again.build())
        self.assertEqual(derived_again.last_build["rebuilt"], "changed: dataset")

    def test_refuses_a_transform_and_other_views(self):
        _, source = self._source()
        with self.assertRaisesRegex(ValueError, "derived cache .* takes no transform"):
            FeatureCache(_tmp(self), torch.nn.Conv2d(4, 2, 1), source.open(), T.ToTensor())
        with self.assertRaisesRegex(ValueError, r"num_views of a derived cache is its source's \(3\), got 2"):
            FeatureCache(_tmp(self), torch.nn.Conv2d(4, 2, 1), source.open(), None, num_views=2)


@unittest.skipUnless(os.path.isdir(OPENCLIPART_ROOT), "Debian package openclipart-png is not installed")
class TestOpenClipArtCache(unittest.TestCase):
    def test_real_images_through_a_mobilenet_prefix(self):
        data = OpenClipArt("test", max_classes=4, max_side=40)
        data.paths, data.labels = data.paths[::40], data.labels[::40]  # a few images of both test classes
        trunk = mobilenet_v2_features(pretrained=False).eval()
        prefix, rest = split_trunk(trunk, "3")
        tf = T.Compose(
            [
                T.RandomResizedCrop(32, scale=(0.6, 1.0)),
                T.ToTensor(),
                T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
            ]
        )
        cache = FeatureCache(_tmp(self), prefix, data, tf, num_views=2, dtype="float32", chunk_size=4)
        self.assertTrue(cache.build())
        features, label = cache.open(seed=0)[1]
        self.assertEqual(tuple(features.shape), (24, 8, 8))
        self.assertEqual(label, int(data.labels[1]))
        image = SeededViewDataset(data, tf, num_views=2).view(1, cache.open(seed=0).view_of(1))
        with torch.no_grad():
            torch.testing.assert_close(features, prefix(image.unsqueeze(0))[0], rtol=1e-5, atol=1e-5)
            self.assertEqual(tuple(rest(features.unsqueeze(0)).shape), (1, 1280, 1, 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_prefix_builds_a_cpu_cache_equal_to_the_cpu_build(tmp_path):
    _, prefix, _ = tiny_split()
    data, tf = TinyImages(n=6), train_transform()
    kw = dict(num_views=2, dtype="float32", chunk_size=3, dataset_key="tiny")
    FeatureCache(tmp_path / "cpu", prefix, data, tf, **kw).build()
    FeatureCache(tmp_path / "cuda", copy.deepcopy(prefix).cuda(), data, tf, **kw).build()
    a = np.load(tmp_path / "cpu" / "features.npy")
    b = np.load(tmp_path / "cuda" / "features.npy")
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "feature_cache_script.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _one_process_bytes(folder):
    from .feature_cache_script import make_cache

    cache, _ = make_cache(folder)
    assert cache.build()
    return _file_bytes(folder)


@pytest.mark.slow
def test_torchrun_ranks_build_their_shards_into_one_cache(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([REPO] + sys.path))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", SCRIPT]
    run = subprocess.run(cmd + [str(tmp_path / "dist"), "dist"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "rank 0 complete=True computed=3" in run.stdout and "rank 1 complete=True computed=2" in run.stdout
    assert _file_bytes(tmp_path / "dist") == _one_process_bytes(tmp_path / "one")


@pytest.mark.slow
def test_sigkilled_build_resumes_with_identical_bytes(tmp_path):
    from tests.forked_process import ForkedScript

    from .feature_cache_script import make_cache

    folder = tmp_path / "killed"
    proc = ForkedScript(SCRIPT, folder, "slow")  # a real child, forked from this process (no fresh imports)
    try:
        deadline = time.time() + 900  # generous: a loaded machine is slow, and the assertion is not about time

        def marked():  # chunk markers only (a marker being written under a temporary name is not done yet)
            return [n for n in os.listdir(folder / "chunks") if n.isdigit()] if os.path.isdir(folder / "chunks") else []

        while len(marked()) < 2:
            assert time.time() < deadline and proc.poll() is None, "the build did not reach its second chunk"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    cache, _ = make_cache(folder)
    done = cache.chunks_done()
    assert 2 <= len(done) < cache.num_chunks
    assert cache.build()
    assert cache.last_build["chunks_computed"] == cache.num_chunks - len(done)
    assert _file_bytes(folder) == _one_process_bytes(tmp_path / "one")
