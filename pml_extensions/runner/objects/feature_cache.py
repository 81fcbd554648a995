"""The ``feature_cache`` config key (``docs/feature_cache.md``): train the trunk's rest on cached outputs of its frozen
pretrained prefix (the library part is :class:`pml_extensions.datasets.FeatureCache`)."""

import contextlib
import hashlib
import os
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from ...datasets.feature_cache import DTYPES, dataset_digest
from ...trunks import split_trunk, trunk_stages
from ...utils.checks import is_int
from ..config.pb_keys import _where, nearest
from ..errors import ConfigError
from ..experiment import distributed as dist_utils

KEY = "feature_cache"
_MODULE = 'a module path (a string such as "0.17") or a stage index'


def _module(v) -> bool:
    return v is None or (is_int(v) or isinstance(v, str)) and v != ""


def _at_least(low: int):
    return f"an int >= {low}", lambda v: is_int(v) and v >= low


#: every key of ``feature_cache``: (default, what a value must be, its check); ``boundary`` is required
_KEYS: Dict[str, Tuple[Any, str, Callable[[Any], bool]]] = {
    "boundary": (None, _MODULE, _module),
    "num_views": (4, *_at_least(1)),
    "dtype": ("float16", f"one of {', '.join(DTYPES)}", lambda v: v in DTYPES),
    "derive_from": (None, _MODULE, _module),
    "view_seed": (0, *_at_least(0)),
    "batch_size": (64, *_at_least(1)),
    "chunk_size": (256, *_at_least(1)),
    "num_workers": (0, *_at_least(0)),
    "folder": (None, "a path or null", lambda v: v is None or isinstance(v, str)),
}
#: the keys of ``feature_cache`` and their defaults (``boundary`` has none)
DEFAULTS: Dict[str, Any] = {k: default for k, (default, _, _) in _KEYS.items()}


def cache_spec(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> Optional[Dict[str, Any]]:
    """The config's ``feature_cache`` with its defaults filled, checked (ConfigError); ``None`` when absent or null."""
    spec, where = config.get(KEY), _where(sources, KEY)
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError(f'{where}: expected a mapping such as {{boundary: "0.17", num_views: 2}}, got {spec!r}')
    unknown = sorted(set(spec) - set(DEFAULTS), key=str)
    if unknown:
        raise ConfigError(
            f"{where}.{unknown[0]}: no such key{nearest(str(unknown[0]), set(DEFAULTS), cutoff=0)} "
            f"(keys: {', '.join(DEFAULTS)})"
        )
    out = dict(DEFAULTS, **spec)
    if out["boundary"] is None:
        raise ConfigError(f"{where}: missing key 'boundary' (where the frozen part of models.trunk ends)")
    for key, (_, expected, ok) in _KEYS.items():
        if not ok(out[key]):
            raise ConfigError(f"{where}.{key}: expected {expected}, got {out[key]!r}")
    return out


def cache_folder(spec: Dict[str, Any], experiment_folder: str) -> str:
    """``spec["folder"]`` (relative to the working directory) or ``<experiment_folder>/feature_cache``."""
    return os.path.abspath(spec["folder"] or os.path.join(experiment_folder, KEY))


class FrozenParts(NamedTuple):
    """A trunk split for its feature cache: ``rest(prefix(x)) == trunk(x)``; with ``derive_from``,
    ``between(source_prefix(x)) == prefix(x)`` (else the three are ``None``)."""

    boundary: str
    prefix: torch.nn.Module
    rest: torch.nn.Module
    source_boundary: Optional[str] = None
    source_prefix: Optional[torch.nn.Module] = None
    between: Optional[torch.nn.Module] = None


def _resolve(trunk: torch.nn.Module, boundary, where: str) -> str:
    if not isinstance(boundary, int):  # a stage index: the module path where that stage ends
        return boundary
    try:
        stages = trunk_stages(trunk)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    if not -len(stages) <= boundary < len(stages):
        raise ConfigError(f"{where}: stage index {boundary} out of range; the trunk's stages end at {stages}")
    return stages[boundary]


def _split(trunk: torch.nn.Module, boundary: str, where: str, make_sequential=None):
    """``(prefix, rest)``; a ``Sequential`` trunk's rest keeps its later children's names."""
    try:
        prefix, rest = split_trunk(trunk, boundary)
        if not isinstance(trunk, torch.nn.Sequential):
            return prefix, rest
        top, _, inner = boundary.partition(".")
        names = [name for name, _ in trunk.named_children()]
        children = {name: getattr(trunk, name) for name in names[names.index(top) + 1 :]}
        if inner:
            child_rest = split_trunk(getattr(trunk, top), inner)[1]
            if any(n.op not in ("placeholder", "output") for n in child_rest.graph.nodes):  # not an identity
                children = {top: child_rest, **children}
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {str(e).splitlines()[0]}") from None
    rest = (make_sequential or torch.nn.Sequential)()
    for name, child in children.items():
        rest.add_module(name, child)
    return prefix, rest


def split_trunk_for_cache(trunk, spec: Dict[str, Any], where: str = f"config: {KEY}", make_sequential=None):
    """``trunk`` split at ``spec["boundary"]`` (and ``"derive_from"``) into :class:`FrozenParts`, the prefix frozen;
    ConfigError when it does not split there or ``derive_from`` is not a module before the boundary."""
    boundary = _resolve(trunk, spec["boundary"], f"{where}.boundary")
    prefix, rest = _split(trunk, boundary, f"{where}.boundary", make_sequential)
    prefix.requires_grad_(False)
    if spec.get("derive_from") is None:
        return FrozenParts(boundary, prefix, rest)
    source = _resolve(trunk, spec["derive_from"], f"{where}.derive_from")
    if source == boundary:
        raise ConfigError(f"{where}.derive_from: {source!r} is the boundary itself; name an earlier module")
    try:
        between = split_trunk(prefix, source)[1]
    except ValueError as e:
        raise ConfigError(
            f"{where}.derive_from: {source!r} must be a module before boundary {boundary!r} ({str(e).splitlines()[0]})"
        ) from None
    # split from the trunk itself, so its key equals that of the same boundary cached directly (a shared cache)
    source_prefix = _split(trunk, source, f"{where}.derive_from")[0].requires_grad_(False)
    return FrozenParts(boundary, prefix, rest, source, source_prefix, between)


@contextlib.contextmanager
def _file_lock(path: str):
    """An exclusive ``flock`` on ``path`` for the block (released when the file closes; none off POSIX)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a+") as handle:
        if os.name == "posix":
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def check_fixed_prefix(make_builder: Callable[[], Any], seeds: Sequence[int], where: str) -> None:
    """ConfigError at ``where`` when the frozen prefix of ``make_builder()`` (a fresh Builder) changes with the seed."""
    from ...datasets.feature_cache import prefix_digest
    from ..experiment.folder import seed_everything

    digests = set()
    for seed in (int(seeds[0]), int(seeds[0]) + 1):
        seed_everything(seed)
        builder = make_builder()
        builder.build_models()
        digests.add(prefix_digest(builder.frozen.prefix))
    if len(digests) > 1:
        raise ConfigError(
            f"{where}: the frozen prefix of models.trunk changes with the seed (random initialisation?); a feature "
            "cache needs the same frozen weights for every seed (e.g. pretrained: true)"
        )


def subset_key(dataset, indices: Sequence[int]) -> str:
    """A ``dataset_key`` for the items ``indices`` of ``dataset``."""
    h = hashlib.sha256(dataset_digest(dataset).encode())
    h.update(np.asarray(indices, dtype=np.int64).tobytes())
    return h.hexdigest()


def end_of_epoch_hook(dataset, then: Optional[Callable[[Any], Any]] = None) -> Callable[[Any], bool]:
    """A PML ``end_of_epoch_hook`` moving ``dataset`` (``CachedFeatureDataset``) to the next epoch's views, then
    ``then``'s."""

    def hook(trainer):
        dataset.set_epoch(int(trainer.epoch))
        answer = then(trainer) if then is not None else True
        return True if answer is None else answer

    return hook


class FeatureCaches:
    """The feature caches of one run (``builder``'s config holds ``feature_cache``; ValueError without it), by
    default inside ``experiment_folder``; ``log`` gets one line per cache built."""

    def __init__(self, builder, experiment_folder: str, log: Callable[..., None] = print):
        spec = cache_spec(builder.config, builder.sources)
        if spec is None:
            raise ValueError("FeatureCaches needs a config with a feature_cache key")
        self.spec, self.builder, self.log = spec, builder, log
        self.folder = cache_folder(spec, experiment_folder)

    def _build(self, part: str, boundary: str, spec: Dict[str, Any], rank=None, world_size=None, **objects):
        """``(cache, complete)``: the ``FeatureCache`` of ``part`` at ``boundary``, this process's chunks computed."""
        options = {k: self.spec[k] for k in ("dtype", "chunk_size", "batch_size")}
        options["folder"] = os.path.join(self.folder, boundary, part)
        cache = self.builder.build(f"{KEY}.{part}", {"FeatureCache": dict(options, **spec)}, **objects)
        if cache.complete:
            return cache, True
        name = os.path.relpath(cache.folder, self.folder)
        try:
            reason = None
            if not dist_utils.is_active():  # torchrun orders the ranks itself
                with _file_lock(cache.folder + ".lock"):
                    reason = cache.prepare()
            self.log(  # long work is announced before it starts (minutes for thousands of images on a CPU)
                f"feature cache {name}: computing the frozen prefix's outputs of {cache.num_items} images × "
                f"{cache.views.num_views} view(s) in {cache.num_chunks} chunks (once; every variant and seed reads "
                "them)"
            )
            done = cache.build(rank=rank, world_size=world_size)
        except (RuntimeError, TypeError, ValueError) as e:  # e.g. the prefix refuses the transformed images
            raise ConfigError(
                f"{self.builder.where(KEY)}.{part}: building the cache in {cache.folder} failed: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            ) from e
        reason = reason or cache.last_build.get("rebuilt")
        self.log(
            f"feature cache {name}: {cache.last_build['chunks_computed']} of {cache.num_chunks} chunks computed in "
            f"{cache.last_build['seconds']:.0f} s"
            + (f" ({reason})" if reason else "")
            + ("" if done else " (this process's shard; not complete yet)")
        )
        return cache, done

    def build(self, part, frozen, images, transform, num_views: int, dataset_key=None, rank=None, world_size=None):
        """``(folder, complete)``: the cache of ``part`` (``train``, ``test`` ...) at ``frozen.boundary`` built or
        found (first the ``derive_from`` one): ``num_views`` views of the untransformed ``images`` through
        ``transform``; ``dataset_key`` replaces their digest in the key; ``rank``, ``world_size``: only this shard."""
        derived = frozen.source_boundary is not None
        boundary, prefix = (frozen.source_boundary, frozen.source_prefix) if derived else frozen[:2]
        spec = dict(
            num_views=num_views, dataset_key=dataset_key, **{k: self.spec[k] for k in ("view_seed", "num_workers")}
        )
        cache, done = self._build(
            part, boundary, spec, rank, world_size, prefix=prefix, dataset=images, transform=transform
        )
        if not derived or not done:
            return cache.folder, done
        source = self.builder.build(
            f"{KEY}.{part}", {"CachedFeatureDataset": {"folder": cache.folder, "key": cache.key}}
        )
        cache, done = self._build(part, frozen.boundary, {}, prefix=frozen.between, dataset=source, transform=None)
        return cache.folder, done

    def dataset(self, part: str, frozen: FrozenParts, images, transform, num_views: int, seed: int = 0, **kwargs):
        """:meth:`build`'s cache as a ``CachedFeatureDataset`` drawing views with ``seed`` (ConfigError: unfinished)."""
        folder, done = self.build(part, frozen, images, transform, num_views, **kwargs)
        if not done:
            raise ConfigError(
                f"{self.builder.where(KEY)}: the cache in {folder} is incomplete (another process is building "
                "its shard); rerun when it has finished"
            )
        return self.builder.build(f"{KEY}.{part}", {"CachedFeatureDataset": {"folder": folder, "seed": int(seed)}})
