import unittest

import numpy as np
import torch
from PIL import Image

from pml_extensions.datasets.coupled_augmentation_dataset import CoupledAugmentationDataset


def ramp_image(width=60, height=40, value=None):
    """R = 255·x/(W-1), G = 255·y/(H-1), B = 128: a pixel's colour tells where it came from."""
    x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    arr = np.stack([x, y, np.full_like(x, 128)], axis=2)
    if value is not None:
        arr[:] = value
    return Image.fromarray(arr.astype(np.uint8))


class Images(torch.utils.data.Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, np.asarray(labels)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])


def plain(**kw):
    # no jitter, no mixup, no normalisation: outputs are the cropped RGB in [0, 1]
    args = dict(
        query_size=8,
        database_size=32,
        num_augmentations=4,
        jitter_strength=0.0,
        mixup_alpha=None,
        mean=(0, 0, 0),
        std=(1, 1, 1),
        seed=3,
    )
    args.update(kw)
    return CoupledAugmentationDataset(Images([ramp_image(), ramp_image(50, 70)], [5, 7]), **args)


def downsample(x, size):
    return torch.nn.functional.interpolate(x, size=(size, size), mode="area")


class TestCoupledAugmentationDataset(unittest.TestCase):
    def test_shapes_and_labels(self):
        ds = plain()
        student, teacher, lam, idx, label = ds[1]
        self.assertEqual(student.shape, (4, 3, 8, 8))
        self.assertEqual(teacher.shape, (4, 3, 32, 32))
        self.assertEqual((idx, label), (1, 7))
        self.assertTrue(torch.equal(lam, torch.ones(4)))
        (s, t, cls), ids = CoupledAugmentationDataset.collate([ds[0], ds[1]])
        self.assertEqual(s.shape, (8, 3, 8, 8))
        self.assertEqual(t.shape, (8, 3, 32, 32))
        self.assertEqual(ids.tolist(), [0] * 4 + [1] * 4)
        self.assertEqual(cls.tolist(), [5] * 4 + [7] * 4)

    def test_same_crop_fraction_at_both_resolutions(self):
        ds = plain(num_augmentations=6)
        params = ds.draw_params(0, 60, 40)
        student, teacher, *_ = ds[0]
        for k, p in enumerate(params):
            self.assertIs(p["student"], p["teacher"])
            top, left, h, w = p["student"]["crop"]
            # mean R of a crop is the mean x of the box, mean G its mean y (ramps are linear)
            exp_r = (left + (w - 1) / 2) / 59
            exp_g = (top + (h - 1) / 2) / 39
            for img in (student[k], teacher[k]):
                self.assertAlmostEqual(img[1].mean().item(), exp_g, delta=0.03)
                if not p["student"]["flip"]:
                    self.assertAlmostEqual(img[0].mean().item(), exp_r, delta=0.03)
            # the large crop, downsampled, is the small crop
            torch.testing.assert_close(downsample(teacher[k : k + 1], 8)[0], student[k], atol=0.03, rtol=0)

    def test_flip_is_shared(self):
        ds = plain(flip_p=1.0)
        student, teacher, *_ = ds[0]
        # R decreases along x at both sizes when flipped
        self.assertTrue((student[:, 0, :, 0] > student[:, 0, :, -1]).all())
        self.assertTrue((teacher[:, 0, :, 0] > teacher[:, 0, :, -1]).all())
        ds = plain(flip_p=0.0)
        student, teacher, *_ = ds[0]
        self.assertTrue((student[:, 0, :, 0] < student[:, 0, :, -1]).all())

    def test_jitter_is_shared(self):
        ds = plain(jitter_strength=0.5)
        student, teacher, *_ = ds[0]
        self.assertTrue(all(p["student"]["jitter"] is not None for p in ds.draw_params(0, 60, 40)))
        torch.testing.assert_close(downsample(teacher, 8), student, atol=0.05, rtol=0)

    def test_mixup_lambda_and_partner_shared(self):
        # image 0 is black, image 1 white: a mixed row of image 0 is (1 - lam) everywhere, at both sizes;
        # image 1's partner is image 0 (wrap-around): lam.
        images = [ramp_image(value=0), ramp_image(value=255)]
        ds = CoupledAugmentationDataset(
            Images(images, [0, 1]),
            8,
            16,
            num_augmentations=3,
            mean=(0, 0, 0),
            std=(1, 1, 1),
            jitter_strength=0.0,
            seed=1,
        )
        items = [ds[0], ds[1]]
        lam0, lam1 = items[0][2], items[1][2]
        self.assertTrue(((lam0 > 0) & (lam0 < 1)).all())
        (s, t, _), _ = CoupledAugmentationDataset.collate(items)
        for p in range(3):
            for x in (s[p], t[p]):
                torch.testing.assert_close(x, torch.full_like(x, 1 - lam0[p].item()))
            for x in (s[3 + p], t[3 + p]):
                torch.testing.assert_close(x, torch.full_like(x, lam1[p].item()))

    def test_one_image_batch_is_not_mixed(self):
        # issue 12: with B = 1 the "next image" is the image itself; the rows come back exactly unmixed (lam := 1).
        ds = plain(mixup_alpha=0.2)
        item = ds[0]
        self.assertTrue(((item[2] > 0) & (item[2] < 1)).all())
        (s, t, labels), ids = CoupledAugmentationDataset.collate([item])
        self.assertTrue(torch.equal(s, item[0]))
        self.assertTrue(torch.equal(t, item[1]))
        self.assertEqual(ids.tolist(), [0] * 4)
        x = torch.rand(1, 3, 3, 4, 4, generator=torch.Generator().manual_seed(0))
        self.assertTrue(torch.equal(CoupledAugmentationDataset.mix(x, torch.full((1, 3), 0.3)), x))
        with self.assertRaisesRegex(ValueError, r"lam must be \[B, P\] = \[1, 3\]"):
            CoupledAugmentationDataset.mix(x, torch.full((3,), 0.3))

    def test_seed_reproduces_the_batch_without_global_rng(self):
        batch = lambda ds: CoupledAugmentationDataset.collate([ds[0], ds[1]])  # noqa: E731
        state = torch.get_rng_state()
        np_state = np.random.get_state()[1].copy()
        a = batch(plain(jitter_strength=0.5, mixup_alpha=0.2))
        torch.manual_seed(123)
        np.random.seed(5)
        b = batch(plain(jitter_strength=0.5, mixup_alpha=0.2))
        for x, y in zip(a[0], b[0]):
            self.assertTrue(torch.equal(x, y))
        c = batch(plain(jitter_strength=0.5, mixup_alpha=0.2, seed=4))
        self.assertFalse(torch.equal(a[0][0], c[0][0]))
        ds = plain(jitter_strength=0.5, mixup_alpha=0.2)
        ds.set_epoch(1)
        self.assertFalse(torch.equal(a[0][0], batch(ds)[0][0]))
        # drawing never touched the global RNGs
        torch.set_rng_state(state)
        ds2 = plain()
        before = torch.get_rng_state()
        ds2[0]
        self.assertTrue(torch.equal(before, torch.get_rng_state()))
        self.assertIsNotNone(np_state)

    def test_dataloader_workers_give_the_same_batch(self):
        ds = plain(jitter_strength=0.5, mixup_alpha=0.2)
        kw = dict(batch_size=2, shuffle=False, collate_fn=CoupledAugmentationDataset.collate)
        (s0, t0, c0), i0 = next(iter(torch.utils.data.DataLoader(ds, num_workers=0, **kw)))
        (s2, t2, c2), i2 = next(iter(torch.utils.data.DataLoader(ds, num_workers=2, **kw)))
        self.assertTrue(torch.equal(s0, s2) and torch.equal(t0, t2) and torch.equal(i0, i2))

    def test_uncoupled_ablation(self):
        ds = plain(coupled=False)
        p = ds.draw_params(0, 60, 40)[0]
        self.assertIsNot(p["student"], p["teacher"])

    def test_bad_input(self):
        base = Images([ramp_image()], [0])
        with self.assertRaisesRegex(ValueError, "query_size"):
            CoupledAugmentationDataset(base, 0, 32)
        with self.assertRaisesRegex(ValueError, "database_size"):
            CoupledAugmentationDataset(base, 8, -32)
        with self.assertRaisesRegex(ValueError, "num_augmentations"):
            CoupledAugmentationDataset(base, 8, 32, num_augmentations=0)
        with self.assertRaisesRegex(ValueError, "mixup_alpha"):
            CoupledAugmentationDataset(base, 8, 32, mixup_alpha=0)
        with self.assertRaisesRegex(ValueError, "scale"):
            CoupledAugmentationDataset(base, 8, 32, scale=(0.5, 0.1))
        with self.assertRaisesRegex(ValueError, "flip_p"):
            CoupledAugmentationDataset(base, 8, 32, flip_p=2)
        with self.assertRaisesRegex(TypeError, "PIL"):
            CoupledAugmentationDataset(Images([torch.zeros(3, 4, 4)], [0]), 8, 32)[0]
