"""Exact k nearest neighbours by blocked matrix products: the k-NN engine of the accuracy calculators.

For a block of ``b`` queries the engine computes one ``[b, M]`` score matrix against all ``M`` references (one
matmul, into a buffer reused from block to block), removes each query's own reference row BY INDEX, selects
``k + 1`` candidates with ``torch.topk`` (no ordering), and orders only those. Nothing larger than ``[b, M]`` or
``[b, k]`` is ever built, and ``b`` follows from a memory budget, so the caller never holds an ``[N, k]`` tensor
for the whole set (the accuracy calculators reduce each block to per-query numbers before the next one).

Tie rule (the same everywhere): neighbours are ordered by distance, and equal distances by increasing reference
index. The engine sorts 64-bit keys ``(float32 score bits, reference index)``, so the rule holds exactly for the
scores as computed in float32, also across the k-th/(k+1)-th boundary (a row whose boundary is tied is re-ranked
on all its references). Ranking is done in float32, as PML's stock calculator (which casts embeddings to float32).
"""

from typing import Optional, Tuple, Union

import torch

_LOW32 = 0xFFFFFFFF
_INT64_MAX = torch.iinfo(torch.int64).max


def _ordered_keys(scores: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """int64 keys that sort like ``(scores, columns)``: float32 bits mapped to an order-preserving int32."""
    bits = (scores.to(torch.float32) + 0.0).contiguous().view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (ordered.long() << 32) | columns


class BlockedKNN:
    """Exact k-NN by blocked matmul + ``topk``; also a PML ``knn_func``:
    ``knn(query, k, reference, ref_includes_query)``.

    Args:
        distance: ``"euclidean"`` (default; squared L2 ``|q|² + |r|² − 2 q·r`` ranks the same as PML's default
            ``FaissKNN``, an ``IndexFlatL2``), ``"inner_product"`` (larger is nearer, as ``faiss.IndexFlatIP``), or a
            PML distance object: ``LpDistance(p=2)`` -> euclidean, ``DotProductSimilarity`` / ``CosineSimilarity``
            -> inner product; its ``normalize_embeddings`` is honoured (L2-normalised rows first).
        memory_budget: bytes for one block's temporaries (score matrix, candidates, per-query metric rows);
            default 512 MiB. The block size is ``budget // (4·M + 144·(k + 1))`` rows (the score row, and ~144
            bytes of candidates, keys and metric rows per neighbour), at least 1; rows whose k-th and (k+1)-th
            scores tie are re-ranked in chunks of at most ``budget // (16·M)`` rows, so the peak of the temporaries
            stays below twice the budget.
        block_size: fixed number of query rows per block instead (optional, positive int).

    ``search(query [b, D], k, reference [M, D], self_indices [b] long = None, return_distances=False)`` returns
    ``(indices [b, k] int64, distances [b, k] or None)``: squared L2 distances (euclidean) or similarities (inner
    product), in the float32 of the ranking. ``self_indices[i]`` is the reference row removed for query i.
    ``__call__(query [N, D], k, reference=None, ref_includes_query=False)`` is PML's ``knn_func`` interface and returns
    ``(distances [N, k], indices [N, k])``, with row i of the reference removed for query i when
    ``ref_includes_query`` (the queries are the first rows of the reference, PML's layout).

    k must lie in ``[1, available references]``; the calculators clamp it first (see their docs).
    Runs on the inputs' device (never moves them to another device).

    Raises:
        ValueError: unknown ``distance``, non-positive ``memory_budget``/``block_size``, k out of range, embeddings
            that are not finite or not ``[n, D]`` with one D, more than 2³² references.

    Example:
        >>> knn = BlockedKNN()
        >>> x = torch.tensor([[0.0], [1.0], [3.0]])
        >>> knn(x, 1, x, ref_includes_query=True)[1].flatten().tolist()
        [1, 0, 1]
    """

    def __init__(
        self,
        distance: Union[str, object, None] = None,
        memory_budget: int = 512 * 2**20,
        block_size: Optional[int] = None,
    ):
        self.inner_product, self.normalize = self._parse_distance(distance)
        if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget < 1:
            raise ValueError(f"memory_budget must be a positive int (bytes), got {memory_budget!r}")
        if block_size is not None and (
            isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1
        ):
            raise ValueError(f"block_size must be None or a positive int, got {block_size!r}")
        self.memory_budget, self.fixed_block_size = memory_budget, block_size

    @staticmethod
    def _parse_distance(distance) -> Tuple[bool, bool]:
        if distance is None or distance == "euclidean":
            return False, False
        if distance == "inner_product":
            return True, False
        name = type(distance).__name__
        if name in ("DotProductSimilarity", "CosineSimilarity"):
            return True, bool(getattr(distance, "normalize_embeddings", False))
        if name == "LpDistance" and getattr(distance, "p", None) == 2:
            return False, bool(getattr(distance, "normalize_embeddings", False))
        raise ValueError(
            "distance must be 'euclidean', 'inner_product', LpDistance(p=2), DotProductSimilarity or "
            f"CosineSimilarity, got {distance!r}"
        )

    def block_size(self, num_references: int, k: int) -> int:
        """Query rows per block for ``num_references`` references and ``k`` neighbours."""
        if self.fixed_block_size is not None:
            return self.fixed_block_size
        return max(1, self.memory_budget // (4 * num_references + 144 * (k + 1)))

    def prepare(self, embeddings: torch.Tensor, name: str) -> torch.Tensor:
        """float32 (or float64) ``[n, D]`` copy of ``embeddings``, L2-normalised if the distance asks for it."""
        if not isinstance(embeddings, torch.Tensor) or embeddings.ndim != 2:
            raise ValueError(f"{name} must be a 2-D tensor [n, D], got {getattr(embeddings, 'shape', embeddings)}")
        x = embeddings.to(torch.promote_types(embeddings.dtype, torch.float32))
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or infinite values")
        return torch.nn.functional.normalize(x, dim=1) if self.normalize else x

    def _scores(self, query, reference, sq=None, out=None) -> torch.Tensor:
        """Ascending float32 scores ``[b, M]`` in one GEMM: ``|r|² − 2 q·r`` (squared distance minus ``|q|²``) or
        ``−q·r``; written into ``out[:b]`` when given (a buffer reused over the blocks: allocating a fresh
        ``[b, M]`` tensor per block costs its page faults every time, measured 1.3-2× the GEMM on 2 cores)."""
        b = len(query)
        if out is None:
            out = torch.empty(b, reference.shape[0], dtype=query.dtype, device=query.device)
        scores = out[:b]
        if self.inner_product:
            torch.mm(query, reference.T, out=scores)
            scores.neg_()
        else:
            sq = (reference * reference).sum(1) if sq is None else sq
            torch.addmm(sq, query, reference.T, beta=1, alpha=-2, out=scores)
        return scores.to(torch.float32)

    def score_buffer(self, rows: int, reference: torch.Tensor) -> torch.Tensor:
        """An uninitialised ``[rows, M]`` buffer for :meth:`search`'s ``out`` (``reference``'s dtype and device)."""
        return torch.empty(rows, reference.shape[0], dtype=reference.dtype, device=reference.device)

    def search(
        self,
        query,
        k: int,
        reference,
        self_indices=None,
        return_distances: bool = False,
        reference_sq_norms=None,
        out=None,
    ):
        """k nearest references of each query row (see the class doc). Inputs must come from :meth:`prepare`;
        ``out``: an optional :meth:`score_buffer` with at least ``b`` rows, reused from block to block (its contents
        are overwritten)."""
        m = reference.shape[0]
        if m >= 2**32:
            raise ValueError(f"at most 2**32 references are supported, got {m}")
        if query.shape[1] != reference.shape[1]:
            raise ValueError(f"query has D={query.shape[1]} but reference has D={reference.shape[1]}")
        available = m - (self_indices is not None)
        if not 1 <= k <= available:
            raise ValueError(f"k must lie in [1, {available}] (available references), got {k}")
        scores = self._scores(query, reference, reference_sq_norms, out)
        rows = torch.arange(len(query), device=query.device)
        if self_indices is not None:
            scores[rows, self_indices] = float("inf")
        # k + 1 candidates (unordered), ordered on exact (score, index) keys; a row whose k-th and (k+1)-th
        # scores tie is re-ranked on keys over all its references, so the rule holds across the boundary too
        columns = torch.arange(m, device=query.device)
        if k < available:
            cand_scores, cand_idx = scores.topk(k + 1, dim=1, largest=False, sorted=False)
            keys = _ordered_keys(cand_scores, cand_idx).sort(dim=1).values
            tied = (keys[:, k - 1] >> 32) == (keys[:, k] >> 32)
            keys = keys[:, :k]
            tied_rows = tied.nonzero().flatten()
            chunk = max(1, self.memory_budget // (16 * m))
            for r in tied_rows.split(chunk):
                full = _ordered_keys(scores[r], columns)
                if self_indices is not None:
                    full[torch.arange(len(r), device=r.device), self_indices[r]] = _INT64_MAX
                keys[r] = full.topk(k, dim=1, largest=False, sorted=True).values
        else:
            keys = _ordered_keys(scores, columns)
            if self_indices is not None:
                keys[rows, self_indices] = _INT64_MAX
            keys = keys.sort(dim=1).values[:, :k]
        indices = keys & _LOW32
        if not return_distances:
            return indices, None
        dist = scores.gather(1, indices)
        if self.inner_product:
            dist = -dist
        else:
            dist = (dist + (query * query).sum(1, keepdim=True).to(torch.float32)).clamp_(min=0)
        return indices, dist

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        query = self.prepare(query, "query")
        reference = query if reference is None else self.prepare(reference, "reference")
        n = len(query)
        if ref_includes_query and n > len(reference):
            raise ValueError("ref_includes_query=True needs the queries as the first rows of the reference")
        sq = (reference * reference).sum(1)
        bs = min(self.block_size(len(reference), k), max(n, 1))
        buffer = self.score_buffer(bs, reference)
        dists, idxs = [], []
        for start in range(0, n, bs):
            stop = min(start + bs, n)
            own = torch.arange(start, stop, device=query.device) if ref_includes_query else None
            i, d = self.search(query[start:stop], k, reference, own, True, sq, buffer)
            idxs.append(i)
            dists.append(d)
        if not idxs:
            return query.new_zeros(0, k), torch.zeros(0, k, dtype=torch.long, device=query.device)
        return torch.cat(dists), torch.cat(idxs)
