"""Perturbed maximizer (Berthet et al., "Learning with Differentiable Perturbed Optimizers", NeurIPS 2020) of the
template-matching linear program (Gorgun, Gurbuz & Alatan, BMVC 2022, Sec. 3.1 (P2) and 4.1); written from the
equations (as ``google-research/perturbations``); docs/methods/template_matching.md."""

from typing import Dict, Optional, Union

import torch

from ..utils.checks import is_int
from .margin_softmax import _check_dim, check_soft_maximizer_params

NOISES = ("normal", "gumbel")
DEFAULT_MAX_CHUNK_ELEMENTS = 2**24  # 64 MiB of float32 noise per chunk


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    # never half precision: ties would multiply and the noise stream would depend on the input's dtype
    return torch.promote_types(x.dtype, torch.float32)


def _sample_noise(shape, noise: str, generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    if noise == "normal":
        return torch.randn(shape, generator=generator, device=like.device, dtype=like.dtype)
    # Gumbel(0, 1) = −log(E), E ~ Exp(1)
    e = torch.empty(shape, device=like.device, dtype=like.dtype).exponential_(generator=generator)
    return -torch.log(e.clamp_min(torch.finfo(like.dtype).tiny))


def _noise_score(z: torch.Tensor, noise: str) -> torch.Tensor:
    return z if noise == "normal" else 1.0 - torch.exp(-z)


def _draws(x, mu, epsilon, num_samples, chunk_size, noise, generator):
    # per chunk of samples: the noise Z [s, N, K+1] and argmax([x, μ] + εZ) [s, N]
    aug = torch.cat([x, x.new_full((x.shape[0], 1), mu)], dim=1)
    for start in range(0, num_samples, chunk_size):
        z = _sample_noise((min(chunk_size, num_samples - start), *aug.shape), noise, generator, x)
        yield z, torch.argmax(aug.unsqueeze(0) + epsilon * z, dim=2)


class PerturbedArgmaxFunction(torch.autograd.Function):
    """Forward: p_ε(a) = E_Z[onehot(argmax(ã + εZ))], ã = [a, μ], the Monte-Carlo mean over S samples (slack
    dropped, times η); backward: Berthet et al.'s estimator (Prop. 3.1) ∂p_ε/∂ã ≈ E_Z[onehot(argmax(ã + εZ)) ∇ν(Z)ᵀ]
    / ε, ∇ν(Z) = Z (Gaussian) or 1 − exp(−Z) (Gumbel, where p_ε is the margin-augmented soft-max), on the same noise
    (the generator state is saved and replayed; samples drawn in chunks).

    ``apply(x [N, K], mu, epsilon, eta, num_samples, chunk_size, noise, generator) -> [N, K]``; no gradient to μ, ε, η.
    """

    @staticmethod
    def forward(ctx, x, mu, epsilon, eta, num_samples, chunk_size, noise, generator):
        n, k = x.shape
        state = generator.get_state()
        xw = x.to(_work_dtype(x))
        counts = torch.zeros(n * (k + 1), dtype=xw.dtype, device=x.device)
        offsets = torch.arange(n, device=x.device) * (k + 1)
        for _, idx in _draws(xw, mu, epsilon, num_samples, chunk_size, noise, generator):
            counts += torch.bincount((idx + offsets).view(-1), minlength=n * (k + 1)).to(counts.dtype)
        probs = counts.view(n, k + 1)[:, :k] / num_samples
        ctx.save_for_backward(x)
        ctx.cfg = (mu, epsilon, eta, num_samples, chunk_size, noise, state, generator.device)
        return (eta * probs).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        mu, epsilon, eta, num_samples, chunk_size, noise, state, gen_device = ctx.cfg
        n, k = x.shape
        generator = torch.Generator(device=gen_device)
        generator.set_state(state)
        xw = x.to(_work_dtype(x))
        g_aug = torch.cat([grad_out.to(xw.dtype), xw.new_zeros(n, 1)], dim=1)  # the slack is not an output
        grad = xw.new_zeros(n, k + 1)
        for z, idx in _draws(xw, mu, epsilon, num_samples, chunk_size, noise, generator):
            g_sel = torch.gather(g_aug.unsqueeze(0).expand(z.shape[0], n, k + 1), 2, idx.unsqueeze(2))  # g_{argmax}
            grad += (g_sel * _noise_score(z, noise)).sum(0)
        grad_x = (grad[:, :k] * (eta / (num_samples * epsilon))).to(x.dtype)
        return grad_x, None, None, None, None, None, None, None


class PerturbedMaximizer(torch.nn.Module):
    """η · E_Z[argmax one-hot of [a, μ] + εZ] with the slack dropped (paper Sec. 3.1 (P2), Sec. 4.1; Berthet
    et al. 2020).

    Args:
        mu: μ, the score of the "no match" slack entry (units of the activations). Default 0; paper, ResNet20: 2.5.
        epsilon: ε > 0, the noise scale. Default 1 (paper).
        eta: η > 0, output scale. Default 1; paper, ResNet20: 17.
        num_samples: S ≥ 1 Monte-Carlo samples per forward pass. Default 600 (paper).
        noise: ``"normal"`` (default, paper) or ``"gumbel"`` (then E[·] is the margin-augmented soft-max).
        chunk_size: samples drawn at once; ``None`` (default): at most 2^24 noise entries per chunk.
        seed: seed of the module's own noise generator (one per device; the global RNG is never used);
            :meth:`reset_generator` restarts the stream.
        dim: dimension of the K scores. Default 1 (channels of ``[B, K, H, W]``).

    ``forward(activations [..., K, ...]) -> [..., K, ...]`` (same shape, dtype and device): entries in [0, η]
    that are multiples of η/S, summing to at most η along ``dim``; backward by :class:`PerturbedArgmaxFunction`.
    Stochastic in eval mode too (a fresh draw per call) unless ``reset_generator`` is called before each call.

    Raises:
        ValueError: on ε ≤ 0, η ≤ 0, non-finite μ, ``num_samples`` < 1 (e.g. zero samples), ``chunk_size`` <
            1, an unknown ``noise`` (lists the valid names), or ``dim`` out of range for the input.
        TypeError: if the input is not a floating-point tensor.
    """

    def __init__(
        self,
        mu: float = 0.0,
        epsilon: float = 1.0,
        eta: float = 1.0,
        num_samples: int = 600,
        noise: str = "normal",
        chunk_size: Optional[int] = None,
        seed: int = 0,
        dim: int = 1,
    ):
        super().__init__()
        mu, epsilon, eta = check_soft_maximizer_params(mu, epsilon, eta)
        if not is_int(num_samples) or num_samples < 1:
            raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
        if chunk_size is not None and (not is_int(chunk_size) or chunk_size < 1):
            raise ValueError(f"chunk_size must be None or an int >= 1, got {chunk_size!r}")
        if noise not in NOISES:
            raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
        self.mu, self.epsilon, self.eta = mu, epsilon, eta
        self.num_samples, self.noise, self.chunk_size = num_samples, noise, chunk_size
        self.seed, self.dim = int(seed), int(dim)
        self._generators: Dict[str, torch.Generator] = {}

    def extra_repr(self) -> str:
        return (
            f"mu={self.mu}, epsilon={self.epsilon}, eta={self.eta}, num_samples={self.num_samples}, "
            f"noise={self.noise!r}, seed={self.seed}, dim={self.dim}"
        )

    def reset_generator(self, seed: Optional[int] = None) -> None:
        """Restart the noise stream (all devices) from ``seed`` (default: the constructor's seed)."""
        if seed is not None:
            self.seed = int(seed)
        self._generators = {}

    def generator(self, device: Union[str, torch.device]) -> torch.Generator:
        """The module's noise generator on ``device`` (created from ``seed`` on first use)."""
        device = torch.device(device)
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[key]

    def forward(self, activations: torch.Tensor) -> torch.Tensor:
        moved = activations.movedim(_check_dim(activations, self.dim), -1)
        k = moved.shape[-1]
        rows = moved.reshape(-1, k)
        chunk = self.chunk_size or max(1, DEFAULT_MAX_CHUNK_ELEMENTS // max(1, rows.numel() + rows.shape[0]))
        config = (self.mu, self.epsilon, self.eta, self.num_samples, chunk, self.noise)
        out = PerturbedArgmaxFunction.apply(rows, *config, self.generator(activations.device))
        return out.view(moved.shape).movedim(-1, self.dim)
