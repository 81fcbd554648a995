"""A variant's models, built by the one :class:`~pml_extensions.runner.objects.builder.Builder` and paired by seed.

What makes a variant (all config keys, merged per ``variants`` entry):

- ``models``: the trunk (e.g. ``{SmallResNet: {in_channels: 1, widths: [8, 16, 32, 32]}}``, or a pretrained
  network), an optional ``embedder`` and, for classification, a ``classifier`` whose ``in_features`` /
  ``out_features`` are filled with the embedding width and the number of training classes;
- ``template_block: {aux_weight: 0.5, after: layer3, mixing: ..., ...}``: a
  :class:`~pml_extensions.trunks.TemplateMatchingBlock` inserted into the built trunk by
  :func:`~pml_extensions.trunks.insert_template_matching` (``after``: the stage it follows, default the paper's
  place between the last two stages; ``init``: ``identity``, the inserter's default, or ``paper``, the paper's
  random start for from-scratch training; every other key but ``aux_weight`` goes to the block, e.g. ``mixing:
  none`` for the auxiliary loss alone); ``aux_weight`` is the trainer's λ;
- ``soft_maximizer: {mixing: softmax|perturbed, epsilon, num_samples, estimate_from: [variants]}``: every BN-ReLU
  after a 3×3 conv replaced by η·soft-maximizer([a, μ]) (:func:`~pml_extensions.trunks.soft_maximizer_swap`), μ and
  η the means of :func:`~pml_extensions.trunks.estimate_mu` / :func:`~pml_extensions.trunks.estimate_eta` over the
  trained models (every seed) of the ``estimate_from`` variants (paper Sec. 4.1), on the first ``probe_images``
  (default 1000) training images in batches of ``probe_batch_size`` (default 250);
- ``match_parameters: {variant: block, widen: models.trunk.SmallResNet.widths}``: the parameter control. The list at
  that dotted path is scaled by k/8 (``round(w·k/8)``, k = 9, 10, ...; ``deepen:`` a path to an int adds 1, 2, ...)
  until the variant has at least as many parameters as ``variant`` (every model counted: trunk, block, classifier).

With ``feature_cache`` (the trunk's frozen prefix cached, :mod:`pml_extensions.runner.objects.feature_cache`) the
block is inserted into the whole trunk before the Builder splits it, so ``after`` names a module of the whole trunk at
or after the boundary (e.g. ``"0.13"`` with ``boundary: "0.13"``: the block between MobileNetV2's last two stages, the
first trained module); ``models["trunk"]`` is the trainable rest, the prefix in ``builder.frozen``.

Pairing: the trunk is drawn from the global torch RNG seeded with ``seed`` and the embedder and classifier continue
that stream, so variants whose trunk and head are alike start from bit-identical weights; the block's modules and
the perturbed maximizer's noise draw from ``seed + BLOCK_SEED_OFFSET``, so adding them changes nothing else. Building
leaves the global RNGs (torch, numpy, python, PML's ``c_f.NUMPY_RANDOM``) as it found them.
"""

import contextlib
import copy
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from pml_extensions.runner.config.registry import resolve
from pml_extensions.runner.config.specs import one_spec
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.experiment.checkpoint import rng_state, set_rng_state
from pml_extensions.runner.experiment.folder import seed_everything
from pml_extensions.runner.objects.builder import Builder, accepts

from .settings import BLOCK_SEED_OFFSET


def count_parameters(models: Dict[str, torch.nn.Module]) -> int:
    """Every parameter of every model (trunk with its block, embedder, classifier)."""
    return int(sum(p.numel() for m in models.values() for p in m.parameters()))


@contextlib.contextmanager
def _own_rng():
    """Restore the global torch / numpy / python RNG states and PML's ``c_f.NUMPY_RANDOM`` afterwards."""
    from pytorch_metric_learning.utils import common_functions as c_f

    saved, numpy_random = rng_state(), c_f.NUMPY_RANDOM
    try:
        yield
    finally:
        set_rng_state(saved)
        c_f.NUMPY_RANDOM = numpy_random


def build_models(
    builder: Builder,
    cfg: Dict[str, Any],
    seed: int,
    num_classes: int,
    sample: torch.Tensor,
    soft: Optional[Dict[str, float]] = None,
) -> Dict[str, torch.nn.Module]:
    """The variant's ``{"trunk", "embedder", ["classifier"], ...}`` on the builder's device (see the module docstring
    for the pairing).

    Args:
        builder: the variant's Builder.
        cfg: the variant's merged config.
        seed: the unit's seed.
        num_classes: training classes (the block's patch classifier, the classifier's outputs).
        sample: one training input ``[C, H, W]`` (probes the embedding width).
        soft: ``{"mu", "eta"}`` for a ``soft_maximizer`` variant.

    Raises:
        ConfigError: bad specs (naming the file and key), a soft-maximizer variant without ``soft``.
    """
    with _own_rng():
        return _build_models(builder, cfg, seed, num_classes, sample, soft)


def _build_models(builder, cfg, seed, num_classes, sample, soft):
    spec = dict(cfg["models"])
    head = spec.pop("classifier", None)

    def reseed(key):
        if key == "trunk":
            seed_everything(seed)

    block = cfg.get("template_block")
    cached = cfg.get("feature_cache") is not None

    def insert_block(trunk):
        kwargs = {k: v for k, v in block.items() if k != "aux_weight"}
        with _own_rng():
            torch.manual_seed(seed + BLOCK_SEED_OFFSET)
            builder.build(
                "template_block",
                {"insert_template_matching": dict(kwargs, num_classes=int(num_classes), inplace=True)},
                model=trunk,
            )
        return trunk.to(builder.device)

    # with feature_cache the block goes into the whole trunk before it is split (``after`` names its modules)
    edit = insert_block if cached and block is not None else None
    models = builder.build_models(sample, num_classes, spec=spec, before=reseed, edit_trunk=edit, cached=cached)
    if cached:
        _check_cached_split(builder, cfg)
    if head is not None:
        name, kwargs = one_spec(head, builder.where("models.classifier"))
        cls, kwargs = resolve(name, builder.where("models.classifier")), dict(kwargs)
        for key, value in (("in_features", builder.embedding_size), ("out_features", num_classes)):
            if key not in kwargs and accepts(cls, key):
                kwargs[key] = int(value)
        models["classifier"] = builder.build("models.classifier", {name: kwargs}).to(builder.device)
    if block is not None and not cached:
        insert_block(models["trunk"])
    swap = cfg.get("soft_maximizer")
    if swap is not None:
        if soft is None:
            raise ConfigError(f"{builder.where('soft_maximizer')}: μ and η are estimated before the variant is built")
        builder.build(
            "soft_maximizer",
            {
                "soft_maximizer_swap": {
                    "maximizer": swap["mixing"],
                    "mu": float(soft["mu"]),
                    "eta": float(soft["eta"]),
                    "epsilon": float(swap.get("epsilon", 1.0)),
                    "num_samples": int(swap.get("num_samples", 600)),
                    "seed": int(seed + BLOCK_SEED_OFFSET),
                    "inplace": True,
                }
            },
            model=models["trunk"],
        )
        models["trunk"].to(builder.device)
    return models


def _check_cached_split(builder: Builder, cfg: Dict[str, Any]) -> None:
    """The block must train: refuse one that ended up in the frozen (cached) prefix."""
    from pml_extensions.trunks import template_matching_blocks

    if template_matching_blocks(builder.frozen.prefix):
        raise ConfigError(
            f"{builder.where('template_block')}: after: {cfg['template_block'].get('after')!r} puts the block in the "
            f"frozen prefix (feature_cache.boundary {cfg['feature_cache']['boundary']!r}); insert it at or after the "
            "boundary"
        )


def aux_weight(cfg: Dict[str, Any]) -> Optional[float]:
    """λ of a variant with a block (``None`` without one)."""
    block = cfg.get("template_block")
    return None if block is None else float(block.get("aux_weight", 0.5))


def _path(cfg: Dict[str, Any], dotted: str, where: str):
    """``(container, key)`` of a dotted path (dict keys or list indices) in ``cfg``."""
    parts = dotted.split(".")
    node = cfg
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.get(part) if isinstance(node, dict) else None
        if node is None:
            raise ConfigError(f"{where}: {dotted!r} is not a path in this variant's config (stopped at {part!r})")
    last = int(parts[-1]) if isinstance(node, list) else parts[-1]
    if isinstance(node, dict) and last not in node:
        raise ConfigError(f"{where}: {dotted!r} is not a path in this variant's config (no {last!r})")
    return node, last


def match_parameters(
    cfg: Dict[str, Any],
    target_cfg: Dict[str, Any],
    num_classes: int,
    sample: torch.Tensor,
    sources: Optional[Dict[str, str]] = None,
    device=None,
) -> Dict[str, Any]:
    """``cfg`` with the smallest widening (or deepening) of its ``match_parameters`` path that gives at least the
    parameters of ``target_cfg`` (both built at seed 0 on ``device``; the count does not depend on the seed).

    Returns:
        a copy of ``cfg`` with the scaled value and ``match_parameters`` replaced by ``{..., "value": [...],
        "target_parameters": n}`` (what the results record).

    Raises:
        ConfigError: a bad path, or no scaling up to 8× that reaches the target.
    """
    match = cfg["match_parameters"]
    where = f"{(sources or {}).get('match_parameters', 'config')}: match_parameters"
    placeholder = {"mu": 0.0, "eta": 1.0}  # a soft maximizer has no parameters: its μ, η do not change the count
    target = count_parameters(
        build_models(Builder(target_cfg, sources, device), target_cfg, 0, num_classes, sample, placeholder)
    )
    dotted = match.get("widen") or match.get("deepen")
    node, key = _path(cfg, dotted, where)
    base = node[key]
    for k in range(9, 65):
        if "widen" in match:
            if not (isinstance(base, list) and all(isinstance(v, int) for v in base)):
                raise ConfigError(f"{where}: widen: {dotted} must be a list of ints, got {base!r}")
            value: Any = [int(round(v * k / 8)) for v in base]
        else:
            if isinstance(base, bool) or not isinstance(base, int):
                raise ConfigError(f"{where}: deepen: {dotted} must be an int, got {base!r}")
            value = base + (k - 8)
        trial = copy.deepcopy(cfg)
        tnode, tkey = _path(trial, dotted, where)
        tnode[tkey] = value
        trial["match_parameters"] = None
        params = count_parameters(build_models(Builder(trial, sources, device), trial, 0, num_classes, sample))
        if params >= target:
            trial["match_parameters"] = dict(match, value=value, parameters=params, target_parameters=target)
            return trial
    raise ConfigError(f"{where}: no scaling of {dotted} up to 8x reaches {target} parameters")


def probe_batches(view, num_images: int, batch_size: int) -> List[torch.Tensor]:
    """The first ``num_images`` items of ``view`` as image batches (μ and η are measured on them)."""
    n = min(int(num_images), len(view))
    images = [view[i][0] for i in range(n)]
    return [torch.stack(images[i : i + batch_size]) for i in range(0, n, batch_size)]


def soft_estimates(trunks: List[torch.nn.Module], batches: List[torch.Tensor], device) -> Dict[str, Any]:
    """μ and η (paper Sec. 4.1) of every trained BN-ReLU trunk on ``batches`` and their means."""
    from pml_extensions.trunks import estimate_eta, estimate_mu

    moved = [b.to(device) for b in batches]
    mus = [float(estimate_mu(t, moved)) for t in trunks]
    etas = [float(estimate_eta(t, moved)) for t in trunks]
    return {"mu": float(np.mean(mus)), "eta": float(np.mean(etas)), "mu_per_model": mus, "eta_per_model": etas}
