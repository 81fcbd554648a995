"""Frozen-prefix feature cache: the prefix's outputs for V seeded views of every image, computed once into one
memory-mapped ``.npy`` (layout, key, resume and shards: docs/feature_cache.md)."""

import functools
import hashlib
import json
import os
import re
import shutil
import time
from typing import Callable, Optional

import numpy as np
import torch

from ..utils.atomic_io import atomic_path, atomic_write_json, atomic_write_text
from ..utils.checks import int_at_least
from ..utils.eval_mode import eval_mode
from .cached_feature_dataset import FORMAT, CachedFeatureDataset
from .seeded_view_dataset import SeededViewDataset, _labels_of

DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64}
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _dtype_name(dtype) -> str:
    name = str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else dtype
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} (or the torch dtype), got {dtype!r}")
    return name


def _opaque_part(transform) -> Optional[str]:
    """What in ``transform`` its ``repr`` hides (a torchvision ``Lambda``'s function, a memory address), or None."""
    stack = [transform]
    while stack:
        t = stack.pop()
        if type(t).__name__ == "Lambda" and type(t).__module__.startswith("torchvision."):
            return "Lambda's function"
        stack.extend(getattr(t, "transforms", None) or [])
    return "object shown by memory address" if _ADDRESS.search(repr(transform)) else None


def _sha(chunks) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(c if isinstance(c, bytes) else str(c).encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


def prefix_digest(prefix: torch.nn.Module) -> str:
    """SHA-256 hex of a module's ``repr`` (memory addresses dropped) and every ``state_dict`` tensor (name, dtype, size,
    bytes on the CPU): equal for equal weights on any device."""

    def parts():
        yield _ADDRESS.sub("", repr(prefix))
        for name, t in sorted(prefix.state_dict().items()):
            t = t.detach().to("cpu").contiguous().reshape(-1)
            yield f"{name}|{t.dtype}|{t.numel()}"
            yield t.view(torch.uint8).numpy().tobytes()

    return _sha(parts())


def _scalars(obj) -> dict:
    out = {}
    for k, v in sorted(vars(obj).items()):
        if k.startswith("_") or k in ("transform", "paths", "labels"):
            continue
        if isinstance(v, (str, int, float, bool, type(None))):
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(e, (str, int, float, bool)) for e in v):
            out[k] = list(v)
    return out


def dataset_digest(dataset, dataset_key: Optional[str] = None) -> str:
    """SHA-256 hex of what a dataset yields before the cache's transform (docs/feature_cache.md: the key).
    FileNotFoundError: a path of ``dataset.paths`` is missing; ValueError: no ``labels`` array of its length."""
    labels = _labels_of(dataset)
    own = getattr(dataset, "transform", None)
    head = [
        f"{type(dataset).__module__}.{type(dataset).__qualname__}",
        len(dataset),
        labels.tobytes(),
        json.dumps(_scalars(dataset), sort_keys=True),
        "" if own is None else _ADDRESS.sub("", repr(own)),
    ]
    if dataset_key is not None:
        return _sha(head + ["key", str(dataset_key)])
    paths = getattr(dataset, "paths", None)
    if paths is not None:

        def files():
            for p in paths:
                try:
                    st = os.stat(p)
                except FileNotFoundError:
                    raise FileNotFoundError(f"dataset ({type(dataset).__name__}) lists a missing file {p}") from None
                yield f"{p}|{st.st_size}|{st.st_mtime_ns}"

        return _sha(head + ["paths"] + list(files()))

    def items():
        for i in range(len(dataset)):
            x = dataset[i][0]
            x = x.detach().cpu().numpy() if torch.is_tensor(x) else np.asarray(x)
            yield f"{x.dtype}|{x.shape}"
            yield np.ascontiguousarray(x).tobytes()

    return _sha(head + ["items"] + list(items()))


class _ViewItems(torch.utils.data.Dataset):
    """The view tensors of one chunk's ``(index, view)`` items, flat, for a DataLoader."""

    def __init__(self, views: SeededViewDataset, start: int, stop: int):
        self.views, self.start, self.num_views = views, start, views.num_views
        self.count = (stop - start) * views.num_views

    def __len__(self):
        return self.count

    def __getitem__(self, k):
        i, v = divmod(k, self.num_views)
        x = self.views.view(self.start + i, v)
        if not torch.is_tensor(x):
            raise TypeError(f"transform must return a tensor, got {type(x).__name__} for item {self.start + i}")
        return x


class FeatureCache:
    """The outputs of a frozen ``prefix`` for ``num_views`` seeded views of every item of ``dataset``, on disk.

    Args:
        folder: the cache's folder (created; it holds only this cache).
        prefix: the frozen module, run in eval mode under ``torch.no_grad()`` (modes restored) on the device and
            dtype of its first floating parameter or buffer; inputs are cast to them.
        dataset: items ``(untransformed image, label)`` with an int ``labels`` array [N]; or a finished
            :class:`~pml_extensions.datasets.CachedFeatureDataset`: a derived cache, whose view ``v`` of item ``i`` is
            ``prefix(source.features[i, v])`` (no ``transform``; V, view seed and labels the source's).
        transform: image -> ``[C, H, W]`` tensor, run seeded per (view_seed, index, view); its ``repr`` is part of the
            key, so one whose repr shows a memory address (a lambda) needs ``transform_key``.
        num_views: V views per item (training: a few; evaluation: 1). Default 1, or the source's V.
        view_seed: seeds the views' contents. Default 0, or the source's.
        dtype: stored dtype, ``"float16"`` (outputs must fit its range), ``"float32"`` or ``"float64"``.
        chunk_size: items per chunk, the unit of resume and sharding; batch_size: views per prefix forward;
            num_workers: DataLoader workers that load and transform images.
        transform_key, dataset_key: strings that replace the transform's repr / the dataset's files or contents in
            the key (change them when the input changes).

    Raises:
        ValueError / TypeError: bad sizes, seeds or dtype; a transform repr with a memory address and no
            ``transform_key``; a dataset without ``labels``; a prefix without floating parameters or buffers; a
            derived cache given a transform, or a ``num_views`` / ``view_seed`` other than its source's.

    Example::

        >>> import tempfile, torchvision.transforms as T
        >>> images = torch.utils.data.TensorDataset(torch.rand(4, 3, 8, 8), torch.tensor([0, 0, 1, 1]))
        >>> images.labels = np.array([0, 0, 1, 1])
        >>> cache = FeatureCache(tempfile.mkdtemp(), torch.nn.Conv2d(3, 2, 3), images, T.RandomCrop(6), num_views=2,
        ...                      dtype="float32", dataset_key="four")
        >>> cache.build()
        True
        >>> features, label = cache.open(seed=0)[3]
        >>> features.shape, features.dtype, label
        (torch.Size([2, 4, 4]), torch.float32, 1)
    """

    def __init__(
        self,
        folder: str,
        prefix: torch.nn.Module,
        dataset,
        transform: Optional[Callable],
        num_views: Optional[int] = None,
        view_seed: Optional[int] = None,
        dtype="float16",
        chunk_size: int = 256,
        batch_size: int = 64,
        num_workers: int = 0,
        transform_key: Optional[str] = None,
        dataset_key: Optional[str] = None,
    ):
        if not isinstance(folder, (str, os.PathLike)):
            raise TypeError(f"folder must be a path, got {folder!r}")
        if not isinstance(prefix, torch.nn.Module):
            raise TypeError(f"prefix must be a torch.nn.Module, got {type(prefix).__name__}")
        self.folder = os.fspath(folder)
        self.prefix = prefix
        self.source = dataset if isinstance(dataset, CachedFeatureDataset) else None
        if self.source is not None:
            if transform is not None:
                raise ValueError("a derived cache (dataset is a CachedFeatureDataset) takes no transform: pass None")
            for name, value in (("num_views", num_views), ("view_seed", view_seed)):
                own = getattr(self.source, name)
                if value is not None and value != own:
                    raise ValueError(f"{name} of a derived cache is its source's ({own}), got {value!r}")
            self.views = self.source
        else:
            self.views = SeededViewDataset(
                dataset, transform, 1 if num_views is None else num_views, 0 if view_seed is None else view_seed
            )
        self.dataset, self.transform = dataset, transform
        self.num_views, self.view_seed = self.views.num_views, self.views.view_seed
        self.dtype = _dtype_name(dtype)
        self.chunk_size = int_at_least("chunk_size", chunk_size, 1)
        self.batch_size = int_at_least("batch_size", batch_size, 1)
        self.num_workers = int_at_least("num_workers", num_workers, 0)
        if transform_key is None and (opaque := _opaque_part(transform)) is not None:
            raise ValueError(
                f"transform's repr does not describe its {opaque}, so the cache key cannot see it change: pass "
                "transform_key='<a name that changes with the transform>'"
            )
        self.transform_key, self.dataset_key = transform_key, dataset_key
        floats = [t for t in list(prefix.parameters()) + list(prefix.buffers()) if t.is_floating_point()]
        if not floats:
            raise ValueError(
                f"prefix ({type(prefix).__name__}) has no floating parameter or buffer to take a dtype from"
            )
        self.device, self.input_dtype = floats[0].device, floats[0].dtype
        self.num_items = len(self.views)
        if self.num_items == 0:
            raise ValueError(f"dataset ({type(dataset).__name__}) is empty: nothing to cache")
        self.num_chunks = -(-self.num_items // self.chunk_size)
        #: what the last :meth:`build` call did: ``rebuilt`` (reason or None), ``chunks_computed``, ``seconds``
        self.last_build = {}

    @functools.cached_property
    def key_parts(self) -> dict:
        """Digests of the key's parts (computed once per object)."""
        if self.source is not None:  # a derived cache: its input is the source's stored views
            transform, data = "derived from a feature cache", _sha(["source", self.source.meta["key"]])
        else:
            transform = self.transform_key if self.transform_key is not None else repr(self.transform)
            data = dataset_digest(self.dataset, self.dataset_key)
        return {
            "format": FORMAT,
            "prefix": prefix_digest(self.prefix),
            "transform": _sha(["transform", transform]),
            "dataset": data,
            "layout": f"views={self.num_views} view_seed={self.view_seed} dtype={self.dtype} "
            f"chunk_size={self.chunk_size}",
        }

    @property
    def key(self) -> str:
        """SHA-256 hex of :attr:`key_parts`."""
        return _sha(json.dumps(self.key_parts, sort_keys=True))

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def _marker(self, chunk: int) -> str:
        return os.path.join(self.folder, "chunks", f"{chunk:05d}")

    def read_meta(self) -> Optional[dict]:
        """The folder's ``meta.json``, or None when there is none."""
        try:
            with open(self._path("meta.json"), encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    @property
    def complete(self) -> bool:
        """Whether the folder holds a finished cache with this object's key."""
        meta = self.read_meta()
        return bool(meta and meta.get("key") == self.key and meta.get("complete"))

    def chunks_done(self):
        """Indices of the chunks marked done."""
        folder = self._path("chunks")
        return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []

    def _wipe(self):
        # markers first and meta last: an interruption leaves the old meta, so the next call wipes again
        shutil.rmtree(self._path("chunks"), ignore_errors=True)
        for name in ("features.npy", "labels.npy", "meta.json"):
            if os.path.exists(self._path(name)):
                os.remove(self._path(name))

    def _feature_shape(self):
        x = self.views.view(0, 0)
        if not torch.is_tensor(x):
            raise TypeError(f"transform must return a tensor, got {type(x).__name__}")
        with torch.no_grad(), eval_mode(self.prefix):
            y = self.prefix(x.unsqueeze(0).to(self.device, self.input_dtype))
        if not torch.is_tensor(y) or not y.is_floating_point():
            raise TypeError(f"prefix must return a floating-point tensor, got {getattr(y, 'dtype', type(y))}")
        return tuple(y.shape[1:])

    def prepare(self) -> Optional[str]:
        """Make the folder hold this key's (possibly partial) cache, emptied when the key differs; returns why it
        rebuilt (``"new"``, ``"changed: prefix, transform"``, ...) or None when the folder already had this key."""
        meta = self.read_meta()
        if meta is not None and meta.get("key") == self.key:
            return None
        if meta is not None:
            old = meta.get("key_parts", {})
            reason = "changed: " + ", ".join(k for k in sorted(self.key_parts) if old.get(k) != self.key_parts[k])
        else:
            reason = "new"
        self._wipe()
        os.makedirs(self._path("chunks"), exist_ok=True)
        shape = (self.num_items, self.num_views) + self._feature_shape()
        target = self._path("features.npy")
        if os.path.exists(target):  # another process prepared it first (explicit ranks)
            existing = np.load(target, mmap_mode="r")
            if existing.shape != shape or existing.dtype != DTYPES[self.dtype]:
                del existing
                os.remove(target)
        if not os.path.exists(target):
            with atomic_path(target) as tmp:
                np.lib.format.open_memmap(tmp, mode="w+", dtype=DTYPES[self.dtype], shape=shape).flush()
        with atomic_path(self._path("labels.npy")) as tmp:
            np.save(tmp, self.views.labels)
        atomic_write_json(
            self._path("meta.json"),
            {
                "format": FORMAT,
                "key": self.key,
                "key_parts": self.key_parts,
                "num_items": self.num_items,
                "num_views": self.num_views,
                "view_seed": self.view_seed,
                "feature_shape": list(shape[2:]),
                "dtype": self.dtype,
                "chunk_size": self.chunk_size,
                "num_chunks": self.num_chunks,
                "complete": False,
            },
        )
        return reason

    def _compute_chunk(self, features: np.ndarray, chunk: int):
        start = chunk * self.chunk_size
        stop = min(start + self.chunk_size, self.num_items)
        items = _ViewItems(self.views, start, stop)
        # its own generator: a DataLoader iterator otherwise draws its workers' base seed from the global RNG
        loader = torch.utils.data.DataLoader(
            items, batch_size=self.batch_size, num_workers=self.num_workers, generator=torch.Generator()
        )
        parts = []
        with torch.no_grad(), eval_mode(self.prefix):
            for batch in loader:
                y = self.prefix(batch.to(self.device, self.input_dtype)).to("cpu", getattr(torch, self.dtype))
                if not torch.isfinite(y).all():
                    hint = " (beyond float16's range: use dtype='float32')" if self.dtype == "float16" else ""
                    raise ValueError(f"prefix output of chunk {chunk} (items {start}-{stop - 1}) is not finite{hint}")
                parts.append(y.numpy())
        features[start:stop] = np.concatenate(parts).reshape((stop - start, self.num_views) + features.shape[2:])
        features.flush()
        atomic_write_text(self._marker(chunk), f"{stop - start}\n")

    def _ranks(self, rank, world_size):
        if rank is None and world_size is None:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size(), dist
            return 0, 1, None
        if rank is None or world_size is None:
            raise ValueError(f"give both rank and world_size or neither, got rank={rank!r}, world_size={world_size!r}")
        world_size = int_at_least("world_size", world_size, 1)
        if not 0 <= int_at_least("rank", rank, 0) < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        return int(rank), world_size, None

    def build(self, rank: Optional[int] = None, world_size: Optional[int] = None, progress: bool = False) -> bool:
        """Compute the missing chunks of this rank's shard; returns whether the whole cache is complete.

        Args:
            rank, world_size: this process's shard (chunks ``rank::world_size``). Both None: from ``torch.distributed``
                when it is initialised (with barriers; every rank returns True), else the whole cache in this process.
            progress: show a tqdm bar over this rank's chunks.

        Raises:
            ValueError: a bad rank / world_size; a non-finite output (float16 overflow); a folder whose meta.json
                another process wrote with a different key. Whatever the dataset, transform or prefix raise
                (finished chunks stay done).
        """
        rank, world_size, dist = self._ranks(rank, world_size)
        start = time.perf_counter()
        reason = self.prepare() if (dist is None or rank == 0) else None
        if dist is not None:
            dist.barrier()
        meta = self.read_meta()
        if meta is None or meta.get("key") != self.key:
            raise ValueError(f"{self._path('meta.json')} holds another key than this process's (ranks disagree?)")
        computed = 0
        if not meta.get("complete"):
            features = np.load(self._path("features.npy"), mmap_mode="r+")
            done = set(self.chunks_done())
            todo = [c for c in range(rank, self.num_chunks, world_size) if c not in done]
            if progress:
                from tqdm import tqdm

                todo = tqdm(todo, desc=f"feature cache {os.path.basename(self.folder)} rank {rank}")
            for chunk in todo:
                self._compute_chunk(features, chunk)
                computed += 1
            del features
        if dist is not None:
            dist.barrier()
        if (dist is None or rank == 0) and not meta.get("complete") and len(self.chunks_done()) == self.num_chunks:
            meta["complete"] = True
            atomic_write_json(self._path("meta.json"), meta)
        if dist is not None:
            dist.barrier()
        self.last_build = {"rebuilt": reason, "chunks_computed": computed, "seconds": time.perf_counter() - start}
        return self.complete

    def open(self, seed: int = 0, dtype: torch.dtype = torch.float32):
        """The finished cache as a :class:`~pml_extensions.datasets.CachedFeatureDataset` drawing views by ``seed``."""
        return CachedFeatureDataset(self.folder, seed=seed, dtype=dtype, key=self.key)

    def size_bytes(self) -> int:
        """Bytes of ``features.npy`` on disk (its logical size)."""
        return os.path.getsize(self._path("features.npy"))
