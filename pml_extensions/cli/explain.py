"""``python -m pml_extensions explain``: why are these two images similar?

Examples::

    python -m pml_extensions explain query.jpg other.jpg --out why/            # ImageNet MobileNetV2 + GAP
    python -m pml_extensions explain query.jpg photos/ --k 5 --checkpoint run/model.pth --out why/

Writes one PNG overlay per (query, reference) pair — query | reference (its true rank, cosine and class) |
"Decomposition" overall maps on both images ("Decomposition+Bias" too when the head's bias changes them) | one
point-specific map — and ``similarity.json`` (rank, cosine similarity and dot product of the pre-normalisation
embeddings, the file names and classes). A reference folder is read recursively, the first folder level naming the
class (as torchvision's ImageFolder); the query's own file (same path or same bytes) is left out of it, with a note.
Maps follow Zhu et al., "Visual Explanation for Deep Metric Learning", IEEE TIP 2021.
"""

from __future__ import annotations  # annotations name torch types that load only when a command runs

import argparse
import os
import sys
from typing import TYPE_CHECKING, List, Optional

if TYPE_CHECKING:
    import torch
    from torch import nn

# torch, PIL and the package's rooms are imported inside the functions: `explain --help` answers at once

DEFAULT_IMAGE_SIZE = 320


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors in one line on stderr (exit status 2) instead of the usage block and the error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (all options: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="pml_extensions explain",
        description="Explain the similarity of a query image and a reference image (or the top-k of a folder).",
    )
    p.add_argument("query", help="query image file")
    p.add_argument(
        "reference",
        help="reference image file, or a folder of images read recursively, one class per first-level folder "
        "(the top-k are explained; the query's own file is left out)",
    )
    p.add_argument("--out", default="explanations", help="output folder (default: explanations)")
    p.add_argument(
        "--checkpoint",
        default=None,
        help="what our runs write: an MLRC fold's best.pth or fold folder, the XML job's PML model "
        "folder (trunk_best*.pth / embedder_best*.pth), the resolution protocol's student or teacher "
        "file; the model is rebuilt from the run's config.yaml. Also a {'trunk': ..., 'embedder': ...} "
        "file (modules need --trust-checkpoint; state dicts without a config are read as MobileNetV2 + "
        "GAP and a Linear embedder). Default: the ImageNet MobileNetV2 features with GAP.",
    )
    p.add_argument(
        "--reference-checkpoint",
        default=None,
        help="the database model, when it differs from the query model (e.g. RAML: a student query "
        "against a teacher database); same formats as --checkpoint. Default: the query model",
    )
    p.add_argument("--trust-checkpoint", action="store_true", help="allow unpickling whole modules from --checkpoint")
    p.add_argument(
        "--layer",
        default=None,
        help="name of the trunk module whose [N, C, h, w] map (or [N, T, C] tokens) "
        "is explained, e.g. 'features.18' or '0.features'. Default: the last such module",
    )
    p.add_argument("--reference-layer", default=None, help="--layer for the reference model")
    p.add_argument(
        "--reference-image-size",
        type=int,
        default=None,
        help="square size of the reference images (default: --image-size); e.g. the teacher's database resolution",
    )
    p.add_argument(
        "--image-size",
        type=int,
        default=None,
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
        default=None,
        help="query pixel (in --image-size coordinates) for the point-specific map; default: the maximum "
        "of the query's overall map",
    )
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    return p


def _mobilenet_trunk(pretrained: bool) -> nn.Module:
    from torch import nn

    from pml_extensions.trunks.pretrained import mobilenet_v2_features

    return nn.Sequential(mobilenet_v2_features(pretrained=pretrained), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def load_models(checkpoint: Optional[str], trust: bool = False):
    """``(trunk, embedder)`` from ``checkpoint`` (see ``--checkpoint`` and
    :mod:`pml_extensions.runner.objects.saved_models`) or the ImageNet MobileNetV2.

    Raises:
        FileNotFoundError: a missing checkpoint; ValueError: an unreadable one (one line naming the file).
    """
    from torch import nn

    from ..runner.objects.saved_models import load_models as _load_models

    return _load_models(checkpoint, trust, default=lambda: (_mobilenet_trunk(True), nn.Identity()))


def load_image(path: str, size: int, channels: int = 3, keep_aspect: bool = False, stats=None) -> torch.Tensor:
    """Image file → ``[channels, size, size]`` tensor (resized without cropping, as the authors' demo), or
    with ``keep_aspect`` the shorter side resized to ``size`` (``[channels, size, W']`` or ``[channels, H',
    size]``); normalised with ``stats = (mean, std)`` when given (a run's own eval normalisation), else
    ImageNet-normalised for 3 channels and grey in [0, 1] for 1 channel."""
    from PIL import Image
    from torchvision.transforms import functional as TF

    from ..explain.reference_images import read_image

    im = read_image(path, "RGB" if channels == 3 else "L")  # transparency on white, as the datasets
    if keep_aspect:
        w, h = im.size
        new = (size, max(1, round(h * size / w))) if w <= h else (max(1, round(w * size / h)), size)
    else:
        new = (size, size)
    im = im.resize(new, Image.BILINEAR)
    x = TF.to_tensor(im)
    mean, std = stats if stats is not None else _default_stats(channels)
    return x if mean is None else TF.normalize(x, mean, std)


def _default_stats(channels: int):
    from ..datasets.normalization import IMAGENET_MEAN, IMAGENET_STD

    return (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else (None, None)


def _side(checkpoint, channels, size):
    """``(size, (mean, std))`` of one side: the run's own preprocessing when ``checkpoint`` is a run's file."""
    from ..runner.objects.saved_models import run_preprocessing

    run = run_preprocessing(checkpoint)
    fits = run is not None and (run["mean"] is None or len(run["mean"]) == channels)  # else a config we cannot read
    stats = (run["mean"], run["std"]) if fits else _default_stats(channels)
    return size or (run or {}).get("image_size") or DEFAULT_IMAGE_SIZE, stats


def _channels(trunk: nn.Module) -> int:
    from torch import nn

    for m in trunk.modules():
        if isinstance(m, nn.Conv2d):
            return int(m.in_channels)
    return 3


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command; returns the exit status (0 on success)."""
    args = build_parser().parse_args(argv)

    for flag, v in (("--image-size", args.image_size), ("--reference-image-size", args.reference_image_size)):
        if v is not None and v < 16:
            print(f"{flag} must be at least 16", file=sys.stderr)
            return 2
    if not os.path.isfile(args.query):
        print(f"query image {args.query} not found", file=sys.stderr)
        return 2
    import torch

    from ..explain.reference_images import ReferenceImage, exclude_query, list_reference_images

    excluded = []
    if os.path.isdir(args.reference):
        try:
            refs, excluded = exclude_query(args.query, list_reference_images(args.reference))
        except ValueError as e:
            print(str(e), file=sys.stderr)
            return 2
        for ref, why in excluded:
            print(f"left out {ref.path}: {why}")
        if not refs:
            print(f"{args.reference} holds no image but the query itself: nothing to compare with", file=sys.stderr)
            return 2
        if args.k < 1 or args.k > len(refs):
            left = " besides the query" if excluded else ""
            print(f"--k must be in [1, {len(refs)}] (the number of images in the folder{left})", file=sys.stderr)
            return 2
    elif os.path.isfile(args.reference):
        refs = [ReferenceImage(args.reference, None)]
    else:
        print(f"reference {args.reference} not found", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    from ..runner.errors import OUTPUT_ERRNOS, Interrupted, OutputError
    from ..runner.experiment.interrupts import raise_on_signals

    try:  # before the models load and the images are read: an --out that cannot be written stops at once
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise NotADirectoryError(20, "a file, not a folder", args.out)
        os.makedirs(args.out, exist_ok=True)
        if not os.access(args.out, os.W_OK):
            raise PermissionError(13, "Permission denied", args.out)
    except OSError as e:
        print(f"error: {OutputError.writing(f'--out {args.out}', e, '--out')}", file=sys.stderr)
        return 1

    try:
        with raise_on_signals():
            return _explain(args, refs, device, excluded)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the overlays written so far stay
        print(f"interrupted; the overlays written so far are in {args.out}; rerun the same command", file=sys.stderr)
        return 128 + (e.signal_number if isinstance(e, Interrupted) else 2)
    except OSError as e:
        if isinstance(e, FileNotFoundError) or e.errno not in OUTPUT_ERRNOS:
            print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
            return 2
        print(f"error: {OutputError.writing(e.filename or args.out, e, '--out')}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, RuntimeError) as e:  # RuntimeError: the model's forward
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2


def _explain(args, refs, device, excluded=()) -> int:
    import torch

    from ..explain.activation_decomposition import ActivationDecomposition
    from ..explain.overlay import explanation_panels, save_pair_overlay, to_display_image
    from ..utils.atomic_io import atomic_write_json

    # the query's class: that of its own file in the reference folder, when it was found there
    query_label = next((ref.label for ref, _ in excluded if ref.label is not None), None)
    labels = [ref.label for ref in refs]
    refs = [ref.path for ref in refs]
    left_out = "; ".join(f"{os.path.basename(ref.path)} ({why})" for ref, why in excluded)

    trunk, embedder = load_models(args.checkpoint, args.trust_checkpoint)
    ref_models = None
    if args.reference_checkpoint is not None:
        ref_models = load_models(args.reference_checkpoint, args.trust_checkpoint)
    for m in (trunk, embedder) + (tuple(ref_models) if ref_models else ()):
        m.to(device)
    try:
        dec = ActivationDecomposition(
            trunk,
            embedder,
            args.layer,
            reference_trunk=ref_models[0] if ref_models else None,
            reference_embedder=ref_models[1] if ref_models else None,
            reference_layer=args.reference_layer if ref_models else None,
        )
    except ValueError as e:
        raise ValueError(f"{e} (--layer / --reference-layer)") from None
    cq = _channels(trunk)
    cr = _channels(ref_models[0]) if ref_models else cq
    size_q, stats = _side(args.checkpoint, cq, args.image_size)
    if ref_models:
        size_r, stats_r = _side(args.reference_checkpoint, cr, args.reference_image_size or args.image_size)
    else:
        size_r, stats_r = args.reference_image_size or size_q, stats
    keep = not args.square
    q = load_image(args.query, size_q, cq, keep, stats).to(device)[None]
    try:
        fq = dec.fold_query(q)
        chunks = []
        for p in refs:  # one at a time: images keep their own aspect ratio
            chunks.append(dec.fold_reference(load_image(p, size_r, cr, keep, stats_r).to(device)[None]).embedding)
    except ValueError as e:
        msg = str(e)
        if "no module with a 4-D" in msg or "cannot be folded" in msg:
            names = [n for n, m in trunk.named_modules() if n][-3:]
            msg += f"; try --layer NAME with a module of the trunk, e.g. {', '.join(names)}"
        raise ValueError(msg.replace("; pass layer=... (a module of the trunk, or its name)", "")) from None
    emb = torch.cat(chunks)
    cos = torch.nn.functional.cosine_similarity(fq.embedding, emb, dim=1)
    order = torch.argsort(cos, descending=True)[: (args.k if len(refs) > 1 else 1)].tolist()
    os.makedirs(args.out, exist_ok=True)
    results = []
    qd = to_display_image(q[0], *stats)
    for rank, idx in enumerate(order):
        r = load_image(refs[idx], size_r, cr, keep, stats_r).to(device)[None]
        fr = dec.fold_reference(r)
        plain = dec.overall_maps(fq, fr)
        bias = dec.overall_maps(fq, fr, bias=True)
        h, w = fq.feature_size
        if args.point is not None:
            point = tuple(args.point)
        else:
            i, j = divmod(int(torch.argmax(plain["query"][0])), w)
            H, W = fq.image_size
            point = ((i + 0.5) * H / h - 0.5, (j + 0.5) * W / w - 0.5)
        pmap = dec.point_specific(fq, fr, [point])[0, 0]
        name = f"{rank:02d}_{os.path.splitext(os.path.basename(refs[idx]))[0]}.png"
        sim = float(cos[idx])  # the number the ranking used: title and similarity.json show the same one
        panels, note = explanation_panels(
            plain["query"][0], plain["reference"][0], bias["query"][0], bias["reference"][0], point, pmap
        )
        same = None if query_label is None or labels[idx] is None else labels[idx] == query_label
        path = save_pair_overlay(
            os.path.join(args.out, name),
            qd,
            [to_display_image(r[0], *stats_r)],
            [panels],
            title=f"{os.path.basename(args.query)} vs {os.path.basename(refs[idx])}",
            similarities=[sim],
            ranks=[rank + 1],
            reference_labels=[labels[idx]],
            same_class=[same],
            query_label=query_label,
            note="; ".join(n for n in (note, f"left out of the references: {left_out}" if left_out else None) if n),
        )
        results.append(
            {
                "reference": refs[idx],
                "label": labels[idx],
                "same_class": same,
                "rank": rank + 1,
                "cosine_similarity": sim,
                "dot_product": float(plain["dot"][0]),
                "overlay": path,
                "point": [float(point[0]), float(point[1])],
            }
        )
        print(f"{refs[idx]}: cosine similarity {sim:.4f} -> {path}")
    out = os.path.join(args.out, "similarity.json")
    atomic_write_json(
        out,
        {
            "query": args.query,
            "query_label": query_label,
            "maps": "Zhu et al. 2021 eq. 5, scale=cosine, signed",
            "excluded": [{"reference": ref.path, "reason": why} for ref, why in excluded],
            "results": results,
        },
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
