"""``python -m pml_extensions explain``: why are these two images similar? One PNG overlay per (query, reference) pair
and ``similarity.json`` (docs/explain.md: what it reads and writes); maps follow Zhu et al., "Visual Explanation for
Deep Metric Learning", IEEE TIP 2021.
"""

import argparse
import functools
import os
import signal
import sys
from typing import List, Optional

# torch, PIL and the package's heavy rooms are imported inside the functions: `explain --help` answers at once
from ..runner.errors import OUTPUT_ERRNOS, OutputError, first_line

_FIRST_IMAGE = "the query (the first test image)"
#: the side images are resized to when neither ``--image-size`` nor the run's config gives one
DEFAULT_IMAGE_SIZE = 320


def load_models(checkpoint: Optional[str], trust: bool = False):
    """``(trunk, embedder)`` of ``checkpoint`` (:func:`pml_extensions.runner.objects.saved_models.load_models`)."""
    from torch import nn

    from ..runner.objects.saved_models import load_models as _load_models
    from ..trunks.pretrained import mobilenet_v2_features

    def imagenet_mobilenet():
        trunk = nn.Sequential(mobilenet_v2_features(pretrained=True), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        return trunk, nn.Identity()

    return _load_models(checkpoint, trust, default=imagenet_mobilenet)


def side_of(checkpoint, channels, size):
    """``(size, (mean, std))`` of one side: the run's own preprocessing when ``checkpoint`` is a run's file."""
    from ..explain.reference_images import default_stats
    from ..runner.objects.saved_models import run_preprocessing

    run = run_preprocessing(checkpoint)
    if run is not None and run["mean"] is not None and len(run["mean"]) == 1 < channels:  # Normalize broadcasts
        run = {**run, "mean": run["mean"] * channels, "std": run["std"] * channels}
    fits = run is not None and (run["mean"] is None or len(run["mean"]) == channels)  # else a config we cannot read
    stats = (run["mean"], run["std"]) if fits else default_stats(channels)
    return size or (run or {}).get("image_size") or DEFAULT_IMAGE_SIZE, stats


def drop_bad(refs: list, skip: bool, where: str) -> list:
    """``refs`` whose files all decode (the runner's image check: the bad ones named, or left out with ``skip``)."""
    from ..datasets.image_files import ImageFileDataset
    from ..runner.objects.preflight import check_images

    files = ImageFileDataset()  # the runner's image check reads a dataset's paths and labels
    files.paths, files.labels = [r.path for r in refs], [0] * len(refs)
    kept = check_images(files, None, skip, where, log=print, skip_hint="--skip_bad_images")
    return refs if kept is files else [refs[int(i)] for i in kept.indices]


class RunData:
    """A run's model pick, test images (``refs``) and eval transform (the variant's config), as explain reads them."""

    def __init__(self, args, run: str):
        import numpy as np

        from ..explain.reference_images import ReferenceImage
        from ..runner.experiment.folder import read_json
        from ..runner.objects.builder import Builder
        from ..runner.objects.data import dataset_labels
        from ..runner.objects.preflight import image_paths
        from ..runner.objects.saved_models import _variant_of, checkpoint_epoch, find_run_config, selected_model

        if args.checkpoint is not None:
            if args.variant is not None or args.seed is not None or args.fold is not None:
                raise ValueError("--variant / --seed / --fold choose the run's model: leave them out with --checkpoint")
            self.checkpoint, self.epoch = args.checkpoint, checkpoint_epoch(args.checkpoint)
            # the unit the file belongs to: <variant>/seed_<s>/... or fold_<k>/...
            self.unit = os.path.relpath(os.path.abspath(args.checkpoint), os.path.abspath(run))
            self.others = []
        else:
            pick = selected_model(run, args.variant, args.seed, args.fold)
            self.checkpoint, self.epoch, self.unit = pick["checkpoint"], pick["epoch"], pick["unit"]
            self.others = pick["others"]
        cfg, _ = find_run_config(run, levels=0)
        if cfg is None:
            raise ValueError(f"--run {run} has no config.yaml")
        cfg = _variant_of(cfg, self.checkpoint)  # the model's variant: its images as the rebuilt model read them
        # every image file listed (explain leaves out the bad ones itself, naming them: drop_bad)
        self.builder = Builder({**cfg, "skip_bad_images": False}, log=lambda *a, **k: None)
        self.dataset, self.files, self.index = None, False, {}
        if args.reference is not None:
            return
        if cfg.get("dataset") is None:
            raise ValueError(f"--run {run}: its config has no dataset key to read the test images from; pass REFERENCE")
        # a protocol that split the classes itself lists its test classes there
        results = read_json(os.path.join(run, "results.json"), "the run's command writes it again") or {}
        test = results.get("test_classes")
        data = self.builder.build_dataset(None if test is not None else "test")
        paths = image_paths(data)
        self.files = paths is not None
        if paths is None:  # images drawn or decoded by the dataset itself (glyphs, Fashion-MNIST): one name per item
            paths = [f"{type(data).__name__}[{i}]" for i in range(len(data))]
        labels = dataset_labels(data)
        keep = np.arange(len(paths)) if test is None else np.nonzero(np.isin(labels, np.asarray(test)))[0]
        classes = getattr(data, "classes", None)
        self.dataset, self.index = data, {paths[int(i)]: int(i) for i in keep}

        def name(y):
            return str(classes[int(y)]) if classes is not None and 0 <= int(y) < len(classes) else str(int(y))

        refs = [ReferenceImage(paths[int(i)], name(labels[int(i)])) for i in keep]
        skip = bool(args.skip_bad_images or cfg.get("skip_bad_images") is True)
        self.refs = drop_bad(refs, skip, f"--run {run}: dataset") if self.files else refs

    def loader(self):
        """``path -> [C, H, W]``: the dataset's reading of its item (or the file), through the run's eval transform."""
        import torch

        from ..explain.reference_images import read_image

        transform = self.builder.build_transform("eval")
        load = getattr(self.dataset, "load_image", None) if self.files else None

        def read(path):
            if path in self.index:  # an item of the run's dataset, read as the dataset reads it
                i = self.index[path]
                image = load(i) if load is not None else self.dataset[i][0]
            else:
                image = read_image(path, "RGB")
            x = transform(image)
            if not torch.is_tensor(x) or x.ndim != 3:
                raise ValueError(f"the run's transforms.eval gives {type(x).__name__}, not a [C, H, W] tensor")
            return x

        return read


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pml_extensions explain",
        description="Explain the similarity of a query image and a reference image (or the top-k of a folder).",
    )
    # errors in one line on stderr (exit status 2) instead of the usage block and the error
    p.error = lambda message: p.exit(2, f"{p.prog}: error: {message} (all options: {p.prog} --help)\n")
    p.add_argument("query", nargs="?", help="query image file (with --run: default the first test image)")
    p.add_argument(
        "reference",
        nargs="?",
        help="reference image file, a folder of images read recursively (one class per first-level folder), or a "
        "CSV table of images (label and path columns; --columns maps others); the top-k are explained and the "
        "query's own file is left out. With --run: default the run's test images",
    )
    p.add_argument("--out", default="explanations", help="output folder (default: explanations)")
    p.add_argument(
        "--run",
        metavar="EXPERIMENT_FOLDER",
        help="an experiment folder of `python -m pml_extensions run`: its selected model (unless --checkpoint), its "
        "test images (unless REFERENCE) and its eval transform (unless --image-size)",
    )
    p.add_argument("--variant", help="with --run: the variant explained")
    p.add_argument("--seed", type=int, help="with --run: the seed explained")
    p.add_argument("--fold", type=int, help="with --run: the fold explained (default 0)")
    p.add_argument(
        "--columns",
        help="for a CSV REFERENCE: its columns, e.g. label=category,path=image (see ImageCSVSplit)",
    )
    p.add_argument(
        "--skip_bad_images",
        "--skip-bad-images",
        action="store_true",
        help="leave out reference images that do not decode (one note) instead of stopping (`--skip_bad_images true`, "
        "as the run's key is given, works too)",
    )
    p.add_argument(
        "--checkpoint",
        help="what our runs write: an MLRC fold's best.pth or fold folder, the XML job's PML model "
        "folder (trunk_best*.pth / embedder_best*.pth), the resolution protocol's student or teacher "
        "file; the model is rebuilt from the run's config.yaml. Also a {'trunk': ..., 'embedder': ...} "
        "file (modules need --trust-checkpoint; state dicts without a config are read as MobileNetV2 + "
        "GAP and a Linear embedder). Default: the ImageNet MobileNetV2 features with GAP.",
    )
    p.add_argument(
        "--reference-checkpoint",
        help="the database model, when it differs from the query model (e.g. RAML: a student query "
        "against a teacher database); same formats as --checkpoint. Default: the query model",
    )
    p.add_argument("--trust-checkpoint", action="store_true", help="allow unpickling whole modules from --checkpoint")
    p.add_argument(
        "--layer",
        help="name of the trunk module whose [N, C, h, w] map (or [N, T, C] tokens) "
        "is explained, e.g. 'features.18' or '0.features'. Default: the last such module",
    )
    p.add_argument("--reference-layer", help="--layer for the reference model")
    p.add_argument(
        "--reference-image-size",
        type=int,
        help="square size of the reference images (default: --image-size); e.g. the teacher's database resolution",
    )
    p.add_argument(
        "--image-size",
        type=int,
        help="shorter side of the query images in pixels (default: the run's image size when --checkpoint is a "
        "run's file, else 320: 10 x w maps for MobileNetV2); images are normalised as the run's eval transform",
    )
    p.add_argument(
        "--square",
        action="store_true",
        help="resize images to --image-size squares (the authors' demo); default: the shorter side to "
        "--image-size, aspect ratio kept",
    )
    p.add_argument("--k", type=int, default=5, help="references explained when REFERENCE is a folder (default 5)")
    p.add_argument(
        "--point",
        type=float,
        nargs=2,
        metavar=("Y", "X"),
        help="query pixel (in --image-size coordinates) for the point-specific map; default: the maximum "
        "of the query's overall map",
    )
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command; returns the exit status (0 on success)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    for i in range(len(argv) - 1, -1, -1):  # `--skip_bad_images true` as `run` spells the key; false drops it
        if argv[i] in ("--skip_bad_images", "--skip-bad-images") and i + 1 < len(argv):
            value = argv[i + 1].lower()
            if value in ("true", "false"):
                argv[i : i + 2] = [argv[i]] if value == "true" else []
    args = parser.parse_args(argv)

    for flag, v in (("--image-size", args.image_size), ("--reference-image-size", args.reference_image_size)):
        if v is not None and v < 16:
            return _fail(f"{flag} must be at least 16")
    run = args.run
    if run is None and args.reference is None and args.checkpoint is not None:  # a run's file: what it trained on
        from ..runner.objects.saved_models import find_run_config

        try:
            run = os.path.dirname(find_run_config(args.checkpoint)[1] or "") or None
        except (OSError, ValueError):
            pass
    if run is None and (args.query is None or args.reference is None):
        parser.error("the following arguments are required: query, reference")
    if run is not None and args.reference_checkpoint is not None:
        return _fail("--reference-checkpoint is not for a run's model (--run): pass both checkpoints")
    if args.query is not None and not os.path.isfile(args.query):
        return _fail(f"query image {args.query} not found")
    if args.reference is not None:  # a folder, a CSV table or one file
        from ..explain.reference_images import ReferenceImage, list_reference_images, list_table_images

        try:
            if os.path.isdir(args.reference):
                refs = list_reference_images(args.reference)
            elif not os.path.isfile(args.reference):
                raise FileNotFoundError(f"reference {args.reference} not found")
            elif args.reference.lower().endswith(".csv"):
                refs = list_table_images(args.reference, args.columns)
            else:
                refs = [ReferenceImage(args.reference, None)]
        except (OSError, ValueError) as e:
            return _fail(first_line(e))
    import torch

    from ..runner.errors import raise_on_signals

    try:  # before the models load and the images are read: an --out that cannot be written stops at once
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise NotADirectoryError(20, "a file, not a folder", args.out)
        os.makedirs(args.out, exist_ok=True)
        if not os.access(args.out, os.W_OK):
            raise PermissionError(13, "Permission denied", args.out)
    except OSError as e:
        return _fail(f"error: {OutputError.writing(f'--out {args.out}', e, '--out')}", 1)

    device = torch.device(args.device)
    try:
        with raise_on_signals():
            data = RunData(args, run) if run is not None else None
            many = args.reference is None or os.path.isdir(args.reference) or args.reference.lower().endswith(".csv")
            if args.reference is None:
                refs = data.refs
            elif many:
                refs = drop_bad(refs, args.skip_bad_images, f"reference {args.reference}")
            query, excluded = args.query, []
            if not refs:
                return _fail("no reference image to compare with")
            if query is None:  # the first test image: itself left out of its references
                query, excluded, refs = refs[0].path, [(refs[0], _FIRST_IMAGE)], refs[1:]
            elif many and (data is None or args.reference is not None or data.files):
                from ..explain.reference_images import exclude_query

                refs, excluded = exclude_query(query, refs)
            for ref, why in excluded:
                if why != _FIRST_IMAGE:
                    print(f"left out {ref.path}: {why}")
            if not refs:
                return _fail("the references hold no image but the query itself: nothing to compare with")
            if many and (args.k < 1 or args.k > len(refs)):
                left = " besides the query" if excluded else ""
                return _fail(f"--k must be in [1, {len(refs)}] (the number of reference images{left})")
            return _explain(args, query, refs, device, excluded, data)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the overlays written so far stay
        message = f"interrupted; the overlays written so far are in {args.out}; rerun the same command"
        return _fail(message, 128 + getattr(e, "signal_number", signal.SIGINT))
    except (OSError, ValueError, TypeError, RuntimeError) as e:  # RuntimeError: the model's forward
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError) and e.errno in OUTPUT_ERRNOS:
            return _fail(f"error: {OutputError.writing(e.filename or args.out, e, '--out')}", 1)
        return _fail(f"error: {first_line(e)}")


def _fail(message: str, status: int = 2) -> int:
    print(message, file=sys.stderr)
    return status


def _explain(args, query, refs, device, excluded=(), data: Optional[RunData] = None) -> int:
    import torch

    from ..explain import overlay
    from ..explain.activation_decomposition import ActivationDecomposition
    from ..explain.diagnostics import coarse_map_warning, collapse_warning
    from ..explain.reference_images import load_image
    from ..explain.topk_maps import explain_retrieval
    from ..runner.objects.preflight import trunk_input_channels
    from ..runner.objects.saved_models import checkpoint_epoch
    from ..utils.atomic_io import atomic_write_json

    # the query's class: that of its own file among the references, when it was found there
    query_label = next((ref.label for ref, _ in excluded if ref.label is not None), None)
    labels = [ref.label for ref in refs]
    refs = [ref.path for ref in refs]
    left_out = "; ".join(f"{os.path.basename(r.path)} ({why})" for r, why in excluded if why != _FIRST_IMAGE)

    checkpoint = data.checkpoint if data is not None else args.checkpoint
    epoch = data.epoch if data is not None else (checkpoint_epoch(checkpoint) if checkpoint else None)
    trunk, embedder = (m.to(device) for m in load_models(checkpoint, args.trust_checkpoint))
    if data is not None:
        more = f"; other models: {', '.join(data.others[:6])} (--variant / --seed / --fold)" if data.others else ""
        at = f"epoch {epoch}" if epoch is not None else "epoch not recorded"
        print(f"model: {data.unit}, {at} ({checkpoint}){more}")
    ref = {}
    if args.reference_checkpoint is not None:
        models = (m.to(device) for m in load_models(args.reference_checkpoint, args.trust_checkpoint))
        ref = dict(zip(("reference_trunk", "reference_embedder"), models), reference_layer=args.reference_layer)
    ref_trunk = ref.get("reference_trunk")
    try:
        dec = ActivationDecomposition(trunk, embedder, args.layer, **ref)
    except ValueError as e:
        raise ValueError(f"{e} (--layer / --reference-layer)") from None
    cq = trunk_input_channels(trunk) or 3  # a trunk without a convolution: RGB
    cr = (trunk_input_channels(ref_trunk) or 3) if ref_trunk is not None else cq
    size_q, stats = side_of(checkpoint, cq, args.image_size)
    if data is not None and args.reference is None and not data.files and args.image_size is not None:
        raise ValueError("--image-size resizes image files; this run's dataset draws its images: leave it out")
    if data is not None and args.image_size is None:  # the run's own eval transform, as its tester read the images
        load_q = load_r = data.loader()
        stats_r = stats
    else:
        size_r, stats_r = args.reference_image_size or size_q, stats
        if ref_trunk is not None:
            size_r, stats_r = side_of(args.reference_checkpoint, cr, args.reference_image_size or args.image_size)
        load_q = functools.partial(load_image, size=size_q, channels=cq, keep_aspect=not args.square, stats=stats)
        load_r = functools.partial(load_image, size=size_r, channels=cr, keep_aspect=not args.square, stats=stats_r)

    q = load_q(query).to(device)[None]
    try:
        fq = dec.fold_query(q)
        chunks, batch = [], []
        for p in refs:  # batches of images of one shape (kept aspect ratios may differ)
            x = load_r(p)
            if batch and (x.shape != batch[0].shape or len(batch) == 32):
                chunks.append(dec.fold_reference(torch.stack(batch).to(device)).embedding)
                batch = []
            batch.append(x)
        chunks.append(dec.fold_reference(torch.stack(batch).to(device)).embedding)
    except ValueError as e:
        msg = str(e)
        if "no module with a 4-D" in msg or "cannot be folded" in msg:
            names = [n for n, m in trunk.named_modules() if n][-3:]
            msg += f"; try --layer NAME with a module of the trunk, e.g. {', '.join(names)}"
        raise ValueError(msg.replace("; pass layer=... (a module of the trunk, or its name)", "")) from None
    emb = torch.cat(chunks)
    cos = torch.nn.functional.cosine_similarity(fq.embedding, emb, dim=1)
    order = torch.argsort(cos, descending=True)[: (args.k if len(refs) > 1 else 1)].tolist()
    runner = dec.query_folder.runner

    def feature_side(side: int) -> int:
        with torch.no_grad():
            shape = runner.run(torch.zeros(1, q.shape[1], side, side, device=device, dtype=q.dtype)).feature_map.shape
        return int(min(shape[-2:]))

    collapse = collapse_warning(torch.cat([fq.embedding, emb]).detach(), what="images (the query and every reference)")
    warnings = [
        line for line in (collapse, coarse_map_warning(tuple(q.shape[-2:]), fq.feature_size, feature_side)) if line
    ]
    for line in warnings:
        print(line, file=sys.stderr)
    prefix = f"epoch{epoch}_" if epoch is not None else ""
    model = f" ({data.unit}, epoch {epoch})" if data is not None and epoch is not None else ""
    similarities = [float(cos[idx]) for idx in order]  # the numbers the ranking used: titles and similarity.json
    rows = explain_retrieval(
        dec,
        q[0],
        [load_r(refs[idx]).to(device) for idx in order],
        [
            os.path.join(args.out, f"{prefix}{rank:02d}_{os.path.splitext(os.path.basename(refs[idx]))[0]}.png")
            for rank, idx in enumerate(order)
        ],
        titles=[f"{os.path.basename(query)} vs {os.path.basename(refs[idx])}{model}" for idx in order],
        point=args.point,
        stats=stats,
        reference_stats=stats_r,
        similarities=similarities,
        reference_labels=[labels[idx] for idx in order],
        query_label=query_label,
        note=f"left out of the references: {left_out}" if left_out else None,
    )
    results = [
        {"reference": refs[idx], **{key: v for key, v in row.items() if key != "maps"}} for idx, row in zip(order, rows)
    ]
    shown = overlay.format_cosines(similarities)  # as the overlays: distinct ranks print apart
    for rank, (idx, row) in enumerate(zip(order, rows)):
        print(f"{refs[idx]}: cosine similarity {shown[rank]} -> {row['overlay']}")
    atomic_write_json(
        os.path.join(args.out, "similarity.json"),
        {
            "query": query,
            "query_label": query_label,
            "model": {"checkpoint": checkpoint, "epoch": epoch, "unit": data.unit if data is not None else None},
            "maps": "Zhu et al. 2021 eq. 5, scale=cosine, signed",
            "feature_map": list(fq.feature_size),
            "warnings": warnings,
            "excluded": [{"reference": ref.path, "reason": why} for ref, why in excluded],
            "results": results,
        },
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
