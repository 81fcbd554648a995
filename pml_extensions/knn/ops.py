"""The array primitives of the k-NN engine's selection on two backends with one interface: :class:`NumpyOps` on NumPy
views of CPU tensors (no copies; a tenth of torch's per-op overhead on arrays of 10⁵-10⁶ entries) and
:class:`TorchOps` on torch tensors of any device (the tests run it on the CPU too).
"""

from functools import partial

import numpy as np
import torch

from .scores import key_scores, ordered_keys, up32


class NumpyOps:
    """The sweep's primitives on NumPy views of CPU tensors."""

    arr = staticmethod(torch.Tensor.numpy)
    nonzero = staticmethod(np.flatnonzero)
    split = staticmethod(np.divmod)
    repeat = staticmethod(np.repeat)
    count_rows = staticmethod(partial(np.count_nonzero, axis=1))
    count_cols = staticmethod(partial(np.count_nonzero, axis=0))
    sort_rows = staticmethod(partial(np.sort, axis=1))
    cumsum = staticmethod(np.cumsum)
    where = staticmethod(np.where)
    f64 = staticmethod(partial(np.asarray, dtype=np.float64))
    f32 = staticmethod(partial(np.asarray, dtype=np.float32))

    @staticmethod
    def tensor(a) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a))

    @staticmethod
    def bincount(x, n):
        return np.bincount(x, minlength=n)

    @staticmethod
    def arange(n, like):
        return np.arange(n, dtype=np.int64)

    @staticmethod
    def bf16_values(p: torch.Tensor, flat):
        """float32 values of a bfloat16 tile at flat positions."""
        v = p.view(torch.int16).numpy().reshape(-1)[flat].astype(np.int32) << 16
        return v.view(np.float32)

    @staticmethod
    def f32_values(p: torch.Tensor, flat):
        return p.numpy().reshape(-1)[flat]

    @staticmethod
    def keys(d32, refs):
        bits = (d32.astype(np.float32) + np.float32(0.0)).view(np.int32)
        bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        return (bits.astype(np.int64) << 32) | refs

    @staticmethod
    def group_order(ids):
        return np.argsort(ids.astype(np.uint16), kind="stable")

    @staticmethod
    def decode(keys):
        o = (keys >> 32).astype(np.int32)
        return (o ^ ((o >> 31) & 0x7FFFFFFF)).view(np.float32)

    @staticmethod
    def up32(t):
        r = t.astype(np.float32)
        return np.where(r.astype(np.float64) < t, np.nextafter(r, np.float32(np.inf)), r)

    @staticmethod
    def full(shape, value, dtype, like):
        return np.full(shape, value, dtype={torch.int64: np.int64, torch.float32: np.float32}[dtype])

    @staticmethod
    def select(p: torch.Tensor, t_rows, t_cols, buffers, strip: int = 1024):
        """Flat indices of ``p ≥ t_rows[row]`` or ``p ≥ t_cols[col]`` (thresholds already rounded down to the
        tile's dtype, as float32 tensors), in strips of ``strip`` rows (small masks). bfloat16 tiles are compared as
        int16 bits, which order like the values where the threshold is positive; rows/columns with a threshold
        ≤ 0 are compared as floats."""
        nr, nc = p.shape
        bf16 = p.dtype == torch.bfloat16
        pn = p.view(torch.int16).numpy() if bf16 else p.numpy()

        def prepared(t):
            if t is None:
                return None, None
            if not bf16:
                return t.numpy(), None
            bits = t.to(torch.bfloat16).view(torch.int16)
            fast = bits > 0
            slow = (~fast).nonzero().flatten()
            return torch.where(fast, bits, torch.full_like(bits, 32767)).numpy(), (slow if len(slow) else None)

        (tr, slow_r), (tc, slow_c) = prepared(t_rows), prepared(t_cols)
        found = []
        for a in range(0, nr, strip):
            rows = slice(a, min(a + strip, nr))
            mask, other = (m.reshape(rows.stop - a, nc) for m in buffers((rows.stop - a) * nc))
            first = True
            for t, slow, axis in ((tr, slow_r, 0), (tc, slow_c, 1)):
                if t is None:
                    continue
                out = mask if first else other
                np.greater_equal(pn[rows], t[rows, None] if axis == 0 else t[None, :], out=out)
                if slow is not None:  # thresholds <= 0: compare those rows/columns as floats
                    if axis == 0:
                        sel = slow[(slow >= a) & (slow < rows.stop)]
                        if len(sel):
                            out[(sel - a).numpy()] = (p[sel].to(torch.float32) >= t_rows[sel][:, None]).numpy()
                    else:
                        out[:, slow.numpy()] = (p[rows][:, slow].to(torch.float32) >= t_cols[slow][None, :]).numpy()
                if not first:
                    np.logical_or(mask, other, out=mask)
                first = False
            found.append(np.flatnonzero(mask) + a * nc)
        return np.concatenate(found) if len(found) > 1 else found[0]


class TorchOps:
    """The same primitives on torch tensors (any device)."""

    arr = staticmethod(lambda t: t)
    tensor = staticmethod(torch.Tensor.contiguous)
    nonzero = staticmethod(lambda mask: mask.reshape(-1).nonzero().flatten())
    bincount = staticmethod(lambda x, n: torch.bincount(x, minlength=n))
    arange = staticmethod(lambda n, like: torch.arange(n, device=like.device))
    repeat = staticmethod(torch.repeat_interleave)
    count_rows = staticmethod(lambda mask: mask.sum(1))
    count_cols = staticmethod(lambda mask: mask.sum(0))
    bf16_values = f32_values = staticmethod(lambda p, flat: p.reshape(-1).index_select(0, flat).to(torch.float32))
    keys = staticmethod(ordered_keys)
    group_order = staticmethod(lambda ids: torch.sort(ids, stable=True).indices)
    decode = staticmethod(key_scores)
    sort_rows = staticmethod(lambda x: x.sort(dim=1).values)
    up32 = staticmethod(up32)
    full = staticmethod(lambda shape, value, dtype, like: torch.full(shape, value, dtype=dtype, device=like.device))
    f64 = staticmethod(lambda x: x.to(torch.float64))
    f32 = staticmethod(lambda x: x.to(torch.float32))
    cumsum = staticmethod(lambda x: torch.cumsum(x, 0))
    where = staticmethod(torch.where)

    @staticmethod
    def split(flat, ncols):
        i = torch.div(flat, ncols, rounding_mode="floor")
        return i, flat - i * ncols

    @staticmethod
    def select(p: torch.Tensor, t_rows, t_cols, buffers):
        mask = None
        for t, shape in ((t_rows, (-1, 1)), (t_cols, (1, -1))):
            if t is not None:
                m = p >= t.view(shape).to(p.dtype)
                mask = m if mask is None else mask | m
        return mask.reshape(-1).nonzero().flatten()


def ops_for(device: torch.device, force_torch: bool = False):
    """:class:`NumpyOps` on the CPU (unless ``force_torch``), else :class:`TorchOps`."""
    return NumpyOps if device.type == "cpu" and not force_torch else TorchOps
