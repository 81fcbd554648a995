"""A query's top-k explained (maps, point, figures), and the overall maps of every query's top-k of a test set in
batches (Zhu et al., IEEE TIP 2021, Sec. III)."""

from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as nnf

from ..trunks.trunk_split import _float_like
from ..utils.checks import is_int
from . import overlay
from .activation_decomposition import ActivationDecomposition

#: the overall maps of one pair: "Decomposition" and "Decomposition+Bias", on the query and on the reference
MAP_KEYS = ("query", "reference", "query_bias", "reference_bias")


def dataset_image(source, index: int, arg: str) -> torch.Tensor:
    """Image ``[C, H, W]`` of item ``index`` of ``source`` (an image or ``(image, label, ...)``); ``arg`` names the
    source in the ``ValueError`` for anything else."""
    item = source[int(index)]
    image = item[0] if isinstance(item, (tuple, list)) else item
    if not torch.is_tensor(image) or image.ndim != 3:
        raise ValueError(
            f"{arg} must give image tensors [C, H, W] (set the dataset's transform), got "
            f"{type(image).__name__}{tuple(image.shape) if torch.is_tensor(image) else ''}"
        )
    return image


def _stack(source, indices, arg: str) -> torch.Tensor:
    if torch.is_tensor(source):
        return source[torch.as_tensor(indices, dtype=torch.long, device=source.device)]
    return torch.stack([dataset_image(source, i, arg) for i in indices])


def model_device(decomposition: ActivationDecomposition) -> torch.device:
    """The device of the query trunk (CPU for a parameter-free trunk)."""
    return _float_like(decomposition.query_folder.runner.trunk)["device"]


def inner_product_search(queries: torch.Tensor, references: torch.Tensor, k: int):
    """faiss exact inner-product search of ``queries`` ``[Q, L]`` against the L2-normalised ``references`` ``[M, L]``
    (float32, CPU): numpy ``(scores [Q, k], indices [Q, k])``, best first."""
    import faiss

    db = nnf.normalize(references.detach().to("cpu", torch.float32), dim=1).numpy()
    index = faiss.IndexFlatIP(db.shape[1])
    index.add(np.ascontiguousarray(db))
    return index.search(np.ascontiguousarray(queries.detach().to("cpu", torch.float32).numpy()), k)


def topk_overall_maps(
    decomposition: ActivationDecomposition,
    queries,
    references,
    neighbours,
    *,
    query_indices: Optional[Sequence[int]] = None,
    batch_size: int = 16,
    device=None,
) -> Dict[str, torch.Tensor]:
    """Overall maps of every query and each of its ``k`` neighbours, ``batch_size`` queries at a time.

    Args:
        decomposition: the :class:`ActivationDecomposition` to use.
        queries, references: image tensors ``[N, C, H, W]`` or datasets of ``image`` or ``(image, label, ...)``.
        neighbours: ``[Q, k]`` indices into ``references``; query_indices: ``Q`` into ``queries`` (default all).
        batch_size: queries per batch (default 16); device: where the models run (default: the query trunk's).

    Returns:
        CPU tensors ``"query"`` ``[Q, k, h, w]``, ``"reference"`` ``[Q, k, h', w']``, ``"similarity"`` ``[Q, k]``
        and the +Bias maps ``"query_bias"``/``"reference_bias"`` (``scale="cosine"``); equal up to summation order
        to :meth:`ActivationDecomposition.overall_maps` one query at a time.

    Raises:
        ValueError: ``neighbours`` not ``[Q, k]``, a ``query_indices`` of another length, ``batch_size`` < 1.

    Example::

        >>> import torch; from torch import nn; from pml_extensions import explain
        >>> trunk = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        >>> dec = explain.ActivationDecomposition(trunk)
        >>> out = explain.topk_overall_maps(dec, torch.rand(5, 3, 8, 8), torch.rand(7, 3, 8, 8),
        ...                                 torch.tensor([[0, 1], [2, 3], [4, 5], [6, 0], [1, 2]]))
        >>> tuple(out["query"].shape), tuple(out["similarity"].shape)
        ((5, 2, 6, 6), (5, 2))
    """
    nb = torch.as_tensor(neighbours, dtype=torch.long).cpu()
    if nb.ndim != 2 or nb.shape[1] < 1:
        raise ValueError(f"neighbours must be [Q, k] indices, got shape {tuple(nb.shape)}")
    Q, k = nb.shape
    qi = torch.arange(Q) if query_indices is None else torch.as_tensor(query_indices, dtype=torch.long).cpu()
    if qi.shape != (Q,):
        raise ValueError(f"query_indices must have {Q} entries (one per row of neighbours), got {qi.shape}")
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    device = torch.device(device) if device is not None else model_device(decomposition)
    out: Dict[str, torch.Tensor] = {}
    for start in range(0, Q, batch_size):
        q_idx, n_idx = qi[start : start + batch_size], nb[start : start + batch_size]
        b = len(q_idx)
        fq = decomposition.fold_query(_stack(queries, q_idx.tolist(), "queries").to(device))
        fr = decomposition.fold_reference(_stack(references, n_idx.flatten().tolist(), "references").to(device))
        fq = fq[torch.arange(b, device=fq.features.device).repeat_interleave(k)]
        maps = decomposition.overall_maps(fq, fr)
        mb = decomposition.overall_maps(fq, fr, bias=True)
        got = {name: maps[name] for name in ("query", "reference", "similarity")}
        got["query_bias"], got["reference_bias"] = mb["query"], mb["reference"]
        for key in got:
            value = got[key].detach().to("cpu").reshape(b, k, *got[key].shape[1:])
            if key not in out:
                out[key] = value.new_empty((Q,) + tuple(value.shape[1:]))
            out[key][start : start + b] = value
        del fq, fr, maps, mb, got
    return out


def explain_retrieval(
    decomposition: ActivationDecomposition,
    query: torch.Tensor,
    references: Sequence[torch.Tensor],
    paths: Union[str, Sequence[str]],
    *,
    titles: Union[str, Sequence[str], None] = None,
    point: Optional[Sequence[float]] = None,
    maps: Optional[Mapping[str, torch.Tensor]] = None,
    stats=(None, None),
    reference_stats=None,
    similarities: Optional[Sequence[float]] = None,
    reference_labels: Optional[Sequence[Optional[str]]] = None,
    same_class: Optional[Sequence[Optional[bool]]] = None,
    query_label: Optional[str] = None,
    note: Optional[str] = None,
    reference_name: str = "reference",
    save_png: bool = True,
) -> List[Dict]:
    """Explain why ``query`` retrieved ``references`` (rank order): the explain command's and the tester hook's path.

    Per pair, the signed "Decomposition" and "Decomposition+Bias" maps (Zhu et al., "Visual Explanation for Deep Metric
    Learning", IEEE TIP 2021, Sec. III, eq. 5, ``scale="cosine"``) and the point-specific map of one query pixel per
    figure: ``point``, else the centre of the feature cell where the figure's first query map is largest. ``paths``:
    one figure with a row per reference (a string) or one figure per reference (:func:`.overlay.save_pair_overlay`);
    the +Bias panels are in all figures or in none (the pairs' largest :func:`.overlay.bias_difference`).

    Args:
        query: ``[C, H, W]`` float image; references: ``[C, H', W']`` images (one shape per figure) on its device.
        titles: one per figure. maps: this query's rows of :func:`topk_overall_maps` (default: computed here).
        stats, reference_stats: ``(mean, std)`` for display (default none; references: ``stats``).
        similarities (default: the maps'), reference_labels, same_class (default: label == query_label where both are
            known): per reference; query_label, note (after the bias note): as in :func:`.overlay.save_pair_overlay`.
        reference_name: as the panels call a reference. save_png: draw the figures (default).

    Returns:
        Per reference, its record in the explain command's ``similarity.json`` (``label``, ``same_class``, ``rank``,
        ``cosine_similarity``, ``dot_product`` E^q·E^r, ``overlay`` path or ``None``, ``point`` ``[y, x]``) and
        ``maps``: ``MAP_KEYS`` ``[h, w]`` / ``[h', w']``, ``similarity``, ``dot``, ``point_specific`` ``[h', w']``.

    Raises:
        ValueError: no reference, ``paths``/``titles`` not one string or one per reference; and those of
            :class:`ActivationDecomposition`.

    Example::

        >>> import torch; from torch import nn; from pml_extensions import explain
        >>> trunk = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        >>> dec = explain.ActivationDecomposition(trunk, nn.Linear(4, 5))
        >>> rows = explain.explain_retrieval(dec, torch.rand(3, 8, 8), torch.rand(2, 3, 8, 8), "q.png", save_png=False)
        >>> [tuple(row["maps"]["point_specific"].shape) for row in rows], rows[1]["point"] == rows[0]["point"]
        ([(6, 6), (6, 6)], True)
    """
    k = len(references)
    groups = [list(range(k))] if isinstance(paths, str) else [[m] for m in range(k)]
    paths = [paths] if isinstance(paths, str) else list(paths)
    titles = [titles] * len(groups) if titles is None or isinstance(titles, str) else list(titles)
    if k == 0:
        raise ValueError("references must hold at least one image [C, H, W], got none")
    for name, values in (("paths", paths), ("titles", titles)):
        if len(values) != len(groups):
            raise ValueError(f"{name} must be one string or one per reference ({k}), got {len(values)}")
    labels = list(reference_labels) if reference_labels is not None else [None] * k
    if same_class is None:
        same_class = [None if query_label is None or y is None else y == query_label for y in labels]
    fq = decomposition.fold_query(query[None])
    (h, w), (H, W) = fq.feature_size, fq.image_size
    records = []  # every pair's maps first: the +Bias panels are shown in all figures or in none
    for group in groups:
        fr = decomposition.fold_reference(torch.stack([references[m] for m in group]))
        if maps is None:
            plain, bias = decomposition.overall_maps(fq, fr), decomposition.overall_maps(fq, fr, bias=True)
            got = {"query_bias": bias["query"], "reference_bias": bias["reference"], **plain}
        else:
            got = {key: maps[key][group] for key in MAP_KEYS + ("similarity",)}
        i, j = divmod(int(torch.argmax(got["query"][0])), w)  # default: that feature cell's centre, pixels
        at = tuple(point) if point is not None else ((i + 0.5) * H / h - 0.5, (j + 0.5) * W / w - 0.5)
        got["dot"] = (fq.embedding * fr.embedding).sum(dim=1)
        got["point_specific"] = decomposition.point_specific(fq, fr, [at])[:, 0]
        for n, m in enumerate(group):
            records.append(
                {
                    "label": labels[m],
                    "same_class": same_class[m],
                    "rank": m + 1,
                    "cosine_similarity": float(got["similarity"][n]) if similarities is None else similarities[m],
                    "dot_product": float(got["dot"][n]),
                    "overlay": None,
                    "point": [float(at[0]), float(at[1])],
                    "maps": {key: got[key][n] for key in got},
                }
            )
    if not save_png:
        return records
    difference = max(overlay.bias_difference(*(row["maps"][key] for key in MAP_KEYS)) for row in records)
    show_bias = difference > overlay.BIAS_RTOL
    note = "; ".join(line for line in (None if show_bias else overlay.bias_note(difference), note) if line)
    shown = overlay.to_display_image(query, *stats)
    for group, path, title in zip(groups, paths, titles):
        rows = [records[m] for m in group]
        overlay.save_pair_overlay(
            path,
            shown,
            [overlay.to_display_image(references[m], *(reference_stats or stats)) for m in group],
            [
                overlay.explanation_panels(
                    *(row["maps"][key] for key in MAP_KEYS),
                    row["point"],
                    row["maps"]["point_specific"],
                    reference_name=reference_name,
                    show_bias=show_bias,
                )[0]
                for row in rows
            ],
            title=title,
            similarities=[row["cosine_similarity"] for row in rows],
            ranks=[row["rank"] for row in rows],
            reference_labels=[row["label"] for row in rows],
            same_class=[row["same_class"] for row in rows],
            query_label=query_label,
            note=note,
        )
        for row in rows:
            row["overlay"] = path
    return records
