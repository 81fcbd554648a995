"""The main XML job: train HistogramPooling + XMLWrapper and the GAP baseline in one run, evaluate unseen classes.

``python -m pml_extensions job [--config xml_glyphs] [--dataset NAME] [--output runs] ...``

Everything is described by YAML files in powerful-benchmarker's ``{ClassName: {kwargs}}`` format (read with
``yaml.safe_load``); each entry of ``variants`` in ``config_general.yaml`` is deep-merged over the files and trained
with the same seed. Training uses PML's ``MetricLossOnly`` and ``MPerClassSampler``; evaluation PML's
``GlobalEmbeddingSpaceTester`` + ``AccuracyCalculator`` (faiss) on the class-disjoint test split; logs go through
record-keeper + ``HookContainer`` (CSV and SQLite). Outputs under ``<output>/<experiment_name>/``: ``results.md``,
``results.json``, ``map_at_r.png``, ``prototype_usage.png`` and one folder per variant with logs and models.
"""

import argparse
import os
import shutil
import sys
import time

import numpy as np
import torch

from ..utils.atomic_io import atomic_savefig, atomic_write_json, atomic_write_text
from .config_files import deep_merge, find_config_dir, load_config_dir
from .factory import ConfigError, build

METRICS = ("mean_average_precision_at_r", "precision_at_1", "r_precision")
METRIC_NAMES = {"mean_average_precision_at_r": "MAP@R", "precision_at_1": "P@1", "r_precision": "R-precision"}


REQUIRED_KEYS = {
    "dataset": "config_dataset.yaml",
    "models": "config_models.yaml",
    "loss_funcs": "config_loss_and_miners.yaml",
    "sampler": "config_loss_and_miners.yaml",
    "optimizers": "config_optimizers.yaml",
    "transforms": "config_transforms.yaml",
    "accuracy_calculator": "config_eval.yaml",
    "tester": "config_eval.yaml",
    "num_epochs": "config_general.yaml",
    "iterations_per_epoch": "config_general.yaml",
    "batch_size": "config_general.yaml",
}


def check_config(cfg: dict):
    """Required keys present; epochs, iterations and batch size positive integers.

    Raises:
        ConfigError: naming the file that should define the key.
    """
    for key, filename in REQUIRED_KEYS.items():
        if cfg.get(key) is None:
            raise ConfigError(f"{filename}: missing key {key!r}")
    for key in ("num_epochs", "iterations_per_epoch", "batch_size"):
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"config_general.yaml: {key} must be a positive integer, got {value!r}")
    for key in ("models", "transforms"):
        for sub in {"models": ("trunk", "embedder"), "transforms": ("train", "eval")}[key]:
            if not isinstance(cfg[key], dict) or cfg[key].get(sub) is None:
                raise ConfigError(f"{REQUIRED_KEYS[key]}: missing key {key}.{sub}")
    if not isinstance(cfg["dataset"], dict) or not cfg["dataset"].get("name"):
        raise ConfigError("config_dataset.yaml: missing key dataset.name")


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"config_general.yaml: device: {e}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"config_general.yaml: device {name!r} requested but no CUDA device is available")
    return device


def find_histogram_layers(module: torch.nn.Module):
    from ..trunks import HistogramPooling

    return [m for m in module.modules() if isinstance(m, HistogramPooling)]


def attach_histogram_layer(loss_funcs: dict, trunk: torch.nn.Module):
    """Give every XMLWrapper without a ``histogram_layer`` the (single) HistogramPooling of the trunk."""
    from ..losses import XMLWrapper

    layers = find_histogram_layers(trunk)
    for loss in loss_funcs.values():
        for m in loss.modules():
            if isinstance(m, XMLWrapper) and m.histogram_layer is None:
                if len(layers) != 1:
                    raise ConfigError(
                        f"config_loss_and_miners: XMLWrapper needs exactly one HistogramPooling in the trunk, found {len(layers)}"
                    )
                m.__dict__["histogram_layer"] = layers[0]


def trunk_body(trunk: torch.nn.Module, layer: torch.nn.Module) -> torch.nn.Module:
    """The part of a Sequential trunk before ``layer``."""
    if not isinstance(trunk, torch.nn.Sequential):
        raise ConfigError("prototype_init needs a Sequential trunk ([body, HistogramPooling, ...])")
    children = list(trunk.children())
    return torch.nn.Sequential(*children[: children.index(layer)])


def make_loader(dataset, batch_size, seed):
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed), num_workers=0
    )


def run_variant(name: str, cfg: dict, out_dir: str, device: torch.device, log=print) -> dict:
    """Train and evaluate one variant; returns its accuracy history and final metrics."""
    import record_keeper
    from pytorch_metric_learning.utils import common_functions as c_f
    from pytorch_metric_learning.utils import logging_presets

    from ..datasets import get_dataset
    from ..trainers import MetricLossOnly

    seed = int(cfg.get("seed", 0))
    torch.manual_seed(seed)
    c_f.NUMPY_RANDOM = np.random.RandomState(seed)
    where = cfg.get("_origin", {})

    ds_cfg = cfg["dataset"]
    train_tf = build(cfg["transforms"]["train"], where.get("transforms", "config_transforms"))
    eval_tf = build(cfg["transforms"]["eval"], where.get("transforms", "config_transforms"))
    ds_kwargs = dict(ds_cfg.get("kwargs") or {})
    try:
        train_set = get_dataset(ds_cfg["name"], "train", train_tf, ds_cfg.get("root"), **ds_kwargs)
        test_set = get_dataset(ds_cfg["name"], "test", eval_tf, ds_cfg.get("root"), **ds_kwargs)
        train_eval_set = get_dataset(ds_cfg["name"], "train", eval_tf, ds_cfg.get("root"), **ds_kwargs)
    except (ValueError, TypeError, FileNotFoundError) as e:
        raise ConfigError(f"{where.get('dataset', 'config_dataset.yaml')}: dataset: {e}") from e

    models_where = where.get("models", "config_models")
    trunk = build(cfg["models"]["trunk"], f"{models_where}: models.trunk").to(device)
    embedder = build(cfg["models"]["embedder"], f"{models_where}: models.embedder").to(device)
    loss_where = where.get("loss_funcs", "config_loss_and_miners")
    loss_funcs = {k: build(v, f"{loss_where}: loss_funcs.{k}") for k, v in cfg["loss_funcs"].items()}
    for loss in loss_funcs.values():
        loss.to(device)
    attach_histogram_layer(loss_funcs, trunk)
    mining_funcs = {k: build(v, f"{loss_where}: mining_funcs.{k}") for k, v in (cfg.get("mining_funcs") or {}).items()}

    batch_size = int(cfg["batch_size"])
    iterations = int(cfg["iterations_per_epoch"])
    try:
        sampler = build(
            cfg["sampler"], f"{loss_where}: sampler", labels=train_set.labels, batch_size=batch_size,
            length_before_new_iter=batch_size * iterations,
        )
    except AssertionError as e:  # PML's samplers check their arguments with assert
        raise ConfigError(
            f"{loss_where}: sampler: {e} (the {ds_cfg['name']} train split has "
            f"{len(np.unique(train_set.labels))} classes; batch_size is {batch_size})"
        ) from e
    pools = find_histogram_layers(trunk)
    init = cfg.get("prototype_init")
    if pools and init:
        pools[0].init_from_data(
            trunk_body(trunk, pools[0]), make_loader(train_eval_set, batch_size, seed),
            num_batches=int(init.get("num_batches", 4)), method=init.get("method", "kmeans"), seed=seed,
        )

    opt_where = where.get("optimizers", "config_optimizers")
    optimizers = {}
    for key, spec in cfg["optimizers"].items():
        model = {"trunk_optimizer": trunk, "embedder_optimizer": embedder}.get(key)
        if model is None:
            model = loss_funcs.get(key.replace("_optimizer", ""))
        if model is None:
            raise ConfigError(f"{opt_where}: optimizers.{key} names no model or loss (use trunk_optimizer, embedder_optimizer or <loss>_optimizer)")
        optimizers[key] = build(spec, f"{opt_where}: optimizers.{key}", params=model.parameters())

    variant_dir = os.path.join(out_dir, name)
    if os.path.isdir(variant_dir):  # a rerun of the job replaces that variant's previous logs and models
        shutil.rmtree(variant_dir)
    writer = record_keeper.RecordWriter(
        folder=os.path.join(variant_dir, "logs"), global_db_path=os.path.join(variant_dir, "records.db"),
        experiment_name=name, is_new_experiment=True,
    )
    rk = record_keeper.RecordKeeper(
        record_writer=writer, attributes_to_search_for=c_f.list_of_recordable_attributes_list_names()
    )
    hooks = logging_presets.HookContainer(rk, primary_metric="mean_average_precision_at_r", log_freq=10)
    history = []

    def end_of_testing(tester):
        hooks.end_of_testing_hook(tester)
        acc = tester.all_accuracies["val"]
        history.append({"epoch": int(acc["epoch"]), **{m: float(acc[f"{m}_level0"]) for m in METRICS}})
        log(f"  [{name}] epoch {history[-1]['epoch']}: " + ", ".join(f"{METRIC_NAMES[m]} {history[-1][m]:.4f}" for m in METRICS))

    eval_where = where.get("tester", "config_eval")
    accuracy_calculator = build(cfg["accuracy_calculator"], f"{eval_where}: accuracy_calculator")
    tester = build(
        cfg["tester"], f"{eval_where}: tester", end_of_testing_hook=end_of_testing,
        accuracy_calculator=accuracy_calculator, data_device=device,
    )
    dataset_dict = {"val": test_set}
    model_folder = os.path.join(variant_dir, "models")
    end_of_epoch = hooks.end_of_epoch_hook(tester, dataset_dict, model_folder, test_interval=1, patience=None)
    trainer = MetricLossOnly(
        models={"trunk": trunk, "embedder": embedder}, optimizers=optimizers, batch_size=batch_size,
        loss_funcs=loss_funcs, mining_funcs=mining_funcs, dataset=train_set, sampler=sampler,
        iterations_per_epoch=iterations, dataloader_num_workers=int(cfg.get("dataloader_num_workers", 0)),
        data_device=device, end_of_iteration_hook=hooks.end_of_iteration_hook, end_of_epoch_hook=end_of_epoch,
    )
    tester.test(dataset_dict, 0, trunk, embedder)
    start = time.time()
    trainer.train(num_epochs=int(cfg["num_epochs"]))
    train_seconds = time.time() - start
    rk.save_records()
    xml_stats = {}
    for loss in loss_funcs.values():
        if hasattr(loss, "num_skipped_xml"):
            xml_stats = {"num_skipped_xml": int(loss.num_skipped_xml), "last_xml_loss": float(loss.xml_loss)}
    return {
        "name": name, "history": history, "final": history[-1], "best": max(history, key=lambda h: h[METRICS[0]]),
        "train_seconds": train_seconds, "trunk": trunk, "embedder": embedder, "test_set": test_set,
        "train_eval_set": train_eval_set, "xml": xml_stats,
    }


@torch.no_grad()
def class_histograms(result: dict, num_prototypes: int, device, seed: int, batch_size: int = 128):
    """Mean soft histogram per test class [C, m]. A trunk without HistogramPooling gets a post-hoc layer whose
    prototypes are k-means centres of its own training-set local features (same m), so variants compare."""
    from ..trunks import HistogramPooling

    trunk = result["trunk"].eval()
    pools = find_histogram_layers(trunk)
    if pools:
        pool, body = pools[0], trunk_body(trunk, pools[0])
    else:
        children = list(trunk.children())
        body = torch.nn.Sequential(*children[:1])
        width = body(result["train_eval_set"][0][0][None].to(device)).shape[1]
        pool = HistogramPooling(width, num_prototypes).to(device)
        pool.init_from_data(body, make_loader(result["train_eval_set"], batch_size, seed), num_batches=4, seed=seed)
    labels, hists = [], []
    for images, y in torch.utils.data.DataLoader(result["test_set"], batch_size=batch_size):
        hists.append(pool.histograms(body(images.to(device))).cpu())
        labels.append(y)
    labels, hists = torch.cat(labels), torch.cat(hists)
    classes = torch.unique(labels)
    return classes, torch.stack([hists[labels == c].mean(0) for c in classes])


def save_plots(results, out_dir, class_names, num_prototypes, device, seed):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        ax.plot([h["epoch"] for h in r["history"]], [h[METRICS[0]] for h in r["history"]], marker="o", label=r["name"])
    ax.set_xlabel("epoch")
    ax.set_ylabel("MAP@R (unseen test classes)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    map_path = os.path.join(out_dir, "map_at_r.png")
    atomic_savefig(fig, map_path, dpi=120)
    plt.close(fig)

    shown = 4
    fig, axes = plt.subplots(len(results), shown, figsize=(3 * shown, 2.4 * len(results)), squeeze=False)
    for row, r in enumerate(results):
        classes, hist = class_histograms(r, num_prototypes, device, seed)
        for col in range(min(shown, len(classes))):
            ax = axes[row][col]
            ax.bar(np.arange(hist.shape[1]), hist[col].numpy(), width=1.0)
            ax.set_title(f"{r['name']}: class '{class_names[int(classes[col])]}'", fontsize=8)
            ax.set_xticks([])
            ax.set_ylim(0, float(hist.max()) * 1.05)
    fig.suptitle(
        "Mean prototype histogram per unseen class (cf. XML paper Fig. 4); "
        "trunks without HistogramPooling: post-hoc k-means prototypes of their own features",
        fontsize=9,
    )
    fig.tight_layout()
    usage_path = os.path.join(out_dir, "prototype_usage.png")
    atomic_savefig(fig, usage_path, dpi=110)
    plt.close(fig)
    return map_path, usage_path


def results_table(results) -> str:
    lines = [
        "| variant | " + " | ".join(METRIC_NAMES[m] for m in METRICS) + " | best MAP@R (epoch) | train s |",
        "|---|" + "---|" * (len(METRICS) + 2),
    ]
    for r in results:
        f, b = r["final"], r["best"]
        lines.append(
            f"| {r['name']} | " + " | ".join(f"{f[m]:.4f}" for m in METRICS)
            + f" | {b[METRICS[0]]:.4f} ({b['epoch']}) | {r['train_seconds']:.0f} |"
        )
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m pml_extensions job", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="xml_glyphs", help="shipped config name or a folder of config_*.yaml files")
    p.add_argument("--dataset", help="override dataset.name (glyphs, glyphs_debian, openclipart, fashion_mnist, ...)")
    p.add_argument("--dataset-root", help="override dataset.root")
    p.add_argument("--output", default="runs", help="output folder (default: runs)")
    p.add_argument("--epochs", type=int, help="override num_epochs")
    p.add_argument("--iterations", type=int, help="override iterations_per_epoch")
    p.add_argument("--seed", type=int, help="override seed")
    p.add_argument("--device", help="override device (auto, cpu, cuda, cuda:1)")
    p.add_argument("--variants", nargs="+", help="run only these variants")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config_dir(find_config_dir(args.config))
        origin = cfg.pop("_origin")
        for key, value in (("num_epochs", args.epochs), ("iterations_per_epoch", args.iterations), ("seed", args.seed), ("device", args.device)):
            if value is not None:
                cfg[key] = value
        if args.dataset:
            cfg["dataset"] = {"name": args.dataset, "root": args.dataset_root, "kwargs": {}}
        elif args.dataset_root:
            cfg["dataset"]["root"] = args.dataset_root
        variants = cfg.pop("variants", None) or {"default": {}}
        for name, override in variants.items():
            check_config(deep_merge(cfg, override or {}))
        if args.variants:
            unknown = set(args.variants) - set(variants)
            if unknown:
                raise ConfigError(f"--variants: unknown {sorted(unknown)}; config has {sorted(variants)}")
            variants = {k: variants[k] for k in args.variants}
        device = select_device(cfg.get("device", "auto"))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out_dir = os.path.join(args.output, cfg.get("experiment_name", "experiment"))
    os.makedirs(out_dir, exist_ok=True)
    print(f"pml_extensions job: config {args.config}, dataset {cfg['dataset']['name']}, device {device}, output {out_dir}")
    results = []
    start = time.time()
    for name, override in variants.items():
        variant_cfg = deep_merge(cfg, override or {})
        variant_cfg["_origin"] = origin
        print(f"== variant {name}")
        try:
            results.append(run_variant(name, variant_cfg, out_dir, device))
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    total = time.time() - start
    class_names = results[0]["test_set"].classes if hasattr(results[0]["test_set"], "classes") else None
    if class_names is None:
        class_names = [str(i) for i in range(int(max(results[0]["test_set"].labels)) + 1)]
    m = next((p.num_prototypes for r in results for p in find_histogram_layers(r["trunk"])), 64)
    map_path, usage_path = save_plots(results, out_dir, class_names, m, device, int(cfg.get("seed", 0)))
    table = results_table(results)
    header = (
        f"Dataset `{cfg['dataset']['name']}` (unseen test classes: {len(np.unique(results[0]['test_set'].labels))}, "
        f"{len(results[0]['test_set'])} images), {cfg['num_epochs']} epochs × {cfg['iterations_per_epoch']} iterations, "
        f"batch {cfg['batch_size']}, seed {cfg.get('seed', 0)}, device {device}, total {total:.0f} s."
    )
    atomic_write_text(os.path.join(out_dir, "results.md"), header + "\n\n" + table + "\n")
    summary = {
        "config": args.config, "dataset": cfg["dataset"], "device": str(device), "total_seconds": total,
        "variants": [{k: r[k] for k in ("name", "history", "final", "best", "train_seconds", "xml")} for r in results],
    }
    atomic_write_json(os.path.join(out_dir, "results.json"), summary)
    print("\n" + header + "\n\n" + table)
    print(f"\nplots: {map_path}, {usage_path}\nlogs: {out_dir}/<variant>/logs (CSV) and records.db (SQLite)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
