"""Dtype matrix (issue 12, item 1): every trunk component, loss and the distillation loss in float32, bfloat16 and
float16, as a pure ``.to(dtype)`` model and under ``torch.autocast``, on CPU and, when one is present, on CUDA
(``benchmarks/gpu_check.py`` runs this file on the GPU machine; TF32 is switched off there so that the float32
reference is float32). The explanation module has its own matrix in ``tests/explain/``.

For each (module, dtype, mode) the outputs and the gradients (parameters and input) must be finite, the same
tensors must receive gradient, and both must agree with float32 on the same inputs (in pure mode the float32
reference sees the inputs rounded to the dtype; models run in train mode, BatchNorm on batch statistics).
Stated tolerances (float16 has an 11-bit, bfloat16 an 8-bit significand):

* every output tensor: ``max|y - y_32| <= TOL[dtype] · max|y_32|``, TOL = {float32: 1e-5, float16: 2e-2,
  bfloat16: 8e-2};
* all gradients together (every parameter's and the first input's, flattened into one vector g):
  ``||g - g_32|| <= GTOL[dtype] · ||g_32||``, GTOL = {float32: 1e-5, float16: 5e-2, bfloat16: 2e-1}. One vector,
  not tensor by tensor: a bias followed by training-mode BatchNorm has a gradient that is exactly 0 in exact
  arithmetic, so its own relative error is meaningless.

Whole torchvision backbones (see ``BACKBONES``) run in eval mode with 4x these tolerances.

Gradients use a fixed random cotangent so they are not trivially zero.
"""

import copy
import unittest

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from pml_extensions.losses import PatchClassificationLoss, ResolutionDistillationLoss, XMLWrapper
from pml_extensions.trunks import (
    ConvNetBody,
    GeMPooling,
    HistogramPooling,
    MarginAugmentedSoftmax,
    PerturbedMaximizer,
    RetrievalHead,
    TemplateMatchingBlock,
    insert_template_matching,
    mobilenet_v2_features,
    soft_maximizer_swap,
)
from pml_extensions.utils.ridge import ridge_prototypes

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MODES = ("pure", "autocast")
TOL = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 8e-2}
GTOL = {torch.float32: 1e-5, torch.float16: 5e-2, torch.bfloat16: 2e-1}


def rand(*shape, seed=0, low=0.0):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) + low


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Stage(torch.nn.Module):
    """Module whose forward returns a dict of named output tensors, for one row of the matrix."""

    def __init__(self, fn, **modules):
        super().__init__()
        self.parts = torch.nn.ModuleDict(modules)
        self.fn = fn

    def forward(self, *inputs):
        return self.fn(self.parts, *inputs)


def tiny_resnet():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=4)
    model.fc = torch.nn.Identity()
    return model


def xml_pipeline(p, images, labels):
    feats = p["body"](images)
    pooled = p["pool"](feats)
    emb = p["head"](pooled)
    loss = p["loss"](emb, labels)
    return {"loss": loss, "histograms": p["pool"].last_histograms}


def template_pipeline(p, images, labels):
    out = p["model"](images)
    block = [m for m in p["model"].modules() if isinstance(m, TemplateMatchingBlock)][0]
    return {"embeddings": out, "aux": PatchClassificationLoss()(block.last_class_scores, labels)}


def distillation(p, student_maps, teacher_maps, image_ids):
    u = p["head"](p["body"](student_maps))
    with torch.no_grad():
        v = p["teacher"](p["body"](teacher_maps))
    return {"loss": ResolutionDistillationLoss()(u, image_ids, ref_emb=v)}


def cases():
    """name -> (build() -> float32 module, inputs() -> tuple (float tensors are cast; integer ones are labels))."""
    torch.manual_seed(0)
    labels8 = torch.arange(4).repeat_interleave(2)
    out = {
        "ConvNetBody": (lambda: ConvNetBody(3, widths=(8, 16), blocks_per_stage=1), lambda: (rand(2, 3, 12, 12),)),
        "GeMPooling": (lambda: GeMPooling(p=3.0), lambda: (rand(2, 4, 5, 5, low=0.1),)),
        "HistogramPooling": (
            lambda: Stage(lambda p, x: {"gap": p["h"](x), "hist": p["h"].last_histograms}, h=HistogramPooling(8, 4)),
            lambda: (randn(2, 8, 3, 3),),
        ),
        "MarginAugmentedSoftmax": (lambda: MarginAugmentedSoftmax(mu=0.5, epsilon=0.5), lambda: (randn(2, 5, 3, 3),)),
        "PerturbedMaximizer": (
            lambda: PerturbedMaximizer(mu=0.5, epsilon=1.0, num_samples=256, seed=0),
            lambda: (randn(2, 5, 3, 3),),
        ),
        "RetrievalHead": (lambda: RetrievalHead(8, 6), lambda: (rand(2, 8, 4, 4),)),
        "TemplateMatchingBlock[bn_relu,add]": (lambda: TemplateMatchingBlock(8, 4), lambda: (randn(2, 8, 6, 6),)),
        "TemplateMatchingBlock[softmax,concat]": (
            lambda: TemplateMatchingBlock(8, 4, mixing="softmax", combine="concat"),
            lambda: (randn(2, 8, 6, 6),),
        ),
        "TemplateMatchingBlock[perturbed,add]": (
            lambda: TemplateMatchingBlock(8, 4, mixing="perturbed", num_samples=64),
            lambda: (randn(2, 8, 6, 6),),
        ),
        "MobileNetV2Features(ImageNet weights)": (
            lambda: mobilenet_v2_features(pretrained=True),
            lambda: (randn(4, 3, 32, 32),),
        ),
        # the resnet18 rows: 2 images (eval mode: the batch size changes no statistic), as half-precision
        # convolutions on the CPU are slow; errors measured at 2 images stay under half of the bounds
        "soft_maximizer_swap(resnet18)": (
            lambda: soft_maximizer_swap(tiny_resnet(), "softmax", mu=0.5, eta=2.0),
            lambda: (rand(2, 3, 32, 32),),
        ),
        "insert_template_matching(resnet18)+PatchClassificationLoss": (
            lambda: Stage(template_pipeline, model=insert_template_matching(tiny_resnet(), num_classes=4)),
            lambda: (rand(2, 3, 32, 32), torch.arange(2)),
        ),
        "PatchClassificationLoss": (
            lambda: Stage(lambda p, s, y: {"loss": PatchClassificationLoss()(s, y)}),
            lambda: (randn(4, 5, 3, 3), torch.tensor([0, 1, 4, 2])),
        ),
        "ridge_prototypes": (
            lambda: Stage(lambda p, h, y: {"v": ridge_prototypes(h.softmax(dim=1), y, 0.05)}),
            lambda: (randn(8, 6), randn(8, 4, seed=1)),
        ),
        "HistogramPooling+XMLWrapper(ContrastiveLoss)": (
            lambda: Stage(
                xml_pipeline,
                body=ConvNetBody(3, widths=(8, 8), blocks_per_stage=1),
                pool=(pool := HistogramPooling(8, 4)),
                head=torch.nn.Linear(8, 6),
                loss=XMLWrapper(pml_losses.ContrastiveLoss(), xml_weight=1.0, histogram_layer=pool, seed=0),
            ),
            lambda: (rand(8, 3, 12, 12), labels8),
        ),
        "XMLWrapper(ProxyAnchorLoss)": (
            lambda: Stage(
                lambda p, e, h, y: {"loss": p["loss"](e, y, histograms=h.softmax(dim=1))},
                loss=XMLWrapper(pml_losses.ProxyAnchorLoss(4, 6), xml_weight=1.0, seed=0),
            ),
            lambda: (randn(8, 6), randn(8, 5, seed=1), labels8),
        ),
        "ResolutionDistillationLoss": (
            lambda: Stage(
                lambda p, u, v, y: {"loss": ResolutionDistillationLoss()(p["n"](u), y, ref_emb=p["n"](v))},
                n=torch.nn.Identity(),
            ),
            lambda: (
                torch.nn.functional.normalize(randn(8, 6), dim=1),
                torch.nn.functional.normalize(randn(8, 6, seed=1), dim=1),
                labels8,
            ),
        ),
        "distillation(student RetrievalHead, frozen teacher)": (
            lambda: Stage(
                distillation,
                body=ConvNetBody(3, widths=(8, 8), blocks_per_stage=1),
                head=RetrievalHead(8, 6),
                teacher=RetrievalHead(8, 6).requires_grad_(False),
            ),
            lambda: (rand(8, 3, 8, 8), rand(8, 3, 12, 12, seed=1), labels8),
        ),
    }
    return out


# Whole torchvision backbones (17-52 layers) around our blocks run in eval mode with a 4x looser tolerance.
# Eval mode: randomly initialised, with training-mode BatchNorm over a 4-image batch of 2 x 2 maps they are
# ill-conditioned in float32 itself (random MobileNetV2, 64 px: float32 and float64 gradients differ by 1.7e-2),
# so the comparison would measure the backbone, not our code. MobileNetV2 uses its ImageNet weights (offline
# package, installed by tox): randomly initialised, its eval-mode activations decay to 1e-9 and underflow in
# float16. Looser: in eval mode float32 agrees with float64 to 1e-6, but torchvision's own layers in half precision
# (ReLU6 saturation, depthwise convs) put MobileNetV2's gradient 0.24 (bfloat16) and 0.09 (float16) from float32
# (relative L2, 32 px, 4 images); the bound still catches NaN/inf, zeros and dropped gradients.
BACKBONES = {
    "MobileNetV2Features(ImageNet weights)",
    "soft_maximizer_swap(resnet18)",
    "insert_template_matching(resnet18)+PatchClassificationLoss",
}
BACKBONE_FACTOR = 4


def as_dict(out):
    return out if isinstance(out, dict) else {"out": out}


def run(model, inputs, dtype, mode, train=True, device="cpu"):
    """Forward + backward with a fixed cotangent; returns (outputs, grads) as float32 CPU dicts."""
    model = copy.deepcopy(model).to(device)
    model.train(train)
    cast = dtype if mode == "pure" else torch.float32
    if mode == "pure":
        model = model.to(dtype)
    xs = [
        x.detach().to(device, cast).clone().requires_grad_(True) if x.is_floating_point() else x.to(device)
        for x in inputs
    ]
    with torch.autocast(torch.device(device).type, dtype=dtype, enabled=mode == "autocast"):
        outs = as_dict(model(*xs))
    total = 0
    for i, (_, o) in enumerate(sorted(outs.items())):
        if o.requires_grad:
            w = (randn(*o.shape, seed=100 + i) if o.ndim else torch.tensor(1.0)).to(o.device)
            total = total + (o.float() * w).sum()
    total.backward()
    grads = {f"grad:{n}": p.grad for n, p in model.named_parameters() if p.grad is not None}
    if xs[0].is_floating_point() and xs[0].grad is not None:
        grads["grad:input"] = xs[0].grad
    return (
        {k: v.detach().float().cpu() for k, v in outs.items()},
        {k: v.float().cpu() for k, v in grads.items()},
    )


def gradient_error(grads, ref):
    """||g - g_32|| / ||g_32|| over all gradient tensors flattened into one vector."""
    keys = sorted(ref)
    g = torch.cat([grads[k].flatten().double() for k in keys])
    r = torch.cat([ref[k].flatten().double() for k in keys])
    return float((g - r).norm() / r.norm()) if float(r.norm()) > 0 else float(g.norm())


def relative_error(x, ref):
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    err = float((x - ref).abs().max()) if ref.numel() else 0.0
    return err / scale if scale > 0 else err


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # the reference is float32 on the same device


class TestDtypeMatrix(unittest.TestCase):
    @pytest.mark.slow  # over 3 s on 2 cores: tox runs it, -m 'not slow' leaves it out
    def test_every_module_every_dtype_pure_and_autocast(self):
        for device in DEVICES:
            if device == "cuda":
                tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
                try:
                    self._matrix(device)
                finally:
                    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
            else:
                self._matrix(device)

    def _matrix(self, device):
        for name, (build, make_inputs) in cases().items():
            train, factor = (False, BACKBONE_FACTOR) if name in BACKBONES else (True, 1)
            torch.manual_seed(0)
            model32 = build()
            inputs = make_inputs()
            # the float32 references, one per input rounding: the inputs as given serve autocast and float32 (whose
            # rounding is the identity); pure bfloat16 / float16 see the inputs rounded to their dtype
            refs = {}
            for dtype in DTYPES:
                for mode in MODES:
                    if dtype == torch.float32 and mode == "autocast":
                        continue  # autocast to float32 is not a mode
                    with self.subTest(module=name, dtype=str(dtype), mode=mode, device=device):
                        key = dtype if mode == "pure" and dtype != torch.float32 else None
                        if key not in refs:
                            rounded = [x.to(dtype).float() if x.is_floating_point() else x for x in inputs]
                            ref_in = rounded if mode == "pure" else inputs
                            refs[key] = run(model32, ref_in, torch.float32, "pure", train, device)
                        ref_out, ref_grad = refs[key]
                        out, grad = run(model32, inputs, dtype, mode, train, device)
                        self.assertEqual(set(out), set(ref_out))
                        self.assertEqual(set(grad), set(ref_grad), "the same tensors must receive gradient")
                        for key, value in list(out.items()) + list(grad.items()):
                            self.assertTrue(bool(torch.isfinite(value).all()), f"{key} not finite")
                        for key in sorted(ref_out):
                            err = relative_error(out[key], ref_out[key])
                            self.assertLessEqual(err, factor * TOL[dtype], f"{key}: relative error {err:.2e}")
                        err = gradient_error(grad, ref_grad)
                        self.assertLessEqual(err, factor * GTOL[dtype], f"gradients: relative L2 error {err:.2e}")


if __name__ == "__main__":
    unittest.main()
