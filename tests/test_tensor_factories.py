"""Every tensor factory call passes a device (issue 22, item 4).

An AST scan of the package: each call ``torch.<factory>(...)`` with a factory in :data:`FACTORIES` must pass
``device=`` (a ``**kwargs`` expansion counts: it carries the factory arguments) or be listed in :data:`CPU_ONLY` with
the reason it is meant to live on the CPU. A factory without a device makes a CPU tensor also when the model runs on
CUDA, which then fails with a device mismatch, or silently runs on the CPU. ``*_like`` factories and
``tensor.new_*`` take their template's device and are not listed; ``torch.from_numpy`` has no device argument (its
tensors are host tensors by definition).

The scan is parametrised by package room: the library rooms, the runner and the command line (``benchmarks/`` is left
out: its scripts are being rewritten, and they run one measured step on a device they choose). A listed call that no
longer exists fails the test too, so the list cannot go stale.
"""

import ast
import os

import pytest

import pml_extensions

PKG = os.path.dirname(os.path.abspath(pml_extensions.__file__))
REPO = os.path.dirname(PKG)
FACTORIES = frozenset(
    {"arange", "zeros", "ones", "full", "eye", "empty", "empty_strided", "tensor", "as_tensor", "linspace"}
    | {"logspace", "rand", "randn", "randint", "randperm", "normal"}
)
#: package rooms scanned (paths relative to the repository root)
ROOMS = (
    "pml_extensions/trunks",
    "pml_extensions/losses",
    "pml_extensions/trainers",
    "pml_extensions/testers",
    "pml_extensions/datasets",
    "pml_extensions/explain",
    "pml_extensions/utils",
    "pml_extensions/knn",
    "pml_extensions/runner",
    "pml_extensions/cli",
)

_DATA = "dataset items, collate and sampler: host tensors, moved to the data device by the trainer (pinned on CUDA)"
_FAISS = "host-side bookkeeping of faiss neighbours and of the files written to disk"
_POINTS = "a few (y, x) points: weights built on the host in float64, moved to `device` at the end"
_ROI = "the region of interest as a host mask (from numpy or a tensor); the weights are moved to `device` at the end"
_TOPK = "neighbour and query indices select dataset items (host indexing)"
_PLOT = "figure drawing: as_tensor keeps a tensor's own device (numpy maps are host arrays); only scalars are read back"
#: "file (under the repository root)::enclosing function::factory" -> why that tensor is meant to be on the CPU
CPU_ONLY = {
    "pml_extensions/trainers/resolution_distillation_trainer.py::ResolutionDistillationTrainer.initialize_dataloader"
    "::randint": "the DataLoader's base seed when the dataset has none, from the global CPU RNG as PML's loader",
    "pml_extensions/datasets/coupled_augmentation_dataset.py::CoupledAugmentationDataset.__getitem__::tensor": _DATA,
    "pml_extensions/datasets/coupled_augmentation_dataset.py::CoupledAugmentationDataset.collate::tensor": _DATA,
    "pml_extensions/explain/explanation_hook.py::ExplanationHook.explain::as_tensor": _FAISS,
    "pml_extensions/explain/explanation_hook.py::_labels::as_tensor": "the tester's labels arrive as a CPU numpy array",
    "pml_extensions/explain/overlay.py::bias_difference::as_tensor": _PLOT,
    "pml_extensions/explain/overlay.py::explanation_panels::as_tensor": _PLOT,
    "pml_extensions/explain/explanation_hook.py::ExplanationHook.explain::tensor": _FAISS,
    "pml_extensions/explain/fidelity.py::SimilarityFidelity.curves::as_tensor": (
        "maps may come as numpy arrays; they are moved to the images' device before use"
    ),
    "pml_extensions/explain/fidelity.py::SimilarityFidelity.curves::tensor": (
        "the step fractions of the curves, which are returned on the CPU"
    ),
    "pml_extensions/explain/localization_evaluator.py::LocalizationEvaluator.resized_map::as_tensor": (
        "localisation is scored on the CPU in float64 (boxes and thresholds are host values)"
    ),
    "pml_extensions/explain/map_utils.py::point_weights::as_tensor": _POINTS,
    "pml_extensions/explain/map_utils.py::point_weights::zeros": _POINTS,
    "pml_extensions/explain/map_utils.py::point_weights::arange": _POINTS,
    "pml_extensions/explain/orientation_estimator.py::OrientationEstimator.estimate::tensor": (
        "per-pair angles and points gathered from Python numbers"
    ),
    "pml_extensions/explain/overlay.py::pair_figure.on_image::as_tensor": "pictures are drawn by matplotlib from numpy",
    "pml_extensions/explain/partial_similarity_retrieval.py::PartialSimilarityRetrieval.roi_weights::as_tensor": _ROI,
    "pml_extensions/explain/partial_similarity_retrieval.py::PartialSimilarityRetrieval.roi_weights::zeros": _ROI,
    "pml_extensions/explain/topk_maps.py::topk_overall_maps::as_tensor": _TOPK,
    "pml_extensions/explain/topk_maps.py::topk_overall_maps::arange": _TOPK,
    "pml_extensions/knn/metrics.py::EngineAccuracyMixin.get_accuracy::as_tensor": (
        "reads only the input's device (a tensor keeps its own)"
    ),
    "pml_extensions/runner/objects/data.py::Subset.__getitem__::as_tensor": _DATA + " (a hierarchical label row)",
    "pml_extensions/runner/objects/saved_models.py::models_from_config::zeros": (
        "a dummy image for the Builder's shape inference, on the CPU where the models are built (weights are loaded "
        "on the CPU and moved by the caller)"
    ),
}


class _Scanner(ast.NodeVisitor):
    def __init__(self):
        self.scope, self.calls = [], []

    def _enter(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _enter

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch":
            if f.attr in FACTORIES:
                has_device = any(k.arg == "device" or k.arg is None for k in node.keywords)
                self.calls.append((".".join(self.scope) or "<module>", f.attr, node.lineno, has_device))
        self.generic_visit(node)


def factory_calls(path):
    """``(enclosing function, factory, line, passes a device)`` for every ``torch.<factory>(...)`` call in a file."""
    scanner = _Scanner()
    with open(path, encoding="utf-8") as f:
        scanner.visit(ast.parse(f.read(), path))
    return scanner.calls


def without_device(root):
    """``{"file::function::factory": [lines]}`` of the calls without a device under ``root`` (repository-relative)."""
    out = {}
    for dirpath, _, files in os.walk(os.path.join(REPO, root)):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, REPO).replace(os.sep, "/")
                for func, factory, line, has_device in factory_calls(path):
                    if not has_device:
                        out.setdefault(f"{rel}::{func}::{factory}", []).append(line)
    return out


def test_the_scanner_sees_calls_and_their_devices(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import torch\n"
        "class A:\n"
        "    def f(self, x, fk):\n"
        "        a = torch.zeros(3)\n"
        "        b = torch.arange(3, device=x.device)\n"
        "        c = torch.randn(2, **fk)\n"
        "        d = torch.zeros_like(x)\n"
        "        return torch.tensor([1.0], dtype=x.dtype)\n"
        "e = torch.linspace(0, 1, 5)\n"
    )
    assert factory_calls(str(probe)) == [
        ("A.f", "zeros", 4, False),
        ("A.f", "arange", 5, True),
        ("A.f", "randn", 6, True),
        ("A.f", "tensor", 8, False),
        ("<module>", "linspace", 9, False),
    ]


@pytest.mark.parametrize("room", ROOMS)
def test_every_factory_call_passes_a_device_or_is_listed_cpu_only(room):
    found = without_device(room)
    unlisted = sorted(f"{key} (lines {lines})" for key, lines in found.items() if key not in CPU_ONLY)
    assert unlisted == [], "pass device= (or list the call in CPU_ONLY with a reason):\n" + "\n".join(unlisted)
    stale = sorted(key for key in CPU_ONLY if key.startswith(room + "/") and key not in found)
    assert stale == [], "CPU_ONLY lists calls that no longer exist (remove them):\n" + "\n".join(stale)


def test_every_listed_call_has_a_reason():
    assert all(isinstance(why, str) and len(why) > 20 for why in CPU_ONLY.values())
    assert all(any(key.startswith(room + "/") for room in ROOMS) for key in CPU_ONLY)
