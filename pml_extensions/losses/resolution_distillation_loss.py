"""RAML distillation loss: absolute + relational (teacher-student and student-student) terms, eq. 10
(docs/methods/resolution_distillation.md)."""

import math
from typing import Optional

import torch
from pytorch_metric_learning.distances import DotProductSimilarity
from pytorch_metric_learning.losses import BaseMetricLossFunction

from ..utils.checks import is_number

TERMS = ("abs", "rel_ts", "rel_ss")


def _check_weight(name, value):
    if not is_number(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


class ResolutionDistillationLoss(BaseMetricLossFunction):
    """Label-free distillation of a small-resolution student from a frozen large-resolution teacher (eq. 10).

    Source: P. Suma and G. Tolias, "Large-to-small Image Resolution Asymmetry in Deep Metric Learning", WACV 2023,
    Sec. 4, eq. (5), (8)-(10); ``eps0`` and the excluded diagonal from ``pavelsuma/raml`` (``lib/layers/loss.py``).

    Rows are augmented images: ``embeddings`` holds the student rows ``u_i = f_φ(S_i)``, ``ref_emb`` the teacher rows
    ``v_i = f_θ(T_i)`` ALIGNED BY INDEX, ``labels`` the id of the SOURCE image of each row (its P augmentations share
    the id). For one source image with P rows:

        L_abs    = 1/P        Σ_i       (1 − u_iᵀv_i + eps0)²
        L_rel-ts = 1/(P(P−1)) Σ_{i≠j}   (u_iᵀv_j − v_iᵀv_j + eps0)²
        L_rel-ss = 1/(P(P−1)) Σ_{i≠j}   (u_iᵀu_j − v_iᵀv_j + eps0)²
        L        = lambda_abs·L_abs + lambda_ts·L_rel-ts + lambda_ss·L_rel-ss                      (eq. 10)

    Relations never cross source images. Each active term (weight > 0) is its own PML sub-loss (``abs_loss``,
    ``rel_ts_loss``, ``rel_ss_loss``, ``reduction_type="element"``, one value per source image), so the default
    ``MeanReducer`` averages over source images; the paper's code SUMS (``reducer=reducers.SumReducer()``). A zero
    weight drops a term (Table 3; ``lambda_ts=lambda_ss=0`` is eq. 5). The unweighted per-batch means are kept in the
    recordable attributes ``abs_loss``, ``rel_ts_loss``, ``rel_ss_loss``. Similarities come from ``distance`` (default
    ``DotProductSimilarity()`` on L2-normalised rows: cosines, as the paper's code); non-inverted distances are refused.

    Args:
        lambda_ts, lambda_ss: weights of L_rel-ts and L_rel-ss (CLI ``--lam-1``, ``--lam-2``).
        lambda_abs: weight of L_abs (paper: 1; 0 only for ablations).
        eps0: constant inside each square (paper code: 1e-6; 0 gives the paper's text).
        detach_ref_emb: no gradient into the teacher rows ``ref_emb``.
        **kwargs: ``distance``, ``reducer``, ``embedding_regularizer``... as for every PML loss.

    ``forward(embeddings [N, D] float, labels [N] int, indices_tuple=None, ref_emb [N, D] float, ref_labels=None)``
    -> scalar, with autocast disabled in the common dtype of both (at least float32), on one device. ``indices_tuple``
    is ignored; ``ref_labels``, when given, must equal ``labels``.

    Raises:
        ValueError: negative/non-finite weights or eps0, all weights zero, a non-similarity distance; at forward:
            missing ``labels`` or ``ref_emb``, student and teacher row counts or widths that differ, ``ref_labels`` not
            equal to ``labels``, NaN/inf inputs, or a source image with fewer than 2 augmentations while a relational
            term is active.
        TypeError: non-floating embeddings or non-integer labels.
    """

    def __init__(
        self,
        lambda_ts: float = 0.7,
        lambda_ss: float = 0.7,
        lambda_abs: float = 1.0,
        eps0: float = 1e-6,
        detach_ref_emb: bool = True,
        **kwargs,
    ):
        # Set before the base constructor, which already asks for the sub-loss names (they depend on the weights).
        self.lambda_ts = _check_weight("lambda_ts", lambda_ts)
        self.lambda_ss = _check_weight("lambda_ss", lambda_ss)
        self.lambda_abs = _check_weight("lambda_abs", lambda_abs)
        self.eps0 = _check_weight("eps0", eps0)
        if not isinstance(detach_ref_emb, bool):
            raise TypeError(f"detach_ref_emb must be True or False, got {detach_ref_emb!r}")
        self.detach_ref_emb = detach_ref_emb
        super().__init__(**kwargs)
        if self.lambda_ts == self.lambda_ss == self.lambda_abs == 0:
            raise ValueError("at least one of lambda_abs, lambda_ts, lambda_ss must be > 0")
        if not self.distance.is_inverted:
            raise ValueError(
                f"distance must be a similarity (is_inverted=True), e.g. DotProductSimilarity(); got "
                f"{type(self.distance).__name__}"
            )
        self.abs_loss = self.rel_ts_loss = self.rel_ss_loss = 0.0
        self.add_to_recordable_attributes(list_of_names=["lambda_ts", "lambda_ss", "lambda_abs", "eps0"], is_stat=False)
        self.add_to_recordable_attributes(list_of_names=["abs_loss", "rel_ts_loss", "rel_ss_loss"], is_stat=False)

    def get_default_distance(self):
        return DotProductSimilarity()

    def weights(self) -> dict:
        return {"abs": self.lambda_abs, "rel_ts": self.lambda_ts, "rel_ss": self.lambda_ss}

    def active_terms(self) -> list:
        return [t for t in TERMS if self.weights()[t] > 0]

    def _sub_loss_names(self):
        return [f"{t}_loss" for t in self.active_terms()]

    def forward(
        self,
        embeddings: torch.Tensor,
        labels: Optional[torch.Tensor] = None,
        indices_tuple=None,
        ref_emb: Optional[torch.Tensor] = None,
        ref_labels: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        self.check_inputs(embeddings, labels, ref_emb, ref_labels)
        if self.detach_ref_emb:
            ref_emb = ref_emb.detach()
        dtype = torch.promote_types(torch.promote_types(embeddings.dtype, ref_emb.dtype), torch.float32)
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            return super().forward(embeddings.to(dtype), labels, indices_tuple, ref_emb.to(dtype), ref_labels)

    def check_inputs(self, embeddings, labels, ref_emb, ref_labels):
        """Validate a forward call (the class docstring's rules)."""
        for name, t in (("embeddings", embeddings), ("ref_emb", ref_emb)):
            if t is None:
                raise ValueError(
                    f"{name} is required: student rows go in `embeddings`, the teacher rows of the same augmented "
                    "images in `ref_emb`"
                )
            if not torch.is_tensor(t) or not t.is_floating_point() or t.ndim != 2:
                raise TypeError(f"{name} must be a floating-point [N, D] tensor, got {getattr(t, 'shape', type(t))}")
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"{name} contains NaN or inf values")
        if embeddings.device != ref_emb.device:
            raise ValueError(
                f"embeddings are on {embeddings.device} but ref_emb on {ref_emb.device}; put both on one device"
            )
        if embeddings.shape[0] != ref_emb.shape[0]:
            raise ValueError(
                f"student rows (embeddings, {embeddings.shape[0]}) and teacher rows (ref_emb, {ref_emb.shape[0]}) "
                "must be aligned one to one (same augmented image per row)"
            )
        if embeddings.shape[1] != ref_emb.shape[1]:
            raise ValueError(
                f"embeddings have D={embeddings.shape[1]} but ref_emb have D={ref_emb.shape[1]}; they must match"
            )
        if labels is None:
            raise ValueError("labels (the source-image id of every row) are required")
        if not torch.is_tensor(labels) or labels.is_floating_point() or labels.ndim != 1:
            raise TypeError(f"labels must be a 1-D integer tensor of source-image ids, got {labels!r}")
        if labels.shape[0] != embeddings.shape[0]:
            raise ValueError(f"labels has {labels.shape[0]} entries but embeddings has {embeddings.shape[0]} rows")
        if ref_labels is not None and not torch.equal(ref_labels.to(labels.device), labels):
            raise ValueError("ref_labels must equal labels (rows of student and teacher are aligned by index)")
        if (self.lambda_ts > 0 or self.lambda_ss > 0) and labels.numel() > 0:
            _, counts = torch.unique(labels, return_counts=True)
            if int(counts.min()) < 2:
                raise ValueError(
                    "every source image needs at least 2 augmentations for the relational terms "
                    f"(smallest group has {int(counts.min())}); set lambda_ts=lambda_ss=0 for L_abs alone"
                )

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        # maybe_normalize: L2 normalisation unless the distance has normalize_embeddings=False (PML default True).
        u, v = self.distance.maybe_normalize(embeddings), self.distance.maybe_normalize(ref_emb)
        sim = self.distance.compute_mat
        n = u.shape[0]
        if n == 0:
            return self.zero_losses()
        _, image, counts = torch.unique(labels, return_inverse=True, return_counts=True)
        num_images = counts.shape[0]
        counts = counts.to(u.dtype)
        # First row of every source image: the index PML's reducers attach to that image's loss.
        first_row = torch.full((num_images,), n, dtype=torch.long, device=u.device)
        first_row = first_row.scatter_reduce(0, image, torch.arange(n, device=u.device), reduce="amin")

        def per_image(values, row_of_value):
            return torch.zeros(num_images, dtype=u.dtype, device=u.device).index_add(0, image[row_of_value], values)

        out, unweighted = {}, {}
        if self.lambda_abs > 0:
            sq = (1 - self.distance.pairwise_distance(u, v) + self.eps0) ** 2
            unweighted["abs"] = per_image(sq, torch.arange(n, device=u.device)) / counts
        if self.lambda_ts > 0 or self.lambda_ss > 0:
            same = image[:, None] == image[None, :]
            same.fill_diagonal_(False)
            rows, cols = torch.where(same)
            vv = sim(v, v)[rows, cols]
            norm = counts * (counts - 1)
            for term, other in (("rel_ts", v), ("rel_ss", u)):
                if self.weights()[term] > 0:
                    sq = (sim(u, other)[rows, cols] - vv + self.eps0) ** 2
                    unweighted[term] = per_image(sq, rows) / norm
        weights = self.weights()
        for term in TERMS:
            value = unweighted.get(term)
            setattr(self, f"{term}_loss", float(value.detach().mean()) if value is not None else 0.0)
            if value is not None:
                out[f"{term}_loss"] = {
                    "losses": weights[term] * value,
                    "indices": first_row,
                    "reduction_type": "element",
                }
        return out
