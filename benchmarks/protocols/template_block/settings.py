"""The ``template_block`` protocol's checks beyond its settings' types, run before anything is built: the task, and
each variant's ``template_block`` / ``soft_maximizer`` / ``match_parameters`` settings.

Every error is one line naming the file and the key (:class:`pml_extensions.runner.errors.ConfigError`).

Example::

    >>> cfg = {"models": {"trunk": {"SmallResNet": {}}}, "template_block": {"aux_weight": 2}}
    >>> try:
    ...     check_variant(cfg, "block", ["block"], {"variants": "general.yaml"})
    ... except ValueError as e:
    ...     print(e)
    general.yaml (variants.block): task classification needs models.classifier (e.g. {Linear: {}})
"""

from typing import Any, Dict, List, Optional

from pml_extensions.runner.errors import ConfigError

TASKS = ("classification", "metric_learning")
#: the block's own modules (and a soft maximizer's noise) draw from ``seed + BLOCK_SEED_OFFSET``, never from the
#: stream the shared modules are drawn from, so a variant with a block shares the baseline's weights bit for bit
BLOCK_SEED_OFFSET = 100_003
#: keys of ``template_block`` that are the trainer's or the inserter's, not the block's
BLOCK_KEYS = ("aux_weight", "after", "init")
SOFT_MAXIMIZER_KEYS = ("mixing", "epsilon", "num_samples", "estimate_from", "probe_images", "probe_batch_size")
MATCH_KEYS = ("variant", "widen", "deepen")


def check_variant(cfg: Dict[str, Any], name: str, names, sources=None) -> None:
    """One merged variant: required keys, positive sizes, and its ``template_block`` / ``soft_maximizer`` /
    ``match_parameters`` settings.

    Raises:
        ConfigError: naming ``variants.<name>`` and the key.
    """
    here = f"{(sources or {}).get('variants', 'config')} (variants.{name})"
    if cfg["models"].get("trunk") is None:
        raise ConfigError(f"{here}: missing key models.trunk")
    task = cfg.get("task", "classification")
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
        from pml_extensions.runner.objects.feature_cache import cache_spec

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


def check_task(configs: Dict[str, Dict[str, Any]], sources: Optional[Dict[str, str]] = None) -> None:
    """Every variant has the same task, and a ``soft_maximizer`` variant estimates from BN-ReLU variants listed
    before it.

    Raises:
        ConfigError: naming the file and the key.
    """
    names = list(configs)
    for name, vcfg in configs.items():
        soft = vcfg.get("soft_maximizer")
        for other in _names(soft["estimate_from"]) if soft else ():
            if names.index(other) >= names.index(name) or configs[other].get("soft_maximizer"):
                raise ConfigError(
                    f"{(sources or {}).get('variants', 'config')} (variants.{name}): soft_maximizer.estimate_from: "
                    f"{other!r} must be a BN-ReLU variant listed before {name!r}"
                )
    tasks = {v.get("task", "classification") for v in configs.values()}
    if len(tasks) > 1:
        where = (sources or {}).get("task", "config")
        raise ConfigError(f"{where}: task: every variant must have the same task, got {sorted(tasks)}")
