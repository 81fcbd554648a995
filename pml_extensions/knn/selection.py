"""Candidate buffers and the threshold sweep of the exact k-NN engine; the method and its bounds are derived in
``docs/evaluation.md`` ("The k-NN engine"). Array work runs through :mod:`~pml_extensions.knn.ops` (``ops``).
"""

import math
import threading
import time
from functools import partial
from typing import Iterator, Optional, Tuple

import numpy as np
import torch

from .scores import (
    INT64_MAX,
    LOW32,
    SLACK,
    bf16_floor,
    down32,
    finish,
    gamma,
    kth_largest_rows,
    kth_smallest_rows,
    pair_dots,
    self_dots,
)

STRIP = 1024  # query rows of a tile whose proposals are handled together


# ------------------------------------------------------------------------------------------------ geometry
class Geometry:
    """Operands of one search, their norms and error bounds (``delta32`` = Δ32, ``eps64`` = ε64, ``c_lp`` = c per
    query, in the docs' notation; ``d = w·(|q|² + |r|²) − s·q·r``), and the tile operands (references sorted by norm,
    so each tile's thresholds are tight)."""

    def __init__(self, query, reference, inner_product, low_precision, c_lp, symmetric, tiles):
        self.q, self.r = query, reference
        self.device = query.device
        self.w, self.s = (0, 1) if inner_product else (1, 2)
        self.q32, self.r32 = query.to(torch.float32), reference.to(torch.float32)
        self.qn = torch.linalg.vector_norm(self.q32, dim=1)
        self.rn = torch.linalg.vector_norm(self.r32, dim=1)
        zeros = lambda n: torch.zeros(n, dtype=torch.float64, device=self.device)  # noqa: E731
        self.qsq = self_dots(query) if self.w else zeros(len(query))
        self.rsq = self.qsq if reference is query else (self_dots(reference) if self.w else zeros(len(reference)))
        self.rsq32 = self.rsq.to(torch.float32)
        d = query.shape[1]
        wide = query.dtype != torch.float32  # float64 inputs: one more rounding (to float32) per entry
        self.g_dot = gamma(d + 2 * wide, 2.0**-24)  # a float32 dot product or squared norm, any order
        self.eta = 2 * d * 2.0**-126  # flushed / underflowed subnormals, times (1 + |q|)(1 + |r|)
        rn_max = float(self.rn.max()) if len(self.rn) else 0.0
        qn64 = self.qn.to(torch.float64)
        scale = self.w * (qn64**2 + rn_max**2) + self.s * qn64 * rn_max
        self.delta32 = gamma(d + 4 + 2 * wide, 2.0**-24) * scale + self.s * self.eta * (1 + qn64) * (1 + rn_max)
        self.eps64 = gamma(d + 4, 2.0**-53) * scale * 1.01 + 1e-300
        self.low_precision = bool(low_precision)
        self.c_lp = c_lp if low_precision else self.g_dot
        self._r64 = None
        self.perm = self.inv = None
        if tiles:
            lo, hi = (float(self.rn.min()), rn_max) if len(self.rn) else (0.0, 0.0)
            if hi > lo * (1 + 2.0**-10):
                self.perm = torch.argsort(self.rn, stable=True)
                self.inv = torch.empty_like(self.perm)
                self.inv[self.perm] = torch.arange(len(self.perm), device=self.device)
            take = (lambda t: t) if self.perm is None else (lambda t: t[self.perm])  # noqa: E731
            self.t_r, self.t_r32, self.t_rn, self.t_rsq = take(reference), take(self.r32), take(self.rn), take(self.rsq)
            self.t_rlp = self.t_r32.to(torch.bfloat16) if low_precision else self.t_r32
            self.t_ids = torch.arange(len(self.r), device=self.device) if self.perm is None else self.perm
            if symmetric:
                self.t_q, self.t_qn, self.t_qlp, self.t_qsq = self.t_r, self.t_rn, self.t_rlp, self.t_rsq
                self.t_eps = take(self.eps64)
            else:
                self.t_q, self.t_qn, self.t_qsq = query, self.qn, self.qsq
                self.t_qlp = self.q32.to(torch.bfloat16) if low_precision else self.q32
                self.t_eps = self.eps64

    @property
    def r64(self) -> torch.Tensor:
        """float64 copy of the references, made once."""
        if self._r64 is None:
            self._r64 = self.r.to(torch.float64)
        return self._r64

    @staticmethod
    def canon(x, eps):
        """Bound on ``|e − d|`` for an engine score ``e`` near ``x``: ``2⁻²⁴·|x| + eps``, with slack."""
        return (abs(x) * (2.0**-24) + eps) * (1 + SLACK) + 1e-300

    def ref_ids(self, t_idx: torch.Tensor) -> torch.Tensor:
        return t_idx if self.perm is None else self.perm[t_idx]


# ------------------------------------------------------------------------------------------------ buffers
class State:
    """Candidate buffers of a set of queries (``cap`` int64 keys each), their bounds ``U`` on the k-th engine score,
    keep limits ``up32(U)`` and failed (not certified) flags, as ``ops`` arrays; ``delta``: their ``eps64``."""

    def __init__(self, n: int, cap: int, k: int, delta: torch.Tensor, device: torch.device, ops):
        self.ops, self.cap, self.k = ops, cap, k
        self.keys = ops.arr(torch.full((n, cap), INT64_MAX, dtype=torch.long, device=device))
        self.count = ops.arr(torch.zeros(n, dtype=torch.long, device=device))
        self.U = ops.arr(torch.full((n,), math.inf, dtype=torch.float64, device=device))
        self.limit = ops.arr(torch.full((n,), math.inf, dtype=torch.float32, device=device))
        self.delta = ops.arr(delta.to(torch.float64).contiguous())
        self.failed = ops.arr(torch.zeros(n, dtype=torch.bool, device=device))
        self._flat = self.keys.reshape(-1)

    def _set_u(self, rows, u) -> None:
        ops = self.ops
        self.U[rows] = u
        self.limit[rows] = ops.where(self.failed[rows], -math.inf, ops.up32(u))

    def export(self, local):
        return self.ops.sort_rows(self.keys[local]), self.count[local], self.failed[local]

    def lower_u(self, base: int, bound) -> None:
        ops = self.ops
        bound = ops.arr(bound.contiguous())
        span = slice(base, base + len(bound))
        u = self.U[span]
        ok = (bound < math.inf) & ~self.failed[span]
        self._set_u(span, ops.where(ok & (bound < u), bound, u))

    def fail(self, rows) -> None:
        self.failed[rows] = True
        self.U[rows] = -math.inf
        self.limit[rows] = -math.inf
        self.count[rows] = 0
        self.keys[rows] = INT64_MAX

    def add(self, rows, d32, refs, base: int, span: int) -> None:
        """Add candidates (``rows`` ascending within ``base:base + span``) below the keep limit; a full buffer is
        pruned with them (:meth:`_merge`)."""
        ops = self.ops
        keep = ops.nonzero(d32 <= self.limit[rows])
        rows, d32, refs = rows[keep], d32[keep], refs[keep]
        if len(rows) == 0:
            return
        counts = ops.bincount(rows - base, span)
        count = self.count[base : base + span]
        over = count + counts > self.cap
        if bool(over.any()):
            self._merge(rows, d32, refs, base, span, over, counts)
            keep = ops.nonzero(~over[rows - base])
            rows, d32, refs = rows[keep], d32[keep], refs[keep]
            counts = counts * ~over
        starts = ops.cumsum(counts) - counts
        rank = ops.arange(len(rows), rows) - starts[rows - base]
        self._flat[rows * self.cap + self.count[rows] + rank] = ops.keys(d32, refs)
        count += counts

    def _merge(self, rows, d32, refs, base, span, over, counts) -> None:
        """Prune the union of full buffers and their new candidates; fail rows where it still does not fit."""
        ops = self.ops
        big = ops.nonzero(over) + base
        sel = ops.nonzero(over[rows - base])
        r = rows[sel]
        nb = counts[big - base]
        local = ops.full((span,), -1, torch.int64, rows)
        local[big - base] = ops.arange(len(big), rows)
        starts = ops.cumsum(nb) - nb
        lr = local[r - base]
        rank = ops.arange(len(r), rows) - starts[lr]
        width = self.cap + int(nb.max())
        merged = ops.full((len(big), width), INT64_MAX, torch.int64, rows)
        merged[:, : self.cap] = self.keys[big]
        merged.reshape(-1)[lr * width + self.count[big][lr] + rank] = ops.keys(d32[sel], refs[sel])
        merged, newc = self._prune(big, merged, self.count[big] + nb)
        fits = newc <= self.cap
        ok = big[ops.nonzero(fits)]
        self.keys[ok] = merged[ops.nonzero(fits), : self.cap]
        self.count[ok] = newc[ops.nonzero(fits)]
        self.fail(big[ops.nonzero(~fits)])

    def _prune(self, rows, keys, counts):
        """Sort ``keys``, tighten ``U`` to the k-th score, drop candidates beyond it (ties kept): (keys, counts)."""
        ops = self.ops
        keys = ops.sort_rows(keys)
        have = (counts >= self.k) & ~self.failed[rows]
        bound = ops.f64(ops.decode(keys[:, self.k - 1]))  # k candidates at or below: the k-th score is no larger
        u = self.U[rows]
        self._set_u(rows, ops.where(have & (bound < u), bound, u))
        limit_keys = ops.keys(self.limit[rows], ops.full((len(rows),), LOW32, torch.int64, rows))
        newc = ops.where(have, (keys <= limit_keys[:, None]).sum(1), counts)
        keys[ops.arange(keys.shape[1], rows)[None, :] >= newc[:, None]] = INT64_MAX
        return keys, newc


# ------------------------------------------------------------------------------------------------ workers
def run_tasks(tasks, pool, workers: int) -> None:
    """Run ``(blocks, fn)`` tasks on ``workers`` threads of ``pool``: two tasks sharing a block never run together,
    each starts in list order once its blocks are free; the first error is re-raised here."""
    if workers <= 1 or pool is None or len(tasks) <= 1:
        for _, fn in tasks:
            fn()
        return
    pending, busy, errors = list(tasks), set(), []
    cond = threading.Condition()

    def worker():
        while True:
            with cond:
                while True:
                    if errors or not pending:
                        return
                    pick = next((t for t in pending if not busy.intersection(t[0])), None)
                    if pick is not None:
                        break
                    cond.wait()
                pending.remove(pick)
                busy.update(pick[0])
            try:
                pick[1]()
            except BaseException as e:  # re-raised in the calling thread
                with cond:
                    errors.append(e)
            finally:
                with cond:
                    busy.difference_update(pick[0])
                    cond.notify_all()

    for f in [pool.submit(worker) for _ in range(min(workers, len(tasks)))]:
        f.result()
    if errors:
        raise errors[0]


# ------------------------------------------------------------------------------------------------ the sweep
class ThresholdSweep:
    """The threshold method (steps 1-3) over tiles of ``tile`` rows; ``tick(stage, t0)`` accounts time to a stage;
    ``workers`` threads process tiles of disjoint query blocks at once (NumPy and torch release the GIL)."""

    def __init__(self, geo: Geometry, k: int, tile: int, cap: int, tick, ops, workers: int = 1, pool=None):
        self.geo, self.k, self.tile, self.cap, self.tick, self.ops = geo, k, tile, cap, tick, ops
        self.workers = max(1, int(workers)) if pool is not None else 1
        self.run = partial(run_tasks, pool=pool, workers=self.workers)
        self.proposals = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        a = ops.arr
        self.a_ids, self.a_qn = a(geo.t_ids), a(geo.t_qn)

    def _buffers(self, size):
        loc = self._local
        if getattr(loc, "masks", None) is None or loc.masks[0].size < size:
            loc.masks = (np.empty(size, dtype=bool), np.empty(size, dtype=bool))
        return tuple(m[:size] for m in loc.masks)

    # -- thresholds
    def _err(self, qn, rn_max):
        """Per query: bound on ``|p̃ − p|`` against any reference of the tile."""
        g = self.geo
        qn = qn.to(torch.float64)
        return g.c_lp * qn * rn_max + g.eta * (1 + qn) * (1 + rn_max)

    def _thresholds(self, u, eps, qsq, qn, rn_max, rsq_min, dtype):
        """Proposal thresholds on ``p̃`` (the proposal rule), rounded down to the tile's dtype (as float32)."""
        g = self.geo
        n = g.w * (qsq + rsq_min * (1 - 2.0**-50))
        uc = u.clamp(-1e300, 1e300)
        top = uc + Geometry.canon(uc, eps)
        err = self._err(qn, rn_max)
        t = (n - top) / g.s - err
        t = t - SLACK * ((n.abs() + top.abs()) / g.s + err) - 1e-300
        t = torch.where(torch.isposinf(u), torch.full_like(t, -math.inf), t)
        t = torch.where(torch.isneginf(u), torch.full_like(t, math.inf), t)
        return bf16_floor(t).to(torch.float32) if dtype == torch.bfloat16 else down32(t)

    def _seed(self, st, base, p, qn, qsq, rn_max, rsq_max):
        """``U`` from the first tile: k references have ``d ≤ B = w·(|q|² + |r|²_max) − s·(p̃_k − err)``."""
        g = self.geo
        if p.shape[1] <= self.k:
            return
        kth = kth_largest_rows(p, self.k).to(g.device)
        n = g.w * (qsq + rsq_max * (1 + 2.0**-50))
        bound = n - g.s * kth + g.s * self._err(qn, rn_max)
        bound = bound + SLACK * (n.abs() + g.s * kth.abs() + bound.abs())
        eps = self.ops.tensor(st.delta[base : base + len(kth)])
        st.lower_u(base, bound + Geometry.canon(bound, eps))

    def _scores(self, qa, lo, hi):
        """Query-major tile ``[len(qa), hi − lo]`` of proposal scores, in a reused buffer (fresh ones fault pages)."""
        g, loc = self.geo, self._local
        size = len(qa) * (hi - lo)
        if getattr(loc, "buf", None) is None or loc.buf.numel() < size:
            loc.buf = torch.empty(self.tile * self.tile, dtype=g.t_rlp.dtype, device=g.device)
        return torch.mm(qa, g.t_rlp[lo:hi].T, out=loc.buf[:size].view(len(qa), hi - lo))

    # -- tiles
    def row_tile(self, st, base, qsel, lo, hi, seed=False, diagonal=False, own_t=None):
        """Queries ``qsel`` (state rows ``base + 0..``) against tile references ``lo:hi``, excluding ``own_t`` (or the
        diagonal); ``seed``: the queries' first tile."""
        g, ops = self.geo, self.ops
        t0 = time.perf_counter()
        p = self._scores(g.t_qlp[qsel], lo, hi)
        if diagonal:
            p.fill_diagonal_(-math.inf)
        elif own_t is not None:
            r = ((own_t >= lo) & (own_t < hi)).nonzero().flatten()
            p[r, own_t[r] - lo] = -math.inf
        t0 = self.tick("gemm", t0)
        nq = p.shape[0]
        qn, rn, qsq, rsq = g.t_qn[qsel], g.t_rn[lo:hi], g.t_qsq[qsel], g.t_rsq[lo:hi]
        rn_max, rsq_max, rsq_min = rn.max().double(), rsq.max(), rsq.min()
        if seed:
            self._seed(st, base, p, qn, qsq, rn_max, rsq_max)
        span = slice(base, base + nq)
        t = self._thresholds(ops.tensor(st.U[span]), ops.tensor(st.delta[span]), qsq, qn, rn_max, rsq_min, p.dtype)
        q_rows, r_rows = g.t_q[qsel].to(torch.float64), g.t_r[lo:hi].to(torch.float64)
        sq = ops.arr(qn), ops.arr(qsq), ops.arr(rsq)
        for a, n, i, j, d in self._strips(st, p, t, None, q_rows, r_rows, *sq, rn_max, (base,), t0):
            if seed:
                self._tighten_seed(st, base, a, n, i, d)
            st.add(i + base, d, self.a_ids[j + lo], base, nq)

    def _strips(self, st, p, t_rows, t_cols, q_rows, r_rows, a_qn, sq_q, sq_r, rn_max, bases, t0):
        """Proposals of tile ``p``, ``STRIP`` rows at a time, re-scored; fails the queries (rows ``i`` + ``bases[0]``,
        columns ``j`` + ``bases[1]``) of pairs whose ``p̃`` broke its bound. Yields ``(a, strip rows, i, j, d)``."""
        g, ops = self.geo, self.ops
        values = ops.bf16_values if p.dtype == torch.bfloat16 else ops.f32_values
        rn = float(rn_max)
        scale = g.c_lp * (1 + SLACK) * rn + g.eta * (1 + rn) + 2.0**-40 * rn
        for a in range(0, p.shape[0], STRIP):
            sub = p[a : a + STRIP]
            flat = ops.select(sub, t_rows[a : a + STRIP], t_cols, self._buffers)
            i, j = ops.split(flat, p.shape[1])
            i, vals = i + a, values(sub, flat)
            t0 = self.tick("selection", t0)
            with self._lock:
                self.proposals += len(i)
            dots = ops.arr(pair_dots(q_rows, r_rows, ops.tensor(i), ops.tensor(j))) if len(i) else vals * 1.0
            bad = ops.nonzero(~(abs(dots - vals) <= a_qn[i] * scale + g.eta * (1 + rn) + 1e-30))
            if len(bad):
                for x, base in zip((i, j), bases):
                    st.fail(x[bad] + base)
            d = finish(sq_q[i], sq_r[j], dots, g.w)  # a distance: the same value for both directions
            t0 = self.tick("rescore", t0)
            yield a, len(sub), i, j, d
            t0 = self.tick("selection", t0)

    def _tighten_seed(self, st, base, a, n, i, d):
        """``U`` of the seed tile's rows ``a:a + n``: the k-th smallest score of their candidates ``(i, d)``."""
        ops = self.ops
        i = i - a
        counts = ops.bincount(i, n)
        width = int(counts.max()) if len(i) else 0
        if width < self.k:
            return
        starts = counts.cumsum(0) - counts
        rank = ops.arange(len(i), i) - starts[i]
        packed = torch.full((n, width), math.inf, dtype=torch.float32, device=self.geo.device)
        ops.arr(packed).reshape(-1)[i * width + rank] = d
        st.lower_u(base + a, kth_smallest_rows(packed, self.k).to(self.geo.device).to(torch.float64))

    def pair_tile(self, st, a, b, c, e, state_lo):
        """Off-diagonal tile ``a:b`` × ``c:e`` of the symmetric sweep; both sides are queries."""
        g, ops = self.geo, self.ops
        t0 = time.perf_counter()
        p = self._scores(g.t_qlp[a:b], c, e)
        t0 = self.tick("gemm", t0)
        nr, nc = p.shape
        rn_i, rn_j, rsq_i, rsq_j = g.t_rn[a:b], g.t_rn[c:e], g.t_rsq[a:b], g.t_rsq[c:e]
        bi, bj = a - state_lo, c - state_lo
        si, sj = slice(bi, bi + nr), slice(bj, bj + nc)
        u_i, d_i, u_j, d_j = (ops.tensor(x) for x in (st.U[si], st.delta[si], st.U[sj], st.delta[sj]))
        t_i = self._thresholds(u_i, d_i, rsq_i, rn_i, rn_j.max().double(), rsq_j.min(), p.dtype)
        t_j = self._thresholds(u_j, d_j, rsq_j, rn_j, rn_i.max().double(), rsq_i.min(), p.dtype)
        rn_max = torch.maximum(rn_i.max(), rn_j.max()).double()
        q_rows, r_rows = g.t_q[a:b].to(torch.float64), g.t_r[c:e].to(torch.float64)
        sq = self.a_qn[a:b], ops.arr(rsq_i), ops.arr(rsq_j)
        for *_, i, j, d in self._strips(st, p, t_i, t_j, q_rows, r_rows, *sq, rn_max, (bi, bj), t0):
            st.add(i + bi, d, self.a_ids[j + c], bi, nr)
            order = ops.group_order(j)
            st.add(j[order] + bj, d[order], self.a_ids[i[order] + a], bj, nc)

    # -- drivers
    def symmetric(self, wanted_t: torch.Tensor, group_rows: int) -> Iterator[Tuple[State, torch.Tensor, int]]:
        """Self-retrieval in groups of ``group_rows`` rows; yields ``(state, wanted state rows, group start)``."""
        g = self.geo
        n = len(g.t_r)
        blocks = [(s, min(s + self.tile, n)) for s in range(0, n, self.tile)]
        per_group = max(1, group_rows // self.tile)
        for g0 in range(0, len(blocks), per_group):
            group = blocks[g0 : g0 + per_group]
            lo, hi = group[0][0], group[-1][1]
            st = State(hi - lo, self.cap, self.k, g.t_eps[lo:hi], g.device, self.ops)

            # diagonal tiles first: they seed every row's bound
            rt = partial(self.row_tile, st)
            self.run([((x,), partial(rt, a - lo, slice(a, b), a, b, True, True)) for x, (a, b) in enumerate(group)])
            pairs = [(x, y) for x in range(len(group)) for y in range(x + 1, len(group))]
            self.run([((x, y), partial(self.pair_tile, st, *group[x], *group[y], lo)) for x, y in pairs])
            outside = blocks[:g0] + blocks[g0 + per_group :]
            self.run(
                [((y,), partial(rt, c - lo, slice(c, e), a, b)) for a, b in outside for y, (c, e) in enumerate(group)]
            )
            yield st, self.ops.arr(wanted_t[lo:hi].nonzero().flatten()), lo

    def asymmetric(self, rows: torch.Tensor, own_t: Optional[torch.Tensor]) -> Iterator[Tuple[State, int]]:
        """Queries ``rows`` against all references, one query tile per worker; yields ``(state, start in rows)``."""
        g = self.geo
        m = len(g.t_r)
        starts = list(range(0, len(rows), self.tile))
        for w0 in range(0, len(starts), self.workers):
            wave = starts[w0 : w0 + self.workers]
            states = {}
            self.run([((s,), partial(self._query_block, rows, own_t, m, s, states)) for s in wave])
            for start in wave:
                yield states[start], start

    def _query_block(self, rows, own_t, m, start, states):
        g = self.geo
        blk = rows[start : start + self.tile]
        st = State(len(blk), self.cap, self.k, g.t_eps[blk], g.device, self.ops)
        own = None if own_t is None else own_t[start : start + self.tile]
        for n0, lo in enumerate(range(0, m, self.tile)):
            self.row_tile(st, 0, blk, lo, min(lo + self.tile, m), n0 == 0, own_t=own)
        states[start] = st


# ------------------------------------------------------------------------------------------------ ranking
def top_k(keys, counts, failed, k: int, ops):
    """``(indices [b, k], float32 scores [b, k], failed [b])`` of sorted keys; fewer than k candidates fail."""
    b, width = keys.shape
    if width < k:  # only rows with fewer than k candidates (failed below) are this short
        pad = ops.full((b, k - width), INT64_MAX, torch.int64, keys)
        keys = np.concatenate([keys, pad], 1) if isinstance(keys, np.ndarray) else torch.cat([keys, pad], 1)
    top = keys[:, :k]
    return top & LOW32, ops.decode(top), failed | (counts < k)
