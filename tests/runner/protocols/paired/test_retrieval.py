"""runner/protocols/paired/unit.py: the retrieval examples of a unit (a cached unit embeds its cached test
features; the thumbnails are the raw test images)."""

import os

import torch

from pml_extensions.runner.protocols.paired import unit


def _cached_unit(tmp_path, name, **overrides):
    """A unit of the cached test config (its prefix's cache built in ``tmp_path``): ``(cfg, models)``."""
    from pml_extensions.runner.config.loader import variant_configs
    from tests.runner.protocols.paired.test_protocol import cached_config

    cfg = unit.resolve_cache_folder(variant_configs(cached_config(seeds=[0], **overrides))[name], str(tmp_path))
    for key in ("variants", "comparisons", "seeds", "selection", "untrained"):
        cfg.pop(key, None)
    return cfg, unit.build_models({**cfg, "prototype_init": None}, 0, torch.device("cpu"))


def test_a_cached_unit_retrieves_with_its_cached_test_features(tmp_path, monkeypatch):
    """With ``feature_cache`` the trunk is the rest: the retrieval examples embed the cached test features, the same
    embeddings as the whole trunk (frozen prefix + rest) on the test images (float32 cache)."""
    from pml_extensions.runner.outputs import retrieval

    cfg, models = _cached_unit(tmp_path, "contrastive_xml")
    seen = []
    real = retrieval.embed
    monkeypatch.setattr(retrieval, "embed", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    folder = tmp_path / "unit"
    os.makedirs(folder)
    state = {k: m.state_dict() for k, m in unit.networks(models).items()}
    torch.save(state, folder / "best_models.pth")
    unit.save_retrieval("contrastive_xml", cfg, str(folder), str(tmp_path / "out"), "cpu", 0, 1)
    assert os.path.exists(tmp_path / "out" / "retrieval" / "contrastive_xml.json")
    images = unit.load_split({**cfg, "feature_cache": None}, "test", train_transform=False)
    summary = __import__("json").load(open(tmp_path / "out" / "retrieval" / "contrastive_xml.json"))
    from PIL import Image

    thumb = Image.open(tmp_path / "out" / "retrieval" / summary["queries"][0]["image"])
    assert min(thumb.size) > 8  # a raw image, not a cached feature map drawn as 1 x 96 pixels
    whole = torch.nn.Sequential(models["frozen"].prefix, models["trunk"])
    assert torch.allclose(seen[0], real(whole, models["embedder"], images, "cpu"), atol=1e-5)
