"""Overall maps for every query's top-k of a test set, in batches (Zhu et al., IEEE TIP 2021, Sec. III)."""

from typing import Dict, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as nnf

from ..trunks.trunk_split import _float_like
from ..utils.checks import is_int
from .activation_decomposition import ActivationDecomposition


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
