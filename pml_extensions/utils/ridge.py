"""Closed-form ridge regression of embeddings on histograms (XML, Gurbuz & Alatan, ICIP 2023, Sec. 2.3).

One sample per row (PML's layout; the paper writes samples as columns, ``V_k = Y_k Z_k^T (Z_k Z_k^T + eps I)^{-1}``):
``V = argmin_A ||H A - Y||_F^2 + ridge ||A||_F^2`` = ``(H^T H + ridge I_m)^{-1} H^T Y`` (primal, an m × m solve) =
``H^T (H H^T + ridge I_B)^{-1} Y`` (kernel, a B × B solve: cheaper when B < m, the paper's advice).
"""

import torch

RIDGE_FORMS = ("auto", "primal", "kernel")


def ridge_prototypes(histograms: torch.Tensor, embeddings: torch.Tensor, ridge: float, form: str = "auto"):
    """The ridge prototypes ``[m, d]`` mapping histograms ``[B, m]`` to embeddings ``[B, d]``.

    Args:
        histograms: ``[B, m]`` floating tensor (rows usually on the simplex).
        embeddings: ``[B, d]`` floating tensor on the same device.
        ridge: ε_r > 0 added to the diagonal of the Gram matrix (paper: 0.05).
        form: ``"primal"``, ``"kernel"`` or ``"auto"`` (kernel when B < m, else primal).

    Returns:
        ``[m, d]`` float32 (float64 when an input is float64), solved with autocast disabled by ``torch.linalg.solve``;
        gradients flow into both inputs.

    Raises:
        ValueError: on mismatched shapes, an unknown ``form`` or a non-positive ``ridge``.
    """
    if form not in RIDGE_FORMS:
        raise ValueError(f"form must be one of {RIDGE_FORMS}, got {form!r}")
    if not ridge > 0:
        raise ValueError(f"ridge must be > 0, got {ridge!r}")
    if histograms.ndim != 2 or embeddings.ndim != 2 or histograms.shape[0] != embeddings.shape[0]:
        raise ValueError(
            "histograms must be [B, m] and embeddings [B, d] with the same B, got "
            f"{tuple(histograms.shape)} and {tuple(embeddings.shape)}"
        )
    dtype = torch.promote_types(torch.promote_types(histograms.dtype, embeddings.dtype), torch.float32)
    batch, num_prototypes = histograms.shape
    if form == "auto":
        form = "kernel" if batch < num_prototypes else "primal"
    with torch.autocast(device_type=histograms.device.type, enabled=False):
        h = histograms.to(dtype)
        y = embeddings.to(dtype)
        if form == "kernel":
            gram = h @ h.T + ridge * torch.eye(batch, dtype=dtype, device=h.device)
            return h.T @ torch.linalg.solve(gram, y)
        gram = h.T @ h + ridge * torch.eye(num_prototypes, dtype=dtype, device=h.device)
        return torch.linalg.solve(gram, h.T @ y)
