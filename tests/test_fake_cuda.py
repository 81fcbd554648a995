"""GPU readiness without a GPU (issue 22, item 4): the forward passes of the package on FAKE CUDA tensors.

``torch._subclasses.fake_tensor.FakeTensorMode`` gives every tensor a device, a shape and a dtype but no data. Modules
are built with ``device="cuda"`` inside the mode (third-party modules that take no device argument are built under
``torch.device("cuda")`` and their left-over CPU tensors moved by :func:`on_cuda`), inputs are made on "cuda" (or on
the CPU where a DataLoader would hand them over), and every op then checks its operands' devices as CUDA would: a
tensor made on the CPU and mixed in raises ``FakeTensorDeviceMismatchError``. :class:`ShadowValues` runs every op a
second time on real CPU tensors (the "shadows" of the fake ones), so code that reads values (``bool(...)``,
``.item()``, ``int(t.max())``, ``nonzero``, ``unique``) gets the values a real run would and carries on; it also
refuses a random factory whose generator is on another device than its output (CUDA refuses a CPU generator there).

Covered: the forward pass of every trunk component, every loss (``XMLWrapper`` around each shipped inner loss and
the two cross-batch-memory compositions), one forward step of each trainer (``calculate_loss`` and the loss
tracker), the k-NN engine's block scoring and the explainers' folding (ActivationDecomposition's maps through the
supported heads). Not covered, and why:

* backward passes (``loss.backward()``, ``torch.autograd.grad``, ``SimilarityGradCAM``, custom autograd backward
  such as ``PerturbedArgmaxFunction``): the autograd engine asks the CUDA driver for a device context;
* ``torch.Generator(device="cuda")`` (``PerturbedMaximizer`` on CUDA, ``mixing="perturbed"``): needs a driver;
* copies of fake modules (``copy.deepcopy``, ``inplace=False``, ``Module.to`` of a fake parameter): fake tensors
  have no storage to copy or swap (copies are tested on real tensors in ``tests/test_module_copies.py``);
* data-dependent shapes and scalar reads come from the CPU shadows, i.e. from CPU kernels: a CUDA kernel that would
  break a tie differently (``topk``, ``argmax``), TF32 matmuls, nondeterministic atomics are not seen;
* ``.numpy()`` (PML's label mapping in ``get_batch``, faiss), ``pin_memory``, CUDA streams and ``non_blocking``
  copies, NCCL, autocast's CUDA kernels and cuDNN (switched off here: its batch-norm op has no CPU kernel for the
  shadows; the fake shapes are the same).
"""

import contextlib
import unittest

import pytest
import torch
import torchvision
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorDeviceMismatchError,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from pml_extensions import explain, trunks
from pml_extensions.knn.engine import BlockedKNN
from pml_extensions.losses import PatchClassificationLoss, ResolutionDistillationLoss, XMLWrapper
from pml_extensions.trainers import ResolutionDistillationTrainer, TemplateMatchingTrainer, make_teacher_trainer
from pml_extensions.utils import DistributedLossWrapper

CUDA = torch.device("cuda")
_SHADOW = "_shadow_value"


class ShadowValues(TorchDispatchMode):
    """Inside a ``FakeTensorMode``: run every op on the fake tensors (devices, shapes, dtypes, as CUDA would check
    them) AND on real CPU tensors standing in for them, so that reads of values get real values.

    Each fake output keeps its real CPU counterpart in its ``__dict__``. A scalar read (``aten._local_scalar_dense``)
    returns the shadow's value; an op whose output shape depends on the data (``nonzero``, ``unique``, boolean
    masks) gets fake outputs of the shadow's shapes on the device of its fake inputs (which must agree)."""

    @staticmethod
    def _real(x):
        if isinstance(x, FakeTensor):
            real = x.__dict__.get(_SHADOW)
            if real is None:
                raise RuntimeError(f"a fake tensor {tuple(x.shape)} on {x.device} was made outside ShadowValues")
            return real
        if isinstance(x, torch.device) and x.type != "cpu":
            return torch.device("cpu")
        return x

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        real_args, real_kwargs = tree_map(self._real, (args, kwargs))
        with unset_fake_temporarily():
            real_out = func(*real_args, **real_kwargs)
        try:
            fake_out = func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            if func is torch.ops.aten._local_scalar_dense.default:
                return real_out
            if func is torch.ops.aten.index.Tensor:  # a boolean mask: indices may stay on the CPU, as on CUDA
                device = args[0].device
            else:  # FakeTensor's own device rule (raises FakeTensorDeviceMismatchError)
                device, _ = FakeTensor._find_common_device(func, tree_flatten((args, kwargs))[0])
            fake_out = tree_map(
                lambda r: (
                    torch.empty_strided(r.shape, r.stride(), dtype=r.dtype, device=device)
                    if isinstance(r, torch.Tensor)
                    else r
                ),
                real_out,
            )
        fakes, reals = tree_flatten(fake_out)[0], tree_flatten(real_out)[0]
        for fake, real in zip(fakes, reals):
            if isinstance(fake, FakeTensor):
                fake.__dict__[_SHADOW] = real
        generator = kwargs.get("generator")
        out_devices = {f.device.type for f in fakes if isinstance(f, FakeTensor)}
        if generator is not None and out_devices and out_devices != {generator.device.type}:
            raise RuntimeError(f"{func}: a {generator.device.type} generator draws a {out_devices.pop()} tensor")
        return fake_out


@contextlib.contextmanager
def fake_cuda():
    """Fake CUDA: ``FakeTensorMode`` + :class:`ShadowValues`, cuDNN off, the global RNG states restored."""
    with torch.random.fork_rng(devices=[]), torch.backends.cudnn.flags(enabled=False):
        with FakeTensorMode(allow_non_fake_inputs=False), ShadowValues():
            yield


def shadow(t: torch.Tensor) -> torch.Tensor:
    """The real CPU values behind a fake tensor."""
    return t.__dict__[_SHADOW]


def on_cuda(module: torch.nn.Module) -> torch.nn.Module:
    """Every parameter and buffer of ``module`` on CUDA, assigned anew: ``Module.to`` cannot swap fake parameters,
    and some third-party modules ignore ``torch.device("cuda")`` (PML's ProxyAnchorLoss builds its proxies with the
    legacy ``torch.Tensor(n, d)``, always on the CPU)."""
    with torch.no_grad():
        for m in module.modules():
            for name, p in m._parameters.items():
                if p is not None:
                    m._parameters[name] = torch.nn.Parameter(p.to(CUDA), requires_grad=p.requires_grad)
            for name, b in m._buffers.items():
                if b is not None:
                    m._buffers[name] = b.to(CUDA)
    return module


def built_on_cuda(build):
    """``build()`` under ``torch.device("cuda")`` (third-party modules), then :func:`on_cuda`."""
    with CUDA:
        return on_cuda(build())


def images(n=2, c=3, h=8, w=8, device=CUDA):
    return torch.rand(n, c, h, w, device=device)


class FakeCudaCase(unittest.TestCase):
    def assert_on_cuda(self, out, shape=None):
        leaves = [t for t in tree_flatten(out)[0] if torch.is_tensor(t)]
        self.assertTrue(leaves, "no tensor output")
        for t in leaves:
            self.assertIsInstance(t, FakeTensor)
            self.assertEqual(t.device.type, "cuda", f"output {tuple(t.shape)} on {t.device}")
        if shape is not None:
            self.assertEqual(tuple(leaves[0].shape), tuple(shape))
        return leaves


class TestTheMachinery(FakeCudaCase):
    def test_a_cpu_tensor_mixed_in_raises_a_device_mismatch(self):
        with fake_cuda():
            layer = trunks.HistogramPooling(6, 4, device="cuda")
            with self.assertRaisesRegex(RuntimeError, "Expected all tensors to be on the same device"):
                layer(torch.rand(2, 6, 4, 4))  # made on the CPU (convolution's own device check)
            y = layer(images(c=6))
            with self.assertRaises(FakeTensorDeviceMismatchError):
                y + torch.ones(2, 6)

    def test_a_cpu_generator_for_a_cuda_tensor_raises(self):
        with fake_cuda():
            with self.assertRaisesRegex(RuntimeError, "a cpu generator draws a cuda tensor"):
                torch.randn(3, generator=torch.Generator().manual_seed(0), device="cuda")

    def test_shadows_hold_the_values_of_a_real_cpu_run(self):
        x = torch.rand(3, 6, 4, 4, generator=torch.Generator().manual_seed(1))
        real = trunks.HistogramPooling(6, 4, seed=2)
        expected = real(x), real.last_histograms
        total = float(expected[1].detach().sum())
        with fake_cuda():
            layer = trunks.HistogramPooling(6, 4, seed=2, device="cuda")
            pooled = layer(torch.tensor(x.tolist(), device="cuda"))
            self.assertEqual(float(layer.last_histograms.detach().sum()), total)  # a scalar read: the real value
            got = shadow(pooled), shadow(layer.last_histograms)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=0, atol=0)


class TestTrunkComponents(FakeCudaCase):
    def test_each_component(self):
        # name: (build, input [B, C, H, W], output shape)
        cases = {
            "ConvNetBody": (lambda: trunks.ConvNetBody(3, (4, 6), 1, device="cuda"), (2, 3, 8, 8), (2, 6, 4, 4)),
            "GeMPooling": (lambda: trunks.GeMPooling(device="cuda"), (2, 3, 8, 8), (2, 3)),
            "GeMPooling(fixed p)": (lambda: trunks.GeMPooling(trainable=False, device="cuda"), (2, 3, 8, 8), (2, 3)),
            "HistogramPooling": (lambda: trunks.HistogramPooling(3, 4, device="cuda"), (2, 3, 8, 8), (2, 3)),
            "MarginAugmentedSoftmax": (lambda: trunks.MarginAugmentedSoftmax(mu=0.5), (2, 3, 8, 8), (2, 3, 8, 8)),
            "RetrievalHead": (lambda: trunks.RetrievalHead(3, 5, device="cuda"), (2, 3, 8, 8), (2, 5)),
            "MobileNetV2Features": (
                lambda: built_on_cuda(lambda: trunks.MobileNetV2Features(pretrained=False)),
                (2, 3, 32, 32),
                (2, 1280, 1, 1),
            ),
        }
        for mixing in ("bn_relu", "softmax", "none"):
            for combine in ("add", "concat"):
                cases[f"TemplateMatchingBlock({mixing}, {combine})"] = (
                    lambda m=mixing, c=combine: trunks.TemplateMatchingBlock(3, 4, mixing=m, combine=c, device="cuda"),
                    (2, 3, 8, 8),
                    (2, 3 if (combine == "add" or mixing == "none") else 6, 8, 8),
                )
        for name, (build, x, shape) in cases.items():
            with self.subTest(name), fake_cuda():
                self.assert_on_cuda(build()(images(*x)), shape)

    def test_template_matching_block_keeps_its_scores_on_cuda(self):
        with fake_cuda():
            block = trunks.TemplateMatchingBlock(3, 4, device="cuda")
            block(images())
            self.assert_on_cuda([block.last_class_scores, block.last_mixing], (2, 4, 8, 8))

    @pytest.mark.slow  # over 3 s on 2 cores: tox runs it, -m 'not slow' leaves it out
    def test_inserted_block_and_swapped_maximizer_in_torchvision_models(self):
        # the concat variants widen the next layer (new convolutions / BatchNorm built on the old one's device).
        # Every fake op also runs on the CPU: MobileNetV2 at a quarter of its width and a DenseNet of densenet121's
        # layout with fewer layers and channels (the inserter places the block by class and module name, not width)
        cases = (("resnet18", "add"), ("resnet18", "concat"), ("mobilenet_v2", "concat"), ("densenet", "concat"))
        small = {
            "mobilenet_v2": lambda: torchvision.models.mobilenet_v2(num_classes=4, width_mult=0.25),
            "densenet": lambda: torchvision.models.DenseNet(8, (2, 2, 2, 2), 16, num_classes=4),
        }
        for arch, combine in cases:
            with self.subTest(arch=arch, combine=combine), fake_cuda():
                model = built_on_cuda(small.get(arch, lambda a=arch: getattr(torchvision.models, a)(num_classes=4)))
                # in place: a deep copy of fake parameters is not possible (no storage)
                trunks.insert_template_matching(model, num_classes=4, combine=combine, inplace=True)
                if arch == "resnet18":
                    trunks.soft_maximizer_swap(model, maximizer="softmax", inplace=True)
                self.assert_on_cuda(model(images(h=32, w=32)), (2, 4))
                (block,) = trunks.template_matching_blocks(model)
                self.assert_on_cuda(block.last_class_scores, (2, 4, 2, 2))  # stride 16 on 32 x 32 images

    def test_histogram_layer_extras(self):
        with fake_cuda():
            layer = trunks.HistogramPooling(3, 4, device="cuda")
            x = images()
            self.assert_on_cuda(layer.hard_histograms(x), (2, 4))
            self.assert_on_cuda(layer.covering_radius(x), ())
            self.assert_on_cuda(layer.gap_reconstruction_error(x), (2,))


LABELS = [0, 0, 1, 1, 2, 2, 3, 3]
INNER_LOSSES = {
    "ContrastiveLoss": lambda: pml_losses.ContrastiveLoss(pos_margin=0.0, neg_margin=1.0),
    "ProxyAnchorLoss": lambda: built_on_cuda(lambda: pml_losses.ProxyAnchorLoss(4, 5, margin=0.1, alpha=32)),
    "MultiSimilarityLoss": lambda: pml_losses.MultiSimilarityLoss(),
    "TripletMarginLoss": lambda: pml_losses.TripletMarginLoss(margin=0.1),
    "CrossBatchMemory(ContrastiveLoss)": lambda: built_on_cuda(
        lambda: pml_losses.CrossBatchMemory(pml_losses.ContrastiveLoss(), 5, memory_size=16)
    ),
}


def xml_model():
    trunk = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 1, device="cuda"), trunks.HistogramPooling(6, 4, device="cuda"))
    return trunk, torch.nn.Linear(6, 5, device="cuda")


class TestLosses(FakeCudaCase):
    def test_patch_classification_loss(self):
        with fake_cuda():
            scores = torch.randn(2, 4, 3, 3, device="cuda")
            self.assert_on_cuda(PatchClassificationLoss()(scores, torch.tensor([0, 3], device="cuda")), ())
            # labels from a CPU batch are moved to the scores' device
            self.assert_on_cuda(PatchClassificationLoss()([scores, scores], torch.tensor([0, 3])), ())

    def test_resolution_distillation_loss(self):
        for weights in ({}, {"lambda_ts": 0, "lambda_ss": 0}, {"lambda_abs": 0, "lambda_ts": 0}):
            with self.subTest(**weights), fake_cuda():
                loss = ResolutionDistillationLoss(**weights)
                ids = torch.tensor([0, 0, 0, 1, 1, 1], device="cuda")
                emb, ref = torch.randn(6, 5, device="cuda"), torch.randn(6, 5, device="cuda")
                self.assert_on_cuda(loss(emb, ids, ref_emb=ref), ())

    def test_xml_wrapper_around_each_shipped_inner_loss(self):
        for name, inner in INNER_LOSSES.items():
            for target in ("embeddings", "pooled"):
                for mined in (False, True):
                    with self.subTest(loss=name, target=target, mined=mined), fake_cuda():
                        trunk, embedder = xml_model()
                        loss = XMLWrapper(inner(), xml_weight=1.0, target=target).attach(trunk)
                        if target == "pooled":
                            loss.attach(trunk, embedder)
                        labels = torch.tensor(LABELS, device="cuda")
                        emb = embedder(trunk(images(8)))
                        miner = pml_miners.MultiSimilarityMiner(epsilon=0.5)
                        tuples = miner(emb, labels) if mined and "Proxy" not in name else None
                        self.assert_on_cuda(loss(emb, labels, tuples), ())
                        self.assertEqual(loss.num_skipped_xml, 0)  # the XML term ran: two halves were formed
                        self.assert_on_cuda(loss.xml_loss, ())

    def test_xml_wrapper_inside_a_cross_batch_memory_and_the_distributed_wrapper(self):
        class AdmittingMemory(pml_losses.CrossBatchMemory):  # PML's CBM refuses wrappers by class name
            @staticmethod
            def supported_losses():
                return pml_losses.CrossBatchMemory.supported_losses() + ["XMLWrapper"]

        with fake_cuda():
            trunk, embedder = xml_model()
            labels = torch.tensor(LABELS, device="cuda")
            wrapped = DistributedLossWrapper(XMLWrapper(pml_losses.ContrastiveLoss(), xml_weight=1.0).attach(trunk))
            self.assert_on_cuda(wrapped(embedder(trunk(images(8))), labels), ())
            cbm = built_on_cuda(
                lambda: AdmittingMemory(XMLWrapper(pml_losses.ContrastiveLoss()).attach(trunk), 5, memory_size=16)
            )
            self.assert_on_cuda(cbm(embedder(trunk(images(8))), labels), ())


class TestTrainers(FakeCudaCase):
    """One forward step: the batch comes from the CPU (as a DataLoader hands it over), the trainer moves it."""

    @staticmethod
    def forward_step(trainer, batch):
        trainer.set_to_train()
        trainer.zero_losses()
        trainer.update_loss_weights()
        trainer.calculate_loss(batch)
        trainer.loss_tracker.update(trainer.loss_weights)
        return trainer.losses

    @pytest.mark.slow  # over 3 s on 2 cores: tox runs it, -m 'not slow' leaves it out
    def test_template_matching_trainer(self):
        for main in ("metric_loss", "classifier_loss"):
            with self.subTest(main), fake_cuda():
                trunk = built_on_cuda(lambda: torchvision.models.resnet18(num_classes=4))
                trunk.fc = torch.nn.Identity()
                trunks.insert_template_matching(trunk, num_classes=4, inplace=True)
                models = {"trunk": trunk}
                if main == "metric_loss":
                    models["embedder"] = torch.nn.Linear(512, 8, device="cuda")
                    loss_funcs = {"metric_loss": pml_losses.ContrastiveLoss()}
                else:
                    models["classifier"] = torch.nn.Linear(512, 4, device="cuda")
                    loss_funcs = {"classifier_loss": torch.nn.CrossEntropyLoss()}
                trainer = TemplateMatchingTrainer(
                    models=models,
                    optimizers={},
                    batch_size=4,
                    loss_funcs=loss_funcs,
                    mining_funcs={"tuple_miner": pml_miners.MultiSimilarityMiner()} if main == "metric_loss" else {},
                    dataset=None,
                    data_device=CUDA,
                    freeze_trunk_batchnorm=True,
                )
                losses = self.forward_step(trainer, (torch.rand(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])))
                self.assert_on_cuda([losses["total_loss"], losses[main], losses["template_aux_loss"]], ())

    def test_resolution_distillation_trainer(self):
        for metric in (False, True):
            with self.subTest(metric_loss=metric), fake_cuda():

                def body():
                    return trunks.ConvNetBody(3, (4,), 1, device="cuda")

                models = {
                    "trunk": body(),
                    "embedder": trunks.RetrievalHead(4, 6, device="cuda"),
                    "teacher_trunk": body(),
                    "teacher_embedder": trunks.RetrievalHead(4, 6, device="cuda"),
                }
                loss_funcs = {"distillation_loss": ResolutionDistillationLoss()}
                if metric:
                    loss_funcs["metric_loss"] = pml_losses.TripletMarginLoss()
                trainer = ResolutionDistillationTrainer(
                    models,
                    None,
                    batch_size=2,
                    loss_funcs=loss_funcs,
                    loss_weights={"distillation_loss": 1, "metric_loss": 0.1} if metric else None,
                    dataset=None,
                    data_device=CUDA,
                )
                # CoupledAugmentationDataset.collate's layout, on the CPU: 2 images x 3 augmentations
                batch = ((torch.rand(6, 3, 8, 8), torch.rand(6, 3, 16, 16), torch.tensor([0, 0, 0, 1, 1, 1])),)
                batch += (torch.tensor([0, 0, 0, 1, 1, 1]),)
                losses = self.forward_step(trainer, batch)
                self.assert_on_cuda([losses["total_loss"], losses["distillation_loss"]], ())
                if metric:
                    self.assert_on_cuda(losses["metric_loss"], ())

    def test_teacher_recipe_trainer(self):
        with fake_cuda():
            trunk = torch.nn.Sequential(trunks.ConvNetBody(3, (4,), 1, device="cuda"))
            embedder = trunks.RetrievalHead(4, 6, device="cuda")
            dataset = torch.utils.data.TensorDataset(torch.rand(8, 3, 8, 8), torch.tensor(LABELS))
            trainer = make_teacher_trainer(trunk, embedder, dataset, labels=LABELS, data_device=CUDA)
            # one batch of the sampler's, collated on the CPU (PML's get_batch maps labels through numpy: not covered)
            trainer.initialize_dataloader()
            losses = self.forward_step(trainer, next(trainer.dataloader_iter))
            self.assert_on_cuda([losses["total_loss"], losses["metric_loss"]], ())


class TestKNNEngine(FakeCudaCase):
    def test_block_scoring(self):
        for distance in ("euclidean", "inner_product"):
            with self.subTest(distance), fake_cuda():
                knn = BlockedKNN(distance, block_size=3)
                query, reference = torch.randn(7, 4, device="cuda"), torch.randn(9, 4, device="cuda")
                distances, indices = knn(query, 2, reference)
                self.assert_on_cuda([distances, indices], (7, 2))
                # the queries as the first rows of the reference (PML's layout), each one's own row removed
                distances, indices = knn(query, 3, torch.cat([query, reference]), ref_includes_query=True)
                self.assert_on_cuda([distances, indices], (7, 3))
                own = torch.arange(7, device="cuda")
                self.assertFalse(bool((indices == own[:, None]).any()))
                # search(): one block, with ties at the k-th place re-ranked on (score, index) keys
                tied = torch.zeros(4, 4, device="cuda")
                got, _ = knn.search(knn.prepare(tied[:2], "q"), 2, knn.prepare(tied, "r"), own[:2])
                self.assertEqual(shadow(got).tolist(), [[1, 2], [0, 2]])


def _conv():
    return torch.nn.Conv2d(3, 4, 3, device="cuda")


def _gap():
    return torch.nn.Sequential(_conv(), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())


# every head family the folder supports: name -> () -> (trunk, embedder)
HEADS = {
    "GAP": lambda: (_gap(), torch.nn.Linear(4, 5, device="cuda")),
    "GMP": lambda: (
        torch.nn.Sequential(_conv(), torch.nn.AdaptiveMaxPool2d(1), torch.nn.Flatten()),
        torch.nn.Linear(4, 5, device="cuda"),
    ),
    "HistogramPooling": lambda: (
        torch.nn.Sequential(_conv(), trunks.HistogramPooling(4, 3, device="cuda")),
        torch.nn.Linear(4, 5, device="cuda"),
    ),
    "RetrievalHead (GeM, L2N)": lambda: (_conv(), trunks.RetrievalHead(4, 5, device="cuda")),
    "GAP, Linear, BatchNorm1d": lambda: (
        _gap(),
        torch.nn.Sequential(torch.nn.Linear(4, 5, device="cuda"), torch.nn.BatchNorm1d(5, device="cuda")),
    ),
}


class TestExplainFolding(FakeCudaCase):
    def test_decomposition_maps_through_each_head(self):
        for name, build in HEADS.items():
            with self.subTest(name), fake_cuda():
                dec = explain.ActivationDecomposition(*build())
                q, r = images(2, h=10, w=12), images(2, h=10, w=12)
                folded = dec.fold_query(q)
                self.assert_on_cuda([folded.features, folded.bias], (2, 8, 10, 5))
                maps = dec.overall_maps(q, r, output_size="image")
                self.assert_on_cuda([maps["query"], maps["reference"]], (2, 10, 12))
                self.assert_on_cuda(maps["similarity"], (2,))
                self.assert_on_cuda(dec.point_to_point(q, r), (2, 8, 10, 8, 10))
                self.assert_on_cuda(dec.point_specific(q, r, [(4.0, 5.0), (1.0, 2.0)]), (2, 2, 8, 10))

    def test_partial_similarity_scores(self):
        # search() hands the scores to faiss (host memory): not covered
        with fake_cuda():
            retrieval = explain.PartialSimilarityRetrieval(explain.ActivationDecomposition(*HEADS["GAP"]()))
            ref_emb = torch.randn(6, 5, device="cuda")
            self.assert_on_cuda(retrieval.scores(images(1, h=10, w=12), (0, 0, 6, 5), ref_emb), (6,))
            self.assert_on_cuda(retrieval.scores(images(1, h=10, w=12), (3.0, 4.0), ref_emb), (6,))


if __name__ == "__main__":
    unittest.main()
