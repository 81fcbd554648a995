"""Coupled augmentations at two resolutions for RAML distillation (docs/methods/resolution_distillation.md)."""

import math
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
import torchvision.transforms.functional as TF
from PIL import Image

from ..utils.checks import int_at_least
from .normalization import IMAGENET_MEAN, IMAGENET_STD

JITTER_OPS = ("brightness", "contrast", "saturation", "hue")


def _count(name: str, value) -> int:
    """``value`` as an int when it is a whole number >= 0 (``2.0`` included); ValueError otherwise."""
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


class CoupledAugmentationDataset(torch.utils.data.Dataset):
    """Wraps a dataset of ``(PIL image, class label)`` into P coupled augmentations per image at two sizes.

    Source: Suma & Tolias, WACV 2023, Sec. 4-5 (Table 3: random resized crop, flip, colour distortion of strength 0.5
    [SimCLR], mixup α = 0.2 with the next image of the batch); jitter factors as SimCLR and ``pavelsuma/raml``
    (``lib/datasets/datahelpers.py``), whose global-RNG reseeding is replaced by the private generator below.

    For every augmentation the crop box (on the original image), the flip, the colour-jitter factors and their order,
    and the mixup λ ~ Beta(alpha, alpha) are drawn once, from ``numpy.random.default_rng([seed, epoch, data_pass,
    index])`` (independent of the workers' fetch order; global RNGs untouched), and applied at the query size (student)
    and the database size (teacher). Call :meth:`set_epoch` and :meth:`set_pass` before each epoch / DataLoader iterator
    (:class:`~pml_extensions.trainers.ResolutionDistillationTrainer` does both), else a second pass repeats the first.

    Args:
        dataset: items ``(PIL.Image, int label)`` (any mode, converted to RGB).
        query_size, database_size: student (small) / teacher (large) square size in pixels.
        num_augmentations: P per image (paper: 8).
        scale, ratio: RandomResizedCrop ranges (torchvision's, as the paper code).
        flip_p: horizontal-flip probability.
        jitter_strength: SimCLR colour-distortion strength s (paper: 0.5; 0 disables); jitter_p: its probability.
        mixup_alpha: Beta parameter of the mixup λ (paper: 0.2); ``None`` disables mixup.
        mean, std: normalisation; seed: base seed.
        coupled: ``False`` draws the teacher's crop/flip/jitter independently (the paper's Table 3 ablation).

    ``__getitem__(i) -> (student [P, 3, q, q] float32, teacher [P, 3, d, d] float32, lam [P] float32, i, class_label)``.
    ``collate(batch) -> ((student [B·P, 3, q, q], teacher [B·P, 3, d, d], class_labels [B·P]), image_ids [B·P])``, rows
    image-major (row b·P + p), mixing row p of image b with row p of image ``(b + 1) mod B`` with image b's λ at both
    sizes, on normalised tensors (the paper's code): the DataLoader's ``collate_fn``. ``labels`` are the wrapped
    dataset's.

    Raises:
        ValueError: non-positive sizes or P, invalid ranges or probabilities, negative jitter strength or
            non-positive mixup alpha.
    """

    def __init__(
        self,
        dataset,
        query_size: int,
        database_size: int,
        num_augmentations: int = 8,
        scale: Tuple[float, float] = (0.08, 1.0),
        ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        flip_p: float = 0.5,
        jitter_strength: float = 0.5,
        jitter_p: float = 1.0,
        mixup_alpha: Optional[float] = 0.2,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        seed: int = 0,
        coupled: bool = True,
    ):
        self.dataset = dataset
        self.query_size = int_at_least("query_size", query_size, 1)
        self.database_size = int_at_least("database_size", database_size, 1)
        self.num_augmentations = int_at_least("num_augmentations", num_augmentations, 1)
        if not (0 < scale[0] <= scale[1] <= 1):
            raise ValueError(f"scale must satisfy 0 < min <= max <= 1, got {scale!r}")
        if not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"ratio must satisfy 0 < min <= max, got {ratio!r}")
        for name, p in (("flip_p", flip_p), ("jitter_p", jitter_p)):
            if not 0 <= p <= 1:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
        if not jitter_strength >= 0:
            raise ValueError(f"jitter_strength must be >= 0, got {jitter_strength!r}")
        if mixup_alpha is not None and not mixup_alpha > 0:
            raise ValueError(f"mixup_alpha must be > 0 or None (no mixup), got {mixup_alpha!r}")
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError("mean and std must have 3 entries each, std > 0")
        self.scale, self.ratio = tuple(scale), tuple(ratio)
        self.flip_p, self.jitter_p, self.jitter_strength = float(flip_p), float(jitter_p), float(jitter_strength)
        self.mixup_alpha = None if mixup_alpha is None else float(mixup_alpha)
        self.mean, self.std = list(mean), list(std)
        self.seed = int(seed)
        self.coupled = bool(coupled)
        self.epoch = 0
        self.data_pass = 0
        labels = getattr(dataset, "labels", None)
        self.labels = np.asarray(labels if labels is not None else [dataset[i][1] for i in range(len(dataset))])

    def __len__(self):
        return len(self.dataset)

    def set_epoch(self, epoch: int):
        """Select the augmentation draws of ``epoch``. ValueError if negative."""
        self.epoch = _count("epoch", epoch)

    def set_pass(self, data_pass: int):
        """Select the draws of pass ``data_pass`` (fresh crops, flips, jitter, λ). ValueError if negative."""
        self.data_pass = _count("data_pass", data_pass)

    def generator(self, index: int) -> np.random.Generator:
        """The private generator of item ``index`` for the current epoch and pass."""
        return np.random.default_rng([self.seed, self.epoch, self.data_pass, int(index)])

    def _crop_box(self, rng, width, height):
        """RandomResizedCrop's box (top, left, h, w) on the original image (torchvision's rule), drawn with ``rng``."""
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(*log_ratio))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            h, w = height, int(round(height * self.ratio[1]))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def _geometry_and_colour(self, rng, width, height):
        params = {"crop": self._crop_box(rng, width, height), "flip": bool(rng.random() < self.flip_p), "jitter": None}
        s = self.jitter_strength
        if s > 0 and rng.random() < self.jitter_p:
            m, h = 0.8 * s, min(0.5, 0.2 * s)
            params["jitter"] = {"order": [JITTER_OPS[k] for k in rng.permutation(4)]}
            for op in JITTER_OPS:  # drawn in this order
                params["jitter"][op] = float(rng.uniform(-h, h) if op == "hue" else rng.uniform(max(0.0, 1 - m), 1 + m))
        return params

    def draw_params(self, index: int, width: int, height: int) -> list:
        """The P parameter sets ``{"student": {"crop": (top, left, h, w), "flip", "jitter": dict | None}, "teacher":
        same (the very dict when coupled), "lam": float (1: no mixup)}`` of item ``index`` (size ``width × height``)."""
        rng = self.generator(index)
        out = []
        for _ in range(self.num_augmentations):
            student = self._geometry_and_colour(rng, width, height)
            teacher = student if self.coupled else self._geometry_and_colour(rng, width, height)
            lam = 1.0 if self.mixup_alpha is None else float(rng.beta(self.mixup_alpha, self.mixup_alpha))
            out.append({"student": student, "teacher": teacher, "lam": lam})
        return out

    def apply(self, image: Image.Image, params: dict, size: int) -> torch.Tensor:
        """Crop box -> resize to ``size`` -> flip -> jitter -> tensor -> normalise: ``[3, size, size]`` float32."""
        top, left, h, w = params["crop"]
        out = TF.resized_crop(image, top, left, h, w, [size, size], antialias=True)
        if params["flip"]:
            out = TF.hflip(out)
        jitter = params["jitter"]
        if jitter is not None:
            for op in jitter["order"]:
                out = getattr(TF, f"adjust_{op}")(out, jitter[op])
        return TF.normalize(TF.to_tensor(out), self.mean, self.std)

    def __getitem__(self, index):
        image, label = self.dataset[index]
        if not isinstance(image, Image.Image):
            raise TypeError(f"the wrapped dataset must yield PIL images, got {type(image).__name__}")
        image = image.convert("RGB")
        params = self.draw_params(index, *image.size)
        student = torch.stack([self.apply(image, p["student"], self.query_size) for p in params])
        teacher = torch.stack([self.apply(image, p["teacher"], self.database_size) for p in params])
        lam = torch.tensor([p["lam"] for p in params], dtype=torch.float32)
        return student, teacher, lam, int(index), int(label)

    @staticmethod
    def mix(images: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        """Mixup with the next image of the batch: ``lam[b,p]·x[b,p] + (1 − lam[b,p])·x[(b+1) mod B, p]``.

        images: [B, P, C, H, W]; lam: [B, P]; returns the same shape. A one-image batch has no other image to mix with:
        its rows are returned unmixed. Raises ValueError if ``lam`` is not ``[B, P]``.
        """
        if lam.shape != images.shape[:2]:
            raise ValueError(f"lam must be [B, P] = {list(images.shape[:2])} for these images, got {list(lam.shape)}")
        if images.shape[0] < 2:
            return images
        partner = torch.roll(images, shifts=-1, dims=0)
        lam = lam.to(images.dtype).view(*lam.shape, *([1] * (images.ndim - 2)))
        return lam * images + (1 - lam) * partner

    @classmethod
    def collate(cls, batch):
        """Stack items, apply the shared mixup and flatten to rows (see the class docstring)."""
        student, teacher, lam, ids, labels = zip(*batch)
        student, teacher, lam = torch.stack(student), torch.stack(teacher), torch.stack(lam)
        b, p = lam.shape
        student, teacher = cls.mix(student, lam), cls.mix(teacher, lam)
        image_ids = torch.tensor(ids).repeat_interleave(p)
        class_labels = torch.tensor(labels).repeat_interleave(p)
        return (student.flatten(0, 1), teacher.flatten(0, 1), class_labels), image_ids


class PassShuffleSampler(torch.utils.data.Sampler):
    """A random permutation of ``range(num_items)`` per pass from ``(seed, data_pass)`` alone (stateless, unlike
    ``RandomSampler``: a run resumed at a pass boundary sees the uninterrupted run's batches). ValueError: bad sizes.

    Example::

        >>> s = PassShuffleSampler(4, seed=0)
        >>> sorted(s) == [0, 1, 2, 3], list(s) == list(PassShuffleSampler(4, seed=0))
        (True, True)
    """

    def __init__(self, num_items: int, seed: int = 0):
        self.num_items = int_at_least("num_items", num_items, 1)
        self.seed = int(seed)
        self.data_pass = 0

    def set_pass(self, data_pass: int):
        self.data_pass = _count("data_pass", data_pass)

    def __len__(self):
        return self.num_items

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.data_pass)
        return iter(torch.randperm(self.num_items, generator=generator, device=generator.device).tolist())
