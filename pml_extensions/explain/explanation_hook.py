"""End-of-testing hook that explains the top-k retrievals of a PML tester.

Maps: Zhu et al., "Visual Explanation for Deep Metric Learning", IEEE TIP 2021 (overall maps "Decomposition"
    and
"Decomposition+Bias", point-specific maps, weakly supervised localisation, Sec. III and VI-A). Hook protocol:
PML's ``BaseTester(end_of_testing_hook=...)`` calls ``hook(tester)`` after computing accuracies, while
``tester.embeddings_and_labels`` still holds the embeddings; PML's ``HookContainer.end_of_testing_hook`` is
chained first, so accuracies are still recorded.
"""

import os
from typing import Dict, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as nnf
from torch import nn

from .activation_decomposition import ActivationDecomposition
from .localization_evaluator import LocalizationEvaluator
from .overlay import save_pair_overlay, save_tensors, to_display_image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ExplanationHook:
    """Save explanation maps for ``n_queries`` queries and their top-``k`` retrievals after each test.

    For every chosen query of ``split_name`` the top-``k`` references (cosine similarity of the tester's
    embeddings, faiss; the query itself excluded when the reference split is the query split) are explained
    with :class:`ActivationDecomposition`: "Decomposition" and "Decomposition+Bias" overall maps on both
    images (signed, ``scale="cosine"``) and one point-specific map per pair, for the query pixel at the
    maximum of the first pair's query map. Written to ``output_dir``:
    ``{split}_epoch{epoch}_query{index}.png`` (query | retrieved | maps) and ``….pt`` (the tensors) when
    enabled. When ground-truth boxes exist (``boxes[split]`` or ``dataset.boxes``, ``(x0, y0, x1, y1)``
    pixels), the localisation accuracy of the queries' Decomposition maps (top-1 pair; best threshold of
    :class:`LocalizationEvaluator`) is logged through the record keeper under ``explanations_{split}``.

    Args:
        trunk, embedder, layer: the tested models (PML ``models["trunk"]``/``models["embedder"]``).
        dataset_dict: ``{split: dataset}``, the tester's datasets; items ``(image tensor [3, H, W], label)``.
        output_dir: folder for PNGs and tensors.
        hook_container: a PML ``HookContainer`` whose ``end_of_testing_hook`` runs first; its
            ``record_keeper`` is used unless ``record_keeper`` is given.
        split_name: query split. Default: the first split of ``tester.embeddings_and_labels``.
        reference_split_name: reference split. Default: ``split_name``.
        n_queries: queries per call, chosen with ``seed`` (the same ones every epoch). Default 4.
        k: retrievals per query. Default 3.
        mean, std: de-normalisation for display. Default: ImageNet.
        save_png, save_tensors: what to write. Default both.
        boxes: optional ``{split: [N, 4]}`` ground-truth boxes.
        decomposition: use this :class:`ActivationDecomposition` instead of building one from trunk/embedder.

    The models run in eval mode inside the call and get their flags back; no forward or backward hook remains
    on any module afterwards, also after an exception; nothing accumulates between calls.

    Raises:
        ValueError: ``k``/``n_queries`` < 1; at call time, a missing split, ``k`` larger than the reference
            set, items that are not image tensors.
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
        record_keeper=None,
        split_name: Optional[str] = None,
        reference_split_name: Optional[str] = None,
        n_queries: int = 4,
        k: int = 3,
        mean: Optional[Sequence[float]] = IMAGENET_MEAN,
        std: Optional[Sequence[float]] = IMAGENET_STD,
        save_png: bool = True,
        save_tensors: bool = True,
        boxes: Optional[Mapping[str, np.ndarray]] = None,
        seed: int = 0,
        decomposition: Optional[ActivationDecomposition] = None,
    ):
        for name, v in (("k", k), ("n_queries", n_queries)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
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
        self.record_keeper = (
            record_keeper if record_keeper is not None else getattr(hook_container, "record_keeper", None)
        )
        self.split_name, self.reference_split_name = split_name, reference_split_name
        self.n_queries, self.k, self.seed = n_queries, k, int(seed)
        self.mean, self.std = mean, std
        self.save_png, self.save_tensors = bool(save_png), bool(save_tensors)
        self.boxes = dict(boxes) if boxes is not None else {}
        self.evaluator = LocalizationEvaluator()
        self.last_localization: Optional[Dict[str, float]] = None

    # PML calls ``end_of_testing_hook(tester)``
    def __call__(self, tester) -> None:
        self.end_of_testing_hook(tester)

    def end_of_testing_hook(self, tester) -> None:
        if self.hook_container is not None:
            self.hook_container.end_of_testing_hook(tester)
        self.explain(tester)

    def _image(self, split: str, index: int) -> torch.Tensor:
        item = self.dataset_dict[split][int(index)]
        image = item[0] if isinstance(item, (tuple, list)) else item
        if not torch.is_tensor(image) or image.ndim != 3:
            raise ValueError(
                f"dataset {split!r} must return image tensors [3, H, W] (set its transform), got "
                f"{type(image).__name__}"
            )
        return image

    def _topk(self, query_emb, ref_emb, exclude: Optional[np.ndarray]):
        import faiss

        k_avail = ref_emb.shape[0] - (1 if exclude is not None else 0)
        if self.k > k_avail:
            raise ValueError(f"k={self.k} is larger than the reference set ({k_avail} candidates)")
        db = nnf.normalize(ref_emb.detach().to("cpu", torch.float32), dim=1).numpy()
        q = nnf.normalize(query_emb.detach().to("cpu", torch.float32), dim=1).numpy()
        index = faiss.IndexFlatIP(db.shape[1])
        index.add(np.ascontiguousarray(db))
        extra = 1 if exclude is not None else 0
        _, idx = index.search(np.ascontiguousarray(q), self.k + extra)
        out = []
        for row, qi in zip(idx, exclude if exclude is not None else [None] * len(idx)):
            row = [int(j) for j in row if j >= 0 and (qi is None or j != qi)]
            out.append(row[: self.k])
        return out

    def explain(self, tester) -> Optional[Dict[str, float]]:
        """Compute and save the maps for ``tester`` (called by the hook; usable directly)."""
        data = getattr(tester, "embeddings_and_labels", None)
        if not data:
            raise ValueError(
                "tester.embeddings_and_labels is missing: call the hook from a PML tester's test()"
            )
        split = self.split_name or next(iter(data))
        ref_split = self.reference_split_name or split
        for s in (split, ref_split):
            if s not in data:
                raise ValueError(f"split {s!r} not in the tester's embeddings ({sorted(data)})")
            if s not in self.dataset_dict:
                raise ValueError(f"split {s!r} not in dataset_dict ({sorted(self.dataset_dict)})")
        epoch = int(getattr(tester, "all_accuracies", {}).get(split, {}).get("epoch", 0))
        q_emb = torch.as_tensor(data[split][0])
        r_emb = torch.as_tensor(data[ref_split][0])
        gen = torch.Generator().manual_seed(self.seed)
        queries = torch.randperm(q_emb.shape[0], generator=gen)[: self.n_queries].sort().values.numpy()
        same = ref_split == split
        neighbours = self._topk(q_emb[queries], r_emb, queries if same else None)
        boxes = self.boxes.get(split, getattr(self.dataset_dict[split], "boxes", None))
        dec = self.decomposition
        loc_maps, loc_boxes, loc_sizes = [], [], []
        for qi, refs in zip(queries, neighbours):
            q_img = self._image(split, qi)
            r_imgs = torch.stack([self._image(ref_split, j) for j in refs])
            fq = dec.fold_query(q_img[None])
            fr = dec.fold_reference(r_imgs)
            plain = dec.overall_maps(fq, fr)
            with_bias = dec.overall_maps(fq, fr, bias=True)
            h, w = fq.feature_size
            H, W = fq.image_size
            i, j = divmod(int(torch.argmax(plain["query"][0])), w)
            point = (
                (i + 0.5) * H / h - 0.5,
                (j + 0.5) * W / w - 0.5,
            )  # the centre of that feature cell, in pixels
            pmaps = dec.point_specific(fq, fr, [point])[:, 0]
            stem = os.path.join(self.output_dir, f"{split}_epoch{epoch}_query{int(qi)}")
            if self.save_tensors:
                save_tensors(
                    stem + ".pt",
                    {
                        "query_index": int(qi),
                        "reference_indices": torch.tensor(refs),
                        "similarity": plain["similarity"].cpu(),
                        "decomposition_query": plain["query"].cpu(),
                        "decomposition_reference": plain["reference"].cpu(),
                        "decomposition_bias_query": with_bias["query"].cpu(),
                        "decomposition_bias_reference": with_bias["reference"].cpu(),
                        "point": torch.tensor(point),
                        "point_specific": pmaps.cpu(),
                    },
                )
            if self.save_png:
                qd = to_display_image(q_img, self.mean, self.std)
                rds = [to_display_image(r, self.mean, self.std) for r in r_imgs]
                panels = [
                    [
                        ("Decomposition (query)", "query", plain["query"][n], None),
                        ("Decomposition+Bias (query)", "query", with_bias["query"][n], None),
                        ("Decomposition (retrieved)", "reference", plain["reference"][n], None),
                        ("Decomposition+Bias (retr.)", "reference", with_bias["reference"][n], None),
                        ("point-specific (retr.)", "reference", pmaps[n], None),
                    ]
                    for n in range(len(refs))
                ]
                panels[0][0] = ("Decomposition (query) + point", "query", plain["query"][0], point)
                sims = ", ".join(f"{s:.3f}" for s in plain["similarity"].tolist())
                save_pair_overlay(
                    stem + ".png", qd, rds, panels, title=f"{split} query {int(qi)}, cosine: {sims}"
                )
            if boxes is not None:
                loc_maps.append(plain["query"][0].detach().cpu())
                loc_boxes.append(np.asarray(boxes[qi]))
                loc_sizes.append((H, W))
            del fq, fr, plain, with_bias, pmaps
        self.last_localization = None
        if loc_maps:
            res = self.evaluator.evaluate(loc_maps, loc_boxes, loc_sizes)
            self.last_localization = {
                "localization_accuracy": res["best_accuracy"],
                "localization_threshold": res["best_threshold"],
            }
            if self.record_keeper is not None:
                self.record_keeper.update_records(
                    dict(self.last_localization), epoch, parent_name=f"explanations_{split}"
                )
        return self.last_localization
