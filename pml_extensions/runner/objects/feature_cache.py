"""The ``feature_cache`` config key (``docs/feature_cache.md``): train the trunk's rest on cached outputs of its frozen
pretrained prefix (the library part is :class:`pml_extensions.datasets.FeatureCache`).

:meth:`~pml_extensions.runner.objects.builder.Builder.build_models` splits ``models.trunk`` where the frozen part
ends (:func:`split_trunk_for_cache`: ``models["trunk"]`` is the rest, ``builder.frozen`` the :class:`FrozenParts`);
:class:`FeatureCaches` builds (or finds, or resumes) one cache per boundary and part, ``<folder>/<boundary>/<part>``,
and returns the cached datasets; :func:`end_of_epoch_hook` moves the training set to the next epoch's views.

Example::

    >>> import torch
    >>> trunk = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
    ...                             torch.nn.Flatten())
    >>> frozen = split_trunk_for_cache(trunk, cache_spec({"feature_cache": {"boundary": "1"}}))
    >>> frozen.rest, frozen.boundary
    (Sequential(
      (2): AdaptiveAvgPool2d(output_size=1)
      (3): Flatten(start_dim=1, end_dim=-1)
    ), '1')
"""

import contextlib
import hashlib
import os
from collections import OrderedDict
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from ...datasets.feature_cache import DTYPES, dataset_digest
from ...trunks import split_trunk, trunk_stages
from ...utils.checks import is_int
from ..config.eval_keys import _where, nearest
from ..errors import ConfigError
from ..experiment import distributed as dist_utils

KEY = "feature_cache"
#: the keys of ``feature_cache`` and their defaults (``boundary`` has none)
DEFAULTS: Dict[str, Any] = {
    "boundary": None,
    "num_views": 4,
    "dtype": "float16",
    "derive_from": None,
    "view_seed": 0,
    "batch_size": 64,
    "chunk_size": 256,
    "num_workers": 0,
    "folder": None,
}
FOLDER_NAME = "feature_cache"


def cache_spec(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> Optional[Dict[str, Any]]:
    """The config's ``feature_cache`` with its defaults filled, checked; ``None`` when the key is absent or null.

    Raises:
        ConfigError: one line naming the file and the key of a bad value, an unknown key or a missing ``boundary``.

    Example::

        >>> cache_spec({"feature_cache": {"boundary": "0.17", "num_views": 2}})["dtype"]
        'float16'
    """
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
    for key in ("boundary", "derive_from"):
        value = out[key]
        if value is not None and (not (is_int(value) or isinstance(value, str)) or value == ""):
            raise ConfigError(
                f'{where}.{key}: expected a module path (a string such as "0.17") or a stage index, got {value!r}'
            )
    for key, low in (("num_views", 1), ("batch_size", 1), ("chunk_size", 1), ("view_seed", 0), ("num_workers", 0)):
        value = out[key]
        if not is_int(value) or value < low:
            raise ConfigError(f"{where}.{key}: expected an int >= {low}, got {value!r}")
    if out["dtype"] not in DTYPES:
        raise ConfigError(f"{where}.dtype: expected one of {', '.join(DTYPES)}, got {out['dtype']!r}")
    if out["folder"] is not None and not isinstance(out["folder"], str):
        raise ConfigError(f"{where}.folder: expected a path or null, got {out['folder']!r}")
    return out


def cache_folder(spec: Dict[str, Any], experiment_folder: str) -> str:
    """Where the caches live: ``spec["folder"]`` (relative to the working directory) or
    ``<experiment_folder>/feature_cache``."""
    return os.path.abspath(spec["folder"] if spec.get("folder") else os.path.join(experiment_folder, FOLDER_NAME))


class FrozenParts(NamedTuple):
    """A trunk split for its feature cache: ``rest(prefix(x)) == trunk(x)``; with ``derive_from``,
    ``between(source_prefix(x)) == prefix(x)`` (else the three are ``None``)."""

    boundary: str
    prefix: torch.nn.Module
    rest: torch.nn.Module
    source_boundary: Optional[str] = None
    source_prefix: Optional[torch.nn.Module] = None
    between: Optional[torch.nn.Module] = None


def _is_identity(graph_module) -> bool:
    return all(n.op in ("placeholder", "output") for n in graph_module.graph.nodes)


def _resolve(trunk: torch.nn.Module, boundary, where: str) -> str:
    if isinstance(boundary, int):
        try:
            stages = trunk_stages(trunk)
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        if not -len(stages) <= boundary < len(stages):
            raise ConfigError(f"{where}: stage index {boundary} out of range; the trunk's stages end at {stages}")
        return stages[boundary]
    return boundary


def _split(
    trunk: torch.nn.Module, boundary: str, where: str, make_sequential: Callable[[], torch.nn.Sequential] = None
) -> Tuple[torch.nn.Module, torch.nn.Module]:
    """``(prefix, rest)``; for a ``Sequential`` trunk the rest is a ``Sequential`` (from ``make_sequential``) of the
    trunk's later children under their own names, led by the rest of the child that holds the boundary (when
    something of it is left)."""
    try:
        prefix, rest = split_trunk(trunk, boundary)
        if not isinstance(trunk, torch.nn.Sequential):
            return prefix, rest
        top, _, inner = boundary.partition(".")
        names = [name for name, _ in trunk.named_children()]
        children = OrderedDict()
        if inner:
            child_rest = split_trunk(getattr(trunk, top), inner)[1]
            if not _is_identity(child_rest):
                children[top] = child_rest
        for name in names[names.index(top) + 1 :]:
            children[name] = getattr(trunk, name)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {str(e).splitlines()[0]}") from None
    rest = (make_sequential or torch.nn.Sequential)()
    for name, child in children.items():
        rest.add_module(name, child)
    return prefix, rest


def split_trunk_for_cache(
    trunk: torch.nn.Module,
    spec: Dict[str, Any],
    where: str = f"config: {KEY}",
    make_sequential: Optional[Callable[[], torch.nn.Sequential]] = None,
) -> FrozenParts:
    """Split ``trunk`` at ``spec["boundary"]`` (and ``spec["derive_from"]``): :class:`FrozenParts`, the prefix set to
    ``requires_grad=False``; a ``Sequential`` trunk's rest is an empty ``Sequential`` from ``make_sequential`` (the
    Builder's) filled with the trunk's later modules.

    Raises:
        ConfigError: ``"<where>.boundary: ..."`` when the trunk does not split there, or a ``derive_from`` that is
        not a module before ``boundary``.
    """
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
    source_prefix = _split(trunk, source, f"{where}.derive_from")[0]
    source_prefix.requires_grad_(False)
    return FrozenParts(boundary, prefix, rest, source, source_prefix, between)


@contextlib.contextmanager
def _file_lock(path: str):
    """An exclusive ``flock`` on ``path`` (created) for the block; a no-op where ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:  # not POSIX: concurrent preparation of one folder is then the user's to avoid
        yield
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_fixed_prefix(make_builder: Callable[[], Any], seeds: Sequence[int], where: str) -> None:
    """Refuse a frozen prefix that changes with the seed (one cache serves every seed and fold).

    Args:
        make_builder: returns a fresh :class:`~pml_extensions.runner.objects.builder.Builder` of the config (built
            after seeding ``seeds[0]``, then ``seeds[0] + 1``).
        where: ``"<file>: feature_cache"`` for the error.

    Raises:
        ConfigError: the two prefixes differ.
    """
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
    """A ``dataset_key`` for the items ``indices`` of ``dataset``: the dataset's digest
    (:func:`pml_extensions.datasets.feature_cache.dataset_digest`) and the indices.

    Example::

        >>> data = torch.utils.data.TensorDataset(torch.zeros(3, 1))
        >>> data.labels = np.array([0, 1, 1])
        >>> subset_key(data, [0, 2]) == subset_key(data, [0, 1])
        False
    """
    h = hashlib.sha256(dataset_digest(dataset).encode())
    h.update(np.asarray(indices, dtype=np.int64).tobytes())
    return h.hexdigest()


def end_of_epoch_hook(dataset, then: Optional[Callable[[Any], Any]] = None) -> Callable[[Any], bool]:
    """A PML ``end_of_epoch_hook`` that moves ``dataset`` (a :class:`~pml_extensions.datasets.CachedFeatureDataset`)
    to the next epoch's views, then returns ``then(trainer)``'s answer (or True)."""

    def hook(trainer):
        dataset.set_epoch(int(trainer.epoch))
        answer = then(trainer) if then is not None else True
        return True if answer is None else answer

    return hook


class FeatureCaches:
    """The feature caches of one run.

    Args:
        builder: the run's :class:`~pml_extensions.runner.objects.builder.Builder` (its config holds
            ``feature_cache``).
        experiment_folder: the run's folder (the default cache folder is inside it).
        log: a print-like function (one line per cache built).

    Raises:
        ConfigError: as :func:`cache_spec`; ValueError if the config has no ``feature_cache``.
    """

    def __init__(self, builder, experiment_folder: str, log: Callable[..., None] = print):
        spec = cache_spec(builder.config, builder.sources)
        if spec is None:
            raise ValueError("FeatureCaches needs a config with a feature_cache key")
        self.spec, self.builder, self.log = spec, builder, log
        self.folder = cache_folder(spec, experiment_folder)

    def _options(self) -> Dict[str, Any]:
        return {k: self.spec[k] for k in ("dtype", "chunk_size", "batch_size")}

    def _build(self, cache, part: str, rank: Optional[int], world_size: Optional[int]) -> bool:
        """Prepare (under a file lock, unless torchrun orders the ranks) and compute this process's chunks."""
        if cache.complete:
            return True
        try:
            reason = None
            if not dist_utils.is_active():
                with _file_lock(cache.folder + ".lock"):
                    reason = cache.prepare()
            self.log(  # long work is announced before it starts (minutes for thousands of images on a CPU)
                f"feature cache {os.path.relpath(cache.folder, self.folder)}: computing the frozen prefix's outputs of "
                f"{cache.num_items} images × {cache.views.num_views} view(s) in {cache.num_chunks} chunks (once; every "
                "variant and seed reads them)"
            )
            done = cache.build(rank=rank, world_size=world_size)
        except (RuntimeError, TypeError, ValueError) as e:  # e.g. the prefix refuses the transformed images
            raise ConfigError(
                f"{self.builder.where(KEY)}.{part}: building the cache in {cache.folder} failed: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            ) from e
        reason = reason or cache.last_build.get("rebuilt")
        self.log(
            f"feature cache {os.path.relpath(cache.folder, self.folder)}: {cache.last_build['chunks_computed']} of "
            f"{cache.num_chunks} chunks computed in {cache.last_build['seconds']:.0f} s"
            + (f" ({reason})" if reason else "")
            + ("" if done else " (this process's shard; not complete yet)")
        )
        return done

    def build(
        self,
        part: str,
        frozen: FrozenParts,
        images,
        transform,
        num_views: int,
        dataset_key: Optional[str] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
    ) -> Tuple[str, bool]:
        """Build (or find) the cache of ``part`` at ``frozen.boundary`` — first the source boundary's when the
        spec has ``derive_from`` — and return ``(folder, complete)``.

        Args:
            part: a name for the folder (``train``, ``test`` ...).
            frozen: the trunk's :class:`FrozenParts`.
            images, transform: the untransformed dataset (items ``(image, label)``, a ``labels`` array) and its
                transform.
            num_views: views per image.
            dataset_key: replaces the digest of ``images`` in the key (e.g. :func:`subset_key`).
            rank, world_size: compute only this shard. Default: everything, or torchrun's ranks.

        Raises:
            ConfigError: the cache's arguments refused (naming ``feature_cache.<part>``).
        """
        common = dict(self._options(), num_views=num_views, view_seed=self.spec["view_seed"])
        common.update(num_workers=self.spec["num_workers"])
        first = frozen.source_boundary if frozen.source_boundary is not None else frozen.boundary
        cache = self.builder.build(
            f"{KEY}.{part}",
            {"FeatureCache": dict(common, folder=os.path.join(self.folder, first, part), dataset_key=dataset_key)},
            prefix=frozen.source_prefix if frozen.source_boundary is not None else frozen.prefix,
            dataset=images,
            transform=transform,
        )
        done = self._build(cache, part, rank, world_size)
        if frozen.source_boundary is None or not done:
            return cache.folder, done
        source = self.builder.build(
            f"{KEY}.{part}", {"CachedFeatureDataset": {"folder": cache.folder, "key": cache.key}}
        )
        derived = self.builder.build(
            f"{KEY}.{part}",
            {"FeatureCache": dict(self._options(), folder=os.path.join(self.folder, frozen.boundary, part))},
            prefix=frozen.between,
            dataset=source,
            transform=None,
        )
        return derived.folder, self._build(derived, part, None, None)

    def dataset(self, part: str, frozen: FrozenParts, images, transform, num_views: int, seed: int = 0, **kwargs):
        """The finished cache of ``part`` (:meth:`build` first; ``kwargs`` go there) as a
        :class:`~pml_extensions.datasets.CachedFeatureDataset` drawing views with ``seed``.

        Raises:
            ConfigError: as :meth:`build`, or when another process has not finished its shard yet.
        """
        folder, done = self.build(part, frozen, images, transform, num_views, **kwargs)
        if not done:
            raise ConfigError(
                f"{self.builder.where(KEY)}: the cache in {folder} is incomplete (another process is building "
                "its shard); rerun when it has finished"
            )
        return self.builder.build(f"{KEY}.{part}", {"CachedFeatureDataset": {"folder": folder, "seed": int(seed)}})
