"""Block-wise retrieval metrics of the accuracy calculators on :class:`~pml_extensions.knn.engine.BlockedKNN`:
per-query values added into per-class sums (definitions, stages and distribution: ``docs/evaluation.md``); the MLRC
protocol's separate and concatenated test numbers of k fold models (:func:`ensemble_metrics`).
"""

import time
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils.accuracy_calculator import EQUALITY, AccuracyCalculator

from ..utils.checks import is_int
from ..utils.sharded_embedding import _world
from .engine import BlockedKNN

BUILTIN = (
    "precision_at_1",
    "r_precision",
    "mean_average_precision_at_r",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "recall_at_1",
    "mean_average_precision_trapezoidal",
)


def trapezoidal_average_precision(is_relevant: torch.Tensor, num_relevant: torch.Tensor) -> torch.Tensor:
    """Average precision as the trapezoid-rule area under the precision-recall curve (retrieval literature).

    Walking down the ranking, every relevant item raises recall by ``1 / num_relevant``; the area of that step is
    its width times the mean of the precision just before the item and the precision at the item. For the c-th
    relevant item at 1-based rank k: ``p_before = (c − 1)/(k − 1)`` (1 when k = 1), ``p_at = c/k``, and
    ``AP = Σ (p_before + p_at) / (2 · num_relevant)``. Relevant items missing from the ranking add nothing.
    Example: relevance [1, 0, 1] with 2 relevant -> (1 + (1/2 + 2/3)/2)/2 = 19/24 (the non-interpolated AP is 5/6).

    Args:
        is_relevant: [Nq, K] bool, relevance of the K ranked references of each query (junk already removed).
        num_relevant: [Nq] int, number of relevant references of each query (> 0).

    Returns:
        [Nq] float64 AP in [0, 1].

    Raises:
        ValueError: if the shapes disagree or a query has ``num_relevant`` <= 0.

    Example:
        >>> trapezoidal_average_precision(torch.tensor([[True, False, True]]), torch.tensor([2])).tolist()
        [0.7916666666666666]
    """
    if is_relevant.ndim != 2 or num_relevant.ndim != 1 or num_relevant.shape[0] != is_relevant.shape[0]:
        raise ValueError(
            f"is_relevant must be [Nq, K] and num_relevant [Nq], got {tuple(is_relevant.shape)} and "
            f"{tuple(num_relevant.shape)}"
        )
    if bool((num_relevant <= 0).any()):
        raise ValueError("num_relevant must be > 0 for every query")
    rel = is_relevant.to(torch.float64)
    count = torch.cumsum(rel, dim=1)
    rank = torch.arange(1, rel.shape[1] + 1, dtype=torch.float64, device=rel.device).expand_as(rel)
    p_at = count / rank
    p_before = torch.where(rank > 1, (count - 1) / (rank - 1).clamp(min=1), torch.ones_like(rank))
    return ((p_before + p_at) * rel).sum(dim=1) / (2 * num_relevant.to(torch.float64))


def per_query_metrics(rel: torch.Tensor, num_relevant: torch.Tensor, names) -> Dict[str, torch.Tensor]:
    """Per-query values ``[b]`` float64 of the built-in metrics ``names`` from relevance ``rel [b, k]`` (bool) and
    ``num_relevant [b]`` (int, > 0): the c-th hit at rank j has precision ``c / j``, summed in rank order (the
    brute force's arithmetic) over the hits only."""
    b, k = rel.shape
    names = set(names)
    out = {}
    if {"precision_at_1", "recall_at_1"} & names:
        first = rel[:, 0].to(torch.float64)
        out.update({n: first for n in ("precision_at_1", "recall_at_1") if n in names})
    if not names - {"precision_at_1", "recall_at_1"}:  # the others need the ranks of the hits
        return out
    lim = num_relevant.clamp(max=k)
    if rel.device.type == "cpu":  # NumPy: a tenth of torch's per-op cost on these 1-D arrays
        values = _ranked_metrics(np, rel.numpy(), lim.numpy(), num_relevant.numpy(), names)
        out.update({m: torch.from_numpy(v) for m, v in values.items()})
    else:
        out.update(_ranked_metrics(torch, rel, lim, num_relevant, names))
    return out


def _ranked_metrics(xp, rel, lim, num_relevant, names):
    b, k = rel.shape
    f64 = xp.float64
    if xp is np:
        counts = np.count_nonzero(rel, axis=1)
        flat = np.flatnonzero(rel)
        rows = np.arange(b)
        row = np.repeat(rows, counts)
        starts = np.cumsum(counts) - counts
        c = (np.arange(1, len(flat) + 1) - np.repeat(starts, counts)).astype(f64)  # hits up to that rank
        R = num_relevant.astype(f64)

        nonempty = counts > 0
        first_of = starts[nonempty]

        def per_row(w):  # sums over each row's contiguous run, in rank order
            out = np.zeros(b, dtype=f64)
            if len(w):
                out[nonempty] = np.add.reduceat(w, first_of)
            return out

    else:
        counts = rel.sum(1)
        flat = rel.reshape(-1).nonzero().flatten()
        row = torch.repeat_interleave(torch.arange(b, device=rel.device), counts)
        starts = torch.cumsum(counts, 0) - counts
        c = (torch.arange(1, len(flat) + 1, device=rel.device) - torch.repeat_interleave(starts, counts)).to(f64)
        R = num_relevant.to(f64)

        def per_row(w):
            return torch.bincount(row, weights=w, minlength=b)

    pos = flat - row * k  # 0-based rank of each relevant neighbour; rows in order, ranks ascending
    rank = pos + 1.0
    out = {}
    within_r = (pos < lim[row]) * 1.0
    if "mean_reciprocal_rank" in names:
        hit = counts > 0
        first = rank[starts * hit] if len(rank) else starts * 0.0  # rank of the first relevant neighbour
        out["mean_reciprocal_rank"] = hit / xp.where(hit, first, 1.0)
    if "r_precision" in names:
        out["r_precision"] = per_row(within_r) / lim
    precision = c / rank
    if "mean_average_precision" in names:
        out["mean_average_precision"] = per_row(precision) / R
    if "mean_average_precision_at_r" in names:
        out["mean_average_precision_at_r"] = per_row(precision * within_r) / R
    if "mean_average_precision_trapezoidal" in names:  # see trapezoidal_average_precision
        before = xp.where(pos > 0, (c - 1) / xp.maximum(pos, pos * 0 + 1), c * 0 + 1)
        out["mean_average_precision_trapezoidal"] = per_row(before + precision) / (2 * R)
    return {m: v.astype(f64) if xp is np else v.to(f64) for m, v in out.items()}


class EngineAccuracyMixin:
    """k-NN metrics of an ``AccuracyCalculator`` subclass through the blocked engine; ``get_accuracy`` and
    ``get_accuracy_multi`` of both calculators (``_require_query_rows``: PML's check that the queries are the first
    reference rows when ``ref_includes_query`` and no ``self_indices``)."""

    _require_query_rows = True

    def __init__(
        self,
        *args,
        chunk_size: Optional[int] = None,
        memory_budget: int = 512 * 2**20,
        distance=None,
        distributed: bool = False,
        **kwargs,
    ):
        if chunk_size is not None and (not is_int(chunk_size) or chunk_size < 1):
            raise ValueError(f"chunk_size must be None or a positive int, got {chunk_size!r}")
        knn_func = kwargs.get("knn_func", args[7] if len(args) > 7 else None)  # PML's positional order
        device = kwargs.get("device", args[6] if len(args) > 6 else None)
        super().__init__(*args, **kwargs)
        if knn_func is None:
            self.knn_func = BlockedKNN(distance, memory_budget, chunk_size)
        elif distance is not None:
            raise ValueError("pass either knn_func or distance, not both (distance configures the default engine)")
        self.chunk_size, self.distributed, self._device_given = chunk_size, bool(distributed), device is not None

    def requires_knn(self):
        """Every metric that is not a clustering metric needs the k-NN (PML's list misses MRR)."""
        return [m for m in self.original_function_dict if m not in self.requires_clustering()]

    def _is_builtin(self, name):
        fn = getattr(type(self), "calculate_" + name, None)
        if name in ("recall_at_1", "mean_average_precision_trapezoidal"):
            return getattr(fn, "_pml_extensions_builtin", False)
        return name in BUILTIN and fn is getattr(AccuracyCalculator, "calculate_" + name, None)

    def _class_structure(self, q_lab, r_lab, exclude_self):
        """Per query: class id (sorted like ``torch.unique`` of the query labels), relevant count, lone flag, and
        the ids of the references (equality only) plus PML's ``label_counts``."""
        fn = self.label_comparison_fn
        if fn is EQUALITY:
            dtype = torch.promote_types(q_lab.dtype, r_lab.dtype)
            both = torch.cat([q_lab.to(dtype), r_lab.to(dtype)])
            uniq, inv = torch.unique(both, dim=0, return_inverse=True)
            q_ids, r_ids = inv[: len(q_lab)], inv[len(q_lab) :]
            ref_counts = torch.bincount(r_ids, minlength=len(uniq))
            count_q = ref_counts[q_ids]
            self_match = torch.ones_like(count_q)
            uq_ids = torch.unique(q_ids)
            label_counts = (uniq[uq_ids], ref_counts[uq_ids])
        else:
            uniq, q_ids = torch.unique(q_lab, dim=0, return_inverse=True)
            counts = torch.stack([fn(uniq[i : i + 1], r_lab).sum() for i in range(len(uniq))]).long()
            count_q = counts[q_ids]
            self_match = fn(uniq, uniq).long()[q_ids]
            r_ids = None
            label_counts = (uniq, counts)
        if exclude_self:
            not_lone = count_q - self_match > 0
        else:
            not_lone = count_q > 0
        num_relevant = count_q - int(exclude_self)
        return q_ids, r_ids, num_relevant, not_lone, label_counts

    # ------------------------------------------------------------------ one reference set
    def _engine_accuracy(self, query, q_lab, reference, r_lab, self_indices, metrics) -> dict:
        """k-NN ``metrics`` of ``query`` against one reference set; ``self_indices`` [Nq] long or None."""
        exclude_self = self_indices is not None
        q_ids, r_ids, num_relevant, not_lone, label_counts = self._class_structure(q_lab, r_lab, exclude_self)
        available = len(reference) - int(exclude_self)
        k = self.determine_k(label_counts[1], len(reference), exclude_self) if len(label_counts[1]) else 0
        k = min(k, available)  # the clamp rule: never more neighbours than references left
        c_f.LOGGER.info(f"exact k-NN with k={k}: {len(query)} queries, {len(reference)} references")
        rows = not_lone.nonzero().flatten()
        classes, cls = torch.unique(q_ids[rows], return_inverse=True)
        nan = [float("nan")] * len(label_counts[0]) if self.return_per_class else float("nan")
        if len(rows) == 0 or k < 1:
            return {m: nan for m in metrics}
        class_counts = torch.bincount(cls, minlength=len(classes)).to(torch.float64).cpu()
        sums = torch.zeros(len(metrics), len(classes), dtype=torch.float64, device=query.device)
        rank, world = _world() if self.distributed else (0, 1)
        builtin = [m for m in metrics if self._is_builtin(m)]
        engine = self.knn_func if isinstance(self.knn_func, BlockedKNN) else None
        # blocks of query rows dealt round-robin over the ranks; ``mine`` indexes ``rows``
        deal = self.chunk_size or 4096
        starts = range(rank * deal, len(rows), world * deal)
        mine = torch.cat([torch.arange(s, min(s + deal, len(rows)), device=rows.device) for s in starts] or [rows[:0]])
        seconds = {}
        want_dist = len(builtin) < len(metrics)
        ctx = dict(q_ids=q_ids, r_ids=r_ids, q_lab=q_lab, r_lab=r_lab, num_relevant=num_relevant, cls=cls)
        ctx.update(label_counts=label_counts, exclude_self=exclude_self, sums=sums)
        if r_ids is not None and query.device.type == "cpu":  # NumPy gathers of the smallest integer class ids
            small = np.min_scalar_type(
                max(int(r_ids.max()) if len(r_ids) else 0, int(q_ids.max()) if len(q_ids) else 0)
            )
            ctx.update(r_ids_np=r_ids.numpy().astype(small), q_ids_np=q_ids.numpy().astype(small))
        if engine is not None:
            query, reference = engine.prepare(query, "query"), engine.prepare(reference, "reference")
            if len(mine):
                for pos, idx, dist in engine.blocks(query, k, reference, self_indices, rows[mine], want_dist):
                    t0 = time.perf_counter()
                    self._add_block(rows, mine[pos], idx, dist, metrics, builtin, query, reference, ctx)
                    seconds["metrics"] = seconds.get("metrics", 0.0) + time.perf_counter() - t0
                seconds = dict(engine.stage_seconds, **seconds)
        else:
            query, reference = query.float(), reference.float()
            for s in range(0, len(mine), deal):
                sel = mine[s : s + deal]
                t0 = time.perf_counter()
                own = self_indices[rows[sel]] if exclude_self else None
                dist, idx = self._user_knn(query[rows[sel]], k, reference, own)
                t1 = time.perf_counter()
                self._add_block(rows, sel, idx, dist, metrics, builtin, query, reference, ctx)
                seconds["knn"] = seconds.get("knn", 0.0) + t1 - t0
                seconds["metrics"] = seconds.get("metrics", 0.0) + time.perf_counter() - t1
        self.stage_seconds = seconds
        if world > 1:
            torch.distributed.all_reduce(sums)
        sums = sums.cpu()
        out = {}
        for i, m in enumerate(metrics):
            per_class = sums[i] / class_counts
            if self.return_per_class:
                out[m] = per_class.tolist()
            elif self.avg_of_avgs:
                out[m] = float(per_class.mean())
            else:
                out[m] = float(sums[i].sum() / class_counts.sum())
        return out

    def _add_block(self, rows, sel, idx, dist, metrics, builtin, query, reference, ctx):
        """Per-class sums of the metrics of the queries ``rows[sel]`` with neighbours ``idx [b, k]``."""
        block, cls = rows[sel], ctx["cls"][sel]
        if "r_ids_np" in ctx:  # a tenth of torch's int64 gather
            rel = torch.from_numpy(ctx["r_ids_np"][idx.numpy()] == ctx["q_ids_np"][block.numpy()][:, None])
        elif ctx["r_ids"] is not None:
            rel = ctx["r_ids"][idx] == ctx["q_ids"][block][:, None]
        else:
            rel = self.label_comparison_fn(ctx["q_lab"][block][:, None], ctx["r_lab"][idx]).bool()
        values = per_query_metrics(rel, ctx["num_relevant"][block], builtin)
        sums = ctx["sums"]
        for i, m in enumerate(metrics):
            if m in values:
                sums[i].index_add_(0, cls, values[m])
                continue
            # a user's own ``calculate_<m>`` (a mean over queries) on the block: its per-class means back to sums
            kwargs = dict(
                query=query[block],
                reference=reference,
                query_labels=ctx["q_lab"][block],
                reference_labels=ctx["r_lab"],
                ref_includes_query=ctx["exclude_self"],
                label_counts=ctx["label_counts"],
                knn_labels=ctx["r_lab"][idx],
                knn_distances=dist,
                knn_indices=idx,
                lone_query_labels=None,
                not_lone_query_mask=torch.ones(len(block), dtype=torch.bool, device=query.device),
                label_comparison_fn=self.label_comparison_fn,
            )
            saved = (self.avg_of_avgs, self.return_per_class)
            self.avg_of_avgs, self.return_per_class = False, True
            try:
                per_class = torch.tensor(self.original_function_dict[m](**kwargs), dtype=torch.float64, device="cpu")
            finally:
                self.avg_of_avgs, self.return_per_class = saved
            block_classes, counts = torch.unique(cls, return_counts=True)
            sums[i, block_classes] += (per_class * counts.cpu().to(torch.float64)).to(sums.device)

    def knn_excluding_self(self, query, k: int, reference, self_indices) -> tuple:
        """k nearest references of each query with its own row ``self_indices[i]`` removed (k clamped to M − 1).

        Returns ``(distances [Nq, k], indices [Nq, k])`` in the ``knn_func``'s order and units.
        """
        self_indices = torch.as_tensor(self_indices, device=query.device).long()
        k = min(k, len(reference) - 1)
        if isinstance(self.knn_func, BlockedKNN):
            q, r = self.knn_func.prepare(query, "query"), self.knn_func.prepare(reference, "reference")
            idx, dist = self.knn_func.search(q, k, r, self_indices, True)
            return dist, idx
        return self._user_knn(query, k, reference, self_indices)

    def _user_knn(self, query, k, reference, own):
        """A user's ``knn_func`` (e.g. faiss) on one block; the own row is removed by index from k + 1."""
        if own is None:
            return self.knn_func(query, k, reference, False)
        dist, idx = self.knn_func(query, min(k + 1, len(reference)), reference, False)
        is_self = idx == own.to(idx.device)[:, None]
        drop = is_self.clone()
        drop[:, -1] |= ~is_self.any(dim=1)
        n = len(query)
        return dist[~drop].view(n, -1)[:, :k], idx[~drop].view(n, -1)[:, :k]

    # ------------------------------------------------------------------ get_accuracy
    def get_accuracy(
        self,
        query,
        query_labels,
        reference=None,
        reference_labels=None,
        ref_includes_query=False,
        include=(),
        exclude=(),
        *,
        self_indices=None,
    ):
        if reference is None:
            if reference_labels is not None:
                raise ValueError("reference_labels given without reference")
            reference, reference_labels, ref_includes_query = query, query_labels, True
        if query is None:
            raise ValueError("query is missing")
        dev = self.device if self._device_given else torch.as_tensor(query).device
        query, reference = torch.as_tensor(query, device=dev), torch.as_tensor(reference, device=dev)
        if query.ndim != 2 or reference.ndim != 2 or query.shape[1] != reference.shape[1]:
            raise ValueError(
                f"query [Nq, D] and reference [M, D] must have the same dimension D, got "
                f"{tuple(query.shape)} and {tuple(reference.shape)}"
            )
        for name, x in (("query", query), ("reference", reference)):  # before any metric (NMI/AMI included) runs
            if not bool(torch.isfinite(x).all()):
                raise ValueError(f"{name} contains NaN or infinite values")
        labels = {"query_labels": (query_labels, len(query)), "reference_labels": (reference_labels, len(reference))}
        for name, (lab, n) in labels.items():
            if lab is None:
                raise ValueError(f"{name} is missing")
            labels[name] = lab = torch.as_tensor(lab, device=dev)
            if lab.ndim not in (1, 2) or len(lab) != n:
                raise ValueError(
                    f"{name} must be [n] or [n, L] and have the same length n = {n} as its embeddings, "
                    f"got {tuple(lab.shape)}"
                )
        q_lab, r_lab = labels.values()
        self.check_primary_metrics(include, exclude)
        if (
            self._require_query_rows
            and ref_includes_query
            and self_indices is None
            and not (
                len(query) <= len(reference)
                and torch.allclose(query.float(), reference[: len(query)].float())
                and torch.equal(q_lab, r_lab[: len(query)])
            )
        ):
            raise ValueError(
                "When ref_includes_query is True, the first len(query) rows of reference (and "
                "reference_labels) must equal query (and query_labels); or pass self_indices"
            )
        exclude_self = bool(ref_includes_query) or self_indices is not None
        if exclude_self:
            self_indices = self._check_self_indices(self_indices, q_lab, r_lab)
        function_dict = self.get_function_dict(include, exclude)
        metrics = list(function_dict)
        clustering = [m for m in metrics if m in self.requires_clustering()]
        knn = [m for m in metrics if m not in clustering]
        out = {}
        if clustering:
            ids = torch.unique(q_lab, dim=0, return_inverse=True)[1].to(torch.float32)
            out.update(AccuracyCalculator.get_accuracy(self, query, ids, include=clustering))
        # this call's metrics, before k is chosen: PML's ``determine_k`` warns from them when k truncates MAP@R or
        # R-precision (the clustering call above set its own list)
        self.curr_function_dict = function_dict
        if knn:
            out.update(self._engine_accuracy(query, q_lab, reference, r_lab, self_indices, knn))
        return {m: out[m] for m in metrics}

    @staticmethod
    def _check_self_indices(self_indices, query_labels, reference_labels):
        n, m = len(query_labels), len(reference_labels)
        if self_indices is None:
            if n > m:
                raise ValueError(
                    f"ref_includes_query=True needs the {n} query images as the first reference rows, but the "
                    f"reference has only {m} rows; pass self_indices"
                )
            self_indices = torch.arange(n, device=query_labels.device)
        self_indices = torch.as_tensor(self_indices, device=query_labels.device)
        if self_indices.ndim != 1 or len(self_indices) != n or self_indices.is_floating_point():
            raise ValueError(f"self_indices must be a 1-D integer tensor of length {n} (one per query)")
        self_indices = self_indices.long()
        if n and (int(self_indices.min()) < 0 or int(self_indices.max()) >= m):
            raise ValueError(f"self_indices must lie in [0, {m}) (reference rows)")
        if len(torch.unique(self_indices)) != n:
            raise ValueError("self_indices must not repeat: each query has its own reference row")
        if not torch.equal(reference_labels[self_indices], query_labels):
            raise ValueError(
                "the reference rows named by self_indices have labels different from their queries; query i and "
                "reference row self_indices[i] must be the same image"
            )
        return self_indices

    # ------------------------------------------------------------------ several reference sets
    def get_accuracy_multi(self, query, query_labels, references: dict, include=(), exclude=()) -> dict:
        """One query set against several reference sets in one call.

        Args:
            query: [Nq, D] embeddings; query_labels: [Nq] (or [Nq, L]) integer labels.
            references: ``{name: (reference [M, D], reference_labels [M])}`` or ``{name: dict(reference=...,
                reference_labels=..., ref_includes_query=False, self_indices=None)}``; ``ref_includes_query`` /
                ``self_indices`` as in ``get_accuracy``.
            include, exclude: metric names, as in ``get_accuracy``.

        Returns:
            ``{name: {metric: value}}``, each equal to ``get_accuracy`` on that reference set.

        Raises:
            ValueError: ``references`` empty or not a dict of pairs/dicts, and everything ``get_accuracy`` raises.
        """
        if not isinstance(references, dict) or not references:
            raise ValueError("references must be a non-empty dict {name: (reference, reference_labels)}")
        out = {}
        for name, spec in references.items():
            if isinstance(spec, dict):
                unknown = set(spec) - {"reference", "reference_labels", "ref_includes_query", "self_indices"}
                if unknown:
                    raise ValueError(f"references[{name!r}] has unknown keys {sorted(unknown)}")
                spec = dict(spec)
            elif isinstance(spec, (tuple, list)) and len(spec) == 2:
                spec = {"reference": spec[0], "reference_labels": spec[1]}
            else:
                raise ValueError(f"references[{name!r}] must be (reference, reference_labels) or a dict")
            out[name] = self.get_accuracy(query, query_labels, include=include, exclude=exclude, **spec)
        return out


def ensemble_metrics(
    embeddings: List[torch.Tensor], labels: torch.Tensor, calculator, normalize=True, tester_normalize=False
) -> Dict[str, Any]:
    """MLRC test numbers from the k models' embeddings of the same test items, as powerful-benchmarker computes them:
    each model is tested with the tester's settings, the concatenation with the ensemble's.

    Args:
        embeddings: k tensors ``[N, d]`` (float), one per fold model, rows aligned, as the tester returns them (its
            ``normalize_embeddings`` already applied).
        labels: ``[N]`` integer labels.
        calculator: a PML ``AccuracyCalculator`` (queries compared to themselves).
        normalize: L2-normalise each model's embeddings before concatenating them (PB's
            ``ConcatenateEmbeddings.normalize_embeddings``).
        tester_normalize: the tester's ``normalize_embeddings``, applied to the concatenation too (PB's tester
            normalises whatever the ensemble model outputs).

    Returns:
        ``{"separate_<d>D": mean over the models of each metric, "concatenated_<k·d>D": metrics of
        ``cat([normalize(e) for e in embeddings], 1)`` (normalised again with ``tester_normalize``), "per_model": [k
        dicts]}`` — MLRC's "128D" and "512D".

    Raises:
        ValueError: an empty list or embeddings with different shapes.
    """
    if not embeddings or any(e.shape != embeddings[0].shape or e.ndim != 2 for e in embeddings):
        raise ValueError(f"embeddings must be [N, d] tensors of one shape, got {[tuple(e.shape) for e in embeddings]}")
    per_model = [{m: float(v) for m, v in calculator.get_accuracy(e.float(), labels).items()} for e in embeddings]
    d = embeddings[0].shape[1]
    separate = {m: float(np.mean([p[m] for p in per_model])) for m in per_model[0]}
    normalized = [torch.nn.functional.normalize(e.float(), dim=1) if normalize else e.float() for e in embeddings]
    concat = torch.cat(normalized, dim=1)
    if tester_normalize:
        concat = torch.nn.functional.normalize(concat, dim=1)
    concatenated = {m: float(v) for m, v in calculator.get_accuracy(concat, labels).items()}
    return {f"separate_{d}D": separate, f"concatenated_{concat.shape[1]}D": concatenated, "per_model": per_model}
