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

    python benchmarks/xml_cached.py --render                               # the table again from its .json

A part run alone builds whatever cache it misses. Verdicts: the paper claims XML > GAP on unseen classes; each row is
that claim (``"greater"``) with the smallest effect of interest :data:`SMALLEST_EFFECT` = 1 MAP@R point, worded by the
runner's rules (:func:`pml_extensions.utils.verdicts.verdict_word`: shown / no effect of practical size /
contradicted / inconclusive (n seeds)), Holm-corrected over the six rows of the table. ``--render`` rewrites
``benchmarks/results/xml_cached.{json,md}`` from the stored per-seed differences (no run).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

from pml_extensions.utils.atomic_io import atomic_write_json
from pml_extensions.utils.paired_stats import holm
from pml_extensions.utils.verdicts import compare, verdict_word, wins

try:  # the repository's root is on sys.path (PYTHONPATH, pytest)
    from benchmarks import protocols
    from benchmarks.protocols.xml_paper.plots import histogram_view
except ModuleNotFoundError:  # python benchmarks/xml_cached.py: benchmarks/ is sys.path[0]
    import protocols
    from protocols.xml_paper.plots import histogram_view

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
    # the fair setting: features.14-18 trained on cached features.13 maps (each config's own experiment folder and
    # cache inside it, as `python -m pml_extensions run benchmarks/configs/xml_trained_* --root_experiment_folder RUNS`)
    "clipart_trained": ("xml_trained_clipart", None, None),
    "glyphs_trained": ("xml_trained_glyphs", None, None),
}
#: the parts of each setting's table
SETTINGS = {
    "frozen": ("clipart_frozen", "clipart_last", "glyphs"),
    "trained": ("clipart_trained", "glyphs_trained"),
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
    if cache is not None:
        config["feature_cache"] = dict(config["feature_cache"], folder=os.path.abspath(os.path.join(runs, cache)))
        config["experiment_name"] = f"xml_cached_{part}"
    return config, sources, os.path.join(runs, config["experiment_name"])


def build_caches(runs: str, rank: int, world_size: int, device: str) -> dict:
    """This shard of every cache of both configs (the last process to finish completes a cache and derives the
    features.18 one). Returns ``{config: complete}``."""
    out = {}
    for part in SETTINGS["frozen"]:
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
    """``(pooled [N, C], z [N, m], labels [N], embeddings [N, d])`` of the cached test split for the probe (float64,
    CPU): the GAP vectors (the trunk's output), the histograms of the trunk's HistogramPooling, or for a GAP trunk of
    a post-hoc HistogramPooling with k-means prototypes of its training local features (the eval view), and the
    model's embeddings (what the run tested)."""
    from pml_extensions.runner.objects.builder import Builder
    from pml_extensions.runner.protocols.paired.unit import load_split

    builder = Builder(cfg, device=device, log=lambda *a, **k: None)
    builder.frozen = models["frozen"]
    trunk = models["trunk"].eval()
    pool, body = histogram_view(cfg, trunk, device, seed, num_prototypes, builder, batch_size)
    ys, zs, ls, es = [], [], [], []
    test = load_split(cfg, "test", train_transform=False, builder=builder)
    embedder = models["embedder"].eval()
    for x, y in torch.utils.data.DataLoader(test, batch_size=batch_size):
        x = x.to(device)
        pooled = trunk(x)
        ys.append(pooled.double().cpu())
        es.append(embedder(pooled).double().cpu())
        zs.append(pool.histograms(body(x)).double().cpu())
        ls.append(y)
    return torch.cat(ys), torch.cat(zs), torch.cat(ls), torch.cat(es)


def per_class_map_at_r(embeddings, labels) -> dict:
    """``{class: [sum, count]}`` of the per-query MAP@R (points) of the test embeddings among themselves (PML's
    ``AccuracyCalculator``, ``k = "max_bin_count"``, L2-normalised as the tester does): the data of the bootstrap over
    seeds and test classes (Σ sum / Σ count is the run's MAP@R)."""
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    calc = AccuracyCalculator(
        include=("mean_average_precision_at_r",), k="max_bin_count", return_per_class=True, device=torch.device("cpu")
    )
    e = torch.nn.functional.normalize(embeddings.float(), dim=1)
    per = calc.get_accuracy(e, labels, ref_includes_query=True)["mean_average_precision_at_r"]
    classes, counts = np.unique(labels.numpy(), return_counts=True)
    return {str(int(c)): [100 * float(m) * int(n), int(n)] for c, m, n in zip(classes, per, counts)}


def run_probe(config, folder, device, splits, variants=None) -> dict:
    """MAP_c and MAP_x (:func:`xml_generalization.probe`) of every XML / GAP variant's selected model (or of
    ``variants``), per seed, and each model's per-class test MAP@R."""
    from xml_generalization import probe

    from pml_extensions.runner.config.loader import variant_configs
    from pml_extensions.runner.protocols.paired.unit import load_models, resolve_cache_folder

    merged = variant_configs(config)
    out = {}
    dev = torch.device(device)
    for name, cfg in merged.items():
        if "lambda0" in name or (variants is not None and name not in variants):  # λ = 0 equals its GAP twin
            continue
        if not all(os.path.isdir(os.path.join(folder, name, f"seed_{s}")) for s in config["seeds"]):
            continue  # a variant not run (a run of fewer variants than the config's)
        cfg = resolve_cache_folder(cfg, folder)
        for seed in config["seeds"]:
            models = load_models(cfg, os.path.join(folder, name, f"seed_{seed}"), dev)
            y, z, labels, e = probe_features(cfg, models, dev, seed)
            map_c, map_x, _, _ = probe(y, z, labels, splits, lambda p, e=models["embedder"]: e(p.to(dev)).cpu())
            out.setdefault(name, {})[str(seed)] = {
                "map_seen": 100 * map_c,
                "map_unseen": 100 * map_x,
                "per_class": per_class_map_at_r(e, labels),
            }
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
    ("clipart_trained", "features.14-18 trained", "contrastive", "contrastive_xml", "contrastive_gap"),
    ("clipart_trained", "features.14-18 trained", "ProxyAnchor", "proxy_anchor_xml", "proxy_anchor_gap"),
    ("glyphs_trained", "features.14-18 trained", "contrastive", "contrastive_xml", "contrastive_gap"),
    ("glyphs_trained", "features.14-18 trained", "ProxyAnchor", "proxy_anchor_xml", "proxy_anchor_gap"),
)
DATASETS = {
    "clipart_frozen": "Open Clip Art",
    "clipart_last": "Open Clip Art",
    "glyphs": "glyphs",
    "clipart_trained": "Open Clip Art",
    "glyphs_trained": "glyphs",
}
LAMBDA0 = {
    "clipart_frozen": ("contrastive_xml_lambda0_frozen", "contrastive_gap_frozen"),
    "glyphs": ("contrastive_xml_lambda0", "contrastive_gap"),
    "clipart_trained": ("contrastive_xml_lambda0", "contrastive_gap"),
    "glyphs_trained": ("contrastive_xml_lambda0", "contrastive_gap"),
}
#: the results file of each setting (benchmarks/results/NAME.{json,md})
OUTPUT = {"frozen": "xml_cached", "trained": "xml_trained"}


#: δ of the claim "XML > GAP" (MAP@R points): the paper claims "consistent improvements" of MAP@R (its Table 1 values
#: are not in the text we have, methods.md A3) and the evidence guide sets 1 MAP@R point as XML's smallest effect of
#: interest; a 0.1-point difference is no improvement a user would notice, however narrow its interval
SMALLEST_EFFECT = 1.0


def paired(a: dict, b: dict, smallest_effect=None, claim: str = "greater", per_class=None) -> dict:
    """The runner's paired comparison ``a − b`` (:func:`~pml_extensions.utils.verdicts.compare`) over the
    seeds both have (points): mean difference, sd, 95 % t interval, per-seed differences, and ``wins`` (seeds where
    ``a`` is higher); with ``smallest_effect`` (δ, points) also the bootstrap, the p-values and the verdict on the
    claim (one claim: no Holm correction, :func:`claims` corrects a table's rows together). ``per_class``: ``(a's,
    b's)`` ``{seed: {class: [sum, count]}}`` (points): the bootstrap resamples seeds and test classes; else seeds.

    Raises:
        ValueError: per-class data whose Σ sum / Σ count differs from the seed's value (by more than 1e-3 points).
    """
    seeds = sorted(set(a) & set(b), key=int)
    arms = {name: {"per_seed": {s: {"m": arm[s]} for s in seeds}} for name, arm in (("a", a), ("b", b))}
    classes = None
    if per_class is not None:
        classes = {}
        for name, arm, rows in (("a", a, per_class[0]), ("b", b, per_class[1])):
            for s in seeds:
                total = sum(v[0] for v in rows[s].values()) / sum(v[1] for v in rows[s].values())
                if abs(total - arm[s]) > 1e-3:
                    raise ValueError(f"per-class MAP@R of seed {s} ({name}): Σ sum / Σ count {total} ≠ {arm[s]}")
            classes[name] = {s: {"m": rows[s]} for s in seeds}
    d = compare(arms, "a", "b", "m", per_class=classes, smallest_effect=smallest_effect, claim=claim)
    for key in ("variant", "baseline", "metric"):
        d.pop(key)
    d["wins"] = wins(d)
    return d


def claims(differences) -> list:
    """Holm's correction over the claims of one table (each a :func:`paired` result with a δ): sets each one's
    ``p_holm`` and ``verdict`` (the runner's rules); returns the verdicts.

    Example (the runner's hand-checked claims A, B, C: differences 2, 2.5, 3; 0.5, 1, 1.5; 0.10, 0.12, 0.14; δ = 1)::

        >>> zero = {"0": 0.0, "1": 0.0, "2": 0.0}
        >>> ds = [paired(dict(zip(zero, v)), zero, 1.0) for v in ([2, 2.5, 3], [0.5, 1, 1.5], [0.1, 0.12, 0.14])]
        >>> claims(ds), [round(d["p_holm"], 4) for d in ds]
        (['shown', 'inconclusive (3 seeds)', 'no effect of practical size'], [0.0274, 0.0742, 0.0274])
    """
    for d, p in zip(differences, holm([d["p_value"] for d in differences])):
        d["p_holm"] = p
        d["verdict"] = verdict_word(d, d["claim"])
    return [d["verdict"] for d in differences]


def _points(results: dict, variant: str) -> dict:
    return {s: 100 * v["mean_average_precision_at_r"] for s, v in results["variants"][variant]["per_seed"].items()}


def merge(runs: str, setting: str = "frozen") -> dict:
    """One setting's experiments' results and probes in one table (MAP@R in points); a row whose variants a part did
    not run (or a part without results) is listed under ``not_run``."""
    from pml_extensions.runner.experiment.folder import environment_summary

    parts, missing = {}, []
    for part in SETTINGS[setting]:
        name, _, cache = PARTS[part]
        folder = os.path.join(runs, f"xml_cached_{part}" if cache is not None else name)
        if not os.path.isfile(os.path.join(folder, "results.json")):
            missing.append(part)
            continue
        with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
            results = json.load(f)
        probe = {}  # not probed (yet): the rows say so
        if os.path.isfile(os.path.join(folder, "probe.json")):
            with open(os.path.join(folder, "probe.json"), encoding="utf-8") as f:
                probe = json.load(f)
        record = os.path.join(runs, f"part_{part}.json")
        seconds = json.load(open(record, encoding="utf-8")) if os.path.exists(record) else {}
        parts[part] = {"results": results, "probe": probe, "seconds": seconds}
    if not parts:
        raise FileNotFoundError(f"no results.json of the {setting} setting's parts under {runs}")
    rows, not_run = [], []
    for part, label, loss, xml, gap in ROWS:
        if part in missing:
            not_run.append(f"{DATASETS[part]} {label} {loss}")
            continue
        if part not in parts:
            continue
        r = parts[part]["results"]
        if xml not in r["variants"] or gap not in r["variants"]:
            not_run.append(f"{DATASETS[part]} {label} {loss}")
            continue
        selection = r["selection"]
        epoch = selection["epochs"][xml]
        probe = parts[part]["probe"]
        classes, probed = None, xml in probe and gap in probe
        if probed and all("per_class" in next(iter(probe[v].values())) for v in (xml, gap)):
            classes = tuple({s: v["per_class"] for s, v in probe[v].items()} for v in (xml, gap))
        d = paired(_points(r, xml), _points(r, gap), SMALLEST_EFFECT, "greater", classes)
        row = {
            "dataset": DATASETS[part],
            "setting": label,
            "loss": loss,
            "iterations": epoch * r["iterations_per_epoch"],
            "untrained": float(np.mean(list(_points(r, UNTRAINED).values()))),
            "gap": float(np.mean(list(_points(r, gap).values()))),
            "xml": float(np.mean(list(_points(r, xml).values()))),
            "difference": d,
            "gap_minus_untrained": paired(_points(r, gap), _points(r, UNTRAINED)),
        }
        for metric in ("map_unseen", "map_seen") if probed else ():  # a row not probed: no MAP_x / MAP_c
            a = {s: v[metric] for s, v in probe[xml].items()}
            b = {s: v[metric] for s, v in probe[gap].items()}
            row[metric] = {
                "xml": float(np.mean(list(a.values()))),
                "gap": float(np.mean(list(b.values()))),
                "difference": paired(a, b),
            }
        if classes is not None:  # with the arms' own values, so a re-render recomputes the same comparison
            row["per_class"] = {"xml": classes[0], "gap": classes[1]}
            row["per_seed"] = {"xml": _points(r, xml), "gap": _points(r, gap)}
        rows.append(row)
    for row, word in zip(rows, claims([row["difference"] for row in rows])):
        row["verdict"] = word
    identity = {}
    for part, (l0, gap) in LAMBDA0.items():
        if part not in parts or l0 not in parts[part]["results"]["variants"]:
            continue
        r = parts[part]["results"]
        diffs = [abs(a - b) for a, b in zip(_points(r, l0).values(), _points(r, gap).values())]
        identity[DATASETS[part]] = {"max_abs_difference": max(diffs), "seeds": len(diffs)}
    first = next(iter(parts.values()))["results"]
    envs = {DATASETS[p]: environment_summary(v["results"]["environment"]) for p, v in parts.items()
            if v["results"].get("environment")}  # fmt: skip
    return {
        "setting": setting,
        "rows": rows,
        "not_run": not_run,
        "identity": identity,
        "seeds": first["seeds"],
        "environment": _one_environment(envs),
        "environments": envs,
        "untrained_spread": {p: v["results"]["untrained"] for p, v in parts.items()},
        "seconds": {p: v["seconds"] for p, v in parts.items()},
        "splits": {
            DATASETS[p] + (f" ({p.split('_')[1]})" if "_" in p else ""): v["probe"].get("splits")
            for p, v in parts.items()
        },
    }


def _stored(d: dict, seeds, smallest_effect=None) -> dict:
    """A comparison of a stored ``xml_cached.json`` recomputed from its per-seed differences (paired statistics read
    nothing else): its ``seeds``, or for a file written before they were stored the run's seeds as strings in the
    order :func:`paired` sorted them (``"0", "1", "10", ...``)."""
    keys = d.get("seeds") or sorted(str(s) for s in seeds)
    if len(keys) != len(d["differences"]):
        raise ValueError(f"a stored comparison has {len(d['differences'])} differences for {len(keys)} seeds")
    return paired(dict(zip(keys, d["differences"])), {s: 0.0 for s in keys}, smallest_effect, d.get("claim", "greater"))


def rerender(out: dict) -> dict:
    """A stored ``xml_cached.json`` with every comparison recomputed from its per-seed differences and the rows'
    verdicts worded again (what ``--merge`` writes from the same runs)."""
    rows = []
    for row in out["rows"]:
        row = {k: v for k, v in row.items() if k not in ("target_half_width", "verdict")}
        classes, arms = row.get("per_class"), row.get("per_seed")
        if classes is not None and arms is not None:
            row["difference"] = paired(
                arms["xml"], arms["gap"], SMALLEST_EFFECT, "greater", (classes["xml"], classes["gap"])
            )
        else:
            row["difference"] = _stored(row["difference"], out["seeds"], SMALLEST_EFFECT)
        row["gap_minus_untrained"] = _stored(row["gap_minus_untrained"], out["seeds"])
        for metric in ("map_unseen", "map_seen"):
            if metric in row:
                row[metric] = dict(row[metric], difference=_stored(row[metric]["difference"], out["seeds"]))
        rows.append(row)
    for row, word in zip(rows, claims([row["difference"] for row in rows])):
        row["verdict"] = word
    return dict(out, rows=rows)


def _one_environment(by_dataset: dict):
    """One environment line: the shared one, or each dataset's where the parts ran on different ones (a part rerun
    with another thread count); None when no part recorded one."""
    if len(set(by_dataset.values())) <= 1:
        return next(iter(by_dataset.values()), None)
    return "; ".join(f"{name}: {env}" for name, env in by_dataset.items())


def update(stored: dict, rerun: dict) -> dict:
    """``stored`` (a results file) with the rows of ``rerun`` (a :func:`merge` of some parts: the others not run) in
    place of the stored rows of the same dataset, setting and loss, or added where the stored file lists them under
    ``not_run``; the verdicts Holm-corrected again over the table; the rerun parts' seconds, split counts, λ = 0
    identity and environment lines replace theirs. Raises ValueError for a rerun row the stored file neither has nor
    lists as not run, or other seeds."""
    if [str(s) for s in rerun["seeds"]] != [str(s) for s in stored["seeds"]]:
        raise ValueError(f"the rerun's seeds {rerun['seeds']} differ from the stored {stored['seeds']}")
    key = lambda r: (r["dataset"], r["setting"], r["loss"])  # noqa: E731
    new = {key(r): r for r in rerun["rows"]}
    missing = list(stored.get("not_run") or [])
    added = [k for k in new if " ".join(k) in missing]
    unknown = sorted(set(new) - {key(r) for r in stored["rows"]} - set(added))
    if unknown:
        raise ValueError(f"the stored table has no rows {unknown}")
    same = total = 0
    largest = 0.0
    for r in stored["rows"]:
        if key(r) in new:
            a, b = r["difference"]["differences"], new[key(r)]["difference"]["differences"]
            same, total = same + sum(x == y for x, y in zip(a, b)), total + len(a)
            largest = max([largest] + [abs(x - y) for x, y in zip(a, b)])
    notes = list(stored.get("notes", []))
    if total:
        rerun_keys = [k for k in new if k not in added]
        notes.append(
            f"Rows rerun later ({', '.join(' '.join(k) for k in rerun_keys)}): {same} of {total} per-seed XML − GAP "
            f"differences bit-identical to the first run's (largest difference {largest:.3g} points); their probe was "
            "recomputed."
        )
    rows = [new.get(key(r), r) for r in stored["rows"]] + [new[k] for k in added]
    not_run = [m for m in missing if m not in {" ".join(k) for k in added}]
    out = dict(stored, rows=rows, notes=notes, not_run=not_run)
    if "environments" not in stored and stored.get("environment"):  # a file written before the per-dataset field
        stored = dict(stored, environments={r["dataset"]: stored["environment"] for r in stored["rows"]})
    for field in ("seconds", "splits", "identity", "untrained_spread", "environments"):
        out[field] = {**(stored.get(field) or {}), **(rerun.get(field) or {})}
    out["environment"] = _one_environment(out["environments"])
    return rerender(out)


def _ci(d: dict, key: str = "ci95") -> str:
    return f"{d['mean_difference']:+.2f} [{d[key][0]:+.2f}, {d[key][1]:+.2f}]"


def _splits(splits) -> str:
    """The probe's class splits per model: one number when every part used the same, else per part."""
    if not isinstance(splits, dict):
        return str(splits)
    if len(set(splits.values())) == 1:
        return str(next(iter(splits.values())))
    return ", ".join(f"{k} {v}" for k, v in splits.items())


#: what each setting's table says of how it was made (before the seeds and the verdict rules)
HOW = {
    "frozen": "`python benchmarks/xml_cached.py` (the runner: configs `xml_cached_clipart` / `xml_cached_glyphs`, "
    "protocol `xml_paper` with `feature_cache`), {n} paired seeds. ImageNet MobileNetV2 (offline weights), its frozen "
    "prefix's outputs cached once (2 seeded views of every training image; Open Clip Art at 128 px, glyphs at 96 px); "
    "HistogramPooling(1280, 64) + XMLWrapper (λ = 0.01, ridge 0.05, pooled target) against GAP, Linear(1280, 64) "
    "embedder, batch 32. 8 of the 30 (glyphs: 31) training classes validate; the training length of each compared "
    "pair is chosen once on their mean validation curve over all seeds (50-200 iterations), then every model is "
    "tested once at it on the unseen test classes.",
    "trained": "`python -m pml_extensions run benchmarks/configs/xml_trained_clipart --root_experiment_folder RUNS` "
    "(likewise `xml_trained_glyphs`; the runner's `xml_paper` protocol with `feature_cache`), then `python "
    "benchmarks/xml_cached.py --runs RUNS --part clipart_trained --probe-only` (and `glyphs_trained`) and `--merge "
    "--setting trained`; {n} paired seeds, declared in the configs before running. ImageNet MobileNetV2 (offline "
    "weights) at 160 px: its prefix up to features.13 frozen and cached (4 seeded views of every training image), "
    "features.14-18 (the last stride-32 stage, 5 × 5 maps), the 64 prototypes and the Linear(1280, 64) embedder "
    "trained (Adam, trunk 1e-4, embedder 1e-3), so the XML term shapes the features HistogramPooling reads; "
    "HistogramPooling(1280, 64, k-means initialised) + XMLWrapper (λ = 0.01, ridge 0.05, pooled target) against GAP, "
    "batch 32. 8 of the 30 (glyphs: 31) training classes validate; the training length of each compared pair is "
    "chosen once on their mean validation curve over all seeds (0-300 iterations, the untrained network included), "
    "then every model is tested once at it on the unseen test classes.",
}


def markdown(out: dict) -> str:
    n = len(out["seeds"])
    setting = out.get("setting", "frozen")
    with_classes = [r for r in out["rows"] if "per_class" in r]
    boot = (
        "seeds and test classes"
        if len(with_classes) == len(out["rows"])
        else "seeds and test classes in the rows whose probe recorded per-class MAP@R ("
        + ", ".join(sorted({f"{r['dataset']} {r['setting']}" for r in with_classes}))
        + "), over seeds elsewhere"
        if with_classes
        else "seeds"
    )
    lines = [
        HOW[setting].format(n=n) + " MAP@R in points (× 100); Δ = XML − GAP paired by seed with its 95 % Student-t "
        f"interval and the 95 % percentile bootstrap over {boot}. Verdict on the paper's claim XML > GAP with the "
        f"smallest effect of interest δ = {SMALLEST_EFFECT:g} MAP@R point (the evidence guide's δ for XML): **shown** "
        "(the envelope of both intervals excludes 0 after Holm's correction over the "
        f"{len(out['rows'])} row{'s' if len(out['rows']) != 1 else ''}, and Δ ≥ δ), **no effect of practical size** "
        "(the envelope lies within ±δ), "
        "**contradicted** (excludes 0 after Holm, Δ ≤ −δ), otherwise **inconclusive**. "
        f"Environment: {out['environment']}."
        + (f" Not run: {', '.join(out['not_run'])}." if out.get("not_run") else ""),
        "",
        "| dataset | setting | loss | length | untrained | GAP | XML | Δ [95 % CI] | Δ [bootstrap] | sd Δ | XML wins "
        '| p (Holm) | verdict on "XML > GAP" |',
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        d = r["difference"]
        lines.append(
            f"| {r['dataset']} | {r['setting']} | {r['loss']} | {r['iterations']} | {r['untrained']:.2f} | "
            f"{r['gap']:.2f} | {r['xml']:.2f} | {_ci(d)} | {_ci(d, 'bootstrap_ci95')} | {d['std']:.2f} | "
            f"{d['wins']}/{d['n']} | {d['p_holm']:.2g} | {r['verdict']} |"
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
        if "map_unseen" not in r:
            lines.append(f"| {r['dataset']} | {r['setting']} | {r['loss']} | not probed | | | | | |")
            continue
        x, c = r["map_unseen"], r["map_seen"]
        dx, dc = x["difference"], c["difference"]
        lines.append(
            f"| {r['dataset']} | {r['setting']} | {r['loss']} | {x['gap']:.2f} | {x['xml']:.2f} | {_ci(dx)} | "
            f"{c['gap']:.2f} | {c['xml']:.2f} | {_ci(dc)} |"
        )
    ident = "; ".join(
        f"{k}: max |Δ| = {v['max_abs_difference']:.2g} over {v['seeds']} seeds" for k, v in out["identity"].items()
    )
    trained = "; ".join(
        f"{r['dataset']} {r['setting']} {r['loss']} {_ci(r['gap_minus_untrained'])}" for r in out["rows"]
    )
    lines += (
        [""]
        + [f"{n}\n" for n in out.get("notes", [])]
        + [
            f"Pairing test (λ = 0, HistogramPooling without the XML term, against GAP): {ident}. Trained GAP − "
            f"untrained network (points, 95 % CI): {trained}.",
        ]
    )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["cache"] + list(PARTS))
    p.add_argument("--probe-only", action="store_true", help="with --part: the probe on the part's finished run")
    p.add_argument("--variants", nargs="+", default=None, help="with --probe-only: only these variants")
    p.add_argument("--setting", choices=list(SETTINGS), default="frozen", help="the table --merge/--render write")
    p.add_argument("--merge", action="store_true", help="write benchmarks/results/xml_cached.{json,md}")
    p.add_argument("--render", action="store_true", help="rewrite xml_cached.{json,md} from the json, no run")
    p.add_argument("--update", action="store_true", help="replace the stored rows of the parts found under --runs")
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
    elif args.part is not None and args.probe_only:
        config, _, folder = part_config(args.part, args.runs, seeds, args.device)
        start = time.time()
        probe = run_probe(config, folder, args.device, args.splits, args.variants)
        path = os.path.join(folder, "probe.json")
        if args.variants is not None and os.path.isfile(path):  # the other variants' probes stay
            with open(path, encoding="utf-8") as f:
                probe = {**json.load(f), **probe}
        atomic_write_json(path, probe, indent=1)
        print(f"{args.part}: probe {time.time() - start:.0f} s")
    elif args.part is not None:
        out = run_part(args.part, args.runs, seeds, args.device, args.splits)
        print(f"{args.part}: {out['seconds']:.0f} s, probe {out['probe_seconds']:.0f} s")
        atomic_write_json(os.path.join(args.runs, f"part_{args.part}.json"), {k: out[k] for k in out if k != "results"})
    if args.merge or args.render or args.update:
        name = OUTPUT[args.setting]
        if args.merge:
            out = merge(args.runs, args.setting)
        elif args.update:
            with open(os.path.join(args.out, f"{name}.json"), encoding="utf-8") as f:
                out = update(json.load(f), merge(args.runs, args.setting))
        else:
            with open(os.path.join(args.out, f"{name}.json"), encoding="utf-8") as f:
                out = rerender(json.load(f))
        protocols.write_table(args.out, name, out, markdown(out), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
