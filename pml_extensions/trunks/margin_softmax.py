"""Margin-augmented soft-max: the entropy-regularised solution of the template-matching linear program (Gorgun,
Gurbuz & Alatan, BMVC 2022, Sec. 3.1 (P3) and 4.1); the problem and its smoothing: docs/methods/template_matching.md."""

import math
from typing import Union

import torch


def _check_dim(x: torch.Tensor, dim: int, name: str = "activations") -> int:
    if not torch.is_tensor(x):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not torch.is_floating_point(x):
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least one dimension (the K template/class scores)")
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim={dim} is out of range for {name} of shape {tuple(x.shape)}")
    return dim % x.ndim


def margin_argmax(activations: torch.Tensor, mu: Union[float, torch.Tensor] = 0.0, dim: int = 1) -> torch.Tensor:
    """Exact solution of the linear program (P1) (paper Sec. 3.1): one-hot at argmax_k a_k if max_k a_k > μ, else 0.

    Args:
        activations: a, any float tensor with the K scores along ``dim`` (e.g. ``[B, K, H, W]`` with ``dim=1``).
        mu: the margin μ (same units as ``a``); a float or a tensor broadcastable against ``a`` with ``dim`` of size 1.
        dim: the dimension holding the K scores.

    Returns:
        Tensor of the shape, dtype and device of ``activations``, entries in {0, 1}, at most one 1 along ``dim``
        (ties to the lowest index; ``max_k a_k == μ`` gives 0, as the paper's "no greater than μ"). Not
        differentiable.

    Raises:
        TypeError: if ``activations`` is not a floating-point tensor.
        ValueError: if ``dim`` is out of range.
    """
    dim = _check_dim(activations, dim)
    top, idx = activations.max(dim=dim, keepdim=True)
    one_hot = torch.zeros_like(activations).scatter_(dim, idx, 1.0)
    return one_hot * (top > mu).to(activations.dtype)


def check_soft_maximizer_params(mu, epsilon, eta):
    """μ, ε, η as floats; ``ValueError`` unless μ is finite and ε, η are finite and > 0."""
    mu, epsilon, eta = float(mu), float(epsilon), float(eta)
    for name, value in (("epsilon", epsilon), ("eta", eta)):
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if not math.isfinite(mu):
        raise ValueError(f"mu must be finite, got {mu!r}")
    return mu, epsilon, eta


class MarginAugmentedSoftmax(torch.nn.Module):
    """η · soft-max([a, μ] / ε) with the slack entry dropped (paper Sec. 3.1 (P3) and Sec. 4.1).

    Args:
        mu: μ, the score of the "no match" slack entry (units of the activations). Default 0; paper, ResNet20: 2.5
            (:func:`pml_extensions.trunks.soft_maximizer_swap.estimate_mu`).
        epsilon: ε > 0, the entropy weight / temperature. Default 1 (paper).
        eta: η > 0, the output scale. Default 1; paper, ResNet20: 17
            (:func:`pml_extensions.trunks.soft_maximizer_swap.estimate_eta`).
        dim: the dimension of the K scores. Default 1 (channels of a ``[B, K, H, W]`` map).

    ``forward(activations [..., K, ...]) -> [..., K, ...]`` (same shape, dtype, device), entries in [0, η)
    summing to less than η along ``dim``: p_k = η·exp(a_k/ε) / (exp(μ/ε) + Σ_j exp(a_j/ε)) (plain autograd ops,
    computed in float32 for half inputs). As ε → 0 the output tends to η·:func:`margin_argmax`.

    Raises:
        ValueError: if ``epsilon`` or ``eta`` is not > 0 or ``mu`` is not finite (at construction); if ``dim``
            is out of range for the input (at forward).
        TypeError: if the input is not a floating-point tensor.
    """

    def __init__(self, mu: float = 0.0, epsilon: float = 1.0, eta: float = 1.0, dim: int = 1):
        super().__init__()
        mu, epsilon, eta = check_soft_maximizer_params(mu, epsilon, eta)
        self.mu, self.epsilon, self.eta, self.dim = mu, epsilon, eta, int(dim)

    def extra_repr(self) -> str:
        return f"mu={self.mu}, epsilon={self.epsilon}, eta={self.eta}, dim={self.dim}"

    def forward(self, activations: torch.Tensor) -> torch.Tensor:
        dim = _check_dim(activations, self.dim)
        shape = list(activations.shape)
        shape[dim] = 1
        # float32 inside for float16/bfloat16 (a / ε overflows float16 for small ε); output in the input's dtype
        work = activations.to(torch.promote_types(activations.dtype, torch.float32))
        slack = work.new_full(shape, self.mu)
        probs = torch.softmax(torch.cat([work, slack], dim=dim) / self.epsilon, dim=dim)
        return (self.eta * probs.narrow(dim, 0, activations.shape[dim])).to(activations.dtype)
