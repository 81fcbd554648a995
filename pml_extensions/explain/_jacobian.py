"""Internal: first-order (Taylor) fold of a head at the current input (Zhu et al., IEEE TIP 2021, Sec. IV).

F_ij = Σ_c ∂E/∂A_cij · A_cij is computed with forward-mode AD (one ``torch.func.jvp`` per map position,
vectorised with ``vmap``); where an operation has no forward-mode rule (e.g. CPU flash attention,
``_scaled_dot_product_flash_attention_for_cpu``) it falls back to reverse mode (one ``torch.autograd.grad``
per embedding dimension).
"""

from typing import Callable, Optional, Tuple

import torch

from ._model_runner import require_autograd


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
    """``(F [N, h, w, L], E0 [N, L])`` for the head ``g: A [N, C, h, w] -> E [N, L]`` linearised at ``A0``."""
    with torch.no_grad():
        E0 = g(A0).detach()
    try:
        F = _forward_mode(g, A0, chunk_size)
    except (NotImplementedError, RuntimeError):
        F = _reverse_mode(g, A0, chunk_size)
    return F.to(E0.dtype), E0
