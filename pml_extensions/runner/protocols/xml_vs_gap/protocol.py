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

``selection`` (ours): how the tested epoch is chosen —

- ``best_epoch`` (default): each unit's own best validation epoch;
- ``mean_validation_curve``: one epoch for every unit of a group, where a group is the variants linked by
  ``comparisons`` (a variant in none is a group of its own): the epoch (>= 1) with the highest validation MAP@R
  averaged over the group's variants and every seed. The paired difference then compares equal training lengths,
  and the selection noise of a few validation classes per unit does not enter it (the issue-24 pilot: the sd of
  XML − GAP fell from 1.50 to 0.79 points);
- ``last``: the last epoch for every unit.

Every unit is then tested once, at its chosen epoch (``<variant>/seed_<s>/selected_models.pth``). ``untrained:
true`` adds a row ``untrained``: the first variant's epoch-0 model (the same network for every variant that shares
the trunk and embedder) tested per seed; comparisons may name it. With ``feature_cache`` the trunk's rest trains on
cached features of its frozen prefix (:mod:`pml_extensions.runner.objects.feature_cache`; the prefix must not
depend on the seed, e.g. pretrained weights), the caches in ``<output>/<experiment_name>/feature_cache`` unless the
key names another folder.

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
from ...experiment import distributed as dist_utils
from ...experiment.folder import ENVIRONMENT_NAME, environment_summary, run_environment
from ...objects.builder import Builder
from ...objects.feature_cache import check_fixed_prefix
from ...outputs.results import summarize, write_results
from .unit import METRICS, cached_split, evaluate, load_models, resolve_cache_folder, train_and_select

DEFAULT_SEEDS = (0, 1, 2)
SELECTIONS = ("best_epoch", "mean_validation_curve", "last")
UNTRAINED = "untrained"
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
    """``(header, footer)`` of ``results.md`` from ``results.json`` alone (the run's setup, how epochs were selected,
    the environment, the ``xml_loss`` curves). The paper's claim beside the comparisons is the benchmark's
    (``benchmarks/xml_vs_gap.py``)."""
    seeds, units = results["seeds"], results["units"]
    any_unit = next(u[str(seeds[0])] for n, u in units.items() if n != UNTRAINED)
    selection = results.get("selection") or {"mode": "best_epoch"}
    mode = selection.get("mode", "best_epoch")
    how = {
        "best_epoch": "best epoch chosen",
        "mean_validation_curve": "one epoch per group of compared variants chosen on their mean validation curve "
        "over all seeds",
        "last": "the last epoch tested (validation curves",
    }[mode]
    header = (
        f"Dataset `{dataset_name(results['dataset'])}`: trained on {any_unit['num_train_classes']} classes, {how} "
        f"on {any_unit['num_val_classes']} held-out training classes{')' if mode == 'last' else ''} (validation), "
        f"tested once on the unseen test classes. {results['num_epochs']} epochs × {results['iterations_per_epoch']} "
        f"iterations, batch {results['batch_size']}, seeds {', '.join(map(str, seeds))} (paired: same initial weights "
        f"for shared modules and same batches within a seed), device {results['device']}. Test metrics; differences "
        f"are paired by seed, 95 % Student-t interval."
    )
    if selection.get("curves"):
        header += (
            " Tested epochs: "
            + "; ".join(f"{', '.join(c['variants'])}: {c['epoch']}" for c in selection["curves"].values())
            + "."
        )
    if results.get("environment"):
        header += f" Environment: {environment_summary(results['environment'])}."
    untrained = results.get("untrained")
    if untrained:
        header += (
            f" `untrained`: {untrained['variant']} at epoch 0 (validation MAP@R at epoch 0 of the variants "
            f"differs by at most {untrained['max_val_spread_at_epoch_0']:.2g} within a seed)."
        )
    curve_lines = []
    for n, per in (results.get("xml_loss_curves") or {}).items():
        ok = [c for c in per.values() if c]
        if ok:
            curve_lines.append(
                f"- `xml_loss` of {n} (logged every iteration, mean over seeds): first 10 iterations "
                f"{np.mean([c['first10'] for c in ok]):.3f}, last 10 {np.mean([c['last10'] for c in ok]):.3f}, "
                f"std over iterations {np.mean([c['std'] for c in ok]):.3f}"
            )
    footer = ""
    if curve_lines:
        footer = "The XML term (contrastive: 2.00 is its value when all cross-batch predictions coincide):\n"
        footer += "\n".join(curve_lines)
    return header, footer


def _unit_result(name, seed, cfg, folder, device, log, sources=None, selection="best_epoch", keep_epochs=False):
    """Train (or find) one unit; with ``best_epoch`` selection also test it (``result["test"]``)."""
    stage = os.path.join(folder, name, f"seed_{seed}")
    path = os.path.join(stage, "result.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f), None
    r = train_and_select(name, cfg, seed, stage, device, log, sources=sources, keep_epochs=keep_epochs)
    result = {k: v for k, v in r.items() if k != "models"}
    if selection == "best_epoch":
        result["test"] = evaluate(cfg, r["models"], device, "test", sources=sources)
    atomic_write_json(path, result, indent=2)
    return result, r["models"]


def selection_groups(variants, comparisons) -> List[List[str]]:
    """The variants linked by ``comparisons`` (connected components, in ``variants`` order); a variant in no
    comparison is a group of its own; ``untrained`` belongs to none.

    Example::

        >>> selection_groups(["a", "b", "c", "d"], [("b", "a"), ("c", "untrained")])
        [['a', 'b'], ['c'], ['d']]
    """
    group = {v: {v} for v in variants}
    for pair in comparisons:
        if UNTRAINED in pair:
            continue
        merged = group[pair[0]] | group[pair[1]]
        for v in merged:
            group[v] = merged
    out, seen = [], set()
    for v in variants:
        if v not in seen:
            out.append([w for w in variants if w in group[v]])
            seen |= group[v]
    return out


def choose_epochs(groups, units, seeds, mode: str, num_epochs: int) -> Dict[str, Any]:
    """The tested epoch per variant: ``{"epochs": {variant: epoch}, "curves": {first variant of a group: mean
    validation MAP@R per epoch}}`` (``mode``: ``mean_validation_curve`` or ``last``; see the module docstring)."""
    epochs, curves = {}, {}
    for group in groups:
        rows = {}
        for name in group:
            for seed in seeds:
                for h in units[name][str(seed)]["history"]:
                    rows.setdefault(int(h["epoch"]), []).append(float(h[METRICS[0]]))
        curve = {e: float(np.mean(v)) for e, v in sorted(rows.items())}
        trained = {e: v for e, v in curve.items() if e >= 1}
        if mode == "last" or not trained:
            chosen = num_epochs
        else:
            chosen = max(trained, key=lambda e: (trained[e], -e))  # ties: the shorter schedule
        for name in group:
            epochs[name] = chosen
        curves[group[0]] = {"variants": group, "mean_val": curve, "epoch": chosen}
    return {"epochs": epochs, "curves": curves}


def _test_at(name, seed, epoch, cfg, folder, device, sources, log):
    """Test metrics of a unit at ``epoch`` (its ``epochs/epoch_<e>.pth``), saved as ``test_epoch_<e>.json``; the
    weights are copied to ``selected_models.pth`` (epoch >= 1). A rerun reads the saved metrics."""
    import shutil

    stage = os.path.join(folder, name, f"seed_{seed}")
    out = os.path.join(stage, f"test_epoch_{epoch}.json")
    if os.path.exists(out):
        with open(out, encoding="utf-8") as f:
            return json.load(f)
    weights = os.path.join(stage, "epochs", f"epoch_{epoch}.pth")
    if not os.path.exists(weights):
        raise ConfigError(f"{stage}: no weights of epoch {epoch} (was the unit trained with another selection?)")
    models = load_models(cfg, stage, device, path=weights)
    test = evaluate(cfg, models, device, "test", sources=sources)  # under torchrun every rank takes part
    if dist_utils.is_main():
        if epoch >= 1:
            shutil.copyfile(weights, os.path.join(stage, "selected_models.pth"))
        atomic_write_json(out, test, indent=2)
    return test


def build_feature_caches(
    config: Dict[str, Any],
    experiment_folder: str,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    sources: Optional[Dict[str, str]] = None,
    log: Callable[..., None] = print,
) -> bool:
    """Build the feature caches of every variant of a ``xml_vs_gap`` config with ``feature_cache`` (parts
    ``train``, ``train_eval``, ``test``), or only shard ``rank`` of ``world_size`` (separate processes; each
    prepares the folder under a file lock, the last one completes the cache, and a derived boundary is computed once
    its source is complete). A run of the config then finds them. Returns whether every cache is complete.

    Raises:
        ConfigError: as :func:`run` reads the config.
    """
    from ...config.loader import variant_configs
    from ...experiment.folder import select_device

    cfg = copy.deepcopy(config)
    variants = {k: (v or {}) for k, v in (cfg.pop("variants", None) or {"default": {}}).items()}
    for key in ("comparisons", "seeds", "seed", "protocol", "selection", UNTRAINED):
        cfg.pop(key, None)
    merged = variant_configs({**cfg, "variants": variants})
    device = select_device(cfg.get("device", "auto"))
    done, seen = True, set()
    for name, vcfg in merged.items():
        if vcfg.get("feature_cache") is None:
            continue
        vcfg = resolve_cache_folder(vcfg, experiment_folder)
        signature = json.dumps([vcfg["feature_cache"], vcfg["models"]["trunk"], vcfg["dataset"], vcfg["transforms"]])
        if signature in seen:
            continue
        seen.add(signature)
        b = Builder(vcfg, variant_sources(sources, name, variants[name]), device, log)
        for split, train in (("train", True), ("train", False), ("test", False)):
            if rank is None and world_size is None:
                cached_split(b, split, train)
            else:
                done = cached_split(b, split, train, rank=rank, world_size=world_size)[1] and done
    return done


def check_dataset_images(merged, variants, sources, device, experiment_folder, log) -> None:
    """Before the first unit trains: every image file of each variant's dataset (train and test splits, each
    distinct dataset once) decodes (:func:`pml_extensions.runner.objects.preflight.check_images`); a bad file
    stopped the job mid-training with PIL's traceback.

    Raises:
        ConfigError: naming every bad file and where the dataset came from.
    """
    from ...objects import preflight

    seen = set()
    for name, cfg in merged.items():
        key = json.dumps(cfg.get("dataset"), sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        vs = variant_sources(sources, name, variants[name])
        b = Builder(copy.deepcopy(cfg), vs, device, lambda *a, **k: None)  # a Builder fills in what it learns
        for split in ("train", "test"):
            where = f"{vs.get('dataset', 'config')}: dataset"
            preflight.check_images(b.build_dataset(split), experiment_folder, False, where, log, skip_hint=None)


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
    selection = cfg.pop("selection", None) or "best_epoch"
    if selection not in SELECTIONS:
        raise ConfigError(
            f"{(sources or {}).get('selection', 'config')}: selection: expected one of {', '.join(SELECTIONS)}, "
            f"got {selection!r}"
        )
    untrained = cfg.pop(UNTRAINED, False)
    if not isinstance(untrained, bool):
        raise ConfigError(
            f"{(sources or {}).get(UNTRAINED, 'config')}: untrained: expected true or false, got {untrained!r}"
        )
    if untrained and UNTRAINED in variants:
        raise ConfigError(f"variants: {UNTRAINED!r} is the name of the untrained row (untrained: true); rename it")
    names = set(variants) | ({UNTRAINED} if untrained else set())
    comparisons = cfg.pop("comparisons", None) or []
    for pair in comparisons:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(p in names for p in pair)):
            raise ConfigError(
                f"comparisons: each entry must be [variant, baseline] naming variants of {sorted(names)}, got {pair!r}"
            )
    from ...config.loader import variant_configs

    merged = variant_configs({**cfg, "variants": variants}) if variants else {}
    device = select_device(cfg.get("device", "auto"))
    checked = set()
    for name in merged:
        for key in ("variants", "comparisons", "seeds", "seed", "protocol"):
            merged[name].pop(key, None)
        check_config(merged[name], f"variants.{name}")
        merged[name] = resolve_cache_folder(merged[name], experiment_folder)
        if merged[name].get("feature_cache") is not None:
            signature = json.dumps([merged[name]["models"]["trunk"], merged[name]["feature_cache"]])
            if signature not in checked:
                vs = variant_sources(sources, name, variants[name])
                check_fixed_prefix(
                    lambda cfg=merged[name], vs=vs: Builder(cfg, vs, device, lambda *a, **k: None),
                    seeds,
                    f"{vs.get('feature_cache', 'config')}: feature_cache",
                )
                checked.add(signature)
    keep_epochs = selection != "best_epoch" or untrained
    os.makedirs(experiment_folder, exist_ok=True)
    check_dataset_images(merged, variants, sources, device, experiment_folder, log)
    start = time.time()
    per_seed: Dict[str, Dict[int, Dict[str, float]]] = {n: {} for n in variants}
    units: Dict[str, Dict[str, Any]] = {n: {} for n in variants}
    first_seed_units = []
    bar = tqdm(total=len(seeds) * len(variants), desc="xml_vs_gap", leave=False)
    for seed in seeds:
        for name in variants:
            result, models = _unit_result(
                name,
                seed,
                merged[name],
                experiment_folder,
                device,
                log,
                variant_sources(sources, name, variants[name]),
                selection,
                keep_epochs,
            )
            if selection == "best_epoch":
                per_seed[name][seed] = result["test"]
            units[name][str(seed)] = {k: v for k, v in result.items() if k != "test"}
            if result.get("best_is_untrained") and selection == "best_epoch":
                log(f"warning: {name} seed {seed}: the best validation epoch is the untrained model (epoch 0)")
            if seed == seeds[0]:
                first_seed_units.append((name, merged[name], result, models))
            bar.update(1)
    bar.close()
    chosen = None
    if selection != "best_epoch":
        groups = selection_groups(list(variants), comparisons)
        chosen = choose_epochs(groups, units, seeds, selection, int(next(iter(merged.values()))["num_epochs"]))
        for seed in seeds:
            for name in variants:
                vs = variant_sources(sources, name, variants[name])
                epoch = chosen["epochs"][name]
                per_seed[name][seed] = _test_at(name, seed, epoch, merged[name], experiment_folder, device, vs, log)
                units[name][str(seed)]["selected_epoch"] = epoch
        first_seed_units = [(n, c, r, None) for n, c, r, _ in first_seed_units]  # the selected weights are loaded
    untrained_check = None
    if untrained:
        name = next(iter(variants))
        vs = variant_sources(sources, name, variants[name])
        per_seed[UNTRAINED] = {
            seed: _test_at(name, seed, 0, merged[name], experiment_folder, device, vs, log) for seed in seeds
        }
        spread = 0.0  # the variants' untrained models should agree: their epoch-0 validation MAP@R per seed
        for sd in seeds:
            at0 = [h[METRICS[0]] for n in variants for h in units[n][str(sd)]["history"] if h["epoch"] == 0]
            spread = max(spread, max(at0) - min(at0)) if at0 else spread
        untrained_check = {"variant": name, "max_val_spread_at_epoch_0": float(spread)}
    if keep_epochs:  # the tested weights are in selected_models.pth and the metrics in test_epoch_<e>.json
        import shutil

        for name in variants:
            for seed in seeds:
                shutil.rmtree(os.path.join(experiment_folder, name, f"seed_{seed}", "epochs"), ignore_errors=True)
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
            "selection": {"mode": selection, **(chosen or {})},
            "untrained": untrained_check,
        },
    )
    results["xml_loss_curves"] = {
        n: {str(sd): xml_loss_curve(os.path.join(experiment_folder, n, f"seed_{sd}")) for sd in seeds}
        for n in merged
        if (_xml_weight(merged[n]) or 0) > 0
    }
    env_path = os.path.join(experiment_folder, ENVIRONMENT_NAME)
    if os.path.exists(env_path):  # the run's first call made the numbers (a resume keeps its file)
        with open(env_path, encoding="utf-8") as f:
            results["environment"] = json.load(f)
    else:
        results["environment"] = run_environment()
    if not dist_utils.is_main():  # under torchrun the main rank writes the files (two writers raced on retrieval/)
        return results
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
        if models is None:  # the tested weights (selected_models.pth, else best_models.pth)
            models = load_models(vcfg, os.path.join(experiment_folder, name, f"seed_{seeds[0]}"), device)
        plot_units.append((name, vcfg, result, models))
    from .plots import save_plots, save_retrieval

    save_plots(plot_units, experiment_folder, device, seeds[0], num_prototypes)
    save_retrieval(plot_units, experiment_folder, device, seeds[0])
    log(f"{experiment_folder}/results.md:\n")
    with open(os.path.join(experiment_folder, "results.md"), encoding="utf-8") as f:
        log(f.read())
    return results
