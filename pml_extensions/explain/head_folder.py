"""Fold the head of a metric-learning model into E = Σ_ij W_ij A_ij + B (Zhu et al., "Visual Explanation for Deep
Metric Learning", IEEE TIP 2021, Sec. III-A eq. 4 and Sec. IV); deviations: docs/methods/explanation.md."""

import warnings
from typing import Callable, Optional, Tuple

import torch
from torch import nn

from ..trunks.gem_pooling import GeMPooling
from ..trunks.histogram_pooling import HistogramPooling
from ._model_runner import (
    POOLING_TYPES,
    HeadRecord,
    ModelRunner,
    refuse_normalised_output,
    require_autograd,
    split_normaliser,
)
from .folded_embedding import FoldedEmbedding

SUPPORTED = (
    "AdaptiveAvgPool2d(1) (GAP), HistogramPooling (its output is the GAP), AdaptiveMaxPool2d(1) (GMP), "
    "GeMPooling, a token mean, Flatten, Linear, BatchNorm1d (eval, running stats), ReLU, Dropout (eval), "
    "Identity, and L2 normalisations (modules or inside forward)"
)
FALLBACKS = ("error", "jacobian")
GMP_TIES = ("share", "first")


def _is_passthrough(record) -> bool:
    m = record.module
    if isinstance(m, (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout)):
        return True
    if isinstance(m, nn.ReLU):  # an in-place ReLU returns its input object
        return False
    return record.output is record.input  # e.g. PML's c_f.Identity


def _is_global(pool_size) -> bool:
    return pool_size == 1 if isinstance(pool_size, int) else tuple(pool_size) in ((1, 1), (1,))


class _Unsupported(Exception):
    def __init__(self, record, why=""):
        super().__init__(f"{record.name} ({type(record.module).__name__}){why}")


def _bn_scale_shift(bn: nn.BatchNorm1d, like: torch.Tensor):
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("BatchNorm1d without running statistics cannot be folded")
    scale = torch.rsqrt(bn.running_var.to(like) + bn.eps)
    if bn.weight is not None:
        scale = bn.weight.to(like) * scale
    shift = (bn.bias.to(like) if bn.bias is not None else 0) - bn.running_mean.to(like) * scale
    return scale, shift


def _close(x: torch.Tensor, y: torch.Tensor, rtol: float) -> bool:
    # entry-wise |x - y| <= rtol · max|y| per row, in float64
    x, y = x.detach().double(), y.detach().double()
    if x.shape != y.shape:
        return False
    tol = rtol * (y.abs().flatten(1).amax(dim=1) + 1e-30)
    return bool(((x - y).abs().flatten(1) <= tol[:, None]).all())


def row_scale(x: torch.Tensor, y: torch.Tensor, rtol: float) -> Optional[torch.Tensor]:
    """The per-row factor s > 0 with ``y = s · x`` (an L2 normalisation inside ``forward``), or ``None``."""
    if x.shape != y.shape or x.ndim != 2:
        return None
    xd, yd = x.detach().double(), y.detach().double()
    s = (xd * yd).sum(dim=1) / (xd * xd).sum(dim=1).clamp_min(1e-300)
    if not bool((s > 0).all()) or not _close(s[:, None] * xd, yd, rtol):
        return None
    return s.to(x.dtype)


def _virtual_pool(A, extra, target, rtol):
    # a mean of the map (over the grid, or over every token with the class token's share in B) to target [N, C]
    # outside modules; None when it is neither
    N, C, h, w = A.shape
    if _close(A.mean(dim=(2, 3)), target, rtol):
        return A.permute(0, 2, 3, 1) / (h * w), A.new_zeros(N, C)
    if extra is not None and extra.shape[1] > 0:
        e = extra.to(A.dtype)
        T = h * w + e.shape[1]
        if _close((A.sum(dim=(2, 3)) + e.sum(dim=1)) / T, target, rtol):
            return A.permute(0, 2, 3, 1) / T, e.sum(dim=1) / T
        if _close(e[:, 0], target, rtol):
            raise _Unsupported(
                HeadRecord(None, "the class token", None, None),
                ": a class-token read-out has no exact fold over the token grid; use SimilarityGradCAM, or "
                "fallback='jacobian' at a layer before the last attention",
            )
    return None


def fold_records(records, A: torch.Tensor, extra=None, output=None, rtol: float = 1e-4, gmp_ties: str = "share"):
    """``(F [N, h, w, L], B [N, L])`` of module calls on ``A [N, C, h, w]`` (float64 for float64 maps, else float32);
    ``_Unsupported`` names the first module with no exact fold."""
    N, C, h, w = A.shape
    dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
    X = A.to(dtype)
    kind = "map"
    F = b = None
    for rec in records:
        m = rec.module
        if _is_passthrough(rec) or (isinstance(m, nn.Flatten) and kind != "map"):
            continue
        if kind == "map" and torch.is_tensor(rec.input) and rec.input.ndim == 2:
            pooled = _virtual_pool(X, extra, rec.input, rtol)
            if pooled is None:
                raise _Unsupported(rec, ": its input is reduced from the map outside modules (not a mean)")
            (F, b), kind = pooled, "vec"
        if kind == "map":
            Fm = None  # the pooled vector as a per-position sum [N, C, h, w]
            if isinstance(m, HistogramPooling) or (
                isinstance(m, nn.AdaptiveAvgPool2d) and _is_global(m.output_size)
            ):  # HistogramPooling returns the GAP vector (its histograms are a side output)
                Fm = X / (h * w)
            elif isinstance(m, nn.AdaptiveMaxPool2d) and _is_global(m.output_size):
                # Sec. IV: GMP = Σ_ij (M ⊙ A)_ij with M the arg-max mask; tied positions share the mass equally,
                # or, with gmp_ties="first", all of it goes to the first tied position in raster order (autograd's)
                flat = X.reshape(N, C, h * w)
                if gmp_ties == "first":
                    mask = torch.zeros_like(flat).scatter_(2, flat.argmax(dim=2, keepdim=True), 1.0)
                else:
                    mask = (flat == flat.amax(dim=2, keepdim=True)).to(dtype)
                    mask = mask / mask.sum(dim=2, keepdim=True)
                Fm = (flat * mask).reshape(N, C, h, w)
            elif isinstance(m, GeMPooling):
                # GeM_c = Σ_ij w_ijc x_ijc with w_ijc = x_ijc^(p-1) / (hw · GeM_c^(p-1)), x clamped at eps
                p = float(m.p.detach().double())
                xc = X.clamp(min=m.eps)
                gem = xc.pow(p).mean(dim=(2, 3), keepdim=True).pow(1.0 / p)
                Fm = xc.pow(p) / (h * w * gem.pow(p - 1.0))
            elif isinstance(m, nn.Flatten) and m.start_dim == 1 and m.end_dim == -1 and h * w == 1:
                Fm = X
            elif isinstance(m, nn.Flatten) and m.start_dim == 1 and m.end_dim == -1:
                b, kind = X.new_zeros(N, C * h * w), "flat"
            else:
                raise _Unsupported(rec, " on the [N, C, h, w] feature map")
            if Fm is not None:
                F, b, kind = Fm.permute(0, 2, 3, 1), X.new_zeros(N, C), "vec"
        elif kind == "flat":
            if isinstance(m, nn.BatchNorm1d) and m.num_features == C * h * w:
                s, t = _bn_scale_shift(m, X)
                X = X * s.view(1, C, h, w)
                b = b * s + t
            elif isinstance(m, nn.ReLU):
                keep = ((X + b.view(N, C, h, w)) > 0).to(dtype)
                X, b = X * keep, b * keep.reshape(N, -1)
            elif isinstance(m, nn.Linear) and m.in_features == C * h * w:
                W = m.weight.to(X)
                # Flatten + FC (the face model): W_ij = the FC-weight columns of position (i, j).
                F, b, kind = torch.einsum("lcij,ncij->nijl", W.view(-1, C, h, w), X), b @ W.t(), "vec"
                if m.bias is not None:
                    b = b + m.bias.to(X)
            else:
                raise _Unsupported(rec, " after Flatten")
        else:
            if (
                torch.is_tensor(rec.input)
                and tuple(rec.input.shape) == (N, F.shape[-1])
                and not _close(F.sum(dim=(1, 2)) + b, rec.input, rtol)
            ):
                s = row_scale(
                    F.sum(dim=(1, 2)) + b, rec.input, rtol
                )  # e.g. RetrievalHead's L2N between GeM and whitening
                if s is None:
                    raise _Unsupported(rec, ": its input is not the previous module's output")
                F, b = F * s[:, None, None, None], b * s[:, None]
            if isinstance(m, nn.Linear):
                W = m.weight.to(X)
                F, b = F @ W.t(), b @ W.t()
                if m.bias is not None:
                    b = b + m.bias.to(X)
            elif isinstance(m, nn.BatchNorm1d):
                s, t = _bn_scale_shift(m, X)
                F, b = F * s, b * s + t
            elif isinstance(m, nn.ReLU):
                keep = ((F.sum(dim=(1, 2)) + b) > 0).to(dtype)  # Sec. IV: ReLU = diag(1[z > 0]) at this input
                F, b = F * keep[:, None, None, :], b * keep
            else:
                raise _Unsupported(rec)
    if kind == "map" and torch.is_tensor(output) and output.ndim == 2:
        pooled = _virtual_pool(X, extra, output, rtol)
        if pooled is not None:
            (F, b), kind = pooled, "vec"
    if kind == "map":
        raise _Unsupported(
            records[-1] if records else HeadRecord(None, "no pooling", None, None),
            ": no pooling or Flatten after the map",
        )
    if kind == "flat":
        raise _Unsupported(records[-1], ": Flatten must be followed by a Linear layer")
    return F, b


def _forward_mode(g, A0, chunk_size):
    N, C, h, w = A0.shape
    eye = torch.eye(h * w, dtype=A0.dtype, device=A0.device).view(h * w, 1, 1, h, w)
    tangents = A0.unsqueeze(0) * eye  # T_ij = A₀ restricted to position (i, j)

    def one(t):
        return torch.func.jvp(g, (A0,), (t,))[1]

    F = torch.func.vmap(one, chunk_size=chunk_size)(tangents).detach()  # [hw, N, L]
    return F.permute(1, 0, 2).reshape(N, h, w, -1)


def _reverse_mode(g, A0, chunk_size):
    require_autograd("fallback='jacobian' (reverse mode, for a head without forward-mode rules)")
    A = A0.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        E = g(A)
        L = E.shape[1]
        eye = torch.eye(L, dtype=E.dtype, device=E.device)
        cols = []
        step = max(chunk_size or L, 256)
        for start in range(0, L, step):  # images are independent in eval mode: one grad of the sum per dim
            v = eye[start : start + step, None, :].expand(-1, E.shape[0], -1)
            try:
                (gl,) = torch.autograd.grad(E, A, v, retain_graph=True, is_grads_batched=True)
            except (NotImplementedError, RuntimeError):
                gl = torch.stack([torch.autograd.grad(E, A, vi, retain_graph=True)[0] for vi in v])
            cols.append((gl * A0).sum(dim=2))  # [chunk, N, h, w]
    return torch.cat(cols).permute(1, 2, 3, 0).detach()


def jacobian_features(
    g: Callable[[torch.Tensor], torch.Tensor], A0: torch.Tensor, chunk_size: Optional[int] = 16
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(F [N, h, w, L], E0 [N, L])``, F_ij = Σ_c ∂E/∂A_cij · A_cij of ``g: A -> E`` at ``A0`` (forward mode, else
    reverse mode where an operation has no forward-mode rule, e.g. CPU flash attention)."""
    with torch.no_grad():
        E0 = g(A0).detach()
    try:
        F = _forward_mode(g, A0, chunk_size)
    except (NotImplementedError, RuntimeError):
        F = _reverse_mode(g, A0, chunk_size)
    return F.to(E0.dtype), E0


class HeadFolder:
    """Write a trunk + embedder's embedding as Σ_ij W_ij A_ij + B over the last convolutional feature map.

    Exact fold for a CNN body followed by GAP, GMP (arg-max mask), ``GeMPooling`` (GeM_c = Σ_ij w_ijc x_ijc, w_ijc =
    x_ijc^(p−1) / (hw · GeM_c^(p−1))), ``HistogramPooling`` (its output is the GAP), a token-grid mean outside modules
    or ``Flatten``, then any sequence of ``Linear``, ``BatchNorm1d`` (eval, ``eps``), ``ReLU`` (mask of the current
    input), ``Dropout`` (eval) and ``Identity``. L2 normalisations in the head (modules, or inside ``forward`` as in
    ``trunks.RetrievalHead``) are folded as the positive per-image scale they apply; a trailing one is left out.
    Token layers ``[N, T, C]`` are reshaped to their square grid (class token aside), ``[N, H, W, C]`` maps (Swin)
    permuted. Any other head raises, or with ``fallback="jacobian"`` is linearised at the current input with a
    warning (paper Sec. IV): W_ij = ∂E/∂A_ij, B = E(A₀) − Σ_ij W_ij A₀_ij. Half-precision maps fold in float32 (the
    self-check tolerance widened to 8 ulps of the half type).

    Example::

        >>> import torch; from torch import nn; from pml_extensions import explain
        >>> from pml_extensions.trunks import RetrievalHead
        >>> body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
        >>> f = explain.HeadFolder(body, RetrievalHead(8, 4))(torch.rand(2, 3, 10, 12))  # GeM + 2 L2N
        >>> tuple(f.features.shape), tuple(f.bias.shape), f.normalised, f.exact
        ((2, 8, 10, 4), (2, 4), True, True)

    Args:
        trunk: PML trunk ``[N, 3, H, W] -> [N, D]`` (pooling included); embedder: ``[N, D] -> [N, L]`` or ``None``.
        layer: module (or its name in ``trunk``) whose output A ``[N, C, h, w]`` (or tokens, or channels-last) is
            explained. Default: the last such non-pooling module call (token models: named in a warning).
        fallback: ``"error"`` (default) or ``"jacobian"``.
        gmp_ties: a GMP maximum at several positions is ``"share"``d equally (default) or all at the ``"first"``
            (raster order, as autograd: rectified Grad-CAM then equals ReLU(Decomposition+Bias) exactly).
        rtol: relative tolerance of the self-check ``Σ F + B == E``. Default 1e-4.

    ``folder(images [N, 3, H, W])`` returns a detached :class:`FoldedEmbedding`; models run in eval mode, flags and
    hooks restored afterwards, also after an exception.

    Raises:
        ValueError: an unsupported head module (named) with ``fallback="error"``; a fold that does not reproduce the
            embedding (an operation outside modules); bad images.
        TypeError: non-module trunk/embedder, non-tensor images.
    """

    def __init__(
        self,
        trunk: nn.Module,
        embedder: Optional[nn.Module] = None,
        layer=None,
        *,
        fallback: str = "error",
        rtol: float = 1e-4,
        gmp_ties: str = "share",
    ):
        for name, value, options in (("fallback", fallback, FALLBACKS), ("gmp_ties", gmp_ties, GMP_TIES)):
            if value not in options:
                raise ValueError(f"{name} must be one of {options}, got {value!r}")
        self.gmp_ties = gmp_ties
        self.runner = ModelRunner(trunk, embedder, layer)
        self.fallback = fallback
        self.rtol = float(rtol)

    def tolerance(self, *tensors) -> float:
        """``rtol``, widened to 8 ulps of the least precise dtype among ``tensors`` (bfloat16/float16)."""
        eps = max(torch.finfo(t.dtype).eps for t in tensors if torch.is_tensor(t) and t.is_floating_point())
        return max(self.rtol, 8 * eps)

    def fold(self, images: torch.Tensor) -> FoldedEmbedding:
        """Fold the head at ``images [N, C, H, W]``; see the class docstring."""
        res = self.runner.run(images, mode="capture")
        head, normaliser = split_normaliser(res.head)
        E = (normaliser.input if normaliser is not None else res.output).detach()
        A = res.feature_map
        rtol = self.tolerance(A, E, *[r.input for r in head])
        try:
            with torch.no_grad():
                F, b = fold_records(head, A, res.layout.extra, E, rtol, self.gmp_ties)
        except _Unsupported as err:
            if self.fallback == "error":
                raise ValueError(
                    f"head module {err} cannot be folded exactly; supported after the feature map: {SUPPORTED}. "
                    "Pass fallback='jacobian' for a first-order (approximate) fold."
                ) from None
            warnings.warn(
                f"head module {err} has no exact fold; using the first-order Jacobian at the current "
                "input (Zhu et al. 2021, Sec. IV): maps are approximate away from this input",
                stacklevel=2,
            )
            return self._jacobian_fold(images, res, normaliser)
        folded = F.sum(dim=(1, 2)) + b
        normalised = normaliser is not None
        E = E.to(folded.dtype)
        if not _close(folded, E, rtol):
            scale = row_scale(folded, E, rtol)
            if scale is not None:  # normalisation inside forward(): E is the pre-normalisation vector
                normalised, E = True, folded
            elif self.fallback == "jacobian":
                warnings.warn(
                    "the exact fold does not reproduce the embedding (operations outside modules); using the "
                    "first-order Jacobian at the current input: maps are approximate",
                    stacklevel=2,
                )
                return self._jacobian_fold(images, res, normaliser)
            else:
                err = (folded - E).abs().max().item()
                raise ValueError(
                    "the folded head does not reproduce the model's embedding (max abs error "
                    f"{err:.3g}); the head probably applies operations outside modules (functional calls). "
                    "Use fallback='jacobian' or pass layer=..."
                )
        return FoldedEmbedding(F, b, E, A.to(F.dtype), res.image_size, normalised, True)

    __call__ = fold

    def _jacobian_fold(self, images, res, normaliser) -> FoldedEmbedding:
        if normaliser is None:
            refuse_normalised_output(
                res.output, "the model normalises its output inside forward(); the first-order fallback needs"
            )
        k = len(res.head) - 1 if normaliser is not None else None

        def g(A):
            r = self.runner.run(images, mode="replace", replacement=A)
            return r.head[k].input if k is not None else r.output

        A0 = res.feature_map
        F, E0 = jacobian_features(g, A0)
        b = E0 - F.sum(dim=(1, 2))
        return FoldedEmbedding(F, b, E0, A0, res.image_size, normaliser is not None, False)


__all__ = ["HeadFolder", "POOLING_TYPES"]
