"""A finished run's models, rebuilt from its saved ``config.yaml`` and loaded with its weights (the layouts read are in
``docs/explain.md``); errors are one-line ``ValueError`` / ``FileNotFoundError`` naming the file."""

import os
import re
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from ...utils.checks import is_int
from ..errors import ConfigError
from ..experiment.checkpoint import first_sentence
from ..experiment.folder import read_json
from .builder import Builder

CONFIG_NAME = "config.yaml"


def _load(path: str, trust: bool):
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust)
    except Exception as e:  # EOFError, UnpicklingError, RuntimeError... for unreadable or pickled files
        if not trust and ("weights_only" in str(e) or "Unsupported global" in str(e)):
            raise ValueError(
                f"checkpoint {path} holds pickled Python objects (whole modules): pass --trust-checkpoint to "
                "load it (only for files you trust)"
            ) from None
        reason = first_sentence(e) if str(e) else ""
        raise ValueError(
            f"cannot read checkpoint {path}: {type(e).__name__}: {reason} (a truncated or corrupt file: copy it "
            "again, or rerun the training that wrote it)"
        ) from None


def _epoch(name: str) -> int:
    m = re.search(r"(\d+)\.pth$", name)
    return int(m.group(1)) if m else -1


def pml_model_files(folder: str) -> Tuple[Optional[str], Optional[str]]:
    """``(trunk file, embedder file)`` of a PML model folder: ``best`` files first, then the highest epoch."""
    picks = []
    for prefix in ("trunk_", "embedder_"):
        files = [f for f in os.listdir(folder) if re.fullmatch(rf"{prefix}(?!optimizer).*\.pth", f)]
        pool = [f for f in files if "best" in f] or files
        picks.append(os.path.join(folder, max(pool, key=lambda f: (_epoch(f), f))) if pool else None)
    return picks[0], picks[1]


def find_run_config(path: str, levels: int = 3) -> Tuple[Optional[dict], Optional[str]]:
    """The run's saved config (``config.yaml``, read with YAML 1.2 floats) in ``path``'s folder or above."""
    from ..config.specs import read_yaml

    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    for _ in range(levels + 1):
        candidate = os.path.join(folder, CONFIG_NAME)
        if os.path.isfile(candidate):
            with open(candidate, encoding="utf-8") as f:
                cfg = read_yaml(f)
            if not isinstance(cfg, dict):
                raise ValueError(f"run config {candidate} is not a mapping")
            return cfg, candidate
        folder = os.path.dirname(folder)  # the root is its own parent
    return None, None


def _variant_of(cfg: dict, path: str) -> dict:
    """``cfg`` of the variant whose folder holds ``path`` (``<experiment>/<variant>/...``: a paired unit, the XML
    job's ``models/``), else ``cfg`` itself."""
    chosen = [name for name in cfg.get("variants") or {} if name in os.path.abspath(path).split(os.sep)]
    if not chosen:
        return cfg
    from ..config.loader import variant_configs

    return variant_configs(cfg, [chosen[-1]])[chosen[-1]]


def run_preprocessing(checkpoint: Optional[str]) -> Optional[dict]:
    """``{"mean", "std", "image_size"}`` of the ``transforms.eval`` of the run (the checkpoint's variant): its
    ``Normalize``; the dataset's ``image_size``, else the shorter ``CenterCrop`` / ``Resize`` side; each None where
    unknown; None without them."""
    import torchvision.transforms as T

    cfg = find_run_config(checkpoint)[0] if checkpoint is not None else None
    cfg = _variant_of(cfg, checkpoint) if cfg is not None else None  # the model's variant fed it its images
    if cfg is None or not isinstance(cfg.get("transforms"), dict):
        return None  # no transforms of its own (e.g. a recipe that builds them): the command line's sizes
    keys = ("transforms", "normalize")
    try:
        steps = Builder({k: cfg[k] for k in keys if k in cfg}, log=lambda *a, **k: None).build_transform("eval")
    except ConfigError:  # a transform this process cannot build (e.g. a plugin's): the command line's sizes
        return None
    steps = steps.transforms
    norm = next((t for t in steps if isinstance(t, T.Normalize)), None)
    dataset = next(iter(cfg["dataset"].values())) if isinstance(cfg.get("dataset"), dict) else None
    size = dataset.get("image_size") if isinstance(dataset, dict) and len(cfg["dataset"]) == 1 else None
    for t in (t for kind in (T.CenterCrop, T.Resize) for t in steps if type(t) is kind):
        given = min(t.size) if isinstance(t.size, (list, tuple)) and t.size else t.size
        size = given if size is None and is_int(given) else size
    return {
        "mean": list(norm.mean) if norm else None,
        "std": list(norm.std) if norm else None,
        "image_size": size if is_int(size) else None,
    }


def models_from_config(
    cfg: dict, path: str, trunk_state: Optional[dict] = None
) -> Tuple[nn.Module, nn.Module, Optional[nn.Module]]:
    """``(trunk, embedder, prefix)`` of a run's config (``prefix``: the ``feature_cache`` frozen part, else None)."""
    cfg = _variant_of(cfg, path)
    models = cfg.get("models")
    if not isinstance(models, dict) or "trunk" not in models:
        raise ValueError(f"the run config for {path} has no models.trunk to rebuild the model from")
    cache = cfg.get("feature_cache")  # then the saved trunk is the rest after the frozen prefix (kept pretrained)
    channels = next((int(v.shape[1]) for v in (trunk_state or {}).values() if torch.is_tensor(v) and v.ndim == 4), 3)
    sample = torch.zeros(channels, 64, 64) if cache is None else None
    spec = _not_pretrained(models) if cache is None else models
    b = Builder({"models": spec, "feature_cache": cache}, log=lambda *a, **k: None)
    built = b.build_models(sample)
    return built["trunk"], built["embedder"], None if b.frozen is None else b.frozen.prefix


def _not_pretrained(spec):
    """``spec`` asking for no pretrained weights (``pretrained``, ``weights``, ``weights_path``)."""
    if not isinstance(spec, dict):
        return [_not_pretrained(v) for v in spec] if isinstance(spec, list) else spec
    weights = {k: None for k in ("weights", "weights_backbone") if isinstance(spec.get(k), str)}
    pretrained = {"pretrained": False} if spec.get("pretrained") is True else {}
    return {**{k: _not_pretrained(v) for k, v in spec.items() if k != "weights_path"}, **weights, **pretrained}


def _strip(state: dict) -> dict:
    return {k[len("module.") :] if k.startswith("module.") else k: v for k, v in state.items()}


def _load_state(module: nn.Module, state: dict, what: str, path: str) -> None:
    try:
        module.load_state_dict(_strip(state))
    except RuntimeError as e:
        raise ValueError(
            f"{what} of checkpoint {path} does not fit the model rebuilt from the run config: {str(e).splitlines()[0]}"
        ) from None


#: the model files a run's folder holds, in the order a folder given as a checkpoint is read: an mlrc fold's, a paired
#: unit's selected epoch, a paired unit's best validation epoch
RUN_MODEL_FILES = ("best.pth", "selected_models.pth", "best_models.pth")


def _folder_files(folder: str) -> Tuple[Optional[str], Optional[str]]:
    found = [f for f in RUN_MODEL_FILES if os.path.isfile(os.path.join(folder, f))]
    return (os.path.join(folder, found[0]), None) if found else pml_model_files(folder)


def load_models(checkpoint: Optional[str], trust: bool = False, default=None) -> Tuple[nn.Module, nn.Module]:
    """``(trunk, embedder)`` from ``checkpoint`` (see the module docstring); ``default()`` when it is None."""
    if checkpoint is None:
        return default()
    if not os.path.exists(checkpoint):
        raise FileNotFoundError(f"checkpoint {checkpoint} not found")
    folder = os.path.isdir(checkpoint)
    source, emb_file = _folder_files(checkpoint) if folder else (checkpoint, None)
    if source is None:
        folds = sorted(d for d in os.listdir(checkpoint) if d.startswith("fold_"))
        hint = f"; pass one fold folder, e.g. {os.path.join(checkpoint, folds[0])}" if folds else ""
        raise ValueError(f"no model file ({', '.join(RUN_MODEL_FILES)} or PML's trunk_*.pth) in {checkpoint}{hint}")
    content = _load(source, trust)
    if folder and os.path.basename(source) not in RUN_MODEL_FILES:  # PML's model folder: one file per model
        content = {"trunk": content, **({"embedder": _load(emb_file, trust)} if emb_file else {})}
    if isinstance(content, nn.Module):
        return content, nn.Identity()
    if not isinstance(content, dict) or "trunk" not in content:
        raise ValueError(f"checkpoint {checkpoint} must hold a dict with a 'trunk' entry (module or state dict)")
    trunk, embedder = content["trunk"], content.get("embedder")
    modules = isinstance(trunk, nn.Module) and (embedder is None or isinstance(embedder, nn.Module))
    cfg = None if modules else find_run_config(source)[0]
    if cfg is not None:
        built_trunk, built_emb, prefix = models_from_config(cfg, source, trunk if isinstance(trunk, dict) else None)
        if isinstance(trunk, dict):
            _load_state(built_trunk, trunk, "the trunk", source)
            trunk = built_trunk if prefix is None else nn.Sequential(prefix, built_trunk)  # the whole trunk
        if isinstance(embedder, dict):
            _load_state(built_emb, embedder, "the embedder", source)
            embedder = built_emb
    else:
        trunk, embedder = _without_config(trunk, embedder, source)
    return trunk, embedder if embedder is not None else nn.Identity()


def _without_config(trunk, embedder, path):
    """State dicts read without a run config: a MobileNetV2 + GAP trunk and a single-Linear embedder."""
    from pml_extensions.trunks.pretrained import mobilenet_v2_features

    if not isinstance(trunk, nn.Module):
        module = nn.Sequential(mobilenet_v2_features(pretrained=False), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        _load_state(module, trunk, "the trunk (no config.yaml found: read as MobileNetV2 + GAP)", path)
        trunk = module
    if embedder is not None and not isinstance(embedder, nn.Module):
        state = _strip(embedder)
        weights = [k for k in state if k.endswith("weight")]
        if len(weights) != 1 or state[weights[0]].ndim != 2:
            raise ValueError(
                f"checkpoint {path}: no config.yaml found and the embedder state is not a single Linear layer; "
                "save the run's config.yaml next to it or pass a module with --trust-checkpoint"
            )
        prefix, (out_size, in_size) = weights[0][: -len("weight")], state[weights[0]].shape
        embedder = nn.Linear(in_size, out_size, bias=prefix + "bias" in state)
        embedder.load_state_dict({k[len(prefix) :]: v for k, v in state.items()})
    return trunk, embedder


def _numbered(folder: str, prefix: str) -> List[int]:
    """The ``k`` of the sub-folders ``<prefix><k>`` of ``folder``, sorted."""
    found = [re.fullmatch(rf"{prefix}(\d+)", n) for n in (os.listdir(folder) if os.path.isdir(folder) else [])]
    return sorted(int(m.group(1)) for m in found if m and os.path.isdir(os.path.join(folder, m.group(0))))


def selected_model(run: str, variant=None, seed=None, fold=None) -> Dict[str, Any]:
    """The model an experiment folder selected (``<variant>/seed_<s>/{selected,best}_models.pth``, default the
    first variant and seed; mlrc's ``fold_<k>/best.pth``, default fold 0): ``{"checkpoint", "epoch", "unit",
    "variant", "seed", "fold", "others"}`` (the other units with a model). ValueError naming the units it has."""
    if not os.path.isdir(run):
        raise FileNotFoundError(f"--run {run} is not a folder (an experiment folder of python -m pml_extensions run)")
    if not os.path.isfile(os.path.join(run, CONFIG_NAME)):
        raise ValueError(f"--run {run} has no {CONFIG_NAME}: not an experiment folder of python -m pml_extensions run")
    folds = [k for k in _numbered(run, "fold_") if os.path.isfile(os.path.join(run, f"fold_{k}", "best.pth"))]
    # (unit, checkpoint, variant, seed, fold) of every unit with a model
    units = [(f"fold_{k}", os.path.join(run, f"fold_{k}", "best.pth"), None, None, k) for k in folds]
    if folds:
        if variant is not None or seed is not None:
            raise ValueError(
                f"--run {run}: an mlrc run has folds ({', '.join(map(str, folds))}), not variants and "
                "seeds: pass --fold K"
            )
        if fold is not None and int(fold) not in folds:
            raise ValueError(f"--run {run}: no fold_{fold}/best.pth; folds with a model: {', '.join(map(str, folds))}")
        chosen = units[0 if fold is None else folds.index(int(fold))]
    else:
        if fold is not None:
            raise ValueError(f"--run {run}: --fold is for mlrc runs (fold_<k>/best.pth); this run has none")
        names = list((find_run_config(run, levels=0)[0] or {}).get("variants") or {})
        for name in names or sorted(d for d in os.listdir(run) if _numbered(os.path.join(run, d), "seed_")):
            for s in _numbered(os.path.join(run, name), "seed_"):
                unit = os.path.join(run, name, f"seed_{s}")
                files = [f for f in ("selected_models.pth", "best_models.pth") if os.path.isfile(os.path.join(unit, f))]
                if files:
                    units.append((f"{name}/seed_{s}", os.path.join(unit, files[0]), name, s, None))
        if not units:
            raise ValueError(
                f"--run {run}: no trained model yet (no <variant>/seed_<s>/best_models.pth nor fold_<k>/best.pth); "
                "let the run finish a unit, or pass --checkpoint"
            )
        matching = [u for u in units if (variant is None or u[2] == variant) and (seed is None or u[3] == int(seed))]
        if not matching:
            have = ", ".join(f"{n} seed {s}" for _, _, n, s, _ in units)
            raise ValueError(f"--run {run}: no model for --variant {variant} --seed {seed}; models: {have}")
        chosen = matching[0]
    others = [u[0] for u in units if u[0] != chosen[0]]
    pick = dict(zip(("unit", "checkpoint", "variant", "seed", "fold"), chosen), others=others)
    return dict(pick, epoch=checkpoint_epoch(chosen[1]))


def _record(path: str) -> Dict[str, Any]:
    # a record the run wrote: {} when absent, one line naming it when corrupt (not an "epoch not recorded")
    data = read_json(path, "the run's command writes it again")
    return data if isinstance(data, dict) else {}


def checkpoint_epoch(checkpoint: str) -> Optional[int]:
    """The epoch of a run's model file (or folder) as the run recorded it (``results.json``, the unit's
    ``result.json``, or the file name: ``epoch_<e>.pth``, ``trunk_best<e>.pth``); None when unknown."""
    path = os.path.abspath(checkpoint)
    if os.path.isdir(path):
        path = _folder_files(path)[0] or path
    folder, name = os.path.split(path)
    parent, unit = os.path.split(folder)
    m = re.fullmatch(r"epoch_(\d+)\.pth", name) or re.fullmatch(r"trunk_best(\d+)\.pth", name)
    fold, seed = re.fullmatch(r"fold_(\d+)", unit), re.fullmatch(r"seed_(\d+)", unit)
    if m:
        epoch = int(m.group(1))
    elif fold and name == "best.pth":
        folds = _record(os.path.join(parent, "results.json")).get("folds") or []
        k = int(fold.group(1))
        epoch = folds[k].get("best_epoch") if k < len(folds) and isinstance(folds[k], dict) else None
    elif seed and name == "best_models.pth" and os.path.isfile(os.path.join(folder, "selected_models.pth")):
        epoch = _record(os.path.join(folder, "result.json")).get("best_epoch")  # the selection tested another
    elif seed and name in ("selected_models.pth", "best_models.pth"):
        run, variant = os.path.split(parent)
        units = (_record(os.path.join(run, "results.json")).get("units") or {}).get(variant) or {}
        entry = units.get(str(int(seed.group(1)))) or _record(os.path.join(folder, "result.json"))
        epoch = entry.get("selected_epoch", entry.get("best_epoch"))
    else:
        return None
    return int(epoch) if is_int(epoch) else None
