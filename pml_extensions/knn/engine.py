"""Exact k nearest neighbours at the hardware floor: the k-NN engine of the accuracy calculators.

**What "exact" means.** The engine scores query i and reference j by the float32 rounding of a float64 score,
``e_ij = fl32(|q_i|² + |r_j|² − 2 q_i·r_j)`` (euclidean: the squared distance) or ``e_ij = fl32(−q_i·r_j)`` (inner
product; smaller is nearer), every dot product and norm computed in float64 by one kernel,
``torch.sparse.sampled_addmm`` (:func:`~pml_extensions.knn.scores.pair_dots`), which on the CPU gives a
pair bitwise the same value wherever and with whatever else it is computed; :meth:`BlockedKNN.float32_scores`
returns them. The result is the ranking of these float32 scores with ties (equal float32 values) ordered by
increasing reference index, as before this engine: a float64 brute force on these scores gives identical metrics.
Because the score is rounded once from float64, near-duplicates keep their order (a float32 ``|r|² − 2 q·r``
cannot order distances below ~1e-7 · |r|²). Every cheaper number (bfloat16 or float32 GEMM tiles) only *proposes*
candidates, within proven bounds of the exact score ``d`` and hence of the engine's (``|e − d| ≤ u·|d| + ε64``).

**Threshold method** (self-retrieval and k up to a few thousand; one engine on CPU and CUDA):

1. *Score tiles.* Queries and references (references sorted by norm, so a tile's norm range is narrow) are cut into
   tiles of ``B`` rows; each ``[B, B]`` tile of dot products ``p̃`` is one GEMM, in bfloat16 where this device's
   bfloat16 GEMM is measurably faster (:func:`low_precision_speedup`, measured once per device and cached;
   ``low_precision`` forces it on or off), else in float32. Self-retrieval (reference set = query set, own row
   excluded) computes the upper block triangle only: tile ``(I, J)`` serves the rows of ``I`` (neighbours in ``J``)
   and the rows of ``J`` (neighbours in ``I``); the diagonal tiles come first. On the CPU, tiles that touch
   disjoint blocks of queries run on ``torch.get_num_threads()`` worker threads.
2. *Select by threshold, not by sort.* Each query holds ``U``, a proven upper bound on its k-th engine score: from
   its first tile (the k-th largest ``p̃`` plus its bounds), then the k-th smallest score among its candidates. A
   tile proposes, per query, every reference with ``p̃ ≥ (w·(|q|² + n_lo) − T)/s − E``, ``T = U + u·|U| + ε64``
   (``n_lo`` the tile's smallest ``|r|²``, ``E`` the proposal bound): one vectorised comparison of the tile with a
   threshold per row (and per column in the symmetric case; on the CPU NumPy compares the raw bfloat16 bits as
   int16) and one ``flatnonzero``. No row is sorted and no ``topk`` runs.
3. *Re-score.* Proposed pairs get the engine's scores (the tile's rows are in cache; a symmetric tile's pair is
   scored once, for both of its queries) and are kept when ``e ≤ U``; a query's buffer (``1.25·k + 32`` candidates)
   is pruned when full, which tightens ``U``.
4. *Rank.* A query's candidates are sorted by int64 keys ``(e, reference index)`` (NumPy's vectorised sort on the
   CPU); the first k are its neighbours.

**Rows method.** When ``k`` is a large fraction of the references (``16·k·(1 + ln(M/B)) > M``, e.g. 6 classes),
proposing saves little: a block of queries is scored against all references by one float32 GEMM (transposed, so
candidates come grouped by reference), the k-th smallest of the minima over groups of references bounds each query's
k-th GEMM score ``K`` (a NumPy partition of ``M/g`` values), every reference whose GEMM score is within the bounds
of that is a candidate (about ``2·Δ32`` beyond ``K``), and candidates are re-scored and ranked as in 3-4.

*Dense rows* (the rows method on the CPU when ``32·k ≥ M``, e.g. k = M/6: re-scoring a sixth of all pairs one by
one costs more than scoring all of them by a GEMM). A block of queries is scored against every reference by one
float64 GEMM, ``v' = (|q|² + |r|²) − 2·q·r`` (``−q·r``), query-major, from the same float64 norms as the kernel's
``v``; the two dot products are each within ``γ_D(2⁻⁵³)·Σ|q_d r_d|`` of the exact one (any summation order) and the
combination adds two roundings, so ``|v − v'| ≤ 2·ε64``. With ``c = 4·ε64``: where ``fl32(v' − c) = fl32(v' + c)``,
monotone rounding gives ``fl32(v) = e' = fl32(v')``, the engine score; the other candidates (a few per million)
are re-scored by the kernel. The k-th smallest ``e'`` (a NumPy partition of the row) gives the threshold: an engine
score and its ``e'`` differ by at most ``2⁻²²·|e'| + c + 2⁻¹⁴⁸`` (two float32 roundings of values within ``c/2``),
so the k-th engine score is ``≤ T = kth + 2⁻²¹·|kth| + 2c + 2⁻¹⁴⁷`` and only references with
``e' ≤ T + 2⁻²¹·|T| + 2c + 2⁻¹⁴⁷`` are candidates: k plus the float32 ties and a few ulps, grouped by query with
references ascending, ranked as in 4. No float32 GEMM bound ``Δ32`` widens the window and nothing is re-scored but
the ambiguous pairs.

**Error bounds** (``u`` = unit roundoff, ``γ_n(v) = n·v/(1 − n·v)``; Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., Sec. 3.1):

- bfloat16 proposal pass. The inputs are rounded to nearest: ``q̂_d = q_d(1 + α_d)``, ``|α_d| ≤ u = 2⁻⁸``; the
  product of two bfloat16 numbers (8 significant bits each) is exact in float32; the GEMM adds the D products in
  float32 in an unknown order, bounded for any summation tree by ``γ_D(v)·Σ|q̂_d r̂_d|`` (``v = 2⁻²⁴``; ``2⁻²³``
  on CUDA, whose tensor cores may truncate); ``torch.mm`` stores the sum in bfloat16 (``u_out = 2⁻⁸``). Hence
  ``|p̃ − p| ≤ [(1 + u)²(1 + γ_D(v))(1 + u_out) − 1]·Σ|q_d r_d| ≤ c·|q|·|r|`` (Cauchy–Schwarz), ``c = 0.011772``
  for D = 128 on the CPU (:func:`pass_error_bound`). Subnormals flushed to zero (AVX512-BF16, tensor cores) move
  each input or partial sum by < 2⁻¹²⁶: ``η = 2D·2⁻¹²⁶(1 + |q|)(1 + |r|)`` covers them. float64 inputs add one
  rounding to float32 per entry (``(1 + 2⁻²⁴)²`` more).
- float32 GEMM scores (seeds of the rows method): ``|p32 − p| ≤ γ_D(2⁻²⁴)·|q|·|r|`` in any order (Higham eq. 3.5);
  with ``|r|²`` in float32 and the combination, ``|g − d| ≤ Δ32 = γ_{D+4}(2⁻²⁴)·(w·(|q|² + |r|²_max) +
  s·|q|·|r|_max) + s·η``, per query.
- Engine scores: the float64 score is within ``ε64 = γ_{D+4}(2⁻⁵³)·(w·(|q|² + |r|²_max) + s·|q|·|r|_max)`` of ``d``
  and its rounding to float32 adds at most ``u·|d|`` (``u = 2⁻²⁴``): ``|e − d| ≤ u·|d| + ε64`` (slack added).
- Proposal rule. A reference with engine score ``≤ U`` has ``d ≤ T``, so ``p ≥ (w·(|q|² + |r|²) − T)/s ≥
  (w·(|q|² + n_lo) − T)/s`` and ``p̃ ≥ p − E``: every neighbour, and every reference tied with the k-th, is
  proposed. In the rows method, k references with ``g ≤ K`` prove ``d ≤ K + |q|² + Δ32`` for them, and a candidate
  needs ``g ≤ U + u·|U| + ε64 + Δ32 − |q|²`` with ``U`` the resulting bound on the k-th engine score. Threshold
  arithmetic carries a relative slack of 2⁻²⁰, which covers its own rounding.
- Certification. The bound is checked on every re-scored pair (``|p64 − p̃| ≤ E``). A query whose proposal score
  broke it or whose candidates do not fit its buffer (more than ``1.25·k + 32`` references tied with or proposed
  beyond its k-th score) is *not certified* and is redone by the rows method (buffer ``4k + 4096``); what that
  cannot certify is ranked by scoring every reference. Embeddings whose products could overflow float32 use that
  last path only. Dense rows fail a query only when more than ``4k + 4096`` references are tied at its boundary.

Timings of each method against faiss and PML's calculator: ``benchmarks/results/accuracy_scale.md``.

Under ``torch.distributed`` the calculators give each rank its share of query blocks (``knn_metrics``); the
symmetric sweep is used within a process when its queries are at least half of the reference rows.
"""

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Dict, Iterator, Optional, Tuple, Union

import torch

from ..utils.checks import is_int
from .ops import ops_for
from .scores import (
    INT64_MAX,
    LOW32,
    SLACK,
    engine_scores,
    finish,
    gamma,
    key_scores,
    kth_smallest_rows,
    ordered_keys,
    pair_dots,
    self_dots,
    sort_rows,
    up32,
)
from .selection import Geometry, ThresholdSweep, run_tasks, top_k

_TILE_MAX = 8192
_SPEEDUP: Dict[Tuple[str, Optional[int]], float] = {}


def pass_error_bound(dim: int, device_type: str = "cpu", low_precision: bool = True) -> float:
    """Relative bound ``c`` of the proposal pass: ``|p̃ − q·r| ≤ c·|q|·|r| + η`` for every pair (module doc).

    Args:
        dim: embedding dimension D.
        device_type: ``"cpu"`` (float32 accumulation rounded to nearest) or another torch device type (the
            accumulation may truncate, ``v = 2⁻²³``); the product is stored in bfloat16 on every device.
        low_precision: True for the bfloat16 pass, False for a float32 pass (``γ_D(2⁻²⁴)``).

    Returns:
        ``c`` as a Python float (``η = 2D·2⁻¹²⁶(1 + |q|)(1 + |r|)`` is added separately).

    Example:
        >>> round(pass_error_bound(128), 6)
        0.011772
    """
    if not low_precision:
        return gamma(dim, 2.0**-24)
    u = 2.0**-8
    v = 2.0**-24 if device_type == "cpu" else 2.0**-23
    return (1 + u) ** 3 * (1 + gamma(dim, v)) - 1  # inputs rounded (u each), the sum stored in bfloat16 (u)


def low_precision_speedup(device: torch.device) -> float:
    """Time of a float32 GEMM ÷ time of the same GEMM in bfloat16 on ``device`` ([1024, 128]·[128, 4096], best of
    3), measured once per device and cached; 0 where bfloat16 matrix products fail. The engine uses the bfloat16
    proposal pass by default only where this is at least 1.5 (it never changes results, only speed).

    Example:
        >>> low_precision_speedup(torch.device("cpu")) >= 0
        True
    """
    key = (device.type, device.index)
    if key not in _SPEEDUP:
        try:
            a = torch.full((1024, 128), 0.5, device=device)
            b = torch.full((4096, 128), 0.25, device=device)

            def best(x, y):
                out = torch.mm(x, y.T)
                times = []
                for _ in range(3):
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    t = time.perf_counter()
                    torch.mm(x, y.T, out=out)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    times.append(time.perf_counter() - t)
                return min(times)

            t32 = best(a, b)
            t16 = best(a.to(torch.bfloat16), b.to(torch.bfloat16))
            _SPEEDUP[key] = t32 / max(t16, 1e-9)
        except RuntimeError:
            _SPEEDUP[key] = 0.0
    return _SPEEDUP[key]


class BlockedKNN:
    """Exact k-NN with a memory budget (see the module doc for the method and its error bounds); also a PML
    ``knn_func``: ``knn(query, k, reference, ref_includes_query)``.

    Args:
        distance: ``"euclidean"`` (default; squared L2 ``|q|² + |r|² − 2 q·r`` ranks the same as PML's default
            ``FaissKNN``, an ``IndexFlatL2``), ``"inner_product"`` (larger is nearer, as ``faiss.IndexFlatIP``), or a
            PML distance object: ``LpDistance(p=2)`` -> euclidean, ``DotProductSimilarity`` / ``CosineSimilarity``
            -> inner product; its ``normalize_embeddings`` is honoured (L2-normalised rows first).
        memory_budget: bytes for the engine's temporaries (default 512 MiB): half for score tiles, half for the
            candidate buffers of the queries in flight (8 bytes per candidate, ``1.25·k + 32`` per query; a
            self-retrieval sweep whose buffers do not fit runs in groups of rows); the rows method takes blocks
            of ``budget // (4·M + 144·(k + 1))`` query rows. The peak stays below twice the budget.
        block_size: fixed number of query rows per block (optional, positive int); also the tile size of the
            threshold method when ``block_size ≥ 2k + 2``.
        low_precision: None (default) = the bfloat16 proposal pass where :func:`low_precision_speedup` is at
            least 1.5; True / False force it on / off. The results are identical either way.
        method: ``"auto"`` (default), ``"threshold"`` or ``"rows"`` (module doc); ``"auto"`` takes the threshold
            method when ``16·k·(1 + ln(M/B)) ≤ M`` and a tile fits ``k``.
        symmetric: use the symmetry of self-retrieval (default True).

    ``blocks(query, k, reference, self_indices=None, rows=None, return_distances=False)`` (inputs from
    :meth:`prepare`) yields ``(positions [b] int64, indices [b, k] int64, distances [b, k] or None)`` for the query
    rows ``rows`` (default all; ``positions`` index into ``rows``), query q's own reference ``self_indices[q]``
    removed. ``search(query [b, D], k, reference [M, D], self_indices [b] = None, return_distances=False)`` returns
    ``(indices [b, k], distances [b, k] or None)`` for every query. ``__call__(query [N, D], k, reference=None,
    ref_includes_query=False)`` is PML's ``knn_func`` interface and returns ``(distances [N, k], indices [N, k])``,
    row i of the reference removed for query i when ``ref_includes_query`` (the queries are the first rows of the
    reference, PML's layout). Distances are the engine's scores: squared L2 (euclidean) or similarities (inner
    product, the negated score), in the embeddings' float dtype.

    ``dense_float64`` (attribute; None = auto, True / False force it): whether the rows method scores its blocks
    by a float64 GEMM (module doc, *dense rows*; by default on the CPU when ``32·k ≥ M``). Results are identical.

    After a search, ``stage_seconds`` holds the time per stage (``gemm``, ``selection``, ``rescore``, ``rank``; on
    CUDA synchronised only when ``profile_stages`` is True) and ``last_plan`` what was done (method, tile,
    precision, symmetric, proposals re-scored, queries redone by the rows method and by a full scan, and
    ``rescored_dense``: pairs of the dense rows re-scored by the kernel because they lay near a rounding boundary).

    k must lie in ``[1, available references]``; the calculators clamp it first (see their docs).
    Runs on the inputs' device (never moves them to another device).

    Raises:
        ValueError: unknown ``distance`` or ``method``, bad ``memory_budget``/``block_size``/``low_precision``,
            k out of range, embeddings that are not finite or not ``[n, D]`` with one D, more than 2³² references.

    Example:
        >>> knn = BlockedKNN()
        >>> x = torch.tensor([[0.0], [1.0], [3.0]])
        >>> knn(x, 1, x, ref_includes_query=True)[1].flatten().tolist()
        [1, 0, 1]
        >>> y = torch.randn(300, 8, generator=torch.Generator().manual_seed(0))
        >>> fast = BlockedKNN(method="threshold", low_precision=True, block_size=64)
        >>> torch.equal(fast(y, 5, y, True)[1], BlockedKNN(method="rows", low_precision=False)(y, 5, y, True)[1])
        True
    """

    _DENSE_MARGIN = 4.0  # c = 4·ε64: twice the bound on |v' − v| (tests raise it to force re-scoring)

    def __init__(
        self,
        distance: Union[str, object, None] = None,
        memory_budget: int = 512 * 2**20,
        block_size: Optional[int] = None,
        low_precision: Optional[bool] = None,
        method: str = "auto",
        symmetric: bool = True,
    ):
        self.inner_product, self.normalize = self._parse_distance(distance)
        if not is_int(memory_budget) or memory_budget < 1:
            raise ValueError(f"memory_budget must be a positive int (bytes), got {memory_budget!r}")
        if block_size is not None and (not is_int(block_size) or block_size < 1):
            raise ValueError(f"block_size must be None or a positive int, got {block_size!r}")
        if low_precision not in (None, True, False):
            raise ValueError(f"low_precision must be None, True or False, got {low_precision!r}")
        if method not in ("auto", "threshold", "rows"):
            raise ValueError(f"method must be 'auto', 'threshold' or 'rows', got {method!r}")
        self.memory_budget, self.fixed_block_size = memory_budget, block_size
        self.low_precision, self.method, self.symmetric = low_precision, method, bool(symmetric)
        self.profile_stages = False
        self.dense_float64: Optional[bool] = None  # the rows method's float64 GEMM: None = auto (see _dense64)
        self.stage_seconds: Dict[str, float] = {}
        self.last_plan: Dict[str, object] = {}
        self._device = torch.device("cpu")
        self._force_torch_ops = False  # tests: run the device-generic torch path on the CPU
        self._tick_lock = threading.Lock()
        self._threads, self._pool, self._local = 1, None, threading.local()

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

    # ------------------------------------------------------------------------------------------ sizes and plan
    def block_size(self, num_references: int, k: int) -> int:
        """Query rows per block of the rows method for ``num_references`` references and ``k`` neighbours."""
        if self.fixed_block_size is not None:
            return self.fixed_block_size
        return max(1, self.memory_budget // (4 * num_references + 144 * (k + 1)))

    def tile_size(self, num_rows: int, k: int, low_precision: bool, workers: int = 1) -> int:
        """Rows per tile of the threshold method (at most 8192): the ``workers``' tiles take at most a quarter of the
        budget; 0 when no tile holds ``2k + 2`` rows."""
        if self.fixed_block_size is not None:
            t = self.fixed_block_size
        else:  # the workers' tiles together take at most a quarter of the budget (masks are per strip: small)
            per = (2 if low_precision else 4) * max(1, workers)
            t = min(_TILE_MAX, int(math.isqrt(max(1, self.memory_budget // (4 * per)))))
        t = min(t, 2**16, num_rows)  # local row ids are radix-sorted as uint16
        return t if t >= 2 * k + 2 else 0

    @staticmethod
    def capacity(k: int) -> int:
        """Candidates buffered per query by the threshold method."""
        return k + k // 4 + 32

    def _choose(self, n_ref: int, k: int, low_precision: bool, workers: int) -> Tuple[str, int]:
        tile = self.tile_size(n_ref, k, low_precision, workers)
        if self.method == "threshold" and tile == 0:
            raise ValueError(
                f"method='threshold' needs tiles of at least 2k + 2 = {2 * k + 2} rows; got block_size "
                f"{self.fixed_block_size} and {n_ref} references"
            )
        if self.method == "rows" or tile == 0:
            return "rows", 0
        if self.method == "threshold":
            return "threshold", tile
        expected = k * (1 + math.log(max(1.0, n_ref / tile)))
        return ("threshold", tile) if 16 * expected <= n_ref else ("rows", 0)

    def prepare(self, embeddings: torch.Tensor, name: str) -> torch.Tensor:
        """float32 (or float64) ``[n, D]`` copy of ``embeddings``, L2-normalised if the distance asks for it."""
        if not isinstance(embeddings, torch.Tensor) or embeddings.ndim != 2:
            raise ValueError(f"{name} must be a 2-D tensor [n, D], got {getattr(embeddings, 'shape', embeddings)}")
        x = embeddings.detach().to(torch.promote_types(embeddings.dtype, torch.float32))
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or infinite values")
        return torch.nn.functional.normalize(x, dim=1) if self.normalize else x

    def score_buffer(self, rows: int, reference: torch.Tensor) -> torch.Tensor:
        """An uninitialised float32 ``[rows, M]`` buffer for the rows method (``reference``'s device)."""
        return torch.empty(rows, reference.shape[0], dtype=torch.float32, device=reference.device)

    def _count(self, key: str, n: int) -> None:
        with self._tick_lock:
            self.last_plan[key] = self.last_plan.get(key, 0) + int(n)

    def _tick(self, stage: str, t0: float) -> float:
        if self.profile_stages and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        t = time.perf_counter()
        with self._tick_lock:
            self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + t - t0
        return t

    # ---------------------------------------------------------------------------------------------- public API
    def blocks(
        self,
        query: torch.Tensor,
        k: int,
        reference: torch.Tensor,
        self_indices: Optional[torch.Tensor] = None,
        rows: Optional[torch.Tensor] = None,
        return_distances: bool = False,
        out: Optional[torch.Tensor] = None,
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
        """k nearest references of the query rows ``rows``, block by block (see the class doc); ``out``: an
        optional :meth:`score_buffer` for the rows method."""
        m, n, dev = reference.shape[0], query.shape[0], query.device
        if m >= 2**32:
            raise ValueError(f"at most 2**32 references are supported, got {m}")
        if query.shape[1] != reference.shape[1]:
            raise ValueError(f"query has D={query.shape[1]} but reference has D={reference.shape[1]}")
        available = m - (self_indices is not None)
        if not 1 <= k <= available:
            raise ValueError(f"k must lie in [1, {available}] (available references), got {k}")
        rows = torch.arange(n, device=dev) if rows is None else rows.to(dev)
        self._device, self.stage_seconds = dev, {}
        if len(rows) == 0:
            return
        if self_indices is not None:
            self_indices = self_indices.to(dev)
        symmetric = (
            self.symmetric
            and self_indices is not None
            and n == m
            and 2 * len(rows) >= n
            and torch.equal(self_indices, torch.arange(n, device=dev))
            and (query is reference or torch.equal(query, reference))
        )
        scale = float(torch.linalg.vector_norm(reference, dim=1).max())
        qscale = float(torch.linalg.vector_norm(query, dim=1).max())
        certifiable = (scale + 1) * (qscale + 1) < 2.0**100  # float32 products cannot overflow
        lp = self.low_precision
        if lp is None:
            lp = query.shape[1] >= 16 and low_precision_speedup(dev) >= 1.5
        workers = torch.get_num_threads() if dev.type == "cpu" else 1
        method, tile = self._choose(m, k, bool(lp), workers)
        if not certifiable:
            method, tile = "rows", 0
        lp = bool(lp) and method == "threshold"
        c_lp = pass_error_bound(query.shape[1], dev.type, True)
        if query.dtype != torch.float32:
            c_lp = (1 + c_lp) * (1 + 2.0**-24) ** 2 - 1
        geo = Geometry(
            query, query if symmetric else reference, self.inner_product, lp, c_lp, symmetric, method == "threshold"
        )
        self.last_plan = dict(
            method=method,
            tile=tile,
            low_precision=lp,
            symmetric=symmetric and method == "threshold",
            proposals=0,
            redone_by_rows=0,
            redone_exactly=0,
        )
        # CPU: one worker thread per torch thread, each running single-threaded kernels; the caller's own code (between
        # the blocks this yields) runs with its own setting
        self._threads = torch.get_num_threads() if dev.type == "cpu" else 1
        self._pool = ThreadPoolExecutor(self._threads) if self._threads > 1 else None
        try:
            if method == "rows":
                own = None if self_indices is None else self_indices[rows]
                gen = self._rows_method(geo, k, rows, own, return_distances, out, certifiable)
            elif symmetric:
                gen = self._symmetric(geo, k, rows, tile, return_distances)
            else:
                gen = self._asymmetric(geo, k, rows, self_indices, tile, return_distances)
            yield from self._single_threaded(gen)
        finally:
            if self._pool is not None:
                self._pool.shutdown()
            self._pool = None

    def _single_threaded(self, gen):
        """Yield from ``gen`` with torch's intra-op threads at 1 while it works (its workers share the cores)."""
        if self._threads <= 1:
            yield from gen
            return
        while True:
            torch.set_num_threads(1)
            try:
                item = next(gen)
            except StopIteration:
                return
            finally:
                torch.set_num_threads(self._threads)
            yield item

    def search(
        self,
        query,
        k: int,
        reference,
        self_indices=None,
        return_distances: bool = False,
        out=None,
    ):
        """k nearest references of each query row (see the class doc). Inputs must come from :meth:`prepare`;
        ``out``: an optional :meth:`score_buffer` for the rows method."""
        b = len(query)
        idx = torch.empty(b, k, dtype=torch.long, device=query.device)
        dist = torch.empty(b, k, dtype=query.dtype, device=query.device) if return_distances else None
        for pos, i, d in self.blocks(query, k, reference, self_indices, None, return_distances, out):
            idx[pos] = i
            if return_distances:
                dist[pos] = d
        return idx, dist

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        query = self.prepare(query, "query")
        reference = query if reference is None else self.prepare(reference, "reference")
        n = len(query)
        if ref_includes_query and n > len(reference):
            raise ValueError("ref_includes_query=True needs the queries as the first rows of the reference")
        if n == 0:
            return query.new_zeros(0, k), torch.zeros(0, k, dtype=torch.long, device=query.device)
        own = torch.arange(n, device=query.device) if ref_includes_query else None
        idx, dist = self.search(query, k, reference, own, True)
        return dist, idx

    # ---------------------------------------------------------------------------------------------- methods
    def _rows_method(self, geo, k, rows, own_rows, return_distances, out, certifiable):
        """The rows method for queries ``rows`` (``own_rows``: their excluded references, or None): blocks of queries
        on the workers, yielded in order; the queries it cannot certify are ranked by scoring every reference."""
        m = geo.r.shape[0]
        workers = self._threads if self._pool is not None else 1
        # the workers share the budget; half of it for a block's score rows and candidates, half for its temporaries
        bs = max(1, min(self.block_size(m, k) // (2 * workers), len(rows)))
        dense = self._dense64(geo.device, k, m)
        block = self._rows_block_dense if dense else self._rows_block
        if dense:  # 17 bytes per score (float64, float32, its partitioned copy, the mask) but ~k/4 fewer arrays
            bs = max(1, bs // 2)
        starts = list(range(0, len(rows), bs))
        for w0 in range(0, len(starts), workers):
            wave, results = starts[w0 : w0 + workers], {}
            tasks = [
                ((s,), partial(block, geo, k, rows, own_rows, s, bs, out, certifiable, return_distances, results))
                for s in wave
            ]
            run_tasks(tasks, self._pool, workers)
            for s in wave:
                yield results[s]

    def _rows_block(self, geo, k, rows, own_rows, start, bs, out, certifiable, return_distances, results):
        """One block of the rows method (module doc) into ``results[start]``. The block is scored transposed,
        ``[M, b]`` (references as rows), so its candidates come grouped by reference and the re-scoring loads each
        reference row once per block (query-major, a dense-k block re-read the references ``b`` times)."""
        m = geo.r.shape[0]
        cap = 4 * k + 4096  # candidates beyond this many per query: that query is ranked exactly
        ops = ops_for(geo.device, self._force_torch_ops)
        a = ops.arr
        g = max(1, min(16, (m - 1) // (2 * k)))  # groups of g references; at least 2k groups
        groups = m // g
        loc = self._local
        t0 = time.perf_counter()
        blk = rows[start : start + bs]
        b = len(blk)
        if self._pool is None and out is not None and out.numel() >= bs * m and out.dtype == torch.float32:
            buf = out.view(-1)
        else:
            buf = getattr(loc, "rows_buf", None)
            if buf is None or buf.numel() < bs * m or buf.device != geo.device:
                buf = loc.rows_buf = torch.empty(bs * m, dtype=torch.float32, device=geo.device)
        d = buf[: m * b].view(m, b)  # d[j, i]: GEMM score of query blk[i] and reference j
        if geo.w:
            torch.addmm(geo.rsq32[:, None], geo.r32, geo.q32[blk].T, beta=1, alpha=-2, out=d)
        else:
            torch.mm(geo.r32, geo.q32[blk].T, out=d)
            d.neg_()
        own = own_rows[start : start + bs] if own_rows is not None else None
        if own is not None:
            d[own, torch.arange(b, device=geo.device)] = math.inf
        t0 = self._tick("gemm", t0)
        # finite inputs whose products cannot overflow (``certifiable``) give finite scores
        failed = a(torch.full((b,), not certifiable, dtype=torch.bool, device=geo.device))
        # the k-th smallest of the minima over g strided groups of references bounds each query's k-th GEMM score
        mins = (d[: g * groups].view(g, groups, b).amin(0) if g > 1 else d).T.clone(
            memory_format=torch.contiguous_format
        )
        kth = kth_smallest_rows(mins, k).to(geo.device).to(torch.float64)
        del mins
        # k references have g + |q|² <= kth + |q|², so exact scores <= B = kth + |q|² + Δ32 and engine scores
        # <= U = B + canon(B); an engine score <= U means an exact one <= U + canon(U): a GEMM score g <= that
        # + Δ32 − |q|²
        delta, eps, qsq = geo.delta32[blk], geo.eps64[blk], geo.qsq[blk]
        bound = kth + qsq + delta
        u = bound + Geometry.canon(bound, eps)
        top = u + Geometry.canon(u, eps) + delta - qsq
        limit = up32(top + SLACK * (top.abs() + qsq + delta))
        mask = a(d) <= a(limit)[None, :]
        counts = ops.count_cols(mask)  # candidates per query
        failed = failed | (counts > cap)
        if bool(failed.any()):
            mask[:, failed] = False
            counts[failed] = 0
        per_ref = ops.count_rows(mask)
        flat = ops.nonzero(mask)  # grouped by reference
        del mask
        ref = ops.repeat(ops.arange(m, per_ref), per_ref)
        qi = flat - ref * b
        del flat
        t0 = self._tick("selection", t0)
        tref, tqi = ops.tensor(ref), ops.tensor(qi)
        dots = pair_dots(geo.r64, geo.q.index_select(0, blk).to(torch.float64), tref, tqi)
        sq_q = geo.qsq[blk].index_select(0, tqi) if geo.w else None
        sc = a(finish(geo.rsq.index_select(0, tref) if geo.w else None, sq_q, dots, geo.w))
        del dots, tref
        t0 = self._tick("rescore", t0)
        order = ops.group_order(qi)  # stable: per query, references ascending
        keys = ops.keys(sc[order], ref[order])
        del sc, ref, qi, order
        width = max(int(counts.max()), k)
        packed = ops.full((b, width), INT64_MAX, torch.int64, counts)
        packed[ops.arange(width, counts)[None, :] < counts[:, None]] = keys  # query by query
        del keys
        packed = ops.sort_rows(packed)
        t0 = self._tick("selection", t0)
        idx, dist = self._rank(geo, packed, counts, blk, own, k, failed, return_distances, ops, False)
        self._tick("rank", t0)
        results[start] = (torch.arange(start, start + b, device=geo.device), idx, dist)

    def _dense64(self, device, k, m) -> bool:
        """Whether the rows method scores its blocks by a float64 GEMM (:meth:`_rows_block_dense`): on the CPU
        when the candidates would be at least 1/32 of the references (``32·k ≥ M``; measured break-even on 20,000
        × 128: k ≈ M/30 costs the same both ways, k ≈ M/6 a quarter less CPU time dense), where re-scoring them
        pair by pair costs more than the float64 GEMM's extra arithmetic; ``dense_float64`` forces it on or off."""
        if self.dense_float64 is not None:
            return bool(self.dense_float64)
        return device.type == "cpu" and not self._force_torch_ops and 32 * k >= m

    def _rows_block_dense(self, geo, k, rows, own_rows, start, bs, out, certifiable, return_distances, results):
        """One block of the rows method scored by one float64 GEMM (module doc, *dense rows*) into
        ``results[start]``: ``v' = (|q|² + |r|²) − 2·q·r`` (or ``−q·r``) for the block's queries against every
        reference, query-major ``[b, M]``; its float32 rounding is the engine score wherever ``v' ± c`` round to
        the same float32 (``c = 4·ε64``); the few pairs where they do not are re-scored by :func:`pair_dots`."""
        del out  # float64 scores: the caller's float32 buffer does not fit them
        m = geo.r.shape[0]
        cap = 4 * k + 4096  # candidates beyond this many per query: that query is ranked by a full scan
        ops = ops_for(geo.device, self._force_torch_ops)
        a = ops.arr
        loc = self._local
        t0 = time.perf_counter()
        blk = rows[start : start + bs]
        b = len(blk)
        need = bs * m
        if getattr(loc, "dense_bufs", None) is None or loc.dense_bufs[0].numel() < need:
            loc.dense_bufs = (
                torch.empty(need, dtype=torch.float64, device=geo.device),
                torch.empty(need, dtype=torch.float32, device=geo.device),
                torch.empty(need, dtype=torch.float32, device=geo.device),
            )
        v = loc.dense_bufs[0][: b * m].view(b, m)
        e = loc.dense_bufs[1][: b * m].view(b, m)
        q64 = geo.q.index_select(0, blk).to(torch.float64)
        if geo.w:
            torch.add(geo.qsq.index_select(0, blk)[:, None], geo.rsq[None, :], out=v)
            v.addmm_(q64, geo.r64.T, alpha=-2)
        else:
            torch.mm(q64, geo.r64.T, out=v)
            v.neg_()
        own = own_rows[start : start + bs] if own_rows is not None else None
        if own is not None:
            v[torch.arange(b, device=geo.device), own] = math.inf
        e.copy_(v)  # float32 rounding
        t0 = self._tick("gemm", t0)
        # k references have e ≤ kth; an engine score E and its e differ by at most 2⁻²²·|e| + c + 2⁻¹⁴⁸ (each rounds
        # a float64 value to float32, the two values within c/2), so the k-th engine score is ≤ T = kth +
        # 2⁻²¹·|kth| + 2c + 2⁻¹⁴⁷, and a reference can only reach T when e ≤ T + 2⁻²¹·|T| + 2c + 2⁻¹⁴⁷ (slack
        # covers the float64 arithmetic of the bounds and subnormal float32 values)
        c = self._DENSE_MARGIN * geo.eps64.index_select(0, blk)
        tmp = loc.dense_bufs[2][: b * m].view(b, m)
        tmp.copy_(e)
        kth = ops.tensor(ops.kth_smallest(a(tmp), k)).to(geo.device).to(torch.float64)
        top = kth + 2.0**-21 * kth.abs() + 2 * c + 2.0**-147
        limit = up32(top + 2.0**-21 * top.abs() + 2 * c + 2.0**-147)
        mask = a(e) <= a(limit)[:, None]
        counts = ops.count_rows(mask)
        failed = a(torch.full((b,), not certifiable, dtype=torch.bool, device=geo.device)) | (counts > cap)
        if bool(failed.any()):
            mask[failed] = False
            counts[failed] = 0
        flat = ops.nonzero(mask)  # grouped by query, references ascending
        del mask
        row = ops.repeat(ops.arange(b, counts), counts)
        ref = flat - row * m
        vals = a(v).reshape(-1)[flat]
        sc = a(e).reshape(-1)[flat]
        cr = a(c)[row]
        lo, hi = vals - cr, vals + cr
        amb = ops.nonzero(ops.f32(lo) != ops.f32(hi))
        t0 = self._tick("selection", t0)
        if len(amb):  # v' too close to a float32 rounding boundary: the engine's own kernel decides
            self._count("rescored_dense", len(amb))
            ti, tj = ops.tensor(row[amb]), ops.tensor(ref[amb])
            dots = pair_dots(q64, geo.r64, ti, tj)
            sq_q = geo.qsq[blk].index_select(0, ti) if geo.w else None
            sc[amb] = a(finish(sq_q, geo.rsq.index_select(0, tj) if geo.w else None, dots, geo.w))
        t0 = self._tick("rescore", t0)
        keys = ops.keys(sc, ref)
        del sc, vals, lo, hi
        width = max(int(counts.max()) if b else 0, k)
        starts = ops.cumsum(counts) - counts
        rank = ops.arange(len(flat), counts) - starts[row]
        packed = ops.full((b, width), INT64_MAX, torch.int64, counts)
        packed.reshape(-1)[row * width + rank] = keys
        del keys, flat, ref, row, rank
        packed = ops.sort_rows(packed)
        t0 = self._tick("selection", t0)
        idx, dist = self._rank(geo, packed, counts, blk, own, k, failed, return_distances, ops, False)
        self._tick("rank", t0)
        results[start] = (torch.arange(start, start + b, device=geo.device), idx, dist)

    def _sweep(self, geo, k, tile):
        ops = ops_for(geo.device, self._force_torch_ops)
        return ThresholdSweep(geo, k, tile, self.capacity(k), self._tick, ops, self._threads, self._pool)

    def _asymmetric(self, geo, k, rows, self_indices, tile, return_distances):
        sweep = self._sweep(geo, k, tile)
        own = None if self_indices is None else self_indices[rows]
        own_t = own if own is None or geo.inv is None else geo.inv[own]  # in tile (norm-sorted) coordinates
        for st, start in sweep.asymmetric(rows, own_t):
            blk = rows[start : start + tile]
            local = sweep.ops.arr(torch.arange(len(blk), device=geo.device))
            own_b = None if own is None else own[start : start + tile]
            idx, dist = self._finish(geo, st, local, blk, own_b, k, return_distances, sweep)
            yield torch.arange(start, start + len(blk), device=geo.device), idx, dist

    def _symmetric(self, geo, k, rows, tile, return_distances):
        n = geo.q.shape[0]
        sweep = self._sweep(geo, k, tile)
        group_rows = max(tile, (self.memory_budget // 2) // (8 * self.capacity(k) + 64))
        wanted = torch.zeros(n, dtype=torch.bool, device=geo.device)
        wanted[rows] = True
        position = torch.full((n,), -1, dtype=torch.long, device=geo.device)
        position[rows] = torch.arange(len(rows), device=geo.device)
        orig = geo.ref_ids(torch.arange(n, device=geo.device))  # tile coordinate -> original row
        for st, local, lo in sweep.symmetric(wanted[orig], group_rows):
            for s0 in range(0, len(local), tile):
                loc = local[s0 : s0 + tile]
                q = orig[sweep.ops.tensor(loc) + lo]
                idx, dist = self._finish(geo, st, loc, q, q, k, return_distances, sweep)
                yield position[q], idx, dist

    # ---------------------------------------------------------------------------------------------- ranking
    def _finish(self, geo, st, local, qrows, own, k, return_distances, sweep):
        t0 = time.perf_counter()
        keys, counts, failed = st.export(local)
        t0 = self._tick("selection", t0)
        self._count("proposals", sweep.proposals)
        sweep.proposals = 0
        out = self._rank(geo, keys, counts, qrows, own, k, failed, return_distances, sweep.ops)
        self._tick("rank", t0)
        return out

    def _rank(self, geo, keys, counts, qrows, own, k, failed, return_distances, ops, rows_fallback=True):
        """Top-k of sorted candidate keys (``ops`` arrays). Queries not certified are redone: by the rows method
        (``rows_fallback``, when they come from the threshold method; its buffer holds ``4k + 4096`` candidates),
        else by scoring every reference."""
        idx, d, failed = (ops.tensor(x) for x in top_k(keys, counts, failed, k, ops))
        bad = failed.nonzero().flatten()
        if len(bad):
            own_bad = None if own is None else own[bad]
            idx, d = idx.clone(), d.clone()
            if rows_fallback:
                self._count("redone_by_rows", len(bad))
                for pos, ri, rd in self._rows_method(geo, k, qrows[bad], own_bad, "scores", None, True):
                    idx[bad[pos]], d[bad[pos]] = ri, rd
            else:
                self._count("redone_exactly", len(bad))
                idx[bad], d[bad] = self._exact_rows(geo, qrows[bad], own_bad, k)
        if return_distances == "scores":  # the engine's float32 scores (a fallback feeding the threshold method)
            return idx, d
        if not return_distances:
            return idx, None
        return idx, (d.clamp(min=0) if geo.w else -d).to(geo.q.dtype)  # squared distances or similarities

    def _exact_rows(self, geo, qrows, own, k):
        """The engine's float32 scores of queries ``qrows`` against every reference, sorted by (score, index): the
        last fallback. Returns (indices [b, k], scores [b, k])."""
        m = geo.r.shape[0]
        ref = torch.arange(m, device=geo.device)
        rows = max(1, self.memory_budget // (32 * max(m, 1)))
        idx, d = [], []
        for a in range(0, len(qrows), rows):
            q = qrows[a : a + rows]
            i = torch.arange(len(q), device=geo.device).repeat_interleave(m)
            q64 = geo.q.index_select(0, q).to(torch.float64)
            sc = engine_scores(q64, geo.r64, i, ref.repeat(len(q)), geo.qsq.index_select(0, q), geo.rsq, geo.w)
            sc = sc.view(len(q), m)
            if own is not None:
                sc[torch.arange(len(q), device=geo.device), own[a : a + rows]] = math.inf
            keys = sort_rows(ordered_keys(sc, ref.expand(len(q), m)))[:, :k]
            idx.append(keys & LOW32)
            d.append(key_scores(keys))
        return torch.cat(idx), torch.cat(d)

    def float32_scores(self, query: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """The engine's float32 scores of every pair, ``[Nq, M]`` float32, smaller is nearer: squared distances
        (euclidean) or negated inner products, each the float32 rounding of a float64 score by the one kernel the
        engine ranks with (module doc). A stable sort of a row (ties by reference index) is the engine's ranking of
        that query; meant for checks on small sets.

        Example:
            >>> knn = BlockedKNN()
            >>> x = torch.tensor([[0.0], [1.0], [3.0]])
            >>> knn.float32_scores(x, x).tolist()
            [[0.0, 1.0, 9.0], [1.0, 0.0, 4.0], [9.0, 4.0, 0.0]]
        """
        q, r = self.prepare(query, "query"), self.prepare(reference, "reference")
        n, m = len(q), len(r)
        w = 0 if self.inner_product else 1
        zeros = lambda x: torch.zeros(len(x), dtype=torch.float64, device=x.device)  # noqa: E731
        q_sq, r_sq = (self_dots(q), self_dots(r)) if w else (zeros(q), zeros(r))
        i = torch.arange(n, device=q.device).repeat_interleave(m)
        j = torch.arange(m, device=q.device).repeat(n)
        return engine_scores(q.to(torch.float64), r.to(torch.float64), i, j, q_sq, r_sq, w).view(n, m)
