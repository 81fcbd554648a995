"""The ``template_block`` protocol's keys, checked before anything is built: the task, the variants, the comparisons
and each variant's ``template_block`` / ``soft_maximizer`` / ``match_parameters`` settings.

Every error is one line naming the file and the key (:class:`pml_extensions.runner.errors.ConfigError`).

Example::

    >>> base = {"dataset": {"FashionMNIST": {}}, "models": {"trunk": {"SmallResNet": {}}, "classifier": {"Linear": {}}},
    ...         "loss_funcs": {}, "optimizers": {}, "num_epochs": 2, "iterations_per_epoch": 50, "batch_size": 32}
    >>> s = settings(dict(base, seeds="0 1", variants={"baseline": {}, "block": {"template_block": {}}},
    ...                   comparisons=[["block", "baseline"]]))
    >>> s["seeds"], s["task"], list(s["variants"]), s["comparisons"]
    ([0, 1], 'classification', ['baseline', 'block'], [('block', 'baseline')])
"""

import copy
from typing import Any, Dict, List, Optional

from ...config.keys import PROTOCOL_KEYS, seed_list
from ...config.loader import variant_configs
from ...errors import ConfigError

#: every top-level key this protocol reads (the loader refuses others, naming the nearest)
CONFIG_KEYS = PROTOCOL_KEYS["template_block"]
TASKS = ("classification", "metric_learning")
DEFAULT_SEEDS = (0, 1, 2)
#: the block's own modules (and a soft maximizer's noise) draw from ``seed + BLOCK_SEED_OFFSET``, never from the
#: stream the shared modules are drawn from, so a variant with a block shares the baseline's weights bit for bit
BLOCK_SEED_OFFSET = 100_003
#: keys of ``template_block`` that are the trainer's or the inserter's, not the block's
BLOCK_KEYS = ("aux_weight", "after")
SOFT_MAXIMIZER_KEYS = ("mixing", "epsilon", "num_samples", "estimate_from", "probe_images", "probe_batch_size")
MATCH_KEYS = ("variant", "widen", "deepen")
REQUIRED = ("dataset", "models", "loss_funcs", "optimizers", "num_epochs", "iterations_per_epoch", "batch_size")


def _where(sources, key: str) -> str:
    return f"{(sources or {}).get(key.split('.')[0], 'config')}: {key}"


def _positive_int(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: must be a positive integer, got {value!r}")
    return value


def check_seeds(seeds, where: str = "config: seeds") -> List[int]:
    """A non-empty list of distinct non-negative ints (``"0 1 2"`` from the command line counts as a list).

    Raises:
        ConfigError: otherwise.
    """
    seeds = seed_list(seeds)
    if not isinstance(seeds, (list, tuple)) or not seeds:
        raise ConfigError(f"{where}: must be a non-empty list of ints, got {seeds!r}")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError(f"{where}: must hold non-negative ints, got {s!r}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}: must be distinct, got {list(seeds)}")
    return list(seeds)


def check_variant(cfg: Dict[str, Any], name: str, names, sources=None) -> None:
    """One merged variant: required keys, positive sizes, and its ``template_block`` / ``soft_maximizer`` /
    ``match_parameters`` settings.

    Raises:
        ConfigError: naming ``variants.<name>`` and the key.
    """
    here = f"{(sources or {}).get('variants', 'config')} (variants.{name})"
    for key in REQUIRED:
        if cfg.get(key) is None:
            raise ConfigError(f"{here}: missing key {key!r}")
    for key in ("num_epochs", "iterations_per_epoch", "batch_size"):
        _positive_int(cfg[key], f"{here}: {key}")
    if cfg.get("eval_batch_size") is not None:
        _positive_int(cfg["eval_batch_size"], f"{here}: eval_batch_size")
    if not isinstance(cfg["models"], dict) or cfg["models"].get("trunk") is None:
        raise ConfigError(f"{here}: missing key models.trunk")
    task = cfg.get("task", "classification")
    if task not in TASKS:
        raise ConfigError(f"{here}: task: unknown {task!r}; choose {' or '.join(TASKS)}")
    if task == "classification" and cfg["models"].get("classifier") is None:
        raise ConfigError(f"{here}: task classification needs models.classifier (e.g. {{Linear: {{}}}})")
    block = cfg.get("template_block")
    if block is not None:
        if not isinstance(block, dict):
            raise ConfigError(f"{here}: template_block: expected a mapping {{aux_weight: 0.5, ...}}, got {block!r}")
        lam = block.get("aux_weight", 0.5)
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0 <= lam <= 1:
            raise ConfigError(f"{here}: template_block.aux_weight: must be a number in [0, 1], got {lam!r}")
    soft = cfg.get("soft_maximizer")
    if soft is not None:
        if not isinstance(soft, dict) or soft.get("mixing") not in ("softmax", "perturbed"):
            raise ConfigError(f"{here}: soft_maximizer: expected {{mixing: softmax|perturbed, estimate_from: [...]}}")
        unknown = sorted(set(soft) - set(SOFT_MAXIMIZER_KEYS))
        if unknown:
            raise ConfigError(
                f"{here}: soft_maximizer: unknown keys {unknown}; known: {', '.join(SOFT_MAXIMIZER_KEYS)}"
            )
        sources_of = soft.get("estimate_from")
        if not sources_of or not all(s in names for s in _names(sources_of)):
            raise ConfigError(
                f"{here}: soft_maximizer.estimate_from: name the trained BN-ReLU variants μ and η are estimated from "
                f"(of {', '.join(names)}), got {sources_of!r}"
            )
    if cfg.get("feature_cache") is not None:
        from ...objects.feature_cache import cache_spec

        cache_spec(cfg, sources)  # its keys checked (one line naming the file and the key)
        if soft is not None:
            raise ConfigError(
                f"{here}: soft_maximizer: not with feature_cache (μ and η are measured on the whole trunk's images)"
            )
    match = cfg.get("match_parameters")
    if match is not None:
        if not isinstance(match, dict) or set(match) - set(MATCH_KEYS) or match.get("variant") not in names:
            raise ConfigError(
                f"{here}: match_parameters: expected {{variant: <one of {', '.join(names)}>, widen: "
                "models.trunk.<Class>.widths}} (or deepen: <path of an int>)"
            )
        if ("widen" in match) == ("deepen" in match):
            raise ConfigError(f"{here}: match_parameters: give one of widen or deepen (a dotted path in models)")


def _names(value) -> List[str]:
    return [value] if isinstance(value, str) else list(value)


def settings(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """The checked settings: ``seeds``, ``task``, ``variants`` (name -> merged config), ``updates`` (name -> the
    variant's own entry) and ``comparisons`` (``[(variant, baseline)]``).

    Raises:
        ConfigError: bad seeds, variants or comparisons, or a variant missing a key.
    """
    cfg = copy.deepcopy(config)
    cfg.pop("protocol", None)
    seeds = check_seeds(cfg.pop("seeds", None) or list(DEFAULT_SEEDS), _where(sources, "seeds"))
    updates = {k: (v or {}) for k, v in (cfg.pop("variants", None) or {"default": {}}).items()}
    comparisons = cfg.pop("comparisons", None) or []
    for pair in comparisons:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(p in updates for p in pair)):
            raise ConfigError(
                f"{_where(sources, 'comparisons')}: each entry must be [variant, baseline] naming variants of "
                f"{sorted(updates)}, got {pair!r}"
            )
    merged = variant_configs({**cfg, "variants": updates}, where=(sources or {}).get("variants", "config"))
    names = list(merged)
    for name, vcfg in merged.items():
        check_variant(vcfg, name, names, sources)
        soft = vcfg.get("soft_maximizer")
        for other in _names(soft["estimate_from"]) if soft else ():
            if names.index(other) >= names.index(name) or merged[other].get("soft_maximizer"):
                raise ConfigError(
                    f"{(sources or {}).get('variants', 'config')} (variants.{name}): soft_maximizer.estimate_from: "
                    f"{other!r} must be a BN-ReLU variant listed before {name!r}"
                )
    tasks = {v.get("task", "classification") for v in merged.values()}
    if len(tasks) > 1:
        raise ConfigError(f"{_where(sources, 'task')}: every variant must have the same task, got {sorted(tasks)}")
    return {
        "seeds": seeds,
        "task": tasks.pop(),
        "variants": merged,
        "updates": updates,
        "comparisons": [tuple(p) for p in comparisons],
    }
