"""End-of-testing hook that explains the top-k retrievals of a PML tester (Zhu et al., IEEE TIP 2021, Sec. III and
VI-A); docs/explain.md."""

import os
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as nnf
from torch import nn

from ..datasets.normalization import IMAGENET_MEAN, IMAGENET_STD
from ..utils.atomic_io import atomic_torch_save
from ..utils.checks import is_int
from .activation_decomposition import ActivationDecomposition
from .localization_evaluator import LocalizationEvaluator
from .topk_maps import dataset_image, explain_retrieval, inner_product_search, model_device, topk_overall_maps


class ExplanationHook:
    """Save explanation maps for ``n_queries`` queries and their top-``k`` retrievals after each test.

    Each chosen query of ``split_name`` is explained against its top-``k`` references (cosine of the tester's
    embeddings, faiss; the query itself excluded when both splits are one) by :func:`topk_overall_maps` (signed
    "Decomposition" and "Decomposition+Bias" maps, ``scale="cosine"``, kept on the CPU in ``last_maps``) plus one
    point-specific map per pair at the maximum of the first pair's query map. Written to ``output_dir``:
    ``{split}_epoch{epoch}_query{index}.png`` (:func:`explain_retrieval`: one figure, a row per retrieval) and ``….pt``
    (all maps). With ground-truth boxes (``boxes[split]`` or ``dataset.boxes``, ``(x0, y0, x1, y1)`` pixels) the
    localisation accuracy of the top-1 Decomposition maps (:class:`LocalizationEvaluator`, best threshold) is logged
    through the record keeper under ``explanations_{split}``.

    Args:
        trunk, embedder, layer: the tested models; or ``decomposition``: an :class:`ActivationDecomposition`.
        dataset_dict: ``{split: dataset}``, items ``(image tensor [3, H, W], label)``; output_dir: PNG/tensor folder.
        hook_container: a PML ``HookContainer`` whose ``end_of_testing_hook`` runs first (its ``record_keeper`` logs
            the localisation accuracy).
        split_name: the split of the queries and their references (default: the tester's first).
        n_queries: queries per call, the same every epoch (``seed``); ``None``: every query (set ``save_png=False``).
            Default 4. k: retrievals per query. Default 3.
        mean, std: de-normalisation for display. Default ``"auto"``: ImageNet for 3 channels, min–max for one.
        batch_size: queries folded per batch. Default 16. device: where the models run (default: the trunk's).
        save_png, save_tensors: what to write. Default both. boxes: optional ``{split: [N, 4]}``.
        epoch: the epoch named in files and records. Default: the tester's.
        class_names: ``label -> name`` in the figures. Default: the split dataset's (or its wrapped one's)
            ``classes``, else the label.

    Models run in eval mode and get their flags back; no hook remains afterwards, also after an exception.

    Raises:
        ValueError: ``k``/``n_queries`` < 1; at call time, a missing split, ``k`` larger than the reference set,
            items that are not image tensors.
    """

    def __init__(
        self,
        trunk: Optional[nn.Module] = None,
        embedder: Optional[nn.Module] = None,
        dataset_dict: Optional[Mapping] = None,
        output_dir: str = "explanations",
        *,
        layer=None,
        hook_container=None,
        split_name: Optional[str] = None,
        n_queries: Optional[int] = 4,
        k: int = 3,
        mean="auto",
        std="auto",
        save_png: bool = True,
        save_tensors: bool = True,
        boxes: Optional[Mapping[str, np.ndarray]] = None,
        seed: int = 0,
        decomposition: Optional[ActivationDecomposition] = None,
        batch_size: int = 16,
        device=None,
        epoch: Optional[int] = None,
        class_names: Optional[Sequence[str]] = None,
    ):
        for name, v in (("k", k), ("n_queries", 1 if n_queries is None else n_queries), ("batch_size", batch_size)):
            if not is_int(v) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if decomposition is None:
            if trunk is None:
                raise ValueError("pass trunk (and embedder) or decomposition")
            decomposition = ActivationDecomposition(trunk, embedder, layer)
        if dataset_dict is None or not isinstance(dataset_dict, Mapping):
            raise ValueError("dataset_dict must be a mapping {split_name: dataset}")
        self.decomposition = decomposition
        self.dataset_dict = dataset_dict
        self.output_dir = output_dir
        self.hook_container = hook_container
        self.record_keeper = getattr(hook_container, "record_keeper", None)
        self.split_name = split_name
        self.n_queries, self.k, self.seed = n_queries, k, int(seed)
        self.mean, self.std = mean, std
        self.batch_size, self.device = batch_size, device
        self.last_maps: Optional[Dict[str, torch.Tensor]] = None
        self.save_png, self.save_tensors = bool(save_png), bool(save_tensors)
        self.boxes = dict(boxes) if boxes is not None else {}
        self.evaluator = LocalizationEvaluator()
        self.last_localization: Optional[Dict[str, float]] = None
        self.epoch = None if epoch is None else int(epoch)
        self.class_names = list(class_names) if class_names is not None else None

    def _names(self, split: str) -> Optional[List[str]]:
        return self.class_names if self.class_names is not None else dataset_class_names(self.dataset_dict[split])

    def end_of_testing_hook(self, tester) -> None:
        """What PML's tester calls after testing: the hook container's hook, then :meth:`explain`."""
        if self.hook_container is not None:
            self.hook_container.end_of_testing_hook(tester)
        self.explain(tester)

    __call__ = end_of_testing_hook

    def _topk(self, emb: torch.Tensor, queries: np.ndarray):
        if self.k > emb.shape[0] - 1:
            raise ValueError(f"k={self.k} is larger than the reference set ({emb.shape[0] - 1} candidates)")
        q = nnf.normalize(emb[queries].detach().to("cpu", torch.float32), dim=1)
        _, idx = inner_product_search(q, emb, self.k + 1)
        return [[int(j) for j in row if j >= 0 and j != qi][: self.k] for row, qi in zip(idx, queries)]

    def explain(self, tester) -> Optional[Dict[str, float]]:
        """Compute and save the maps for ``tester`` (called by the hook; usable directly)."""
        data = getattr(tester, "embeddings_and_labels", None)
        if not data:
            raise ValueError("tester.embeddings_and_labels is missing: call the hook from a PML tester's test()")
        split = self.split_name or next(iter(data))
        if split not in data:
            raise ValueError(f"split {split!r} not in the tester's embeddings ({sorted(data)})")
        if split not in self.dataset_dict:
            raise ValueError(f"split {split!r} not in dataset_dict ({sorted(self.dataset_dict)})")
        epoch = self.epoch
        if epoch is None:
            epoch = int(getattr(tester, "all_accuracies", {}).get(split, {}).get("epoch", 0))
        emb, labels = torch.as_tensor(data[split][0]), _labels(data[split])
        gen = torch.Generator().manual_seed(self.seed)  # n_queries=None: every query, in order
        queries = torch.randperm(emb.shape[0], generator=gen, device=gen.device)[: self.n_queries].sort().values.numpy()
        neighbours = self._topk(emb, queries)
        dec, ds = self.decomposition, self.dataset_dict[split]
        boxes = self.boxes.get(split, getattr(ds, "boxes", None))
        nb = torch.as_tensor(neighbours, dtype=torch.long)
        allmaps = topk_overall_maps(
            dec, ds, ds, nb, query_indices=queries, batch_size=self.batch_size, device=self.device
        )
        self.last_maps = {"query_indices": torch.as_tensor(queries), "reference_indices": nb, **allmaps}
        sizes = []
        text = None if labels is None else (lambda i: _label_text(labels[int(i)], self._names(split)))
        device = self.device if self.device is not None else model_device(dec)
        for n, (qi, refs) in enumerate(zip(queries, neighbours)):
            q_img = dataset_image(ds, qi, f"dataset {split!r}")
            sizes.append(tuple(q_img.shape[-2:]))
            if not (self.save_png or self.save_tensors):
                continue
            mean, std = self.mean, self.std
            if isinstance(mean, str) and mean == "auto":
                mean, std = (IMAGENET_MEAN, IMAGENET_STD) if q_img.shape[0] == 3 else (None, None)
            stem = os.path.join(self.output_dir, f"{split}_epoch{epoch}_query{int(qi)}")
            rows = explain_retrieval(
                dec,
                q_img.to(device),
                [dataset_image(ds, j, f"dataset {split!r}").to(device) for j in refs],
                stem + ".png",
                titles=f"{split} query {int(qi)} (itself left out of its references)",
                maps={key: allmaps[key][n] for key in allmaps},
                stats=(mean, std),
                reference_labels=None if text is None else [text(j) for j in refs],
                same_class=None
                if labels is None
                else [bool(torch.equal(labels[int(qi)], labels[int(j)])) for j in refs],
                query_label=None if text is None else text(qi),
                reference_name="retrieved",
                save_png=self.save_png,
            )
            if self.save_tensors:
                atomic_torch_save(
                    {
                        "query_index": int(qi),
                        "reference_indices": torch.tensor(refs),
                        "similarity": allmaps["similarity"][n],
                        "decomposition_query": allmaps["query"][n],
                        "decomposition_reference": allmaps["reference"][n],
                        "decomposition_bias_query": allmaps["query_bias"][n],
                        "decomposition_bias_reference": allmaps["reference_bias"][n],
                        "point": torch.tensor(rows[0]["point"]),
                        "point_specific": torch.stack([row["maps"]["point_specific"] for row in rows]).cpu(),
                    },
                    stem + ".pt",
                )
            del rows
        self.last_localization = None
        if boxes is not None:
            res = self.evaluator.evaluate(allmaps["query"][:, 0], [np.asarray(boxes[qi]) for qi in queries], sizes)
            self.last_localization = {
                "localization_accuracy": res["best_accuracy"],
                "localization_threshold": res["best_threshold"],
            }
            if self.record_keeper is not None:
                self.record_keeper.update_records(
                    dict(self.last_localization), epoch, parent_name=f"explanations_{split}"
                )
        return self.last_localization


def _labels(embeddings_and_labels) -> Optional[torch.Tensor]:
    if len(embeddings_and_labels) < 2 or embeddings_and_labels[1] is None:
        return None
    return torch.as_tensor(np.asarray(embeddings_and_labels[1]))


def _label_text(label: torch.Tensor, names: Optional[Sequence[str]] = None) -> str:
    values = label.flatten().tolist()
    if len(values) == 1 and names is not None and 0 <= int(values[0]) < len(names):
        return str(names[int(values[0])])
    return str(values[0]) if len(values) == 1 else str(values)


def dataset_class_names(dataset) -> Optional[List[str]]:
    """``classes`` of ``dataset`` or of the dataset it wraps (``.dataset``, a few levels), None when none has them."""
    for _ in range(4):
        names = getattr(dataset, "classes", None)
        if isinstance(names, (list, tuple)) and names:
            return [str(n) for n in names]
        dataset = getattr(dataset, "dataset", None)
        if dataset is None:
            return None
    return None
