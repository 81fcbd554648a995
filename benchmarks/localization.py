"""Weakly supervised localisation with explanation maps (Zhu, Yang & Chen, TIP 2021, Sec. VI-A/B, Tables I-IV): a thin
caller of the ``localization`` protocol (a runner plugin) with the config ``benchmarks/configs/localization``, and the
paper-layout tables of its ``results.json``.

Everything about the experiment (the composites drawn per seed, MobileNetV2 + GMP + Linear fine-tuned with the
Multi-Similarity and, paired, the Triplet loss, every method scored under both sign conventions, the rectified
Grad-CAM identity, the paired statistics) is the protocol's: ``benchmarks/protocols/localization``. The
experiment folder resumes after a kill, ``python -m pml_extensions run --reproduce FOLDER`` reruns it, ``report.html``
is inside. This script renders ``benchmarks/results/localization.json`` and ``.md`` (the docs'
``results:localization`` block): Table I (test accuracy per threshold, descriptive), Table II (each method at the
threshold chosen on held-out composites, beside the centre box whose side fraction is chosen the same way; paired
differences vs the centre box and vs Decomposition under the same convention), Tables III-IV (MS vs Triplet, held-out
thresholds) and each paper claim, and each paper method against the centre box, beside our paired difference and its
verdict (:func:`pml_extensions.utils.verdicts.verdict_word`: the runner's rules with
the smallest effect of interest :data:`SMALLEST_EFFECT` = 5 points, Holm-corrected over the claims of the table; shown /
no effect of practical size / contradicted / inconclusive (n seeds)).

    python benchmarks/localization.py --size quick       # 200 test (+100 held-out) images at 224 px, 30 steps, 3 seeds
    python benchmarks/localization.py --size quick --only-seeds 0    # one seed's units (reproduce.py: seeds at once)
    python benchmarks/localization.py --size medium      # 300 test (+150 held-out) images at 256 px, 60 steps
    python benchmarks/localization.py --size full --device cuda
    python benchmarks/localization.py --from-json        # the tables again from benchmarks/results/localization.json

The same run through the command line, from the repository's root: ``python -m pml_extensions run
benchmarks/configs/localization`` (``--variant medium``; any config key, e.g. ``--iterations_per_epoch 100``).
"""

import argparse
import json
import logging
import os
import sys

import numpy as np

from pml_extensions.cli.run import quiet_progress_bars
from pml_extensions.runner.config.loader import CONFIG_FOLDERS
from pml_extensions.runner.protocols import load_config, run_protocol
from pml_extensions.utils.paired_stats import holm
from pml_extensions.utils.verdicts import compare, format_difference, format_mean_std, verdict_word

try:  # the repository's root is on sys.path (PYTHONPATH, pytest)
    from benchmarks import protocols
except ModuleNotFoundError:  # python benchmarks/localization.py: benchmarks/ is sys.path[0]
    import protocols

protocols.register()  # the config names its protocol benchmarks.protocols.localization
_maps = protocols.localization.maps
CONVENTIONS, DEMO, METHODS = _maps.CONVENTIONS, _maps.DEMO, _maps.METHODS

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SIZES = ("quick", "medium", "full")
LOSSES = {"ms": "Multi-Similarity", "triplet": "Triplet"}
#: δ of every claim (localisation accuracy or P@1, points): the paper gives no values (methods.md D3), only orderings,
#: one of them "by a large margin"; 5 points (10 of the docs' 200 test composites per seed) is the smallest difference
#: read as a difference between maps rather than a few images' luck
SMALLEST_EFFECT = 5.0
#: the per-seed metric of Tables II-IV and the claims: the test accuracy at the threshold (the centre box: the side
#: fraction) chosen on the held-out composites; ``best_accuracy`` (chosen on the test images) stays in the json
METRIC = "held_out_accuracy"
CENTRE = "centre box"
#: the paper's maps, each in the paper's convention, as claimed against the centre box (ours, not the paper's)
PAPER_MAPS = ("Decomposition [signed]", "Decomposition+Bias [signed]", "Grad-CAM [ReLU]", "Grad-CAM (no norm) [ReLU]")
# The paper's statements (values not in the text we have): Table II ordering and Tables III-IV trends.
PAPER = {
    "table2": (
        'Decomposition ≥ Decomposition+Bias ("the bias term does not help"); the decomposition beats '
        'both Grad-CAMs; Grad-CAM (no norm) ≫ Grad-CAM ("by a large margin"). Paper maps: decomposition '
        "signed, Grad-CAM with its ReLU."
    ),
    "table3": (
        "MS and Triplet: almost the same training accuracy, a big gap on the validation (unseen) classes "
        "in favour of MS."
    ),
    "table4": "Localisation accuracy drops for Triplet, for Decomposition and Decomposition+Bias alike.",
}


def size_config(args):
    """``(config, sources)``: the config ``benchmarks/configs/localization`` at ``args.size`` with the command line's
    changes."""
    root = protocols.config_path("localization")
    selection = {}
    for folder in CONFIG_FOLDERS:
        if os.path.isdir(os.path.join(root, folder)):
            files = ["default"]
            if args.size != "quick" and os.path.isfile(os.path.join(root, folder, f"{args.size}.yaml")):
                files.append(args.size)
            selection[folder] = files
    overrides = {}
    if args.device:
        overrides["device"] = args.device
    if args.seeds:
        overrides["seeds"] = list(args.seeds)
    config, sources = load_config(root, selection, overrides)
    if args.pool == "gap":
        config["models"]["trunk"][1] = {"AdaptiveAvgPool2d": [1]}
    if args.source:
        for key in ("dataset", "test_dataset"):
            next(iter(config[key].values()))["source"] = args.source
    return config, sources


# ------------------------------------------------------------------------------------------------------------------
# paper layout, from the protocol's results.json
def ordering(variants, names):
    return " > ".join(
        f"{n} ({variants[n]['mean'][METRIC]:.1f})" for n in sorted(names, key=lambda n: -variants[n]["mean"][METRIC])
    )


def analysis(results):
    """The layout this file's ``analysis`` always had: per variant the methods (``results["methods"]``), and
    ``ms_vs_triplet`` (the protocol's variants and comparisons)."""
    out = dict(results["methods"])
    if {"ms", "triplet"} <= set(results["variants"]):
        out["ms_vs_triplet"] = {"variants": results["variants"], "comparisons": results["comparisons"]}
    return out


def claims(res, main):
    """Each paper claim as the runner's comparison (:func:`~pml_extensions.utils.verdicts.compare` with δ =
    :data:`SMALLEST_EFFECT` and the claim's direction, metric :data:`METRIC`) plus ``paper`` (the claim), then each
    paper map (:data:`PAPER_MAPS`) against the centre box ("greater"), Holm-corrected over all of them (each gets
    ``p_holm`` and ``verdict``): ``{"comparisons": [...]}``."""
    v = res[main]["variants"]
    rows = []

    def add(variants, a, b, metric, paper, kind):
        c = compare(variants, a, b, metric, smallest_effect=SMALLEST_EFFECT, claim=kind)
        rows.append(dict(c, paper=paper))

    for a, b, claim, kind in (
        ("Decomposition [signed]", "Grad-CAM [ReLU]", "Decomposition beats Grad-CAM (Table II)", "greater"),
        (
            "Decomposition [signed]",
            "Grad-CAM (no norm) [ReLU]",
            "Decomposition beats Grad-CAM (no norm) (Table II)",
            "greater",
        ),
        ("Decomposition [ReLU]", "Grad-CAM [ReLU]", "same, both maps with ReLU (method without the sign)", "greater"),
        ("Decomposition [ReLU]", "Grad-CAM (no norm) [ReLU]", "same, both maps with ReLU", "greater"),
        (
            "Grad-CAM (no norm) [ReLU]",
            "Grad-CAM [ReLU]",
            "no norm improves Grad-CAM by a large margin (Table II)",
            "greater",
        ),
        ("Decomposition+Bias [signed]", "Decomposition [signed]", "the bias term does not help (Table II)", "on_par"),
    ):
        add(v, a, b, METRIC, claim, kind)
    for a in PAPER_MAPS:
        add(v, a, CENTRE, METRIC, "(ours) the map beats a centre box that ignores the image", "greater")
    if "ms_vs_triplet" in res:
        t = res["ms_vs_triplet"]["variants"]
        for metric, claim, kind in (
            ("train_p_at_1", "MS and Triplet: almost the same training accuracy (Table III)", "on_par"),
            ("test_p_at_1", "MS generalises better to unseen classes (Table III)", "greater"),
            ("Decomposition [signed]", "MS localises better than Triplet (Table IV)", "greater"),
            ("Decomposition+Bias [signed]", "same with Decomposition+Bias (Table IV)", "greater"),
        ):
            add(t, "ms", "triplet", metric, claim, kind)
    for c, p in zip(rows, holm([c["p_value"] for c in rows])):
        c["p_holm"] = p
        c["verdict"] = verdict_word(c, c["claim"])
    return {"comparisons": rows}


def claim_lines(claimed):
    """Markdown lines: each paper claim (:func:`claims`) beside our paired difference and its verdict."""
    rows = []
    for c in claimed["comparisons"]:
        what = f"{c['variant']} − {c['baseline']}" if c["variant"] != "ms" else f"MS − Triplet, {c['metric']}"
        rows.append(f"| {c['paper']} | {what}: {format_difference(c, 1)} | {c['p_holm']:.2g} | {c['verdict']} |")
    return (
        [
            "**Paper claims at our scale** (paired differences, points [95 % t interval]; localisation accuracy at the "
            "threshold, and the centre box's side, chosen on the held-out composites; smallest effect of interest "
            f"δ = {SMALLEST_EFFECT:g} points; p: the larger of the t-test's and the seed bootstrap's, Holm-adjusted "
            f"over the {len(rows)} claims. **shown**: the envelope of the t and bootstrap intervals excludes 0 after "
            "Holm and the difference reaches δ on the claimed side; **no effect of practical size**: the envelope lies "
            "within ±δ (what supports a claim of no difference); **contradicted**: excludes 0 after Holm and reaches δ "
            "on the other side; otherwise **inconclusive**):",
            "",
            "| paper claim | ours | p (Holm) | verdict |",
            "|---|---|---|---|",
        ]
        + rows
        + [""]
    )


def markdown(out):
    res, runs, setup, seeds = out["analysis"], out["runs"], out["args"], out["seeds"]
    losses = setup["losses"]
    fs = runs[str(seeds[0])]["feature_size"]
    main = "ms" if "ms" in losses else losses[0]
    command = f" (`{out['command']}`)" if out.get("command") else ""
    L = [
        f"Setup: {setup['source']} composites, {setup['n_test']} test images of unseen classes at {setup['size']} px "
        f"-> {fs[0]}×{fs[1]} maps, and {setup['n_validation']} held-out composites per seed drawn independently from "
        "the same unseen-class pool (their own seed: other drawings, photo crops and placements; a drawing may recur) "
        "on which each method's threshold, and the centre box's side fraction, is chosen; ImageNet MobileNetV2 + "
        f"{setup['pool'].upper()} + Linear({setup['dim']}), {setup['steps']} fine-tuning steps on {setup['n_train']} "
        f"training composites; seeds {list(seeds)}{command}; accuracy = % of queries whose box has IoU > 0.5.",
        "",
        f"**Table I layout** — test accuracy (%) per threshold, {LOSSES.get(main, main)} model, mean over seeds "
        "(descriptive: the best column of a row is picked on the test images themselves):",
        "",
    ]
    thr = runs[str(seeds[0])]["thresholds"]
    shown = [i for i, t in enumerate(thr) if round(t * 100) % 10 == 0]
    L += [
        "| method | convention | " + " | ".join(f"{thr[i]:.1f}" for i in shown) + " |",
        "|---|---|" + "---|" * len(shown),
    ]
    for k in runs[str(seeds[0])]["losses"][main]["scores"]:
        acc = np.mean([runs[str(s)]["losses"][main]["scores"][k]["accuracy"] for s in seeds], axis=0)
        name, conv = k[:-1].split(" [")
        L.append(f"| {name} | {conv} | " + " | ".join(f"{acc[i]:.1f}" for i in shown) + " |")
    v = res[main]["variants"]
    comps = {(c["variant"], c["baseline"]): c for c in res[main]["comparisons"] if c["metric"] == METRIC}
    L += [
        "",
        f"**Table II layout** — test accuracy (%) at the threshold chosen on the held-out composites, "
        f"{LOSSES.get(main, main)} model, mean ± std over seeds, beside the centre box (a centred box whose side "
        "fraction is chosen on the same held-out composites: it ignores the image); paired differences [95 % CI] vs "
        "the centre box, vs Decomposition under the same convention, and ReLU minus signed per method:",
        "",
        "| method | signed | ReLU | centre box | signed − centre box | ReLU − centre box | vs Decomposition (signed) "
        "| vs Decomposition (ReLU) | ReLU − signed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    centre = format_mean_std(v[CENTRE], METRIC, 1)
    for m in METHODS + (DEMO,):
        s_key, r_key = f"{m} [signed]", f"{m} [ReLU]"
        cells = [
            format_mean_std(v[s_key], METRIC, 1),
            format_mean_std(v[r_key], METRIC, 1) if r_key in v else "(= signed)",
            centre,
        ]
        for key, base in ((s_key, CENTRE), (r_key, CENTRE), (s_key, "Decomposition [signed]")):
            c = comps.get((key, base))
            cells.append(format_difference(c, 1) if c else "—")
        for key, conv in ((r_key, "ReLU"),):
            c = comps.get((key, f"Decomposition [{conv}]"))
            cells.append(format_difference(c, 1) if c else "—")
        c = comps.get((r_key, s_key))
        cells.append(format_difference(c, 1) if c else "—")
        L.append(f"| {m} | " + " | ".join(cells) + " |")
    fractions = [runs[str(s)]["centre_box"]["held_out_fraction"] for s in seeds]
    L.append(
        f"| centre box (side {min(fractions):.2f}–{max(fractions):.2f} of the image, chosen on the held-out "
        f"composites) | {centre} | | | | | | | |"
    )
    optimism = [(n, v[n]["mean"]["best_accuracy"] - v[n]["mean"][METRIC]) for n in [*PAPER_MAPS, CENTRE] if n in v]
    L += [
        "",
        "Picked on the test images themselves (Table I's best column, the optimistic figure the table used to give), "
        "the accuracy would be higher by "
        + ", ".join(f"{d:+.1f} ({n})" for n, d in optimism)
        + " points, mean over seeds.",
    ]
    ident = [runs[str(s)]["losses"][lo]["identity_rgradcam_vs_relu_decomposition_bias"] for s in seeds for lo in losses]

    def yes(key):
        return "yes" if all(i[key] for i in ident) else "no"

    same_first = "max_rel_diff_relu_first" in ident[0]
    L += [
        "",
        "Rectified Grad-CAM (RGrad-CAM with its ReLU, by autograd) vs ReLU(Decomposition+Bias) on the first "
        f"{ident[0]['n_pairs']} pairs of every run, the decomposition with GMP ties shared (the default, the "
        f"rows above): max |difference| / max |map| = {max(i['max_rel_diff_relu'] for i in ident):.1e}, "
        f"localisation hits identical at every threshold: {yes('same_hits_every_threshold')}"
        + (
            f'; with ties broken as autograd breaks them (`gmp_ties="first"`): '
            f"{max(i['max_rel_diff_relu_first'] for i in ident):.1e}, hits identical: "
            f"{yes('same_hits_every_threshold_first')}"
            if same_first
            else ""
        )
        + ". MobileNetV2's last features are ReLU6 outputs: a channel saturated at 6 at several positions ties "
        "in GMP, where autograd credits the first position and the default fold shares the maximum equally; "
        + (
            "so the Decomposition+Bias [ReLU] row is rectified Grad-CAM up to that tie rule."
            if same_first and yes("same_hits_every_threshold_first") == "yes"
            else "the identity is not exact here."
        ),
        "",
        f"Ours, signed: {ordering(v, [f'{m} [signed]' for m in METHODS])}.",
        f"Ours, ReLU: {ordering(v, [f'{m} [ReLU]' for m in METHODS])}.",
        "Ours, the paper's conventions (decomposition signed, Grad-CAM ReLU): "
        + ordering(
            v, ["Decomposition [signed]", "Decomposition+Bias [signed]", "Grad-CAM [ReLU]", "Grad-CAM (no norm) [ReLU]"]
        )
        + ".",
        f"Paper (Table II, CUB): {PAPER['table2']}",
    ]
    if "ms_vs_triplet" in res:
        t = res["ms_vs_triplet"]
        tv = t["variants"]
        tc = {c["metric"]: c for c in t["comparisons"]}
        L += [
            "",
            "**Tables III–IV layout** — Multi-Similarity vs Triplet (same initial weights and batches per seed); "
            "P@1 (%) and localisation accuracy (%) at the threshold chosen on the held-out composites, mean ± std; "
            "paired difference Triplet − MS [95 % CI]:",
            "",
            "| metric | Multi-Similarity | Triplet | Triplet − MS |",
            "|---|---|---|---|",
        ]
        rows = ["train_p_at_1", "test_p_at_1"] + [
            f"{m} [{c}]" for m in ("Decomposition", "Decomposition+Bias", "Grad-CAM (no norm)") for c in CONVENTIONS
        ]
        labels = {"train_p_at_1": "P@1 training classes (Table III)", "test_p_at_1": "P@1 unseen classes (Table III)"}
        for r in rows:
            L.append(
                f"| {labels.get(r, r)} | {format_mean_std(tv['ms'], r, 1)} | {format_mean_std(tv['triplet'], r, 1)} | "
                f"{format_difference(tc[r], 1)} |"
            )
        L += ["", f"Paper (Table III): {PAPER['table3']} Paper (Table IV): {PAPER['table4']}"]
    L += [""] + claim_lines(out["claims"])
    L += [
        f"Size `{out['size']}` on {out['device']}, torch threads {out['torch_threads']}; fine-tuning and "
        f"measurement {out['seconds'] / 60:.1f} min in all (sum over the units, on a machine shared with other work: "
        "not a speed figure)."
    ]
    return "\n".join(L) + "\n"


def save(out: dict, out_dir: str) -> dict:
    """Write ``localization.json`` / ``.md`` into ``out_dir``, print the table; return ``out``."""
    protocols.write_table(out_dir, "localization", out, out["markdown"])
    return out


def render(args, folder, out_dir):
    """``localization.json`` / ``.md`` from the finished experiment in ``folder``."""
    import yaml

    with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    with open(os.path.join(folder, "config.yaml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    with open(os.path.join(folder, "environment.json"), encoding="utf-8") as f:
        threads = json.load(f)["torch_threads"]
    command = None
    if os.path.isfile(os.path.join(folder, "command.txt")):
        with open(os.path.join(folder, "command.txt"), encoding="utf-8") as f:
            command = f.read().strip()
    out = assemble(results, config, threads, args.size, folder, command)
    return save(out, out_dir)


def assemble(results, config, torch_threads, size, folder=None, command=None):
    """The layout ``benchmarks/results/localization.json`` always had (``args``, ``runs``, ``analysis`` ...) and its
    ``markdown``, from the protocol's results and the config that made them (``command``: the command line that
    started the experiment, for the caption)."""
    seeds = results["seeds"]
    first = results["runs"][str(seeds[0])]
    train_spec, test_spec = (next(iter(config[k].values())) for k in ("dataset", "test_dataset"))
    trunk = config["models"]["trunk"]
    setup = {
        "source": test_spec.get("source", "clipart"),
        "n_train": first["n_train"],
        "n_test": first["n_test"],
        "n_validation": first["n_validation"],
        "size": first["image_size"][0],
        "train_size": train_spec.get("image_size"),
        "steps": results["num_epochs"] * results["iterations_per_epoch"],
        "pool": "gap" if any("AdaptiveAvgPool2d" in s for s in trunk if isinstance(s, dict)) else "gmp",
        "dim": next(iter(config["models"]["embedder"].values())).get("out_features"),
        "losses": list(results["variants"]),
        "batch_size": results["batch_size"],
        "frozen_prefix": config.get("frozen_prefix"),
    }
    seconds = sum(u["seconds"] for r in results["runs"].values() for u in r["losses"].values())
    out = {
        "size": size,
        "device": results["device"],
        "torch_threads": torch_threads,
        "args": setup,
        "seeds": seeds,
        "paper": PAPER,
        "runs": results["runs"],
        "analysis": analysis(results),
        "seconds": seconds,
        "experiment_folder": folder,
        "command": command,
        "experiment": results,
    }
    out["claims"] = claims(out["analysis"], "ms" if "ms" in setup["losses"] else setup["losses"][0])
    out["markdown"] = markdown(out)
    return out


def rerender(out):
    """A stored ``localization.json`` (it keeps the analysis and every run) with its claims and Markdown computed
    again, as :func:`assemble` writes them."""
    out = dict(out)
    losses = out["args"]["losses"]
    out["claims"] = claims(out["analysis"], "ms" if "ms" in losses else losses[0])
    out["markdown"] = markdown(out)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=SIZES, default="quick")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="override the config's seeds")
    p.add_argument(
        "--only-seeds",
        type=int,
        nargs="+",
        default=None,
        help="run only these seeds' units in the experiment folder and stop (parts run at once; the call without "
        "this option gathers them and writes the tables)",
    )
    p.add_argument("--pool", choices=("gmp", "gap"), default="gmp")
    p.add_argument("--source", choices=("clipart", "glyph"), default=None, help="what is pasted (default clipart)")
    p.add_argument("--device", default=None, help="override the config's device (cpu, cuda)")
    p.add_argument("--experiment-folder", default=None, help="default experiments/localization_SIZE")
    p.add_argument("--out", default=RESULTS, help="where localization.json / .md go")
    p.add_argument("--render-only", action="store_true", help="render the tables from the finished experiment")
    p.add_argument("--from-json", action="store_true", help="render localization.json / .md again from the json")
    p.add_argument("--resume-anyway", action="store_true", help="continue a folder whose saved config differs")
    args = p.parse_args(argv)
    if args.from_json:
        with open(os.path.join(args.out, "localization.json"), encoding="utf-8") as f:
            return save(rerender(json.load(f)), args.out)
    quiet_progress_bars()  # PML's trainers draw tqdm bars with no switch
    logging.getLogger("PML").setLevel(logging.ERROR)
    folder = args.experiment_folder or os.path.join("experiments", f"localization_{args.size}")
    if args.render_only:
        return render(args, folder, args.out)
    config, sources = size_config(args)
    command = [os.path.basename(sys.executable), "benchmarks/localization.py"] + list(
        sys.argv[1:] if argv is None else argv
    )

    def log(*a, **k):
        print(*a, file=sys.stderr, flush=True)

    on_change = "resume" if args.resume_anyway else "stop"
    if args.only_seeds:
        from pml_extensions.runner.experiment.folder import prepare_folder

        prepare_folder(folder, config, on_change=on_change, command=command, log=log)
        protocols.localization.Localization(config, folder, sources, log).run_units(seeds=args.only_seeds)
        return None
    run_protocol(config, folder, sources, log=log, on_change=on_change, command=command)
    return render(args, folder, args.out)


if __name__ == "__main__":
    main()
