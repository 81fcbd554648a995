"""Replace the BN-ReLU after the 3×3 convolutions of a ResNet by a soft maximizer, and estimate its μ and η from a
trained model (Gorgun, Gurbuz & Alatan, BMVC 2022, Sec. 3.2 and 4.1); docs/methods/template_matching.md."""

import copy
import itertools
from typing import Iterable, List, Optional, Tuple

import torch
import torchvision

from ..utils.eval_mode import eval_mode
from .margin_softmax import MarginAugmentedSoftmax
from .perturbed_maximizer import PerturbedMaximizer
from .trunk_split import _float_like

MAXIMIZERS = ("softmax", "perturbed")
BLOCKS = (torchvision.models.resnet.BasicBlock, torchvision.models.resnet.Bottleneck)


def bn_relu_sites(model: torch.nn.Module) -> List[Tuple[torch.nn.Module, str]]:
    """(block, attribute name) of every BN that follows a 3×3 conv and precedes a ReLU in the torchvision
    ``BasicBlock`` (``bn1``) and ``Bottleneck`` (``bn2``) modules of ``model``, in module order."""
    resnet = torchvision.models.resnet
    return [(m, "bn1" if isinstance(m, resnet.BasicBlock) else "bn2") for m in model.modules() if isinstance(m, BLOCKS)]


def _sites(model, bn: bool = True) -> List[Tuple[torch.nn.Module, str]]:
    # with ``bn``: every site must still hold its BatchNorm (not yet swapped)
    sites = bn_relu_sites(model)
    if not sites:
        raise ValueError(
            f"{type(model).__name__} has no torchvision BasicBlock/Bottleneck, so no BN-ReLU after a 3×3 "
            "conv to replace"
        )
    for block, name in sites if bn else ():
        _check_bn(getattr(block, name))
    return sites


def _check_bn(bn) -> None:
    if not isinstance(bn, torch.nn.modules.batchnorm._BatchNorm):
        raise TypeError(f"expected a BatchNorm layer, got {type(bn).__name__}")


def bn_relu_thresholds(
    bn: torch.nn.Module, mean: Optional[torch.Tensor] = None, var: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Per-channel thresholds μ_k = E a_k − β_k·sqrt(Var a_k + eps)/γ_k of BN-ReLU (paper Sec. 3.2).

    Args:
        bn: an affine BatchNorm layer.
        mean, var: ``[C]`` statistics of the BN input a; default: the layer's running statistics.

    Returns:
        ``[C]`` float tensor (units of a). For γ_k > 0, eval-mode ReLU(BN(a))_k > 0 exactly when a_k > μ_k;
        for γ_k < 0 the inequality flips; γ_k = 0 gives ±inf (or nan when β_k = 0).

    Raises:
        TypeError: if ``bn`` is not a BatchNorm layer.
        ValueError: if it is not affine, or has no running statistics and none are given.
    """
    _check_bn(bn)
    if not bn.affine:
        raise ValueError("bn must be affine (γ, β) for the BN-ReLU threshold")
    if mean is None or var is None:
        if not bn.track_running_stats:
            raise ValueError("bn has no running statistics; pass mean and var")
        mean = bn.running_mean if mean is None else mean
        var = bn.running_var if var is None else var
    gamma, beta = bn.weight.detach(), bn.bias.detach()
    return mean.to(gamma.dtype) - beta * torch.sqrt(var.to(gamma.dtype) + bn.eps) / gamma


def soft_maximizer_swap(
    model: torch.nn.Module,
    maximizer: str = "softmax",
    mu: float = 2.5,
    eta: float = 17.0,
    epsilon: float = 1.0,
    num_samples: int = 600,
    seed: int = 0,
    inplace: bool = False,
) -> torch.nn.Module:
    """Replace every BN-ReLU after a 3×3 conv (:func:`bn_relu_sites`) by η·soft-maximizer([a, μ]) (paper Sec.
    4.1); the ReLU that follows stays (the identity on the maximizer's non-negative output).

    Args:
        model: a torchvision ResNet (or any model built from torchvision ``BasicBlock``/``Bottleneck``).
        maximizer: ``"softmax"`` (:class:`MarginAugmentedSoftmax`) or ``"perturbed"``
            (:class:`PerturbedMaximizer`, Gaussian noise; site i uses seed ``seed + i``).
        mu, eta, epsilon, num_samples: paper defaults μ = 2.5, η = 17 (CIFAR-10 ResNet20 values; estimate
            yours with :func:`estimate_mu` / :func:`estimate_eta` from a trained model), ε = 1, S = 600.
        inplace: modify ``model`` (default ``False``: a deep copy).

    Returns:
        The model, output shapes unchanged; every module, parameter and buffer but the replaced BNs kept bit for bit
        (its function is not: train the swapped network, as the paper does).

    Raises:
        ValueError: on an unknown ``maximizer`` (lists the valid names), bad μ/η/ε/S (see the maximizer
            classes), or a model without any such site.
    """
    if maximizer not in MAXIMIZERS:
        raise ValueError(f"maximizer must be one of {MAXIMIZERS}, got {maximizer!r}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _sites(model, bn=False)
    if not inplace:
        model = copy.deepcopy(model)
    for i, (block, name) in enumerate(bn_relu_sites(model)):
        if maximizer == "softmax":
            new = MarginAugmentedSoftmax(mu=mu, epsilon=epsilon, eta=eta, dim=1)
        else:
            new = PerturbedMaximizer(mu=mu, epsilon=epsilon, eta=eta, num_samples=num_samples, seed=seed + i, dim=1)
        setattr(block, name, new)
    return model


def _run_with_hooks(model, batches, num_batches, hook_fn, sites):
    device = _float_like(model)["device"]
    seen = 0
    handles = [
        getattr(block, name).register_forward_hook(lambda m, inp, out, i=i: hook_fn(i, inp[0], out))
        for i, (block, name) in enumerate(sites)
    ]
    try:
        with torch.no_grad(), eval_mode(model):
            for batch in itertools.islice(batches, num_batches):
                model((batch[0] if isinstance(batch, (list, tuple)) else batch).to(device))
                seen += 1
    finally:
        for h in handles:
            h.remove()
    if seen == 0:
        raise ValueError("batches yielded no data")


def estimate_mu(
    model: torch.nn.Module,
    batches: Optional[Iterable] = None,
    num_batches: Optional[int] = None,
    return_per_channel: bool = False,
):
    """μ: the mean of the non-zero per-channel thresholds μ_k over the BN-ReLU sites of a trained model (paper
    Sec. 4.1; 2.5 for its CIFAR-10 ResNet20).

    Args:
        model: trained model with torchvision ``BasicBlock``/``Bottleneck`` modules (BN not yet swapped).
        batches: iterable of images ``[B, C, H, W]`` or ``(images, labels)`` on which E a_k and Var a_k are
            measured (eval mode, modes restored); ``None``: the BN running statistics.
        num_batches: use at most this many batches (default: all).
        return_per_channel: also return the list of ``[C]`` μ_k tensors, one per site.

    Returns:
        float μ (units of the conv activations a; the mean over the channels with γ_k > 0 and μ_k ≠ 0), or
        ``(μ, [μ_k per site])``.

    Raises:
        ValueError: if the model has no sites, ``batches`` yields nothing, or no channel qualifies.
    """
    sites = _sites(model)
    if batches is None:
        per_site = [bn_relu_thresholds(getattr(b, n)).detach().double().cpu() for b, n in sites]
    else:
        stats = [[0.0, 0.0, 0] for _ in sites]

        def hook(i, inp, out):
            a = inp.detach().double().transpose(0, 1).reshape(inp.shape[1], -1)
            stats[i] = [t + u for t, u in zip(stats[i], (a.sum(1), (a * a).sum(1), a.shape[1]))]

        _run_with_hooks(model, batches, num_batches, hook, sites)
        per_site = []
        for (block, name), (s, ss, n) in zip(sites, stats):
            mean = s / n
            var = (ss / n - mean * mean).clamp_min(0)
            bn = getattr(block, name)
            per_site.append(bn_relu_thresholds(bn, mean.to(bn.weight.device), var.to(bn.weight.device)).double().cpu())
    gammas = [getattr(b, n).weight.detach().double().cpu() for b, n in sites]
    valid = torch.cat([mu_k[(g > 0) & (mu_k != 0) & torch.isfinite(mu_k)] for mu_k, g in zip(per_site, gammas)])
    if valid.numel() == 0:
        raise ValueError("no channel with γ_k > 0 and a finite non-zero μ_k")
    mu = float(valid.mean())
    return (mu, per_site) if return_per_channel else mu


def estimate_eta(model: torch.nn.Module, batches: Iterable, num_batches: Optional[int] = None) -> float:
    """η: the mean per-pixel sum over channels of the BN-ReLU outputs at the sites of a trained model (paper
    Sec. 4.1; 17 for its CIFAR-10 ResNet20), measured on ``batches`` in eval mode (modes restored).

    Args:
        model: trained model with torchvision ``BasicBlock``/``Bottleneck`` modules (BN not yet swapped).
        batches: iterable of images ``[B, C, H, W]`` or ``(images, labels)``.
        num_batches: use at most this many batches (default: all).

    Returns:
        float η: the mean over sites of each site's mean over images and pixels of Σ_k ReLU(BN(a))_k.

    Raises:
        ValueError: if the model has no sites or ``batches`` yields nothing.
    """
    sites = _sites(model)
    sums = [[0.0, 0] for _ in sites]

    def hook(i, inp, out):
        per_pixel = torch.relu(out.detach().double()).sum(1)
        sums[i][0] += float(per_pixel.sum())
        sums[i][1] += per_pixel.numel()

    _run_with_hooks(model, batches, num_batches, hook, sites)
    return float(sum(s / n for s, n in sums) / len(sums))
