"""Retrieval examples for the report (docs/report.md): a few seeded test queries with their top-k neighbours by
cosine similarity, as small PNG thumbnails and ``retrieval/<name>.json`` (:func:`save_retrieval_examples`).
"""

import os
import re
import shutil
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from ...utils.atomic_io import atomic_path, atomic_write_json
from ...utils.checks import is_int

FOLDER = "retrieval"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def dataset_image(dataset, index: int):
    """Item ``index`` of ``dataset`` as an RGB PIL image, before the eval transform where a view (``.dataset`` +
    ``.indices``) leads to it; a tensor or array (``[C, H, W]`` or ``[H, W]``) min-max scaled; else ``TypeError``."""
    from PIL import Image

    getter = None
    while hasattr(dataset, "dataset") and hasattr(dataset, "indices"):
        getter = getattr(dataset, "getter", None) or getter
        index = int(dataset.indices[index])
        dataset = dataset.dataset
    item = dataset[index]
    image = getter(item)[0] if getter is not None else (item[0] if isinstance(item, (tuple, list)) else item)
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, torch.Tensor):
        image = image.detach().float().cpu().numpy()
    if not isinstance(image, np.ndarray):
        raise TypeError(f"dataset item {index}: expected a PIL image, tensor or array as the image, got {type(image)}")
    array = image.astype(np.float64)
    if array.ndim == 3 and array.shape[0] in (1, 3):
        array = array.transpose(1, 2, 0)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    low, high = float(array.min()), float(array.max())
    array = (array - low) / (high - low) if high > low else np.zeros_like(array)
    return Image.fromarray((array * 255).round().astype(np.uint8)).convert("RGB")


@torch.no_grad()
def embed(trunk: torch.nn.Module, embedder: torch.nn.Module, dataset, device, batch_size: int = 64) -> torch.Tensor:
    """``[N, D]`` float32 embeddings of ``dataset``'s images (item ``[0]``) by ``embedder(trunk(x))`` in eval mode,
    in dataset order, on the CPU; the models' train/eval modes are restored."""
    modes = (trunk.training, embedder.training)
    trunk.eval(), embedder.eval()
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=0)
    out = [embedder(trunk(batch[0].to(device))).float().cpu() for batch in loader]
    trunk.train(modes[0]), embedder.train(modes[1])
    return torch.cat(out)


def save_retrieval_examples(
    folder: str,
    name: str,
    query_embeddings: torch.Tensor,
    query_labels: Sequence[int],
    query_image: Callable[[int], Any],
    reference_embeddings: Optional[torch.Tensor] = None,
    reference_labels: Optional[Sequence[int]] = None,
    reference_image: Optional[Callable[[int], Any]] = None,
    same_items: bool = True,
    n_queries: int = 4,
    k: int = 5,
    seed: int = 0,
    thumbnail: int = 96,
    class_names: Optional[Sequence[str]] = None,
    note: str = "",
) -> Dict[str, Any]:
    """Write the retrieval examples of one model and return what ``<name>.json`` holds: ``n_queries`` queries drawn
    with ``seed``, each with its ``k`` nearest references by cosine similarity (equal cosines: the lower index first),
    as thumbnails of the untransformed images under ``<folder>/retrieval/<name>/`` (a rerun replaces them).

    Args:
        folder: the experiment folder (files go to ``<folder>/retrieval/``).
        name: the examples' name (a file name: letters, digits, ``_.-``), e.g. ``"test"`` or a variant's name.
        query_embeddings, query_labels: ``[N, D]`` float embeddings (any device and float dtype), ``[N]`` int labels.
        query_image: ``i -> PIL image`` of query item ``i`` (e.g. ``lambda i: dataset_image(test_set, i)``).
        reference_embeddings, reference_labels, reference_image: the references (``[M, D]``, ``[M]``); default:
            the queries themselves.
        same_items: query ``i`` and reference ``i`` are the same item, left out of its own neighbours.
        n_queries, k, seed: how many queries (drawn by ``torch.Generator().manual_seed(seed)``), neighbours per
            query (clamped to the references available).
        thumbnail, class_names: the thumbnails' longest side in pixels; ``label -> name`` (default: the label).
        note: one line shown above the examples (which model, which split, which resolution).

    Returns:
        ``{"name", "note", "k", "seed", "queries": [{"index", "label", "class", "image", "neighbours": [{"rank",
        "index", "label", "class", "cosine", "same_class", "image"}]}]}`` (image paths relative to
        ``<folder>/retrieval``).

    Raises:
        ValueError: a bad name, embeddings that are not 2-D, label counts that do not match, fewer than two items,
            ``n_queries`` or ``k`` below 1.

    Example::

        >>> import tempfile
        >>> from PIL import Image
        >>> images = [Image.new("RGB", (8, 8), c) for c in ("red", "pink", "blue", "navy")]
        >>> emb = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
        >>> out = save_retrieval_examples(tempfile.mkdtemp(), "test", emb, [0, 0, 1, 1], images.__getitem__, k=2)
        >>> [(n["index"], n["cosine"], n["same_class"]) for n in out["queries"][0]["neighbours"]]
        [(1, 0.9939, True), (3, 0.1104, False)]
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"save_retrieval_examples: name {name!r} must be a file name of letters, digits and _.-")

    def cpu(embeddings):  # pictures are drawn on the CPU
        return torch.as_tensor(embeddings, device="cpu").detach().float()

    def ints(labels):
        return [int(v) for v in np.asarray(labels).reshape(-1)]

    queries, q_labels = cpu(query_embeddings), ints(query_labels)
    refs = queries if reference_embeddings is None else cpu(reference_embeddings)
    r_labels = q_labels if reference_labels is None else ints(reference_labels)
    reference_image = query_image if reference_image is None else reference_image
    if queries.ndim != 2 or refs.ndim != 2 or queries.shape[1] != refs.shape[1]:
        raise ValueError(
            f"save_retrieval_examples: expected [N, D] query and [M, D] reference embeddings, got "
            f"{tuple(queries.shape)} and {tuple(refs.shape)}"
        )
    if len(q_labels) != len(queries) or len(r_labels) != len(refs):
        raise ValueError(
            f"save_retrieval_examples: {len(queries)} queries with {len(q_labels)} labels, {len(refs)} references "
            f"with {len(r_labels)} labels"
        )
    if not (is_int(n_queries) and is_int(k)) or n_queries < 1 or k < 1:
        raise ValueError(f"save_retrieval_examples: n_queries and k must be at least 1, got {n_queries} and {k}")
    available = len(refs) - (1 if same_items else 0)
    if len(queries) < 1 or available < 1:
        raise ValueError("save_retrieval_examples: needs at least one query and one other reference")
    k = min(k, available)
    order = torch.randperm(len(queries), generator=torch.Generator().manual_seed(int(seed)), device="cpu")[:n_queries]
    q = torch.nn.functional.normalize(queries[order].double(), dim=1)
    r = torch.nn.functional.normalize(refs.double(), dim=1)
    sims = q @ r.T
    if same_items:
        sims[torch.arange(len(order), device="cpu"), order] = float("-inf")
    ranked = torch.sort(sims, dim=1, descending=True, stable=True)  # equal cosines: the lower index first
    out_dir = os.path.join(folder, FOLDER, name)
    if os.path.isdir(out_dir):  # a rerun's examples replace the old ones (picture() makes the folder)
        shutil.rmtree(out_dir)

    def picture(kind: str, i: int, image: Callable[[int], Any]) -> str:
        path = f"{name}/{kind}{i}.png"  # relative to <folder>/retrieval; each item's thumbnail written once
        if not os.path.exists(os.path.join(folder, FOLDER, path)):
            small = image(i).copy()
            small.thumbnail((thumbnail, thumbnail))
            with atomic_path(os.path.join(folder, FOLDER, path)) as tmp:
                small.save(tmp, format="PNG")
        return path

    def item(i: int, labels: List[int]) -> Dict[str, Any]:
        named = class_names is not None and 0 <= labels[i] < len(class_names)
        return {"index": i, "label": labels[i], "class": str(class_names[labels[i]] if named else labels[i])}

    rows: List[Dict[str, Any]] = []
    for row, qi in enumerate(order.tolist()):
        q_path = picture("q", qi, query_image)
        neighbours = []
        for rank, (ri, cosine) in enumerate(zip(ranked.indices[row, :k].tolist(), ranked.values[row, :k].tolist())):
            entry = {"rank": rank + 1, **item(ri, r_labels), "cosine": round(cosine, 4)}
            same = r_labels[ri] == q_labels[qi]
            neighbours.append({**entry, "same_class": same, "image": picture("r", ri, reference_image)})
        rows.append({**item(qi, q_labels), "image": q_path, "neighbours": neighbours})
    summary = {"name": name, "note": note, "k": k, "seed": int(seed), "queries": rows}
    atomic_write_json(os.path.join(folder, FOLDER, f"{name}.json"), summary)
    return summary
