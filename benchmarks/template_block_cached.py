#!/usr/bin/env python
"""Template-matching block with power (issue 24, item 3): ``benchmarks/configs/template_block_cached_clipart``
runs through the runner (protocol ``template_block`` with ``feature_cache``), Table 1's layout on pretrained features.

ImageNet MobileNetV2 (offline weights) frozen up to the input of its last stage, its outputs cached once per task;
the plain last stage (baseline), + the template-matching block between the last two stages (block), + its auxiliary
patch loss alone (aux_only) and the plain network with one more pretrained block trained (deeper: the parameter
control) train on them, paired by seed. Two tasks, each an experiment folder of the runner: Open Clip Art
classification (test accuracy, %) and the DML variant (class-disjoint, MAP@R in points). The parts of a call run as
separate single-thread processes::

    python benchmarks/template_block_cached.py --part cache --task classification    # the caches of a task
    python benchmarks/template_block_cached.py --part train --task classification --shard 0/2   # seeds 0, 2, 4 ...
    python benchmarks/template_block_cached.py --part train --task classification --shard 1/2
    python benchmarks/template_block_cached.py --part gather --task classification   # results.json (+ what is missing)
    python benchmarks/template_block_cached.py --merge      # benchmarks/results/template_block_cached.{json,md}
    python benchmarks/template_block_cached.py --render     # the same files again from the .json (no run)

Verdicts (:func:`pml_extensions.utils.verdicts.verdict_word`, the runner's rules): the paper claims the block
beats each control (``"greater"``), with the smallest effect of interest of :data:`SMALLEST_EFFECTS` (0.5 accuracy
points; 1 MAP@R point for the DML variant); each task's claims are Holm-corrected together and worded shown / no effect
of practical size / contradicted / inconclusive (n seeds). The target half-width of the seed count is 0.5 points.
"""

import argparse
import json
import os
import sys
import time

from pml_extensions.cli.run import quiet_progress_bars
from pml_extensions.runner.config.loader import CONFIG_FOLDERS
from pml_extensions.runner.protocols import load_config
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text
from pml_extensions.utils.paired_stats import holm
from pml_extensions.utils.verdicts import compare, format_difference, verdict_word, wins

try:  # the repository's root is on sys.path (PYTHONPATH, pytest)
    from benchmarks import protocols
except ModuleNotFoundError:  # python benchmarks/template_block_cached.py: benchmarks/ is sys.path[0]
    import protocols

protocols.register()  # the config names its protocol benchmarks.protocols.template_block

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
RUNS = os.path.join("runs", "template_block_cached")
CONFIG = "template_block_cached_clipart"
TASKS = ("classification", "dml")
TARGET = 0.5
#: δ of every claim of a task, in its points: classification 0.5 accuracy points, the evidence guide's smallest effect
#: for the block, set from the gains the paper reports for it (its Table 1 values are not in the text we have,
#: methods.md B3); the DML variant (ours, not the paper's) 1 MAP@R point, the guide's δ for retrieval (as XML's)
SMALLEST_EFFECTS = {"classification": 0.5, "metric_learning": 1.0}
#: (variant, baseline, the paper's claim) rows of the table, in order
CLAIMS = (
    ("block", "baseline", "the block beats the plain network (Table 1)"),
    ("aux_only", "baseline", "the auxiliary patch loss alone helps, less than the block (Table 1)"),
    ("block", "aux_only", "the block beats its auxiliary loss alone (Table 1)"),
    ("block", "deeper", "the gain is not the extra parameters: the block beats a plain network with more (Table 1)"),
    ("deeper", "baseline", "(control) one more trained pretrained block"),
)
LABELS = {
    "baseline": "MobileNetV2, plain last stage trained",
    "block": "+ template-matching block after features.13 (λ = 0.5)",
    "aux_only": "+ auxiliary patch loss only (mixing: none)",
    "deeper": "features.13 trained too (≥ the block's parameters)",
}


def task_config(task: str, size: str = "medium", seeds=None, device: str = "cpu", runs: str = RUNS):
    """``(config, sources, experiment folder)`` of one task: the config ``benchmarks/configs/<CONFIG>`` (``dml`` adds
    every folder's ``dml.yaml``; ``quick`` its ``quick.yaml``), the task's own cache folder under ``runs``."""
    root = protocols.config_path(CONFIG)
    selection = {}
    for folder in CONFIG_FOLDERS:
        if not os.path.isdir(os.path.join(root, folder)):
            continue
        files = ["default"] + (
            ["dml"] if task == "dml" and os.path.isfile(os.path.join(root, folder, "dml.yaml")) else []
        )
        if size == "quick" and os.path.isfile(os.path.join(root, folder, "quick.yaml")):
            files.append("quick")
        selection[folder] = files
    overrides = {"device": device}
    if seeds is not None:
        overrides["seeds"] = [int(s) for s in seeds]
    config, sources = load_config(root, selection, overrides)
    cache = os.path.abspath(os.path.join(runs, f"feature_cache_{task}"))
    config["feature_cache"] = dict(config["feature_cache"], folder=cache)
    for variant in config["variants"].values():
        spec = (variant or {}).get("feature_cache~OVERRIDE~") or (variant or {}).get("feature_cache")
        if spec is not None:
            spec["folder"] = cache
    config["experiment_name"] = f"{CONFIG}_{task}"
    return config, sources, os.path.join(runs, config["experiment_name"])


def results_name(size: str) -> str:
    """``benchmarks/results/<name>.{json,md}`` of a merge: ``template_block_cached`` (medium: the evidence table of
    the docs) or ``template_block_cached_quick`` (the 12-class smoke size of ``reproduce.py --size quick``, which
    must never replace the evidence table)."""
    return "template_block_cached" + ("_quick" if size == "quick" else "")


def _log(*args, **kwargs):
    print(*args, file=sys.stderr, flush=True)


def run_part(part: str, task: str, size: str, seeds, device: str, runs: str, shard=None) -> dict:
    """``cache``: build the task's caches (every variant's); ``train``: train this shard's seeds (``(i, n)``: seeds
    ``i, i + n, ...`` of the config); ``gather``: the whole experiment (finds the finished units) and its
    ``results.json``."""
    from pml_extensions.runner.protocols import run_protocol

    config, sources, folder = task_config(task, size, seeds, device, runs)
    start = time.time()
    if part == "cache":
        protocols.template_block.TemplateBlock(config, folder, sources, log=_log).prepare()
    elif part == "train":
        chosen = list(config["seeds"]) if shard is None else list(config["seeds"])[shard[0] :: shard[1]]
        # seed after seed (every variant of a seed), so a stopped shard leaves whole seeds
        protocols.template_block.TemplateBlock(config, folder, sources, log=_log).run_units(seeds=chosen)
    else:  # a gather over more seeds than the last one continues the same experiment
        run_protocol(config, folder, sources, log=_log, on_change="resume")
    return {"seconds": time.time() - start}


# ------------------------------------------------------------------------------------------------------------------
# the table, from the two results.json files


def _scale(results: dict) -> float:
    return 1.0 if results["task"] == "classification" else 100.0


def paired(a: dict, b: dict, smallest_effect: float) -> dict:
    """The runner's paired comparison ``a − b`` (:func:`~pml_extensions.utils.verdicts.compare`) of two
    ``{seed: points}`` with the claim "greater" and δ = ``smallest_effect``: per-seed differences, 95 % t and
    bootstrap intervals, p-values, the verdict as a single claim (:func:`claims` corrects a task's claims together),
    and ``wins``."""
    arms = {name: {"per_seed": {s: {"m": arm[s]} for s in a}} for name, arm in (("a", a), ("b", b))}
    d = compare(arms, "a", "b", "m", smallest_effect=smallest_effect, claim="greater")
    for key in ("variant", "baseline", "metric"):
        d.pop(key)
    return dict(d, wins=wins(d))


def claims(rows: list) -> list:
    """Holm's correction over one task's claims (``{"difference": paired(...)}`` rows): sets each difference's
    ``p_holm`` and ``verdict`` and the row's ``verdict``; returns the verdicts."""
    for row, p in zip(rows, holm([row["difference"]["p_value"] for row in rows])):
        d = row["difference"]
        d["p_holm"] = p
        d["verdict"] = row["verdict"] = verdict_word(d, d["claim"])
    return [row["verdict"] for row in rows]


def _claim_row(variant: str, baseline: str, text: str, difference: dict) -> dict:
    ci = difference["ci95"]
    return {
        "variant": variant,
        "baseline": baseline,
        "claim": text,
        "difference": difference,
        "half_width": None if ci is None else (ci[1] - ci[0]) / 2,
        "target_half_width": TARGET,
        "wins": difference["wins"],
    }


def task_rows(results: dict) -> dict:
    """Means per variant and the paired claims of one task's ``results.json`` (points: accuracy %, MAP@R × 100)."""
    metric = f"test_{results['primary_metric']}"
    scale = _scale(results)
    variants = results["variants"]
    means = {
        name: {
            "mean": scale * v["mean"][metric],
            "std": None if v["std"].get(metric) is None else scale * v["std"][metric],
            "params": results["params"][name],
        }
        for name, v in variants.items()
    }
    rows = []
    for variant, baseline, text in CLAIMS:
        if variant not in variants or baseline not in variants:
            continue
        a, b = ({s: scale * row[metric] for s, row in variants[n]["per_seed"].items()} for n in (variant, baseline))
        rows.append(_claim_row(variant, baseline, text, paired(a, b, SMALLEST_EFFECTS[results["task"]])))
    claims(rows)
    out = {"task": results["task"], "metric": metric, "variants": means, "claims": rows}
    return dict(out, smallest_effect=SMALLEST_EFFECTS[results["task"]], n=len(results["seeds"]))


def rerender(out: dict) -> dict:
    """A stored ``template_block_cached*.json`` with every claim recomputed from its per-seed differences (paired
    statistics read nothing else) and worded again: what ``--merge`` writes from the same runs."""
    tasks = {}
    for name, task in out["tasks"].items():
        delta = SMALLEST_EFFECTS[task["task"]]
        rows = []
        for c in task["claims"]:
            d = c["difference"]
            diffs = dict(zip(d["seeds"], d["differences"]))
            difference = paired(diffs, {s: 0.0 for s in diffs}, delta)
            rows.append(_claim_row(c["variant"], c["baseline"], c["claim"], difference))
        claims(rows)
        tasks[name] = dict(task, claims=rows, smallest_effect=delta)
    return dict(out, tasks=tasks)


def merge(runs: str = RUNS, tasks=TASKS) -> dict:
    """The finished tasks' ``results.json`` in one record (a task without one is left out)."""
    from pml_extensions.runner.experiment.folder import environment_summary

    # the block's start where it is inserted (insert_template_matching's default since the identity start)
    out = {"tasks": {}, "environment": None, "block_init": "identity"}
    for task in tasks:
        path = os.path.join(runs, f"{CONFIG}_{task}", "results.json")
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
        rows = task_rows(results)
        rows.update(
            sizes=results["sizes"],
            num_classes=results["num_classes"],
            iterations=results["num_epochs"] * results["iterations_per_epoch"],
            batch_size=results["batch_size"],
            seeds=results["seeds"],
            train_seconds_sum=results.get("train_seconds_sum"),
        )
        out["tasks"][task] = rows
        env = results.get("environment")
        env_path = os.path.join(runs, f"{CONFIG}_{task}", "environment.json")
        if not env and os.path.exists(env_path):  # the experiment folder's record of what moves the numbers
            with open(env_path, encoding="utf-8") as f:
                env = json.load(f)
        if env and out["environment"] is None:
            out["environment"] = environment_summary(env)
    if not out["tasks"]:
        raise SystemExit(f"template_block_cached: no results.json under {runs} (run the parts first)")
    return out


def markdown(out: dict, size: str = "medium") -> str:
    lines = [
        f"`python benchmarks/template_block_cached.py{' --size quick' if size == 'quick' else ''}` (the runner: config "
        f"`{CONFIG}`, protocol `template_block` "
        "with `feature_cache`). ImageNet MobileNetV2 (offline weights) frozen up to the input of its last stage, its "
        "outputs cached once (2 seeded views of every training image, 128 px); only the last stage (+ block) + head "
        "train on them, paired by seed (same initial weights for shared modules, same batches and views); the best "
        "epoch is chosen on validation images and tested once. "
        + (
            "The block is inserted as the identity (shortcut = identity, value vectors = 0: the pretrained stage "
            "after it first sees what it saw without it); the seeds are the config's, declared before running "
            "(parts: `--part cache`, `--part train`, `--part gather` per `--task`, then `--merge`). "
            if out.get("block_init") == "identity"
            else "The block was inserted with the paper's random initialisation (its 1×1 shortcut random: the "
            "pretrained stage after it sees other features), and seeds were added until the half-width target "
            f"{TARGET} points was met. "
        )
        + "Δ: paired per-seed difference, its 95 % Student-t "
        "interval and 95 % percentile bootstrap over seeds. Verdict on each claim "
        "with its smallest effect of interest δ: **shown** (the envelope of both intervals excludes 0 after Holm's "
        "correction over the task's claims, and Δ ≥ δ), **no effect of practical size** (the envelope lies within "
        "±δ), **contradicted** (excludes 0 after Holm, Δ ≤ −δ), otherwise **inconclusive**. Environment: "
        f"{out.get('environment')}.",
        "",
    ]
    for r in out["tasks"].values():
        unit = "test accuracy (%)" if r["task"] == "classification" else "test MAP@R (points)"
        what = (
            "Open Clip Art classification: every class split 60 / 10 / 30 % (train / validation / test)"
            if r["task"] == "classification"
            else "Open Clip Art DML: 30 training classes (8 validate), 30 unseen test classes"
        )
        classes = (
            f"{r['num_classes']} training classes"
            if r["task"] == "classification"  # DML: the block's patch classifier spans the split's label indices
            else f"the block's patch classifier over {r['num_classes']} label indices"
        )
        lines += [
            f"**{what}** — {classes}, {r['sizes']['train']} / {r['sizes']['val']} / "
            f"{r['sizes']['test']} images, {r['iterations']} iterations of batch {r['batch_size']}, {r['n']} seeds; "
            f"δ = {r['smallest_effect']:g} {'accuracy' if r['task'] == 'classification' else 'MAP@R'} "
            f"point{'s' if r['smallest_effect'] != 1 else ''}.",
            "",
            f"| model | {unit} | trained parameters |",
            "|---|---|---|",
        ]
        for name, v in r["variants"].items():
            std = "–" if v["std"] is None else f"{v['std']:.2f}"
            lines.append(f"| {LABELS.get(name, name)} | {v['mean']:.2f} ± {std} | {v['params']:,} |")
        lines += [
            "",
            "| claim | Δ [95 % CI] | Δ [bootstrap] | half-width | sd Δ | wins | p (Holm) | verdict |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for c in r["claims"]:
            d = c["difference"]
            half = "–" if c["half_width"] is None else f"{c['half_width']:.2f}"
            sd = "–" if d["std"] is None else f"{d['std']:.2f}"
            p = "–" if d.get("p_holm") is None else f"{d['p_holm']:.2g}"
            lines.append(
                f"| {c['variant']} − {c['baseline']}: {c['claim']} | {format_difference(d)} | "
                f"{format_difference(d, interval='bootstrap_ci95')} | {half} | {sd} | {c['wins']}/{d['n']} | {p} | "
                f"{c['verdict']} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["cache", "train", "gather"])
    p.add_argument("--task", choices=TASKS, default="classification")
    p.add_argument("--shard", default=None, help="i/n: train the seeds i, i + n, ... of the config")
    p.add_argument(
        "--merge",
        action="store_true",
        help="write benchmarks/results/template_block_cached.{json,md} (--size quick: template_block_cached_quick)",
    )
    p.add_argument("--render", action="store_true", help="rewrite the results .json / .md from the .json, no run")
    p.add_argument("--size", choices=["quick", "medium"], default="medium")
    p.add_argument("--seeds", type=int, default=None, help="the first N seeds (default: the config's)")
    p.add_argument("--runs", default=RUNS)
    p.add_argument("--device", default="cpu")
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="the tasks --merge reads")
    p.add_argument("--out", default=RESULTS)
    args = p.parse_args(argv)
    quiet_progress_bars()
    seeds = None if args.seeds is None else list(range(args.seeds))
    if args.part is not None:
        shard = None
        if args.shard:
            i, n = (int(x) for x in args.shard.split("/"))
            if not 0 <= i < n:
                p.error(f"--shard {args.shard}: expected i/n with 0 <= i < n")
            shard = (i, n)
        out = run_part(args.part, args.task, args.size, seeds, args.device, args.runs, shard)
        print(f"{args.task} {args.part} {args.shard or ''}: {out['seconds']:.0f} s", file=sys.stderr)
    if args.merge or args.render:
        name = results_name(args.size)
        if args.merge:
            out = merge(args.runs, args.tasks)
        else:
            with open(os.path.join(args.out, name + ".json"), encoding="utf-8") as f:
                out = rerender(json.load(f))
        text = markdown(out, args.size)
        atomic_write_json(os.path.join(args.out, name + ".json"), out, indent=1)
        atomic_write_text(os.path.join(args.out, name + ".md"), text)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
