"""The papers' scale on one GPU in at most 10 minutes (issue 31, item 7): three runs of the existing runner.

    python benchmarks/paper_scale.py                      # CUDA: the three pieces (also `tox -e paper_scale`)
    python benchmarks/paper_scale.py --device cpu --tiny  # the same commands at toy size (1-3 min on 2 CPU cores)

Every piece is ``python -m pml_extensions run CONFIG --KEY VALUE ...``: a config of ``benchmarks/configs`` with its
protocol (``benchmarks.protocols``), merged with command-line overrides (powerful-benchmarker syntax); nothing here
trains a model itself. The overrides of each piece are :func:`piece_args` (``--tiny`` replaces some of them).

1. ``xml``: config ``xml_trained_clipart`` fully fine-tuned — no feature cache, every layer of the ImageNet
   MobileNetV2 (offline weights) trains — at 224 px (7 × 7 maps; drawings shrunk to 256 px, RandomResizedCrop 224 /
   Resize 256 + CenterCrop 224), Open Clip Art (Debian ``openclipart-png``); HistogramPooling + XMLWrapper
   (contrastive) against GAP, paired seeds, the untrained network as a row, the training length chosen on the
   validation classes (the config's ``mean_validation_curve`` over 6 × 50 iterations of batch 32). Claims: XML − GAP
   and GAP − untrained, δ = 1 MAP@R point.
2. ``template_block``: config ``template_block_table1 --variant full`` (Fashion-MNIST, the wide SmallResNet trained
   from scratch, ``init: paper``): baseline, block (λ = 0.5) and the auxiliary loss alone, 1500 iterations of batch
   64 under the one-cycle schedule (about 1.8 passes over the 54 000 training images; the schedule anneals to zero,
   so the last epochs move little), the checkpoint chosen on validation images. Claims: block − baseline and block −
   aux only, δ = 0.5 accuracy points.
3. ``raml``: config ``resolution_distillation`` on Open Clip Art at the paper's database / query resolutions 448 /
   160 px (40 classes, at most 100 test images per class): per seed a teacher (400 iterations at 448 px), then the
   student distilled from the frozen teacher (400 iterations of 25 images × 8 coupled views, learning rate 1e-4,
   its checkpoint chosen on the validation classes every 100 iterations). The teacher is not cached: the protocol
   has no teacher-embedding cache (``benchmarks/raml_teacher_cache.py`` times one with a stand-in bank), so it runs
   live, as in the paper. No low-resolution teacher, no learning-rate grid, no ablation students (budget). Claim:
   distilled asymmetric − naive asymmetric (the teacher on 160-px queries), δ = 1 MAP@R point.

Budget (one H200, estimated, not measured: no GPU was lent to this work): :data:`BUDGET_S` seconds per piece
(xml 240, template_block 150, raml 150), seeds :data:`SEEDS` declared before running (xml 4, template_block 3, raml 3;
``--seeds xml=6`` changes them), from these per-seed estimates: xml 50 s (two 300-iteration units, data-bound at
about 10 ms an iteration with 8 loader workers, 7 validations each, three tests of 3 519 images), template_block 40 s
(three 1500-iteration units at 6-9 ms), raml 45 s (teacher 400 × 8 images, student 400 × 200 views, about 60 ms an
iteration with 8 loader workers, evaluations at 448 and 160 px). A piece still running at its budget (+ 30 s) is
stopped and recorded ``timed out``; the runner resumes it when the same command runs again (finished units are
kept). The whole script stops starting pieces after :data:`TOTAL_S` seconds.

Writes each piece's ``results.json`` (and ``results.md``, ``report.html``) in its experiment folder,
``--root`` (default ``experiments/paper_scale``) ``/<piece>``, and a summary (wall time per piece, the claims'
verdicts and the other comparisons) to ``benchmarks/results/paper_scale.json`` + ``.md``; with ``--tiny`` both go to
``--out`` (default a new temporary folder), never to ``benchmarks/results``. On a machine without CUDA (and without
``--device cpu``) it prints one line and exits 0. The exit status is 1 if a piece failed or timed out.
"""

import argparse
import json
import os
import sys
import tempfile
import time

try:  # the repository's root is on sys.path (PYTHONPATH, pytest)
    from benchmarks import gpu_check
except ModuleNotFoundError:  # python benchmarks/paper_scale.py: benchmarks/ is sys.path[0]
    import gpu_check

REPO = gpu_check.REPO
RESULTS = gpu_check.RESULTS
EXPERIMENTS = os.path.join(REPO, "experiments", "paper_scale")
PIECES = ("xml", "template_block", "raml")
#: seconds of one H200 per piece (estimates; the pieces' own timing is recorded beside them)
BUDGET_S = {"xml": 240, "template_block": 150, "raml": 150}
#: a piece may run this much past its budget before it is stopped
GRACE_S = 30
#: no piece starts after this many seconds of the whole run (the 10 minutes less interpreter and CUDA start-up)
TOTAL_S = 570
#: seeds per piece (declared before running; ``--seeds PIECE=N``)
SEEDS = {"xml": 4, "template_block": 3, "raml": 3}
TINY_SEEDS = 2
IMAGENET = "{mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}"
#: (variant, baseline, claim, smallest effect in the metric's units) per piece; the RAML names are filled with the
#: dataset and the query resolution
CLAIMS = {
    "xml": [("contrastive_xml", "contrastive_gap", "greater", 0.01), ("contrastive_gap", "untrained", "greater", 0.01)],
    "template_block": [("block", "baseline", "greater", 0.5), ("block", "aux_only", "greater", 0.5)],
    "raml": [("{d}/{q}px/teacher_student_asymmetric", "{d}/{q}px/teacher_asymmetric", "greater", 0.01)],
}
MAP_AT_R = "mean_average_precision_at_r"
METRIC = {"xml": MAP_AT_R, "template_block": "test_accuracy", "raml": MAP_AT_R}
#: (scale, unit) of the differences in the summary: MAP@R is stored as a fraction, accuracy in %
UNITS = {"xml": (100.0, "MAP@R points"), "template_block": (1.0, "accuracy points"), "raml": (100.0, "MAP@R points")}
CONFIG = {"xml": "xml_trained_clipart", "template_block": "template_block_table1", "raml": "resolution_distillation"}


def _seed_list(n: int) -> str:
    return "[" + ", ".join(str(s) for s in range(n)) + "]"


def piece_args(piece: str, tiny: bool, device: str, seeds: int) -> dict:
    """``{flag: YAML value}`` of one piece's ``run`` command (without CONFIG and the folder flags); ``--tiny``
    replaces some entries (a value ``None`` drops the flag)."""
    if piece == "xml":
        from pml_extensions.datasets import glyph_dataset

        full = {
            "dataset~OVERRIDE~": "{name: openclipart, root: null, kwargs: {max_side: 256}}",
            "transforms~OVERRIDE~": "{train: {Compose: {transforms: [{RandomResizedCrop: {size: 224, scale: [0.6, "
            "1.0]}}, {RandomHorizontalFlip: {p: 0.5}}, {ToTensor: null}, {Normalize: " + IMAGENET + "}]}}, eval: "
            "{Compose: {transforms: [{Resize: {size: 256}}, {CenterCrop: {size: 224}}, {ToTensor: null}, "
            "{Normalize: " + IMAGENET + "}]}}}",
            "feature_cache": "null",
            "variants": "contrastive_gap contrastive_xml",  # the untrained row stays (untrained: true)
            "dataloader_num_workers": "8",
            "tester": "{GlobalEmbeddingSpaceTester: {batch_size: 256, dataloader_num_workers: 8}}",
        }
        small = {
            # six of matplotlib's fonts: about 180 glyphs per split, 6 per character
            "dataset~OVERRIDE~": "{name: glyphs, root: null, kwargs: {image_size: 32, font_files: "
            + json.dumps(glyph_dataset.matplotlib_font_files()[:6])
            + "}}",
            "transforms~OVERRIDE~": "{train: {Compose: {transforms: [{Grayscale: {num_output_channels: 3}}, "
            "{ToTensor: null}, {Normalize: " + IMAGENET + "}]}}, eval: {Compose: {transforms: [{Grayscale: "
            "{num_output_channels: 3}}, {ToTensor: null}, {Normalize: " + IMAGENET + "}]}}}",
            "num_epochs": "1",
            "iterations_per_epoch": "2",
            "batch_size": "8",
            "models": "{trunk: {Sequential: [{MobileNetV2Features: {pretrained: true}}, {HistogramPooling: "
            "{in_channels: 1280, num_prototypes: 8, scale: 100.0}}]}}",  # 8 prototypes: one batch of 1 x 1 maps
            "prototype_init": "{method: kmeans, num_batches: 1}",
            "dataloader_num_workers": "0",
            "tester": "{GlobalEmbeddingSpaceTester: {batch_size: 128, dataloader_num_workers: 0}}",
        }
    elif piece == "template_block":
        full = {
            "variant": "full",  # the wide SmallResNet, the whole training file, Adam 2e-3
            "variants": "baseline block aux_only",
            "num_epochs": "6",
            "iterations_per_epoch": "250",
        }
        small = {
            "variant": None,  # the default's narrow network
            "split": "{train: 20, val: 10, seed: 1234}",
            "test_dataset": "{FashionMNIST: {split: test, class_disjoint: false, max_per_class: 10, seed: 0}}",
            "num_epochs": "2",
            "iterations_per_epoch": "3",
            "batch_size": "16",
            "eval_batch_size": "200",
        }
    elif piece == "raml":
        full = {
            "datasets~OVERRIDE~": "{openclipart: {database_resolution: 448, query_resolutions: [160], max_classes: 40, "
            "max_side: 512, max_test_per_class: 100, crop_scale: [0.25, 1.0]}}",
            "teacher_iterations": "400",
            "student_iterations": "400",
            "checkpoint_every": "100",
            "images_per_batch": "25",
            "num_augmentations": "8",
            "student_lr_grid": "null",
            "low_resolution_teacher": "false",
            "student_variants": "[]",
            "num_workers": "8",
            "eval_batch_size": "256",
        }
        words = gpu_check.TINY_RESOLUTION  # gpu_check's toy size of this protocol: glyphs at 32 / 16 px
        small = {words[i][2:]: words[i + 1] for i in range(0, len(words), 2)}
    else:
        raise ValueError(f"piece must be one of {PIECES}, got {piece!r}")
    args = dict(full, seeds=_seed_list(seeds), device=device)
    if tiny:
        args.update(small)
    return {k: v for k, v in args.items() if v is not None}


def piece_command(piece: str, tiny: bool, device: str, seeds: int, root: str) -> list:
    """The ``python -m pml_extensions run ...`` command line of one piece, its experiment in ``root/<piece>``."""
    config = gpu_check._benchmark_configs().config_path(CONFIG[piece])
    cmd = gpu_check.cli("run", config, "--root_experiment_folder", root, "--experiment_name", piece)
    for flag, value in piece_args(piece, tiny, device, seeds).items():
        cmd += [f"--{flag}", value]
    return cmd


def claims_of(piece: str, tiny: bool) -> list:
    d, q = ("glyphs", 16) if tiny else ("openclipart", 160)  # the RAML piece's dataset and query resolution
    return [(v.format(d=d, q=q), b.format(d=d, q=q), claim, delta) for v, b, claim, delta in CLAIMS[piece]]


def read_piece(piece: str, folder: str, tiny: bool) -> dict:
    """What the summary keeps of one piece's ``results.json``: variants, seeds, the claims with their verdicts
    (Holm over the piece's claims) and every other comparison the protocol listed, as lines."""
    from pml_extensions.utils.paired_stats import holm
    from pml_extensions.utils.verdicts import compare, format_difference, verdict_word

    path = os.path.join(folder, "results.json")
    if not os.path.isfile(path):
        return {"results": None}
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    variants, metric = results.get("variants") or {}, METRIC[piece]
    scale, unit = UNITS[piece]
    claims, lines = [], []
    for v, b, claim, delta in claims_of(piece, tiny):
        if v in variants and b in variants:
            c = compare(variants, v, b, metric, smallest_effect=delta, claim=claim, per_class=results.get("per_class"))
            claims.append(c)
    for c, p_holm in zip(claims, holm([c.get("p_value") for c in claims])):  # one family: the piece's claims
        c["p_holm"] = p_holm
        c["verdict"] = word = verdict_word(c, c["claim"])
        lines.append(
            f"{c['variant']} − {c['baseline']}: {format_difference(c, 2, scale)} {unit} "
            f"(95 % t interval; δ = {scale * c['smallest_effect']:g}, claim {c['claim']}, Holm over the piece's "
            f"claims): {word}"
        )
    claimed = {(c["variant"], c["baseline"]) for c in claims}
    others = [
        f"{c['variant']} − {c['baseline']}: {format_difference(c, 2, scale)} {unit} (95 % t interval)"
        for c in results.get("comparisons") or []
        if (c["variant"], c["baseline"]) not in claimed and c.get("metric") == metric
    ]
    return {
        "results": path,
        "variants": sorted(variants),
        "seed_list": sorted({int(s) for v in variants.values() for s in v.get("per_seed", {})}),
        "means": {n: v.get("mean", {}).get(metric) for n, v in variants.items()},
        "claims": [
            {
                k: c.get(k)
                for k in (
                    "variant",
                    "baseline",
                    "metric",
                    "mean_difference",
                    "ci95",
                    "bootstrap_ci95",
                    "p_holm",
                    "claim",
                    "smallest_effect",
                    "verdict",
                    "differences",
                )
            }
            for c in claims
        ],  # fmt: skip
        "verdict_lines": lines,
        "comparison_lines": others,
    }


def render(result: dict) -> str:
    lines = [
        f"Paper scale on **{result['device_name']}** (torch {result['torch']}, {'tiny' if result['tiny'] else 'full'}"
        f" size), {result['total_seconds']:.0f} s in all (`python benchmarks/paper_scale.py"
        f"{' --device cpu --tiny' if result['tiny'] else ''}`).",
        "",
        "| piece | status | seconds | budget (s) | seeds | variants | results |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in result["pieces"]:
        results = p.get("results") or "–"
        results = os.path.relpath(results, REPO) if results.startswith(REPO + os.sep) else results
        lines.append(
            f"| {p['name']} | {p['status']} | {p['seconds']:.1f} | {p['budget_s']} | {p['seeds']} | "
            f"{', '.join(p.get('variants') or []) or '–'} | {results} |"
        )
    for p in result["pieces"]:
        what = f"toy size of: {p['what']}" if result["tiny"] else p["what"]
        lines += ["", f"**{p['name']}** — {what}"]
        if p.get("note"):
            lines.append(f"- note: {p['note'][:300]}")
        lines += [f"- {line}" for line in p.get("verdict_lines") or []]
        lines += [f"- {line}" for line in p.get("comparison_lines") or []]
    return "\n".join(lines) + "\n"


WHAT = {
    "xml": "HistogramPooling + XMLWrapper vs GAP (contrastive), ImageNet MobileNetV2 fully fine-tuned at 224 px, "
    "Open Clip Art",
    "template_block": "template-matching block (init: paper) vs plain and aux-only SmallResNet from scratch, "
    "Fashion-MNIST",
    "raml": "RAML student distilled from a 448-px teacher, 160-px queries, Open Clip Art (teacher live)",
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--tiny", action="store_true", help=f"toy sizes, {TINY_SEEDS} seeds (1-3 min on 2 CPU cores)")
    p.add_argument("--pieces", nargs="+", choices=PIECES, default=list(PIECES), help="run only these pieces")
    p.add_argument("--seeds", nargs="+", default=[], metavar="PIECE=N", help="seeds of a piece, e.g. xml=6")
    p.add_argument("--root", default=None, help="experiment folders (default experiments/paper_scale; tiny: --out)")
    p.add_argument("--out", default=None, help="summary folder (default benchmarks/results; tiny: a temp folder)")
    args = p.parse_args(argv)
    seeds = dict(SEEDS) if not args.tiny else dict.fromkeys(PIECES, TINY_SEEDS)
    for item in args.seeds:
        name, _, n = item.partition("=")
        if name not in PIECES or not n.isdigit() or int(n) < 1:
            print(f"paper_scale: --seeds: PIECE=N with PIECE in {PIECES} and N >= 1 expected, got {item!r}")
            return 2
        seeds[name] = int(n)

    import torch

    device, name, status = gpu_check.choose_device("paper_scale", args.device, "nothing to run")
    if device is None:
        return status
    out = args.out or (tempfile.mkdtemp(prefix="paper_scale_") if args.tiny else RESULTS)
    root = args.root or (os.path.join(out, "experiments") if args.tiny else EXPERIMENTS)
    gpu_check.IN_PROCESS["tiny"] = args.tiny  # tiny: the commands' main(argv) in this interpreter
    start = time.perf_counter()
    result = {"device": args.device, "device_name": name, "torch": torch.__version__, "tiny": args.tiny, "pieces": []}
    failed = False
    for piece in args.pieces:
        cmd = piece_command(piece, args.tiny, args.device, seeds[piece], root)
        entry = {"name": piece, "what": WHAT[piece], "budget_s": BUDGET_S[piece], "seeds": seeds[piece]}
        entry["command"] = " ".join(os.path.relpath(w, REPO) if os.path.isabs(w) else w for w in cmd[1:])
        left = TOTAL_S - (time.perf_counter() - start)
        if not args.tiny and left < 30:
            entry.update(status="skipped", seconds=0.0, note=f"the {TOTAL_S}-s budget is spent")
            result["pieces"].append(entry)
            continue
        print(f"paper_scale: {piece} ({seeds[piece]} seeds, budget {BUDGET_S[piece]} s) ...", flush=True)
        status, seconds, note = gpu_check.run_command(cmd, min(BUDGET_S[piece] + GRACE_S, left))
        if note.startswith("timed out"):
            status, note = "timed out", note + " (rerun the same command: the runner resumes the piece)"
        failed |= status != "ok"
        entry.update(status=status, seconds=round(seconds, 1), note=note)
        entry.update(read_piece(piece, os.path.join(root, piece), args.tiny))
        result["pieces"].append(entry)
        print(f"paper_scale: {piece}: {status} ({seconds:.1f} s) {note[:200]}", flush=True)
        for line in entry.get("verdict_lines") or []:
            print(f"  {line}", flush=True)
    result["total_seconds"] = round(time.perf_counter() - start, 1)
    table = render(result)
    from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

    path = os.path.join(out, "paper_scale.json")
    atomic_write_json(path, result, indent=1)
    atomic_write_text(os.path.join(out, "paper_scale.md"), table)
    print(table)
    print(f"paper_scale: wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
