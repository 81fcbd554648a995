"""Keys, directed roundings, per-row order statistics and the float32 scores of the exact k-NN engine (the bounds
that use them: ``docs/evaluation.md``, "The k-NN engine").
"""

import math
import warnings

import numpy as np
import torch

LOW32 = 0xFFFFFFFF
INT64_MAX = torch.iinfo(torch.int64).max
SLACK = 2.0**-20  # relative slack of the threshold arithmetic (covers its own rounding)


def ordered_keys(scores: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """int64 keys that sort like ``(scores, columns)``: float32 bits mapped to an order-preserving int32."""
    bits = (scores.to(torch.float32) + 0.0).contiguous().view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (ordered.long() << 32) | columns


def key_scores(keys: torch.Tensor) -> torch.Tensor:
    """float32 scores of :func:`ordered_keys` keys (the order-preserving map is its own inverse)."""
    ordered = (keys >> 32).to(torch.int32)
    return (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).view(torch.float32)


def gamma(n: int, v: float) -> float:
    """``γ_n = n·v / (1 − n·v)``: relative error bound of n roundings of unit ``v`` (Higham, eq. 3.8)."""
    return n * v / (1 - n * v)


def up32(t: torch.Tensor) -> torch.Tensor:
    """The float32 values nearest at or above the float64 ``t``."""
    r = t.to(torch.float32)
    return torch.where(r.to(torch.float64) < t, torch.nextafter(r, torch.full_like(r, math.inf)), r)


def down32(t: torch.Tensor) -> torch.Tensor:
    """The float32 values nearest at or below the float64 ``t``."""
    r = t.to(torch.float32)
    return torch.where(r.to(torch.float64) > t, torch.nextafter(r, torch.full_like(r, -math.inf)), r)


def bf16_floor(t: torch.Tensor) -> torch.Tensor:
    """The bfloat16 values nearest at or below ``t`` (as bfloat16)."""
    t = t.to(torch.float32)
    b = t.to(torch.bfloat16)
    bits = b.view(torch.int16)
    # one bfloat16 step down: toward zero for positive values, away from zero for negative ones and ±0.0
    down = torch.where(bits > 0, bits - 1, torch.where(bits == 0, torch.full_like(bits, -32767), bits + 1))
    return torch.where(b.to(torch.float32) > t, down, bits).view(torch.bfloat16)


def sort_rows(keys: torch.Tensor) -> torch.Tensor:
    """Rows sorted ascending (NumPy's vectorised sort on the CPU: ~15x ``torch.sort`` there)."""
    if keys.device.type == "cpu":
        return torch.from_numpy(np.sort(keys.numpy(), axis=1))
    return keys.sort(dim=1).values


def kth_smallest_rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """k-th smallest value of each row (1-based k) of a float32 matrix; may reorder ``x`` in place."""
    if x.device.type == "cpu":
        a = x.numpy()
        a.partition(k - 1, axis=1)
        return torch.from_numpy(a[:, k - 1].copy())
    return x.kthvalue(k, dim=1).values


def kth_largest_rows(p: torch.Tensor, k: int) -> torch.Tensor:
    """k-th largest value (float64) of each row of a bfloat16 or float32 score tile (``p`` is not modified)."""
    n = p.shape[1]
    if p.device.type != "cpu":
        return p.to(torch.float32).topk(k, dim=1).values[:, -1].to(torch.float64)
    if p.dtype == torch.bfloat16:  # partition the order-preserving int16 image of the bits, 1024 rows at a time
        bits = p.view(torch.int16).numpy()
        kth = np.empty(len(bits), dtype=np.int16)
        for a in range(0, len(bits), 1024):
            o = np.right_shift(bits[a : a + 1024], 15)
            np.bitwise_and(o, 0x7FFF, out=o)
            np.bitwise_xor(o, bits[a : a + 1024], out=o)
            o.partition(n - k, axis=1)
            kth[a : a + 1024] = o[:, n - k]
        kth ^= (kth >> 15) & 0x7FFF
        return torch.from_numpy(kth).view(torch.bfloat16).to(torch.float64)
    a = p.numpy().copy()
    a.partition(n - k, axis=1)
    return torch.from_numpy(a[:, n - k].copy()).to(torch.float64)


def pair_dots(a: torch.Tensor, b: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """Dot products ``a[i[p]]·b[j[p]]`` (``i`` ascending): THE kernel of every score the engine ranks. On the CPU
    ``torch.sparse.sampled_addmm`` sums each pair in an order that depends only on D, so a pair gets bitwise the same
    value wherever it is scored; elsewhere one gathered product-sum per pair (sparse CSR has no fake-tensor support,
    which the CPU-side CUDA audit needs)."""
    if a.device.type != "cpu":
        out = torch.empty(len(i), dtype=a.dtype, device=a.device)
        step = max(1, (1 << 22) // max(1, a.shape[1]))
        for s in range(0, len(i), step):
            out[s : s + step] = (a.index_select(0, i[s : s + step]) * b.index_select(0, j[s : s + step])).sum(1)
        return out
    crow = torch.zeros(len(a) + 1, dtype=torch.long, device=a.device)
    crow[1:] = torch.cumsum(torch.bincount(i, minlength=len(a)), 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
        pattern = torch.sparse_csr_tensor(
            crow,
            j,
            torch.zeros(len(j), dtype=a.dtype, device=a.device),
            size=(len(a), len(b)),
            check_invariants=False,
        )
        return torch.sparse.sampled_addmm(pattern, a, b.T, beta=0.0).values()


def engine_scores(a64, b64, i, j, a_sq, b_sq, w: int) -> torch.Tensor:
    """The engine's float32 scores of pairs ``(a_i, b_j)`` from float64 rows and squared norms (used when ``w``)."""
    dots = pair_dots(a64, b64, i, j)
    return finish(a_sq.index_select(0, i) if w else None, b_sq.index_select(0, j) if w else None, dots, w)


def finish(sq_a, sq_b, dots, w: int):
    """``fl32((|a|² + |b|²) − 2 a·b)`` (euclidean) or ``fl32(−a·b)`` from float64: the one arithmetic of every score."""
    v = (sq_a + sq_b) - dots * 2 if w else dots * -1
    return v.astype(np.float32) if isinstance(v, np.ndarray) else v.to(torch.float32)


def self_dots(x: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """float64 ``|x_i|²`` by :func:`pair_dots` (the kernel of every score), ``chunk`` rows at a time."""
    out = torch.empty(len(x), dtype=torch.float64, device=x.device)
    for a in range(0, len(x), chunk):
        x64 = x[a : a + chunk].to(torch.float64)
        ids = torch.arange(len(x64), device=x.device)
        out[a : a + chunk] = pair_dots(x64, x64, ids, ids)
    return out
