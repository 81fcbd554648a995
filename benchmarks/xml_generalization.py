"""The XML paper's generalisation probe (Sec. 3, "Prototypes with XML"): MAP on the seen class half (MAP_c) vs the
unseen half (MAP_x) over many random class splits, XML against GAP.

What exactly is measured. The models are the main job's selected models (``python -m pml_extensions job``; one
per variant and seed, trained once). On the job's unseen TEST classes, each model gives every image an embedding
``y`` and a prototype histogram ``z`` (its own HistogramPooling; a GAP trunk gets a post-hoc layer with k-means
prototypes of its own training-set local features, same m, so both are binned the same way). Then, for each of
``--splits`` random class partitions (half / half, ``numpy.random.default_rng(split)``; the same partitions for
every model):

1. fit the ridge prototypes ``V_c`` on the seen half ``c``: GAP vectors ``y_c`` on histograms ``z_c``
   (``utils.ridge_prototypes(z_c, y_c, 0.05)``, as ``XMLWrapper(target="pooled")`` does inside a batch);
2. ``MAP_c`` = MAP@R (PML ``AccuracyCalculator``) of the seen half's predicted embeddings ``embedder(z_c V_c)``
   among themselves;
3. ``MAP_x`` = MAP@R of the unseen half's predicted embeddings ``embedder(z_x V_c)`` among themselves — prototypes
   fitted on other classes, the paper's "unseen class generalisation" of features and prototypes.

Reported per variant: mean over seeds of the split-averaged MAP_c and MAP_x, and the paired (by seed) difference of
XML against GAP with a 95 % t interval, as the paper's claims: MAP_x higher with XML (``"greater"``), MAP_c similar
(``"on_par"``), each with the smallest effect of interest :data:`SMALLEST_EFFECT` = 1 MAP@R point and worded by the
runner's rules (:func:`pml_extensions.runner.outputs.results.summarize`: shown / no effect of practical size /
contradicted / inconclusive (n seeds), Holm over the claims). The main job's models are a smoke test's (3 seeds).
Cheap: no training here, one forward pass per model.

    python benchmarks/xml_generalization.py --run-folder runs/xml_glyphs [--splits 200] [--device cpu]

Writes ``benchmarks/results/xml_generalization.json`` and ``.md``.
"""

import argparse
import os
import time

import numpy as np
import torch
import yaml

from pml_extensions.runner.outputs.results import summarize, write_results
from pml_extensions.runner.protocols.paired.protocol import Paired
from pml_extensions.runner.protocols.paired.unit import load_models, load_split
from pml_extensions.utils.ridge import ridge_prototypes
from pml_extensions.utils.verdicts import verdict

try:  # the repository's root is on sys.path (PYTHONPATH, pytest)
    from benchmarks.protocols.xml_paper.plots import histogram_view
except ModuleNotFoundError:  # python benchmarks/xml_generalization.py: benchmarks/ is sys.path[0]
    from protocols.xml_paper.plots import histogram_view

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: δ of both claims (MAP@R as a fraction: 1 point), the evidence guide's smallest effect for XML; "similar" MAP_c is
#: an effect within ±δ
SMALLEST_EFFECT = 0.01
#: the paper's claim per metric, about XML − baseline
CLAIMS = {"map_unseen": "greater", "map_seen": "on_par"}


@torch.no_grad()
def embeddings_and_histograms(cfg, models, device, seed, num_prototypes=64, batch_size=128):
    """``(pooled [N, C], z [N, m], labels [N])`` of the test split, in eval mode, float64 on the CPU."""
    trunk = models["trunk"].eval()
    models["embedder"].eval()
    pool, body = histogram_view(cfg, trunk, device, seed, num_prototypes, batch_size=batch_size)
    ys, zs, ls = [], [], []
    for images, labels in torch.utils.data.DataLoader(
        load_split(cfg, "test", train_transform=False), batch_size=batch_size
    ):
        images = images.to(device)
        ys.append(trunk(images).double().cpu())  # the GAP vectors: the ridge target (XMLWrapper target="pooled")
        zs.append(pool.histograms(body(images)).double().cpu())
        ls.append(labels)
    return torch.cat(ys), torch.cat(zs), torch.cat(ls)


@torch.no_grad()
def probe(y, z, labels, splits, head, ridge=0.05):
    """Mean MAP_c, MAP_x (and per split) over ``splits`` random half/half class partitions. ``y``: GAP vectors;
    ``head``: the embedder (GAP vector -> embedding) applied to the predictions."""
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    calc = AccuracyCalculator(include=("mean_average_precision_at_r",), k="max_bin_count", device=torch.device("cpu"))
    classes = np.unique(labels.numpy())
    map_c, map_x = [], []
    for s in range(splits):
        perm = np.random.default_rng(s).permutation(classes)
        seen = torch.from_numpy(np.isin(labels.numpy(), perm[: len(classes) // 2]))
        v = ridge_prototypes(z[seen], y[seen], ridge)
        for mask, out in ((seen, map_c), (~seen, map_x)):
            pred = head((z[mask] @ v).float())
            acc = calc.get_accuracy(pred, labels[mask], ref_includes_query=True)
            out.append(float(acc["mean_average_precision_at_r"]))
    return float(np.mean(map_c)), float(np.mean(map_x)), map_c, map_x


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-folder", default=os.path.join("runs", "xml_glyphs"), help="a finished main-job folder")
    p.add_argument("--splits", type=int, default=200, help="random class partitions (>= 100)")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--pairs",
        nargs="+",
        default=[
            "contrastive_xml:contrastive_gap",
            "contrastive_xml:contrastive_xml_lambda0",
            "proxy_anchor_xml:proxy_anchor_gap",
        ],
        help="VARIANT:BASELINE pairs",
    )
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--render-only", action="store_true", help="re-render the .md from the saved .json")
    args = p.parse_args(argv)
    if args.render_only:
        import json

        with open(os.path.join(args.out, "xml_generalization.json"), encoding="utf-8") as f:
            return render(json.load(f), args.out)
    if args.splits < 100:
        p.error(f"--splits must be >= 100 (the paper uses 1000), got {args.splits}")
    with open(os.path.join(args.run_folder, "config.yaml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    merged, _, _ = Paired.variants(config)  # the job's variant configs and its seeds, as the protocol reads them
    seeds = Paired.read(config).seeds
    pairs = [tuple(x.split(":")) for x in args.pairs]
    wanted = [v for pair in pairs for v in pair]
    variants = [v for v in config["variants"] if v in wanted]
    device = torch.device(args.device)
    start = time.time()
    per_seed, per_split = {}, {}
    for name in variants:
        cfg = merged[name]
        for seed in seeds:
            stage = os.path.join(args.run_folder, name, f"seed_{seed}")
            if not os.path.exists(os.path.join(stage, "best_models.pth")):
                raise SystemExit(f"error: {stage}/best_models.pth missing: run the main job first")
            models = load_models(cfg, stage, device)
            y, z, labels = embeddings_and_histograms(cfg, models, device, seed)
            mc, mx, lc, lx = probe(
                y, z, labels, args.splits, lambda p, models=models: models["embedder"](p.to(device)).cpu()
            )
            per_seed.setdefault(name, {})[seed] = {"map_seen": mc, "map_unseen": mx, "gap_seen_minus_unseen": mc - mx}
            per_split[f"{name}/seed_{seed}"] = {
                "map_seen": np.round(lc, 4).tolist(),
                "map_unseen": np.round(lx, 4).tolist(),
            }
            print(f"{name} seed {seed}: MAP_c {mc:.4f}  MAP_x {mx:.4f}")
    results = summarize(
        per_seed,
        comparisons=[p for p in pairs if p[0] in per_seed and p[1] in per_seed],
        metrics=["map_unseen", "map_seen"],
        extra={
            "run_folder": os.path.basename(os.path.normpath(args.run_folder)),
            "seeds": seeds,
            "splits": args.splits,
            "seconds": time.time() - start,
            "per_split": per_split,
        },
    )
    render(results, args.out)


def with_claims(results):
    """``results`` with its comparisons made the paper's claims (:data:`CLAIMS`, δ = :data:`SMALLEST_EFFECT`) by the
    runner's :func:`~pml_extensions.runner.outputs.results.summarize` (Holm over all of them)."""
    pairs = list(dict.fromkeys((c["variant"], c["baseline"]) for c in results["comparisons"]))
    per_seed = {name: v["per_seed"] for name, v in results["variants"].items()}
    claimed = summarize(per_seed, pairs, list(CLAIMS), smallest_effects=SMALLEST_EFFECT, claims=CLAIMS)
    return dict(results, comparisons=claimed["comparisons"])


def render(results, out):
    """Write ``xml_generalization.json`` / ``.md`` from the results dict (``--render-only`` re-renders the saved
    json without recomputing the probe), its comparisons as the paper's claims (:func:`with_claims`)."""
    results = with_claims(results)
    header = (
        f"XML generalisation probe on the main job's models (`{results['run_folder']}`, seeds "
        f"{', '.join(map(str, results['seeds']))}): ridge prototypes fitted on a random half of the unseen "
        f"test classes (seen, MAP_c) predict the other half (unseen, MAP_x); MAP@R of the predictions, averaged "
        f"over {results['splits']} random class splits, then over seeds. GAP trunks are binned with post-hoc "
        f"k-means prototypes. `python benchmarks/xml_generalization.py --splits {results['splits']}`"
    )
    lines = [f"- {verdict(c)}" for c in results["comparisons"]]
    footer = (
        (
            "Paper (Sec. 3, CIFAR-10, 1000 splits): with XML the unseen half's MAP_x is higher (claim: greater) while "
            "the seen half's MAP_c is similar (claim: on par, supported by no effect of practical size). Here, on a "
            f"smoke test's models, with δ = {100 * SMALLEST_EFFECT:g} MAP@R point and Holm over the {len(lines)} "
            "claims:\n"
            + "\n".join(lines)
            + "\n\nRead the XML − GAP rows with care: they change two things at once, the XML term and where "
            "the prototypes come from (HistogramPooling's trained prototypes vs k-means fitted to the GAP trunk's "
            "features after training). The XML − λ = 0 rows change only the XML term (same trunk, same prototype "
            "layer, same seed and batches): they isolate the claim."
        )
        if lines
        else ""
    )
    write_results(
        out, results, metrics=["map_unseen", "map_seen"], header=header, name="xml_generalization", footer=footer
    )
    with open(os.path.join(out, "xml_generalization.md"), encoding="utf-8") as f:
        print(f.read())


if __name__ == "__main__":
    main()
