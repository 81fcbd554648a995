"""``python -m pml_extensions explain``: why are these two images similar?

Examples::

    python -m pml_extensions explain query.jpg other.jpg --out why/            # ImageNet MobileNetV2 + GAP
    python -m pml_extensions explain query.jpg photos/ --k 5 --checkpoint run/model.pth --out why/

Writes one PNG overlay per (query, reference) pair — query | reference | "Decomposition" and
"Decomposition+Bias" overall maps on both images | one point-specific map — and ``similarity.json`` (cosine
similarity and dot product of the pre-normalisation embeddings, and the file names). Maps follow Zhu et al.,
"Visual Explanation for Deep Metric Learning", IEEE TIP 2021.
"""

import argparse
import os
import sys
from typing import List, Optional

import torch
from PIL import Image
from torch import nn

from ..utils.atomic_io import atomic_write_json

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pml_extensions explain",
        description="Explain the similarity of a query image and a reference image "
        "(or the top-k of a folder).",
    )
    p.add_argument("query", help="query image file")
    p.add_argument("reference", help="reference image file, or a folder of images (the top-k are explained)")
    p.add_argument("--out", default="explanations", help="output folder (default: explanations)")
    p.add_argument(
        "--checkpoint",
        default=None,
        help="a file with {'trunk': ..., 'embedder': ...} (modules, or state dicts for a "
        "MobileNetV2-features + GAP trunk and a Linear embedder), or a PML model folder with "
        "trunk_*.pth / embedder_*.pth. Default: the "
        "ImageNet MobileNetV2 features with GAP and no embedder.",
    )
    p.add_argument(
        "--trust-checkpoint", action="store_true", help="allow unpickling whole modules from --checkpoint"
    )
    p.add_argument(
        "--image-size", type=int, default=320, help="square input size in pixels (default 320: 10x10 maps)"
    )
    p.add_argument(
        "--k", type=int, default=5, help="references explained when REFERENCE is a folder (default 5)"
    )
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
    from pml_extensions.trunks.pretrained import mobilenet_v2_features

    return nn.Sequential(mobilenet_v2_features(pretrained=pretrained), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def _latest(folder: str, prefix: str) -> Optional[str]:
    files = sorted(f for f in os.listdir(folder) if f.startswith(prefix) and f.endswith(".pth"))
    best = [f for f in files if "best" in f]
    pick = (best or files)[-1:] if files else []
    return os.path.join(folder, pick[0]) if pick else None


def _load(path: str, trust: bool):
    """``torch.load`` with an error that names the file (empty, truncated or foreign files)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust)
    except Exception as e:  # torch raises EOFError, UnpicklingError, RuntimeError... for unreadable files
        raise ValueError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from e


def load_models(checkpoint: Optional[str], trust: bool = False):
    """``(trunk, embedder)`` from ``checkpoint`` (see ``--checkpoint``) or the ImageNet MobileNetV2.

    Raises:
        FileNotFoundError: a missing checkpoint; ValueError: a checkpoint that holds no trunk.
    """
    if checkpoint is None:
        return _mobilenet_trunk(True), nn.Identity()
    if not os.path.exists(checkpoint):
        raise FileNotFoundError(f"checkpoint {checkpoint} not found")
    if os.path.isdir(checkpoint):
        trunk_file, emb_file = _latest(checkpoint, "trunk_"), _latest(checkpoint, "embedder_")
        if trunk_file is None:
            raise ValueError(f"no trunk_*.pth in {checkpoint}")
        content = {"trunk": _load(trunk_file, trust)}
        if emb_file is not None:
            content["embedder"] = _load(emb_file, trust)
    else:
        content = _load(checkpoint, trust)
    if isinstance(content, nn.Module):
        return content, nn.Identity()
    if not isinstance(content, dict) or "trunk" not in content:
        raise ValueError(
            f"checkpoint {checkpoint} must hold a dict with a 'trunk' entry (module or state dict)"
        )
    trunk, embedder = content["trunk"], content.get("embedder")
    if not isinstance(trunk, nn.Module):
        state = {k.replace("module.", "", 1): v for k, v in trunk.items()}
        trunk = _mobilenet_trunk(False)
        trunk.load_state_dict(state)
    if embedder is None:
        embedder = nn.Identity()
    elif not isinstance(embedder, nn.Module):
        state = {k.replace("module.", "", 1): v for k, v in embedder.items()}
        weight = [v for k, v in state.items() if k.endswith("weight")]
        if len(weight) != 1 or weight[0].ndim != 2:
            raise ValueError(
                "embedder state dict must be a single Linear layer; save the module with --trust-checkpoint"
            )
        key = [k for k in state if k.endswith("weight")][0][: -len("weight")]
        lin = nn.Linear(weight[0].shape[1], weight[0].shape[0], bias=(key + "bias") in state)
        lin.load_state_dict({k[len(key) :]: v for k, v in state.items()})
        embedder = lin
    return trunk, embedder


def load_image(path: str, size: int) -> torch.Tensor:
    """RGB file → ``[3, size, size]`` ImageNet-normalised tensor (resized without cropping, as the authors'
    demo)."""
    from torchvision.transforms import functional as TF

    try:
        with Image.open(path) as im:
            im = im.convert("RGB").resize((size, size), Image.BILINEAR)
    except (OSError, Image.UnidentifiedImageError) as e:
        raise ValueError(f"cannot read image {path}: {e}") from e
    x = TF.to_tensor(im)
    return TF.normalize(x, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command; returns the exit status (0 on success)."""
    args = build_parser().parse_args(argv)
    from .activation_decomposition import ActivationDecomposition
    from .explanation_hook import IMAGENET_MEAN, IMAGENET_STD
    from .overlay import save_pair_overlay, to_display_image

    if args.image_size < 32:
        print("--image-size must be at least 32", file=sys.stderr)
        return 2
    if not os.path.isfile(args.query):
        print(f"query image {args.query} not found", file=sys.stderr)
        return 2
    if os.path.isdir(args.reference):
        refs = sorted(
            os.path.join(args.reference, f)
            for f in os.listdir(args.reference)
            if f.lower().endswith(IMAGE_EXTENSIONS)
        )
        if not refs:
            print(f"no images in {args.reference}", file=sys.stderr)
            return 2
        if args.k < 1 or args.k > len(refs):
            print(f"--k must be in [1, {len(refs)}] (the number of images in the folder)", file=sys.stderr)
            return 2
    elif os.path.isfile(args.reference):
        refs = [args.reference]
    else:
        print(f"reference {args.reference} not found", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    try:
        trunk, embedder = load_models(args.checkpoint, args.trust_checkpoint)
        load_image(args.query, args.image_size)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    trunk.to(device)
    embedder.to(device)
    dec = ActivationDecomposition(trunk, embedder)
    q = load_image(args.query, args.image_size).to(device)[None]
    fq = dec.fold_query(q)
    chunks = []
    for start in range(0, len(refs), 16):
        batch = torch.stack([load_image(p, args.image_size) for p in refs[start : start + 16]]).to(device)
        f = dec.fold_reference(batch)
        chunks.append(f)
    emb = torch.cat([c.embedding for c in chunks])
    cos = torch.nn.functional.cosine_similarity(fq.embedding, emb, dim=1)
    order = torch.argsort(cos, descending=True)[: (args.k if len(refs) > 1 else 1)].tolist()
    os.makedirs(args.out, exist_ok=True)
    results = []
    qd = to_display_image(q[0], IMAGENET_MEAN, IMAGENET_STD)
    for rank, idx in enumerate(order):
        r = load_image(refs[idx], args.image_size).to(device)[None]
        fr = dec.fold_reference(r)
        plain = dec.overall_maps(fq, fr)
        bias = dec.overall_maps(fq, fr, bias=True)
        h, w = fq.feature_size
        if args.point is not None:
            point = tuple(args.point)
        else:
            i, j = divmod(int(torch.argmax(plain["query"][0])), w)
            point = ((i + 0.5) * args.image_size / h - 0.5, (j + 0.5) * args.image_size / w - 0.5)
        try:
            pmap = dec.point_specific(fq, fr, [point])[0, 0]
        except ValueError as err:
            print(str(err), file=sys.stderr)
            return 2
        name = f"{rank:02d}_{os.path.splitext(os.path.basename(refs[idx]))[0]}.png"
        panels = [
            [
                ("Decomposition (query)", "query", plain["query"][0], point),
                ("Decomposition+Bias (query)", "query", bias["query"][0], None),
                ("Decomposition (reference)", "reference", plain["reference"][0], None),
                ("Decomposition+Bias (ref.)", "reference", bias["reference"][0], None),
                ("point-specific (ref.)", "reference", pmap, None),
            ]
        ]
        path = save_pair_overlay(
            os.path.join(args.out, name),
            qd,
            [to_display_image(r[0], IMAGENET_MEAN, IMAGENET_STD)],
            panels,
            title=f"cosine similarity {float(plain['similarity'][0]):.4f}",
        )
        results.append(
            {
                "reference": refs[idx],
                "cosine_similarity": float(plain["similarity"][0]),
                "dot_product": float(plain["dot"][0]),
                "overlay": path,
                "point": [float(point[0]), float(point[1])],
            }
        )
        print(f"{refs[idx]}: cosine similarity {float(plain['similarity'][0]):.4f} -> {path}")
    out = os.path.join(args.out, "similarity.json")
    atomic_write_json(
        out, {"query": args.query, "maps": "Zhu et al. 2021 eq. 5, scale=cosine, signed", "results": results}
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
