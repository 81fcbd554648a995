"""runner/protocols/xml_vs_gap/plots.py: the mean prototype histogram per unseen class (the trunk's own
HistogramPooling, or a post-hoc one built by the Builder for a GAP trunk) and the two PNGs."""

import os

import torch

from pml_extensions.runner.protocols.xml_vs_gap import plots, unit
from pml_extensions.trunks import HistogramPooling
from tests.runner.protocols.xml_vs_gap.test_unit import tiny_config, variant


def test_class_histograms_are_mean_soft_histograms_per_test_class():
    cfg = variant(tiny_config(), "contrastive_xml")
    models = unit.build_models({**cfg, "prototype_init": None}, 0, torch.device("cpu"))
    classes, hist, names = plots.class_histograms(cfg, models, 64, torch.device("cpu"), seed=0)
    assert hist.shape == (len(classes), 64) and len(classes) == 31  # the glyph test split: 31 unseen characters
    assert torch.allclose(hist.sum(1), torch.ones(len(classes)), atol=1e-5)  # means of rows on the simplex
    assert names is not None and len(names) > int(classes.max())


def test_a_gap_trunk_gets_a_post_hoc_layer_of_the_same_width(monkeypatch):
    cfg = variant(tiny_config(), "contrastive_gap")
    models = unit.build_models(cfg, 0, torch.device("cpu"))
    built = []
    real = HistogramPooling.init_from_data

    def record(self, *args, **kwargs):
        built.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(HistogramPooling, "init_from_data", record)
    _, hist, _ = plots.class_histograms(cfg, models, 16, torch.device("cpu"), seed=0)
    (pool,) = built
    assert hist.shape[1] == 16 and pool.prototypes.shape == (16, 128)  # ConvNetBody's last width is 128


def test_save_plots_writes_both_figures(tmp_path):
    cfg = variant(tiny_config(), "contrastive_xml")
    models = unit.build_models({**cfg, "prototype_init": None}, 0, torch.device("cpu"))
    result = {
        "history": [{"epoch": 0, "mean_average_precision_at_r": 0.1}, {"epoch": 1, "mean_average_precision_at_r": 0.2}]
    }
    paths = plots.save_plots([("contrastive_xml", cfg, result, models)], str(tmp_path), torch.device("cpu"), 0, 64)
    assert [os.path.basename(p) for p in paths] == ["map_at_r.png", "prototype_usage.png"]
    assert all(os.path.getsize(p) > 1000 for p in paths)


def _cached_unit(tmp_path, name, **overrides):
    """A unit of the cached test config (its prefix's cache built in ``tmp_path``): ``(cfg, models)``."""
    from pml_extensions.runner.config.loader import variant_configs
    from tests.runner.protocols.xml_vs_gap.test_protocol import cached_config

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
    plots.save_retrieval([("contrastive_xml", cfg, {"best_epoch": 1}, models)], str(tmp_path / "out"), "cpu", 0)
    assert os.path.exists(tmp_path / "out" / "retrieval" / "contrastive_xml.json")
    images = unit.load_split({**cfg, "feature_cache": None}, "test", train_transform=False)
    whole = torch.nn.Sequential(models["frozen"].prefix, models["trunk"])
    assert torch.allclose(seen[0], real(whole, models["embedder"], images, "cpu"), atol=1e-5)


def test_a_cached_gap_rest_bins_the_cached_map_post_hoc(tmp_path, monkeypatch):
    """Frozen up to the pooling, the rest of a GAP trunk starts with its global pooling: the post-hoc prototypes bin
    the cached map's local features (16 channels), not the one pooled vector."""
    cache = {"boundary": "0", "num_views": 1, "dtype": "float32"}
    cfg, models = _cached_unit(tmp_path, "contrastive_gap", feature_cache=cache)
    bodies = []
    real = HistogramPooling.init_from_data
    monkeypatch.setattr(
        HistogramPooling, "init_from_data", lambda self, body, *a, **k: bodies.append(body) or real(self, body, *a, **k)
    )
    _, hist, _ = plots.class_histograms(cfg, models, 4, torch.device("cpu"), seed=0)
    (body,) = bodies
    assert len(body) == 0 and hist.shape[1] == 4  # no module before the pooling: the cached map itself
