"""The ``xml_vs_gap`` protocol (the main job): variants trained pairwise over several seeds and compared.

``python -m pml_extensions job`` runs it on the shipped ``xml_glyphs`` config (:mod:`pml_extensions.cli.job`);
``python -m pml_extensions run CONFIG`` on any flat config (``config_*.yaml`` files with ``variants``).

Every entry of ``variants`` is merged over the config (powerful-benchmarker syntax,
:func:`pml_extensions.runner.config.loader.variant_configs`) and trained once per seed of ``seeds`` (default
``[0, 1, 2]``). Within a seed all variants start from bit-identical weights for the modules they share and see the
same batches (:mod:`.unit`); the best epoch is chosen on a class-disjoint validation part of the
training classes (``validation: {class_fraction, seed}``) and only the selected model is evaluated, once, on the
unseen test classes. ``comparisons: [[variant, baseline], ...]`` are reported as paired per-seed differences with a
95 % t interval (:mod:`pml_extensions.runner.outputs.results`).

Outputs under ``<output>/<experiment_name>/``: ``results.json`` (``variants`` / ``comparisons`` layout, plus
``units``: per variant and seed the validation history, best epoch and train time), ``results.md``,
``map_at_r.png``, ``prototype_usage.png``, ``config.yaml``, ``report.html`` and ``<variant>/seed_<s>/`` with the
record-keeper logs (CSV + SQLite), ``checkpoint.pth`` (per epoch), the selected weights and ``result.json``. A rerun
with the same config skips the finished ``(variant, seed)`` units and resumes an interrupted one from its last epoch.
"""

import copy
import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ....utils.atomic_io import atomic_write_json
from ...config.keys import PROTOCOL_KEYS, seed_list
from ...errors import ConfigError
from ...outputs.results import summarize, write_results
from .unit import METRICS, evaluate, load_models, train_and_select

DEFAULT_SEEDS = (0, 1, 2)
#: every top-level key this protocol reads (the loader refuses others, naming the nearest)
CONFIG_KEYS = PROTOCOL_KEYS["xml_vs_gap"]
REQUIRED_KEYS = (
    "dataset",
    "models",
    "loss_funcs",
    "sampler",
    "optimizers",
    "transforms",
    "accuracy_calculator",
    "tester",
    "num_epochs",
    "iterations_per_epoch",
    "batch_size",
)


def check_config(cfg: dict, where: str = "config") -> None:
    """Required keys present; epochs, iterations and batch size positive integers.

    Raises:
        ConfigError: one line naming the key.
    """
    for key in REQUIRED_KEYS:
        if cfg.get(key) is None:
            raise ConfigError(f"{where}: missing key {key!r}")
    for key in ("num_epochs", "iterations_per_epoch", "batch_size"):
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
    for key, subs in (("models", ("trunk", "embedder")), ("transforms", ("train", "eval"))):
        for sub in subs:
            if not isinstance(cfg[key], dict) or cfg[key].get(sub) is None:
                raise ConfigError(f"{where}: missing key {key}.{sub}")
    if not dataset_name(cfg["dataset"]):
        raise ConfigError(f"{where}: missing key dataset.name")


def dataset_name(spec: Any) -> Optional[str]:
    """The dataset's name: ``glyphs``, ``{name: glyphs, ...}`` or the class of ``{ClassName: kwargs}``."""
    if isinstance(spec, str):
        return spec or None
    if isinstance(spec, dict):
        return spec.get("name") if "name" in spec else (next(iter(spec)) if len(spec) == 1 else None)
    return None


def check_seeds(seeds) -> List[int]:
    """A non-empty list of distinct non-negative ints (``"0 1 2"`` from the command line counts as a list).

    Raises:
        ConfigError: otherwise.
    """
    seeds = seed_list(seeds)
    if not isinstance(seeds, (list, tuple)) or not seeds:
        raise ConfigError(f"seeds must be a non-empty list of ints, got {seeds!r}")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError(f"seeds must hold non-negative ints, got {s!r}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds must be distinct, got {list(seeds)}")
    return list(seeds)


def resolve_seeds(seeds, seed=None) -> List[int]:
    """The run's seeds: ``seeds`` when given (``0`` and ``[0]`` are seed 0), else ``[seed]``, else
    :data:`DEFAULT_SEEDS`; checked by :func:`check_seeds`.

    Example::

        >>> resolve_seeds(0), resolve_seeds(None, 5), resolve_seeds(None)
        ([0], [5], [0, 1, 2])
    """
    if seeds is None:
        seeds = [seed] if seed is not None else list(DEFAULT_SEEDS)
    return check_seeds(seeds)


def _xml_weight(cfg) -> Optional[float]:
    """The XMLWrapper's ``xml_weight`` in a variant's ``loss_funcs`` (``None`` without an XMLWrapper): the claim
    "XML beats GAP" concerns variants with a positive weight against baselines without the wrapper."""
    for spec in (cfg.get("loss_funcs") or {}).values():
        if isinstance(spec, dict) and "XMLWrapper" in spec:
            return float((spec["XMLWrapper"] or {}).get("xml_weight", 0.01))
    return None


def xml_loss_curve(stage: str) -> Optional[Dict[str, float]]:
    """Summary of a unit's logged ``xml_loss`` (record-keeper CSV of its XMLWrapper): mean of the first and last 10
    iterations and the std over all iterations; ``None`` without an XMLWrapper log."""
    import csv
    import glob

    files = [
        f for f in glob.glob(os.path.join(stage, "logs", "*XMLWrapper.csv")) if "_modules" not in os.path.basename(f)
    ]
    if not files:
        return None
    with open(files[0], newline="", encoding="utf-8") as f:
        values = [float(r["xml_loss"]) for r in csv.DictReader(f) if r.get("xml_loss") not in (None, "")]
    if not values:
        return None
    return {
        "first10": float(np.mean(values[:10])),
        "last10": float(np.mean(values[-10:])),
        "std": float(np.std(values)),
        "iterations": len(values),
    }


def variant_sources(sources: Optional[Dict[str, str]], name: str, update: Dict[str, Any]) -> Dict[str, str]:
    """``sources`` for one variant: the top-level keys its ``variants`` entry changes name that entry, so an error
    in them points at ``<file of variants> (variants.<name>)``."""
    out = dict(sources or {})
    here = f"{out.get('variants', 'config')} (variants.{name})"
    for key in update or {}:
        out[str(key).split("~")[0]] = here
    return out


def markdown_parts(results: Dict[str, Any]) -> Tuple[str, str]:
    """``(header, footer)`` of ``results.md`` from ``results.json`` alone (the run's setup; the ``xml_loss`` curves).
    The paper's claim beside the comparisons is the benchmark's (``benchmarks/xml_vs_gap.py``)."""
    seeds, units = results["seeds"], results["units"]
    any_unit = next(iter(units.values()))[str(seeds[0])]
    header = (
        f"Dataset `{dataset_name(results['dataset'])}`: trained on {any_unit['num_train_classes']} classes, "
        "best epoch chosen "
        f"on {any_unit['num_val_classes']} held-out training classes (validation), tested once on the unseen test "
        f"classes. {results['num_epochs']} epochs × {results['iterations_per_epoch']} iterations, batch "
        f"{results['batch_size']}, seeds {', '.join(map(str, seeds))} (paired: same initial weights for shared "
        f"modules and same batches within a seed), device {results['device']}. Test metrics; differences are paired by "
        f"seed, 95 % Student-t interval."
    )
    curve_lines = []
    for n, per in (results.get("xml_loss_curves") or {}).items():
        ok = [c for c in per.values() if c]
        if ok:
            curve_lines.append(
                f"- `xml_loss` of {n} (logged every iteration, mean over seeds): first 10 iterations "
                f"{np.mean([c['first10'] for c in ok]):.3f}, last 10 {np.mean([c['last10'] for c in ok]):.3f}, "
                f"std over "
                f"iterations {np.mean([c['std'] for c in ok]):.3f}"
            )
    footer = ""
    if curve_lines:
        footer = "The XML term (contrastive: 2.00 is its value when all cross-batch predictions coincide):\n"
        footer += "\n".join(curve_lines)
    return header, footer


def _unit_result(name, seed, cfg, folder, device, log, sources=None):
    stage = os.path.join(folder, name, f"seed_{seed}")
    path = os.path.join(stage, "result.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f), None
    r = train_and_select(name, cfg, seed, stage, device, log, sources=sources)
    test = evaluate(cfg, r["models"], device, "test", sources=sources)
    result = {k: v for k, v in r.items() if k != "models"}
    result["test"] = test
    atomic_write_json(path, result, indent=2)
    return result, r["models"]


def run(
    config: Dict[str, Any],
    experiment_folder: str,
    sources: Optional[Dict[str, str]] = None,
    log: Callable[..., None] = print,
) -> Dict[str, Any]:
    """Train every variant at every seed, select on validation classes, test once, compare; write the outputs.

    Returns:
        the ``results.json`` dict.

    Raises:
        ConfigError: bad seeds, variants, comparisons or a variant config missing a key.
    """
    from tqdm import tqdm

    from ...experiment.folder import select_device

    cfg = copy.deepcopy(config)
    cfg.pop("protocol", None)
    seed = cfg.pop("seed", None)
    if cfg.get("seeds") is not None and seed is not None:
        raise ConfigError(
            f"seed: {seed!r} and seeds: {cfg['seeds']!r} both given; keep one (seeds: [...] runs every seed)"
        )
    seeds = resolve_seeds(cfg.pop("seeds", None), seed)
    variants = cfg.pop("variants", None) or {"default": {}}
    variants = {k: (v or {}) for k, v in variants.items()}
    comparisons = cfg.pop("comparisons", None) or []
    for pair in comparisons:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(p in variants for p in pair)):
            raise ConfigError(
                f"comparisons: each entry must be [variant, baseline] naming variants of {sorted(variants)}, "
                f"got {pair!r}"
            )
    from ...config.loader import variant_configs

    merged = variant_configs({**cfg, "variants": variants}) if variants else {}
    for name in merged:
        for key in ("variants", "comparisons", "seeds", "seed", "protocol"):
            merged[name].pop(key, None)
        check_config(merged[name], f"variants.{name}")
    device = select_device(cfg.get("device", "auto"))
    os.makedirs(experiment_folder, exist_ok=True)
    start = time.time()
    per_seed: Dict[str, Dict[int, Dict[str, float]]] = {n: {} for n in variants}
    units: Dict[str, Dict[str, Any]] = {n: {} for n in variants}
    first_seed_units = []
    bar = tqdm(total=len(seeds) * len(variants), desc="xml_vs_gap", leave=False)
    for seed in seeds:
        for name in variants:
            result, models = _unit_result(
                name, seed, merged[name], experiment_folder, device, log, variant_sources(sources, name, variants[name])
            )
            per_seed[name][seed] = result["test"]
            units[name][str(seed)] = {k: v for k, v in result.items() if k != "test"}
            if result.get("best_is_untrained"):
                log(f"warning: {name} seed {seed}: the best validation epoch is the untrained model (epoch 0)")
            if seed == seeds[0]:
                first_seed_units.append((name, merged[name], result, models))
            bar.update(1)
    bar.close()
    total = time.time() - start
    first = next(iter(merged.values()))
    results = summarize(
        per_seed,
        comparisons=[tuple(p) for p in comparisons],
        metrics=[METRICS[0]],
        extra={
            "protocol": "xml_vs_gap",
            "seeds": seeds,
            "dataset": first["dataset"],
            "device": str(device),
            "num_epochs": first["num_epochs"],
            "iterations_per_epoch": first["iterations_per_epoch"],
            "batch_size": first["batch_size"],
            "validation": first.get("validation") or {},
            "seconds_this_invocation": total,  # wall time of this command: small when it found the units finished
            "train_seconds_sum": sum(u["train_seconds"] for v in units.values() for u in v.values()),
            "units": units,
        },
    )
    results["xml_loss_curves"] = {
        n: {str(sd): xml_loss_curve(os.path.join(experiment_folder, n, f"seed_{sd}")) for sd in seeds}
        for n in merged
        if (_xml_weight(merged[n]) or 0) > 0
    }
    header, footer = markdown_parts(results)
    write_results(experiment_folder, results, metrics=list(METRICS), header=header, footer=footer)
    num_prototypes = 64
    for _, vcfg, _, _ in first_seed_units:
        trunk = vcfg["models"]["trunk"]
        for spec in (trunk.get("Sequential") or []) if isinstance(trunk, dict) else []:
            if isinstance(spec, dict) and "HistogramPooling" in spec:
                num_prototypes = int((spec["HistogramPooling"] or {}).get("num_prototypes", 64))
    plot_units = []
    for name, vcfg, result, models in first_seed_units:
        if models is None:
            models = load_models(vcfg, os.path.join(experiment_folder, name, f"seed_{seeds[0]}"), device)
        plot_units.append((name, vcfg, result, models))
    from .plots import save_plots, save_retrieval

    save_plots(plot_units, experiment_folder, device, seeds[0], num_prototypes)
    save_retrieval(plot_units, experiment_folder, device, seeds[0])
    log(f"{experiment_folder}/results.md:\n")
    with open(os.path.join(experiment_folder, "results.md"), encoding="utf-8") as f:
        log(f.read())
    return results
