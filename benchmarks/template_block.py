#!/usr/bin/env python
"""Template-matching block (Gorgun, Gurbuz & Alatan, BMVC 2022: Table 1, Fig. 3, Fig. 4): a thin caller of the
runner's ``template_block`` protocol, and the paper-layout tables of its results.

Three experiments, each an experiment folder of the runner (resumable after a kill, ``run --reproduce`` works on it,
``report.html`` inside):

- ``fashion_lambda``: the config ``benchmarks/configs/template_block_table1`` on Fashion-MNIST: Table 1 (baseline,
  + block, auxiliary loss only, a wider baseline with at least the block's parameters) and Fig. 4's λ sweep;
- ``glyphs``: the same Table 1 variants on the glyphs (``--config_dataset [default, with_glyphs]``);
- ``ablation``: ``template_block_soft_maximizers``, Fig. 3 (BN-ReLU vs the two soft maximizers, μ and η estimated
  from the trained BN-ReLU models);
- ``fashion_converged`` (its own table, ``template_block_converged``; run only when named with ``--part``): Table 1's
  four variants from scratch on Fashion-MNIST with a schedule that levels off (the config's ``converged`` files:
  2400 iterations on 6000 training images, seeds 0-9 run seed after seed).

``--size`` picks the configs' variant (``quick``: 200 iterations, a smoke run; ``medium``: the configs' default, the
docs' 500 iterations; ``full``: the GPU size). Everything about the experiments (data, pairing, selection on
validation images, statistics) is the protocol's: see ``benchmarks/protocols/template_block``. This
script renders ``benchmarks/results/template_block.json`` and ``.md`` (the docs' ``results:template_block`` block)
from the three ``results.json`` files: the per-dataset Table 1, the λ sweep, the soft-maximizer table and each paper
claim beside our paired difference and its verdict (:func:`pml_extensions.utils.verdicts.verdict_word`, the
runner's rules with the smallest effect of interest :data:`SMALLEST_EFFECT` = 0.5 accuracy points, Holm-corrected over
the claims of the table: shown / no effect of practical size / contradicted / inconclusive (n seeds)).

    OMP_NUM_THREADS=1 python benchmarks/template_block.py --size medium        # the three experiments, then the tables
    python benchmarks/template_block.py --size medium --part glyphs            # one experiment (3 in parallel)
    python benchmarks/template_block.py --size medium --part fashion_converged # the converged table (~1.5 h, 1 core)
    python benchmarks/template_block.py --size medium --render-only            # tables from finished experiments
    python benchmarks/template_block.py --from-json      # the tables again from benchmarks/results/template_block.json
    python benchmarks/template_block.py --size full --device cuda

The same runs through the command line, from the repository's root: ``python -m pml_extensions run
benchmarks/configs/template_block_table1`` (``--variant quick``, ``--config_dataset [default, with_glyphs]``) and ``run
benchmarks/configs/template_block_soft_maximizers``.
"""

import argparse
import json
import logging
import os
import sys

import numpy as np

from pml_extensions.cli.run import quiet_progress_bars
from pml_extensions.runner.config.loader import CONFIG_FOLDERS, select_variants
from pml_extensions.runner.protocols import load_config, run_protocol
from pml_extensions.utils.atomic_io import atomic_savefig
from pml_extensions.utils.paired_stats import holm
from pml_extensions.utils.verdicts import compare, format_difference, format_mean_std, verdict_word, wins

try:  # the repository's root is on sys.path (PYTHONPATH, pytest)
    from benchmarks import protocols
except ModuleNotFoundError:  # python benchmarks/template_block.py: benchmarks/ is sys.path[0]
    import protocols

protocols.register()  # the configs name their protocol benchmarks.protocols.template_block

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SIZES = ("quick", "medium", "full")
TABLE1 = ("baseline", "block", "aux_only", "wider")
#: part -> (config of benchmarks/configs, extra file merged in every folder that has one, variants (None: all))
PARTS = {
    "fashion_lambda": ("template_block_table1", None, None),
    "glyphs": ("template_block_table1", "with_glyphs", TABLE1),
    "ablation": ("template_block_soft_maximizers", None, None),
    "fashion_converged": ("template_block_table1", "converged", TABLE1),
}
#: the parts of ``template_block.{json,md}`` (a call without ``--part`` runs them); ``fashion_converged`` (the
#: block from scratch with a schedule that levels off, 10 declared seeds) is its own table,
#: ``template_block_converged.{json,md}``, written by the call that runs it (``--part fashion_converged``)
TABLE_PARTS = ("fashion_lambda", "glyphs", "ablation")
KEYS = {"fashion_lambda": "fashion", "glyphs": "glyphs", "ablation": "ablation", "fashion_converged": "converged"}
TITLES = {"fashion": "Fashion-MNIST", "glyphs": "glyphs", "converged": "Fashion-MNIST, trained to convergence"}
LABELS = {
    "baseline": "ResNet baseline",
    "block": "+ template-matching block (λ = 0.5)",
    "aux_only": "+ auxiliary patch loss only",
    "wider": "wider baseline (≥ block's parameters)",
}
#: δ of every claim (test accuracy points): the evidence guide's smallest effect for the block, set from the gains
#: the paper reports for it (its Table 1 values are not in the text we have, methods.md B3); the λ sweep (Fig. 4) and
#: the soft maximizers' "on par" (Fig. 3) are read with the same δ
SMALLEST_EFFECT = 0.5
FASHION_CLASSES = ["T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Boot"]


def part_config(part, size, device=None, seeds=None, perturbed_samples=None):
    """``(config, sources)`` of one experiment at ``size`` (its config with the size variant selected)."""
    name, extra, variants = PARTS[part]
    root = protocols.config_path(name)
    selection = {}
    for folder in CONFIG_FOLDERS:
        files = ["default"] if os.path.isdir(os.path.join(root, folder)) else []
        for file in ([size] if size != "medium" else []) + ([extra] if extra else []):
            if os.path.isfile(os.path.join(root, folder, f"{file}.yaml")):
                files.append(file)
        if files:
            selection[folder] = files
    overrides = {}
    if device:
        overrides["device"] = device
    if seeds:
        overrides["seeds"] = list(seeds)
    config, sources = load_config(root, selection, overrides)
    if variants:
        config = select_variants(config, variants)
    if perturbed_samples is not None:
        for v in config["variants"].values():
            if (v or {}).get("soft_maximizer", {}).get("mixing") == "perturbed":
                v["soft_maximizer"]["num_samples"] = int(perturbed_samples)
    return config, sources


def run_part(part, args, root, command):
    config, sources = part_config(part, args.size, args.device, args.seeds, args.perturbed_samples)
    folder = os.path.join(root, part)
    print(f"{part}: experiment folder {folder}", file=sys.stderr, flush=True)
    run_protocol(
        config,
        folder,
        sources,
        log=lambda *a, **k: print(*a, file=sys.stderr, flush=True),
        on_change="resume" if args.resume_anyway else "stop",
        command=command,
    )


# ------------------------------------------------------------------------------------------------------------------
# paper layout, from the protocol's results.json
def _comparison(results, variant, baseline, metric="test_accuracy"):
    c = compare(results["variants"], variant, baseline, metric)
    return dict(c, std_difference=c["std"], wins=wins(c))  # the names this file's comparisons always had


def _widths(config):
    return list(config["models"]["trunk"]["SmallResNet"]["widths"]), config["models"]["trunk"]["SmallResNet"].get(
        "blocks", 1
    )


def _iterations(r):
    return int(r["num_epochs"]) * int(r["iterations_per_epoch"])


def table1(results):
    """One data set's Table 1 in the layout this file always wrote (plus the experiment's folder)."""
    names = [n for n in TABLE1 if n in results["variants"]]
    curves = {
        n: np.mean([[h["accuracy"] for h in u["history"]] for u in results["units"][n].values()], axis=0).tolist()
        for n in names
    }
    first = next(iter(results["units"]["baseline"].values()))
    return {
        "variants": {n: results["variants"][n] for n in names},
        "comparisons": [_comparison(results, n, "baseline") for n in names if n != "baseline"],
        "params": {n: results["params"][n] for n in names},
        "mean_val_curve": curves,
        "curve_iterations": [h["iteration"] for h in first["history"]],
        "n_train": results["sizes"]["train"],
        "n_val": results["sizes"]["val"],
        "n_test": results["sizes"]["test"],
        "num_classes": results["num_classes"],
        "per_run": {
            n: {s: {"val_curve": [[h["iteration"], h["accuracy"]] for h in u["history"]], "seconds": u["train_seconds"]}
                for s, u in results["units"][n].items()}
            for n in names
        },
    }  # fmt: skip


def lambda_sweep(results):
    names = {"block": "λ=0.5"}
    for n, lam in results["aux_weight"].items():
        if n.startswith("block_lambda"):
            names[n] = f"λ={lam:g}"
    variants = {label: results["variants"][n] for n, label in names.items() if n in results["variants"]}
    comps = [dict(_comparison(results, n, "baseline"), variant=label) for n, label in names.items()]
    return {"variants": variants, "comparisons": comps, "experiment_variants": names}


def ablation(results):
    label = lambda n: "/".join(n.rsplit("_", 1))  # noqa: E731  bn_relu_8 -> bn_relu/8
    comps = []
    for n in results["variants"]:
        mixing, batch = n.rsplit("_", 1)
        if mixing != "bn_relu":
            comps.append(
                dict(_comparison(results, n, f"bn_relu_{batch}"), variant=label(n), baseline=f"bn_relu/{batch}")
            )
    soft = next(iter(results["soft_maximizer"].values()))
    return {
        "variants": {label(n): v for n, v in results["variants"].items()},
        "comparisons": comps,
        "mu": soft["mu"],
        "eta": soft["eta"],
        "mu_per_model": soft["mu_per_model"],
        "eta_per_model": soft["eta_per_model"],
    }


def claims(out):
    """Each paper claim as the runner's comparison (:func:`~pml_extensions.utils.verdicts.compare` with δ =
    :data:`SMALLEST_EFFECT` and the claim's direction) plus ``paper`` (the claim) and ``data``, Holm-corrected over
    all of them (each gets ``p_holm`` and ``verdict``): ``{"comparisons": [...]}``."""
    rows = []

    def add(results, variant, baseline, claim, paper, data, labels=None):
        c = compare(
            results["variants"], variant, baseline, "test_accuracy", smallest_effect=SMALLEST_EFFECT, claim=claim
        )
        if labels:
            c.update(variant=labels[0], baseline=labels[1])
        rows.append(dict(c, paper=paper, data=data))

    for ds in ("fashion", "glyphs", "converged"):
        if ds not in out:
            continue
        r, title = out["experiments"][ds], TITLES[ds]
        for var, base, claim in (
            ("block", "baseline", "block improves the baseline (Table 1)"),
            ("block", "wider", "the gain is not from parameters: block beats a baseline with ≥ its parameters "
             "(Table 1, RN26+block vs RN38)"),
            ("block", "aux_only", "block beats the auxiliary loss alone (Table 1)"),
        ):  # fmt: skip
            add(r, var, base, "greater", claim, title)
    if "lambda_sweep" in out:
        r = out["experiments"]["fashion"]
        for n, label in out["lambda_sweep"]["experiment_variants"].items():
            if n != "block":
                paper = "λ = 0.5 is best; smaller λ degrades (Fig. 4)"
                add(r, "block", n, "greater", paper, "Fashion-MNIST", ("λ 0.5", label.split("=")[1]))
    if "ablation" in out:
        r = out["experiments"]["ablation"]
        for c in out["ablation"]["comparisons"]:
            names = [n.replace("/", "_") for n in (c["variant"], c["baseline"])]
            paper = "soft maximizers perform on par with BN-ReLU (Fig. 3)"
            add(r, *names, "on_par", paper, "Fashion-MNIST", (c["variant"], c["baseline"]))
    for c, p in zip(rows, holm([c["p_value"] for c in rows])):
        c["p_holm"] = p
        c["verdict"] = verdict_word(c, c["claim"])
    return {"comparisons": rows}


def claim_lines(out):
    """Markdown lines: each paper claim (``out["claims"]``) beside our paired difference and its verdict."""
    rows = out["claims"]["comparisons"]
    if not rows:
        return []
    return (
        [
            f"**Paper claims at our scale** (paired difference of test accuracy, points [95 % t interval]; smallest "
            f"effect of interest δ = {SMALLEST_EFFECT:g} points; p: the larger of the t-test's and the seed "
            f"bootstrap's, Holm-adjusted over the {len(rows)} claims. **shown**: the envelope of the t and bootstrap "
            "intervals excludes 0 after Holm and the difference reaches δ on the claimed side; **no effect of "
            'practical size**: the envelope lies within ±δ (what supports an "on par" claim); **contradicted**: '
            "excludes 0 after Holm and reaches δ on the other side; otherwise **inconclusive**):",
            "",
            "| paper claim | data | ours | p (Holm) | verdict |",
            "|---|---|---|---|---|",
        ]
        + [
            f"| {c['paper']} | {c['data']} | {c['variant']} − {c['baseline']}: {format_difference(c)} | "
            f"{c['p_holm']:.2g} | {c['verdict']} |"
            for c in rows
        ]
        + [""]
    )


def markdown(out):
    L = []
    for ds in ("fashion", "glyphs", "converged"):
        if ds not in out:
            continue
        t, r = out[ds], out["experiments"][ds]
        widths, blocks = _widths(out["config"][ds])
        title = TITLES[ds] if ds != "glyphs" else f"Glyphs ({t['num_classes']} characters, every installed font)"
        L += [
            f"**{title}**: {t['n_train']} train / {t['n_val']} validation / {t['n_test']} test images; "
            f"{len(widths)}-stage ResNet widths {widths} × {blocks} BasicBlock(s) per stage, {_iterations(r)} "
            f"iterations × batch {r['batch_size']}, checkpoint chosen on validation; test accuracy %, seeds "
            f"{list(r['seeds'])}.",
            "",
            "| variant | params | test accuracy (mean ± std) | paired diff. vs baseline [95 % CI] | wins | "
            "best-val iteration |",
            "|---|---|---|---|---|---|",
        ]
        comps = {c["variant"]: c for c in t["comparisons"]}
        for v, s in t["variants"].items():
            c = comps.get(v)
            L.append(
                f"| {LABELS.get(v, v)} | {t['params'][v]:,} | {format_mean_std(s, 'test_accuracy')} | "
                f"{format_difference(c) if c else '—'} | {str(c['wins']) + '/' + str(c['n']) if c else '—'} | "
                f"{s['mean']['best_iteration']:.0f} |"
            )
        cur, its = t["mean_val_curve"]["baseline"], t["curve_iterations"]
        q = len(cur) * 3 // 4
        L += [
            "",
            f"Baseline validation accuracy (mean over seeds) at iterations {its[0]}…{its[-1]}: "
            + ", ".join(f"{a:.1f}" for a in cur)
            + f"; gain over the last quarter ({its[q - 1]} → {its[-1]}): {cur[-1] - cur[q - 1]:+.2f} points.",
            "",
        ]
    if "lambda_sweep" in out:
        t = out["lambda_sweep"]
        L += [
            "**λ sweep (paper Fig. 4)**, Fashion-MNIST, block variant with aux_weight λ (0.5 = the row above); "
            "paired differences vs the baseline.",
            "",
            "| λ | test accuracy | paired diff. vs baseline [95 % CI] |",
            "|---|---|---|",
        ]
        comps = {c["variant"]: c for c in t["comparisons"]}
        for v in sorted(t["variants"], key=lambda n: float(n.split("=")[1])):
            L.append(
                f"| {v.split('=')[1]} | {format_mean_std(t['variants'][v], 'test_accuracy')} | "
                f"{format_difference(comps[v])} |"
            )
        L.append("")
    if "ablation" in out:
        t, r = out["ablation"], out["experiments"]["ablation"]
        widths, _ = _widths(out["config"]["ablation"])
        batches = sorted({int(n.split("/")[1]) for n in t["variants"]})
        samples = {
            (v or {}).get("soft_maximizer", {}).get("num_samples")
            for v in out["config"]["ablation"]["variants"].values()
            if (v or {}).get("soft_maximizer", {}).get("mixing") == "perturbed"
        }
        L += [
            f"**Soft maximizers instead of BN-ReLU (paper Fig. 3)**, Fashion-MNIST, {len(widths)}-stage ResNet widths "
            f"{widths}, {_iterations(r)} iterations; μ = {t['mu']:.2f}, η = {t['eta']:.2f} estimated from the trained "
            f"BN-ReLU models; ε = 1; perturbed maximizer with S = {', '.join(map(str, sorted(samples)))} samples "
            "(paper: 600); test accuracy %, paired diff. vs BN-ReLU at the same batch size [95 % CI].",
            "",
            "| mixing | " + " | ".join(f"batch {b}" for b in batches) + " |",
            "|---|" + "---|" * len(batches),
        ]
        comps = {c["variant"]: c for c in t["comparisons"]}
        for mixing in ("bn_relu", "softmax", "perturbed"):
            cells = []
            for b in batches:
                name = f"{mixing}/{b}"
                if name not in t["variants"]:
                    cells.append("—")
                    continue
                cell = format_mean_std(t["variants"][name], "test_accuracy")
                if name in comps:
                    cell += f" ({format_difference(comps[name])})"
                cells.append(cell)
            L.append(f"| {mixing} | " + " | ".join(cells) + " |")
        L.append("")
    L += claim_lines(out)
    for part, command in (out.get("commands") or {}).items():
        declared, seeds = (out.get("declared_seeds") or {}).get(part), out["experiments"][KEYS[part]]["seeds"]
        stopped = (
            f"; declared seeds {declared}, the units run seed after seed and the run was stopped for time after "
            f"seed {seeds[-1]}"
            if declared and list(declared) != list(seeds)
            else ""
        )
        L.append(f"Command ({part}): `{command}`{stopped}.")
    minutes = ", ".join(f"{p} {s / 60:.1f}" for p, s in out["train_seconds"].items())
    L.append(
        f"Size `{out['size']}` on {out['device']}, torch threads {out['torch_threads']}; training time per "
        f"experiment (sum over its units, min, on a machine shared with other work: not a speed figure): {minutes}."
    )
    return "\n".join(L) + "\n"


def assemble(parts, size, commands=None, declared_seeds=None):
    """The layout ``benchmarks/results/template_block.json`` always had (``fashion``, ``glyphs``, ``lambda_sweep``,
    ``ablation`` ...) and its ``markdown``, from ``{part: (results, config, torch_threads, folder)}`` of the finished
    experiments."""
    out = {"size": size, "experiments": {}, "experiment_folders": {}, "config": {}, "train_seconds": {}}
    out["commands"], out["declared_seeds"] = dict(commands or {}), dict(declared_seeds or {})
    for part, (results, config, threads, folder) in parts.items():
        key = KEYS[part]
        out["config"][key], out["experiments"][key], out["experiment_folders"][key] = config, results, folder
        out["device"], out["torch_threads"] = results["device"], threads
        out["train_seconds"][part] = results["train_seconds_sum"]
        if key == "ablation":
            out["ablation"] = ablation(results)
        else:
            out[key] = table1(results)
            if key == "fashion" and any(n.startswith("block_lambda") for n in results["variants"]):
                out["lambda_sweep"] = lambda_sweep(results)
    out["seconds"] = sum(out["train_seconds"].values())
    out["claims"] = claims(out)
    out["markdown"] = markdown(out)
    return out


def rerender(out):
    """A stored ``template_block.json`` (it keeps every experiment's results) with its claims and Markdown computed
    again, as :func:`assemble` writes them."""
    out = dict(out)
    out["claims"] = claims(out)
    out["markdown"] = markdown(out)
    return out


def save(out: dict, out_dir: str, name: str = "template_block") -> dict:
    """Write ``NAME.json`` / ``.md`` into ``out_dir``, print the table; return ``out``."""
    protocols.write_table(out_dir, name, out, out["markdown"])
    return out


def render(args, root, out_dir, table_parts=TABLE_PARTS, name="template_block"):
    """``NAME.json`` / ``.md`` from the finished experiments of ``table_parts`` under ``root`` (those that exist)."""
    import yaml

    parts = {}
    for part in table_parts:
        folder = os.path.join(root, part)
        if not os.path.isfile(os.path.join(folder, "results.json")):
            continue
        with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
            results = json.load(f)
        with open(os.path.join(folder, "environment.json"), encoding="utf-8") as f:
            threads = json.load(f)["torch_threads"]
        with open(os.path.join(folder, "config.yaml"), encoding="utf-8") as f:
            config = yaml.safe_load(f)
        parts[part] = (results, config, threads, folder)
    if not parts:
        raise SystemExit(f"template_block: no finished experiment under {root} (run without --render-only first)")
    commands, declared = {}, {}
    for part, (_, _, _, folder) in parts.items():
        if os.path.isfile(os.path.join(folder, "command.txt")):
            with open(os.path.join(folder, "command.txt"), encoding="utf-8") as f:
                commands[part] = f.read().strip()
        declared[part] = part_config(part, args.size)[0]["seeds"]  # the config's seeds, before any --seeds
    out = assemble(parts, args.size, commands, declared)
    return save(out, out_dir, name)


def visual_words(root, out_dir, k=32, max_images=1000):
    """k-means (faiss) of the block's soft-maxed per-pixel class scores on the Fashion test images (the block of the
    first seed); one patch per each of the 16 largest clusters."""
    import faiss
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from pml_extensions.trunks import template_matching_blocks

    models, views = protocols.template_block.load_models(os.path.join(root, "fashion_lambda"), "block")
    trunk = models["trunk"].eval()
    block = template_matching_blocks(trunk)[0]
    test = views["test"]
    x = torch.stack([test[i][0] for i in range(min(max_images, len(test)))])
    device = next(trunk.parameters()).device
    with torch.no_grad():
        trunk(x.to(device))
    probs = torch.softmax(block.last_class_scores, dim=1).cpu()  # [N, c, h, w]
    n, c, h, w = probs.shape
    vecs = probs.permute(0, 2, 3, 1).reshape(-1, c).numpy().astype(np.float32)
    km = faiss.Kmeans(c, k, niter=25, seed=0, verbose=False)
    km.train(vecs)
    _, assign = km.index.search(vecs, 1)
    sizes = np.bincount(assign[:, 0], minlength=k)
    order = np.argsort(-sizes)[:16]
    index = faiss.IndexFlatL2(c)
    index.add(vecs)
    _, nearest = index.search(km.centroids[order], 1)
    stride = x.shape[-1] / w
    kh, kw = block.window_for(h, w)
    fig, axes = plt.subplots(4, 4, figsize=(8, 9))
    for ax, cluster, v in zip(axes.flat, order, nearest[:, 0]):
        img, pix = divmod(int(v), h * w)
        i, j = divmod(pix, w)
        r0 = int(max(0, (i - (kh - 1) // 2 - 1) * stride))
        r1 = int(min(x.shape[-2], (i + kh // 2 + 2) * stride))
        c0 = int(max(0, (j - (kw - 1) // 2 - 1) * stride))
        c1 = int(min(x.shape[-1], (j + kw // 2 + 2) * stride))
        ax.imshow(x[img, 0].numpy(), cmap="gray")
        ax.add_patch(plt.Rectangle((c0 - 0.5, r0 - 0.5), c1 - c0, r1 - r0, fill=False, ec="red", lw=1.5))
        top = np.argsort(-vecs[v])[:2]
        ax.set_title(
            "\n".join(f"{FASHION_CLASSES[t]} {vecs[v][t]:.2f}" for t in top) + f"\n(n={sizes[cluster]})", fontsize=7
        )
        ax.axis("off")
    fig.suptitle(
        f"Visual words: k-means (k={k}) of block class scores, nearest patch to the 16 largest clusters", fontsize=8
    )
    fig.tight_layout()
    path = os.path.join(out_dir, "template_block_visual_words.png")
    try:
        atomic_savefig(fig, path, dpi=110)
    finally:
        plt.close(fig)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=SIZES, default="quick")
    p.add_argument("--device", default=None, help="override the configs' device (cpu, cuda)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="override the configs' seeds")
    p.add_argument("--perturbed-samples", type=int, default=None, help="S of the perturbed maximizer")
    p.add_argument("--part", choices=sorted(PARTS), nargs="+", default=None, help="run only these experiments")
    p.add_argument(
        "--experiment-folder", default=None, help="root of the three folders (experiments/template_block_SIZE)"
    )
    p.add_argument("--out", default=RESULTS, help="where template_block.json / .md go")
    p.add_argument(
        "--render-only", action="store_true", help="render the tables from finished experiments, run nothing"
    )
    p.add_argument(
        "--from-json", action="store_true", help="render template_block.json / .md again from the json in --out"
    )
    p.add_argument("--resume-anyway", action="store_true", help="continue folders whose saved config differs")
    p.add_argument("--visual-words", action="store_true", help="also save the k-means visual-words PNG")
    args = p.parse_args(argv)
    if args.perturbed_samples is not None and args.perturbed_samples < 1:
        p.error(f"--perturbed-samples must be >= 1, got {args.perturbed_samples}")
    if args.from_json:
        with open(os.path.join(args.out, "template_block.json"), encoding="utf-8") as f:
            return save(rerender(json.load(f)), args.out)
    quiet_progress_bars()  # PML's trainers draw tqdm bars with no switch
    logging.getLogger("PML").setLevel(logging.ERROR)
    root = args.experiment_folder or os.path.join("experiments", f"template_block_{args.size}")
    command = [os.path.basename(sys.executable), "benchmarks/template_block.py"] + list(
        sys.argv[1:] if argv is None else argv
    )
    if not args.render_only:
        for part in args.part or TABLE_PARTS:
            run_part(part, args, root, command)
    if args.part and "fashion_converged" in args.part:
        return render(args, root, args.out, ("fashion_converged",), "template_block_converged")
    if args.part:  # a part of a parallel run: the tables come from the call that finds all three finished
        return None
    out = render(args, root, args.out)
    if args.visual_words:
        out["visual_words_png"] = visual_words(root, args.out)
    return out


if __name__ == "__main__":
    main()
