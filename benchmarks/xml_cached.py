"""XML vs GAP with power (issue 24, item 2): the configs ``benchmarks/configs/xml_cached_clipart`` and
``xml_cached_glyphs`` run through the runner (protocol ``benchmarks.protocols.xml_paper``: the ``paired`` protocol with
the XML paper's readings; ``feature_cache``, ``selection: mean_validation_curve``, ``untrained: true``), 20 paired
seeds, plus the XML paper's generalisation probe (MAP_x, MAP_c) on the same models.

ImageNet MobileNetV2 (offline weights) frozen; its prefix outputs are cached once per dataset in a folder the
experiments share. Open Clip Art runs as two experiments (the variants of the two settings: ``*_frozen``, frozen up
to features.18, the map HistogramPooling reads; ``*_last``, the last stage features.18 trained on cached features.17
maps), the glyph set as one. The parts of a call run as separate single-thread processes::

    python benchmarks/xml_cached.py --part cache --rank 0 --world-size 2   # the caches' shards (both datasets)
    python benchmarks/xml_cached.py --part cache --rank 1 --world-size 2
    python benchmarks/xml_cached.py --part clipart_frozen                  # an experiment (+ its probe)
    python benchmarks/xml_cached.py --part clipart_last
    python benchmarks/xml_cached.py --part glyphs
    python benchmarks/xml_cached.py --merge                                # the table: benchmarks/results/xml_cached.*

A part run alone builds whatever cache it misses. Verdicts: the paper claims XML > GAP on unseen classes; a paired
95 % interval above 0 reproduces it, below 0 contradicts it, and one containing 0 bounds the effect: "no effect
larger than X points" with X the larger end of the interval in absolute value.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

from pml_extensions.runner.outputs.results import effect_bound
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

try:  # the repository's root is on sys.path (PYTHONPATH, pytest)
    from benchmarks import protocols
except ModuleNotFoundError:  # python benchmarks/xml_cached.py: benchmarks/ is sys.path[0]
    import protocols

protocols.register()  # the configs name their protocol benchmarks.protocols.xml_paper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUNS = os.path.join("runs", "xml_cached")
#: part -> (config, variants, cache folder name)
PARTS = {
    "clipart_frozen": (
        "xml_cached_clipart",
        [
            "contrastive_gap_frozen",
            "contrastive_xml_frozen",
            "contrastive_xml_lambda0_frozen",
            "proxy_anchor_gap_frozen",
            "proxy_anchor_xml_frozen",
        ],
        "feature_cache_clipart",
    ),
    "clipart_last": (
        "xml_cached_clipart",
        ["contrastive_gap_last", "contrastive_xml_last", "proxy_anchor_gap_last", "proxy_anchor_xml_last"],
        "feature_cache_clipart",
    ),
    "glyphs": ("xml_cached_glyphs", None, "feature_cache_glyphs"),
}
UNTRAINED = "untrained"


def part_config(part: str, runs: str, seeds=None, device: str = "cpu"):
    """``(config, sources, experiment folder)`` of one experiment part: its config (``benchmarks/configs``) with the
    part's variants and their comparisons (``untrained`` kept), the shared cache folder and the experiment name."""
    from pml_extensions.cli.job import load_job_config

    name, variants, cache = PARTS[part]
    config, sources = load_job_config([protocols.config_path(name), "--device", device])
    if seeds is not None:
        config["seeds"] = [int(s) for s in seeds]
    if variants is not None:
        keep = set(variants) | {UNTRAINED}
        config = dict(config, variants={k: v for k, v in config["variants"].items() if k in variants})
        config["comparisons"] = [p for p in config["comparisons"] if set(p) <= keep]
    config["feature_cache"] = dict(config["feature_cache"], folder=os.path.abspath(os.path.join(runs, cache)))
    config["experiment_name"] = f"xml_cached_{part}"
    return config, sources, os.path.join(runs, config["experiment_name"])


def build_caches(runs: str, rank: int, world_size: int, device: str) -> dict:
    """This shard of every cache of both configs (the last process to finish completes a cache and derives the
    features.18 one). Returns ``{config: complete}``."""
    out = {}
    for part in ("clipart_frozen", "clipart_last", "glyphs"):
        config, sources, folder = part_config(part, runs, device=device)
        experiment = protocols.xml_paper.XMLPaper(config, folder, sources)
        out[part] = experiment.build_caches(rank=rank, world_size=world_size)
    return out


def run_part(part: str, runs: str, seeds, device: str, splits: int) -> dict:
    """One experiment through the runner, then the probe on its selected models."""
    from pml_extensions.runner.protocols import run_protocol

    config, sources, folder = part_config(part, runs, seeds, device)
    start = time.time()
    results = run_protocol(config, folder, sources, log=lambda *a, **k: None)
    seconds = time.time() - start
    start = time.time()
    probe = run_probe(config, folder, device, splits)
    atomic_write_json(os.path.join(folder, "probe.json"), probe, indent=1)
    return {"seconds": seconds, "probe_seconds": time.time() - start, "results": results}


@torch.no_grad()
def probe_features(cfg, models, device, seed, num_prototypes=64, batch_size=256):
    """``(pooled [N, C], z [N, m], labels [N])`` of the cached test split for the probe (float64, CPU): the GAP
    vectors (the trunk's output) and the histograms of the trunk's HistogramPooling, or for a GAP trunk of a
    post-hoc HistogramPooling with k-means prototypes of its training local features (the eval view)."""
    from pml_extensions.runner.objects.builder import Builder
    from pml_extensions.runner.protocols.paired.unit import load_split, make_loader
    from pml_extensions.trunks import HistogramPooling, find_histogram_layers, trunk_body

    builder = Builder(cfg, device=device, log=lambda *a, **k: None)
    builder.frozen = models["frozen"]
    trunk = models["trunk"].eval()
    pools = find_histogram_layers(trunk)
    if pools:
        pool, body = pools[0], trunk_body(trunk, pools[0])
    else:  # the modules before the average pooling compute the local features
        children = list(trunk.children())
        cut = next(i for i, m in enumerate(children) if isinstance(m, torch.nn.AdaptiveAvgPool2d))
        body = torch.nn.Sequential(*children[:cut])
        train_eval = load_split(cfg, "train", train_transform=False, builder=builder)
        width = body(train_eval[0][0][None].to(device)).shape[1]
        pool = HistogramPooling(width, num_prototypes, seed=seed).to(device)
        pool.init_from_data(body, make_loader(train_eval, batch_size, seed), num_batches=4, seed=seed)
    ys, zs, ls = [], [], []
    test = load_split(cfg, "test", train_transform=False, builder=builder)
    for x, y in torch.utils.data.DataLoader(test, batch_size=batch_size):
        x = x.to(device)
        ys.append(trunk(x).double().cpu())
        zs.append(pool.histograms(body(x)).double().cpu())
        ls.append(y)
    return torch.cat(ys), torch.cat(zs), torch.cat(ls)


def run_probe(config, folder, device, splits) -> dict:
    """MAP_c and MAP_x (:func:`xml_generalization.probe`) of every XML / GAP variant's selected model, per seed."""
    from xml_generalization import probe

    from pml_extensions.runner.config.loader import variant_configs
    from pml_extensions.runner.protocols.paired.unit import load_models, resolve_cache_folder

    merged = variant_configs(config)
    out = {}
    dev = torch.device(device)
    for name, cfg in merged.items():
        if "lambda0" in name:  # the pairing test equals its GAP twin: no probe needed
            continue
        cfg = resolve_cache_folder(cfg, folder)
        for seed in config["seeds"]:
            models = load_models(cfg, os.path.join(folder, name, f"seed_{seed}"), dev)
            y, z, labels = probe_features(cfg, models, dev, seed)
            map_c, map_x, _, _ = probe(y, z, labels, splits, lambda p, e=models["embedder"]: e(p.to(dev)).cpu())
            out.setdefault(name, {})[str(seed)] = {"map_seen": 100 * map_c, "map_unseen": 100 * map_x}
    out["splits"] = splits
    return out


#: (part, setting label, loss label, XML variant, GAP variant)
ROWS = (
    ("clipart_frozen", "frozen to features.18", "contrastive", "contrastive_xml_frozen", "contrastive_gap_frozen"),
    ("clipart_frozen", "frozen to features.18", "ProxyAnchor", "proxy_anchor_xml_frozen", "proxy_anchor_gap_frozen"),
    ("clipart_last", "features.18 trained", "contrastive", "contrastive_xml_last", "contrastive_gap_last"),
    ("clipart_last", "features.18 trained", "ProxyAnchor", "proxy_anchor_xml_last", "proxy_anchor_gap_last"),
    ("glyphs", "frozen to features.18", "contrastive", "contrastive_xml", "contrastive_gap"),
    ("glyphs", "frozen to features.18", "ProxyAnchor", "proxy_anchor_xml", "proxy_anchor_gap"),
)
DATASETS = {"clipart_frozen": "Open Clip Art", "clipart_last": "Open Clip Art", "glyphs": "glyphs"}
LAMBDA0 = {
    "clipart_frozen": ("contrastive_xml_lambda0_frozen", "contrastive_gap_frozen"),
    "glyphs": ("contrastive_xml_lambda0", "contrastive_gap"),
}


def paired(a: dict, b: dict) -> dict:
    """Paired difference ``a - b`` over the common seeds (points), its 95 % t interval and sd."""
    from pml_extensions.utils.paired_stats import paired_difference

    seeds = sorted(set(a) & set(b), key=int)
    d = paired_difference({s: a[s] for s in seeds}, {s: b[s] for s in seeds}, 0.95)
    return {
        "mean": d["mean_difference"],
        "ci95": d["ci"],
        "sd": d["std"],
        "n": len(seeds),
        "wins": int(sum(x > 0 for x in d["differences"])),
        "differences": d["differences"],
    }


def claim(d: dict, target: float) -> str:
    """The verdict on "XML > GAP" from a paired interval (points): reproduced / contradicted / the largest effect
    the interval leaves."""
    lo, hi = d["ci95"]
    if lo > 0:
        return f"reproduced: XML higher by {lo:.2f} to {hi:.2f} points"
    if hi < 0:
        return f"contradicted: XML lower by {-hi:.2f} to {-lo:.2f} points"
    return f"no effect larger than {effect_bound(d):.2f} points" + (
        "" if (hi - lo) / 2 <= target else f" (half-width {(hi - lo) / 2:.2f} > target {target})"
    )


def _points(results: dict, variant: str) -> dict:
    return {s: 100 * v["mean_average_precision_at_r"] for s, v in results["variants"][variant]["per_seed"].items()}


def merge(runs: str) -> dict:
    """The three experiments' results and probes in one table (MAP@R in points)."""
    from pml_extensions.runner.experiment.folder import environment_summary

    parts = {}
    for part in PARTS:
        folder = os.path.join(runs, f"xml_cached_{part}")
        with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
            results = json.load(f)
        with open(os.path.join(folder, "probe.json"), encoding="utf-8") as f:
            probe = json.load(f)
        record = os.path.join(runs, f"part_{part}.json")
        seconds = json.load(open(record, encoding="utf-8")) if os.path.exists(record) else {}
        parts[part] = {"results": results, "probe": probe, "seconds": seconds}
    rows = []
    for part, setting, loss, xml, gap in ROWS:
        r = parts[part]["results"]
        selection = r["selection"]
        epoch = selection["epochs"][xml]
        probe = parts[part]["probe"]
        target = 0.6 if setting.startswith("frozen") else 1.0
        d = paired(_points(r, xml), _points(r, gap))
        row = {
            "dataset": DATASETS[part],
            "setting": setting,
            "loss": loss,
            "iterations": epoch * r["iterations_per_epoch"],
            "untrained": float(np.mean(list(_points(r, UNTRAINED).values()))),
            "gap": float(np.mean(list(_points(r, gap).values()))),
            "xml": float(np.mean(list(_points(r, xml).values()))),
            "difference": d,
            "target_half_width": target,
            "verdict": claim(d, target),
            "gap_minus_untrained": paired(_points(r, gap), _points(r, UNTRAINED)),
        }
        for metric in ("map_unseen", "map_seen"):
            a = {s: v[metric] for s, v in probe[xml].items()}
            b = {s: v[metric] for s, v in probe[gap].items()}
            row[metric] = {
                "xml": float(np.mean(list(a.values()))),
                "gap": float(np.mean(list(b.values()))),
                "difference": paired(a, b),
            }
        rows.append(row)
    identity = {}
    for part, (l0, gap) in LAMBDA0.items():
        r = parts[part]["results"]
        diffs = [abs(a - b) for a, b in zip(_points(r, l0).values(), _points(r, gap).values())]
        identity[DATASETS[part]] = {"max_abs_difference": max(diffs), "seeds": len(diffs)}
    env = parts["clipart_frozen"]["results"].get("environment") or {}
    return {
        "rows": rows,
        "identity": identity,
        "seeds": parts["clipart_frozen"]["results"]["seeds"],
        "environment": environment_summary(env) if env else None,
        "untrained_spread": {p: v["results"]["untrained"] for p, v in parts.items()},
        "seconds": {p: v["seconds"] for p, v in parts.items()},
        "splits": {
            DATASETS[p] + (f" ({p.split('_')[1]})" if "_" in p else ""): v["probe"].get("splits")
            for p, v in parts.items()
        },
    }


def _splits(splits) -> str:
    """The probe's class splits per model: one number when every part used the same, else per part."""
    if not isinstance(splits, dict):
        return str(splits)
    if len(set(splits.values())) == 1:
        return str(next(iter(splits.values())))
    return ", ".join(f"{k} {v}" for k, v in splits.items())


def markdown(out: dict) -> str:
    n = len(out["seeds"])
    lines = [
        f"`python benchmarks/xml_cached.py` (the runner: configs `xml_cached_clipart` / `xml_cached_glyphs`, protocol "
        f"`xml_paper` with `feature_cache`), {n} paired seeds. ImageNet MobileNetV2 (offline weights), its frozen "
        "prefix's outputs cached once (2 seeded views of every training image; Open Clip Art at 128 px, glyphs at "
        "96 px); HistogramPooling(1280, 64) + XMLWrapper (λ = 0.01, ridge 0.05, pooled target) against GAP, "
        "Linear(1280, 64) embedder, batch 32. 8 of the 30 (glyphs: 31) training classes validate; the training "
        "length of each compared pair is chosen once on their mean validation curve over all seeds (50-200 "
        "iterations), then every model is tested once at it on the unseen test classes. MAP@R in points (× 100); "
        "Δ = XML − GAP paired by seed, 95 % Student-t interval. Environment: "
        f"{out['environment']}.",
        "",
        "| dataset | setting | loss | length | untrained | GAP | XML | Δ [95 % CI] | sd Δ | XML wins | verdict on "
        '"XML > GAP" |',
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        d = r["difference"]
        lines.append(
            f"| {r['dataset']} | {r['setting']} | {r['loss']} | {r['iterations']} | {r['untrained']:.2f} | "
            f"{r['gap']:.2f} | {r['xml']:.2f} | {d['mean']:+.2f} [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}] | "
            f"{d['sd']:.2f} | {d['wins']}/{d['n']} | {r['verdict']} |"
        )
    lines += [
        "",
        "The XML paper's generalisation probe on the same models (ridge prototypes fitted on a random half of the "
        f"unseen test classes predict the other half; random class splits per model: {_splits(out.get('splits'))}; GAP "
        "trunks binned with post-hoc k-means prototypes). Paper: XML raises MAP_x (unseen half) and leaves MAP_c "
        "(seen half) similar.",
        "",
        "| dataset | setting | loss | MAP_x GAP | MAP_x XML | Δ MAP_x [95 % CI] | MAP_c GAP | MAP_c XML | Δ MAP_c "
        "[95 % CI] |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        x, c = r["map_unseen"], r["map_seen"]
        dx, dc = x["difference"], c["difference"]
        lines.append(
            f"| {r['dataset']} | {r['setting']} | {r['loss']} | {x['gap']:.2f} | {x['xml']:.2f} | {dx['mean']:+.2f} "
            f"[{dx['ci95'][0]:+.2f}, {dx['ci95'][1]:+.2f}] | {c['gap']:.2f} | {c['xml']:.2f} | {dc['mean']:+.2f} "
            f"[{dc['ci95'][0]:+.2f}, {dc['ci95'][1]:+.2f}] |"
        )
    ident = "; ".join(
        f"{k}: max |Δ| = {v['max_abs_difference']:.2g} over {v['seeds']} seeds" for k, v in out["identity"].items()
    )
    trained = "; ".join(
        f"{r['dataset']} {r['setting']} {r['loss']} {r['gap_minus_untrained']['mean']:+.2f} "
        f"[{r['gap_minus_untrained']['ci95'][0]:+.2f}, {r['gap_minus_untrained']['ci95'][1]:+.2f}]"
        for r in out["rows"]
    )
    lines += [
        "",
        f"Pairing test (λ = 0, HistogramPooling without the XML term, against GAP): {ident}. Trained GAP − untrained "
        f"network (points, 95 % CI): {trained}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["cache"] + list(PARTS))
    p.add_argument("--merge", action="store_true", help="write benchmarks/results/xml_cached.{json,md}")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--seeds", type=int, default=None, help="the first N seeds (default: the configs' 20)")
    p.add_argument("--splits", type=int, default=20, help="random class splits of the probe per model")
    p.add_argument("--runs", default=RUNS)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args(argv)
    seeds = None if args.seeds is None else list(range(args.seeds))
    if args.part == "cache":
        start = time.time()
        done = build_caches(args.runs, args.rank, args.world_size, args.device)
        print(f"cache shard {args.rank}/{args.world_size}: {time.time() - start:.0f} s, complete: {done}")
        record = os.path.join(args.runs, f"cache_rank{args.rank}.json")
        atomic_write_json(record, {"seconds": time.time() - start, "complete": done}, indent=1)
    elif args.part is not None:
        out = run_part(args.part, args.runs, seeds, args.device, args.splits)
        print(f"{args.part}: {out['seconds']:.0f} s, probe {out['probe_seconds']:.0f} s")
        atomic_write_json(os.path.join(args.runs, f"part_{args.part}.json"), {k: out[k] for k in out if k != "results"})
    if args.merge:
        out = merge(args.runs)
        text = markdown(out)
        atomic_write_json(os.path.join(args.out, "xml_cached.json"), out, indent=1)
        atomic_write_text(os.path.join(args.out, "xml_cached.md"), text)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
