"""explain reads how a run fed images to its model (normalisation, image size) from the run's config.yaml."""

import os

import pytest
import yaml

from pml_extensions.runner.objects.saved_models import run_preprocessing

IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def _run(tmp_path, cfg):
    os.makedirs(tmp_path / "fold_0")
    with open(tmp_path / "config.yaml", "w") as f:
        yaml.safe_dump(cfg, f)
    return str(tmp_path / "fold_0")


@pytest.mark.parametrize(
    "cfg, want",
    [
        # MLRC quick: ToTensor + Normalize in the eval transform, size from the dataset
        (
            {
                "dataset": {"GlyphDataset": {"image_size": 32}},
                "transforms": {"eval": {"ToTensor": {}, "Normalize": {"mean": [0.5], "std": [0.5]}}},
            },
            {"mean": [0.5], "std": [0.5], "image_size": 32},
        ),
        # MLRC default: no ToTensor, so the runner appends ToTensor + ImageNet Normalize; size from CenterCrop
        (
            {"transforms": {"eval": {"Resize": {"size": 256}, "CenterCrop": {"size": 227}}}},
            dict(IMAGENET, image_size=227),
        ),
        # the runner's normalize key, and normalize: null (no normalisation)
        (
            {"normalize": {"mean": [0.1], "std": [0.2]}, "transforms": {"eval": {"Resize": {"size": 64}}}},
            {"mean": [0.1], "std": [0.2], "image_size": 64},
        ),
        ({"normalize": None, "transforms": {"eval": {}}}, {"mean": None, "std": None, "image_size": None}),
        # the main job's Compose list with a [h, w] Resize
        (
            {
                "transforms": {
                    "eval": {
                        "Compose": {
                            "transforms": [
                                {"Resize": {"size": [32, 40]}},
                                {"ToTensor": None},
                                {"Normalize": {"mean": [0.5], "std": [0.5]}},
                            ]
                        }
                    }
                }
            },
            {"mean": [0.5], "std": [0.5], "image_size": 32},
        ),
        # ToTensor without Normalize: [0, 1] images
        ({"transforms": {"eval": {"ToTensor": None}}}, {"mean": None, "std": None, "image_size": None}),
    ],
)
def test_run_preprocessing(tmp_path, cfg, want):
    assert run_preprocessing(_run(tmp_path, cfg)) == want


def test_no_run_config_or_a_resolution_run(tmp_path):
    assert run_preprocessing(None) is None
    assert run_preprocessing(str(tmp_path)) is None  # no config.yaml up to three levels above
    assert run_preprocessing(_run(tmp_path, {"resolution_job": {"datasets": {}}})) is None


def test_a_variants_model_is_read_with_its_variants_transforms(tmp_path):
    cfg = {
        "transforms": {"eval": {"Resize": {"size": 64}}},
        "variants": {"small": {"transforms~OVERRIDE~": {"eval": {"Resize": {"size": 32}}}}, "base": {}},
    }
    with open(tmp_path / "config.yaml", "w") as f:
        yaml.safe_dump(cfg, f)
    for variant, size in (("small", 32), ("base", 64)):
        unit = tmp_path / variant / "seed_0"
        os.makedirs(unit)
        assert run_preprocessing(str(unit / "selected_models.pth")) == dict(IMAGENET, image_size=size)
