"""benchmarks/protocols/xml_paper/plots.py: the mean prototype histogram per unseen class (the trunk's own
HistogramPooling, or a post-hoc one built by the Builder for a GAP trunk) and its PNG."""

import os

import torch

from benchmarks.protocols.xml_paper import plots
from pml_extensions.runner.protocols.paired import unit
from pml_extensions.trunks import HistogramPooling
from tests.runner.protocols.paired.test_unit import tiny_config, variant


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


def test_save_prototype_usage_writes_its_figure(tmp_path):
    cfg = variant(tiny_config(), "contrastive_xml")
    models = unit.build_models({**cfg, "prototype_init": None}, 0, torch.device("cpu"))
    result = {
        "history": [{"epoch": 0, "mean_average_precision_at_r": 0.1}, {"epoch": 1, "mean_average_precision_at_r": 0.2}]
    }
    path = plots.save_prototype_usage([("contrastive_xml", cfg, result, models)], str(tmp_path), "cpu", 0, 64)
    assert os.path.basename(path) == "prototype_usage.png" and os.path.getsize(path) > 1000


def _cached_unit(tmp_path, name, **overrides):
    """A unit of the cached test config (its prefix's cache built in ``tmp_path``): ``(cfg, models)``."""
    from pml_extensions.runner.config.loader import variant_configs
    from tests.runner.protocols.paired.test_protocol import cached_config

    cfg = unit.resolve_cache_folder(variant_configs(cached_config(seeds=[0], **overrides))[name], str(tmp_path))
    for key in ("variants", "comparisons", "seeds", "selection", "untrained"):
        cfg.pop(key, None)
    return cfg, unit.build_models({**cfg, "prototype_init": None}, 0, torch.device("cpu"))


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
    classes, hist, names = plots.class_histograms(cfg, models, 4, torch.device("cpu"), seed=0)
    (body,) = bodies
    assert len(body) == 0 and hist.shape[1] == 4  # no module before the pooling: the cached map itself
    # the figure's titles name the classes of the dataset under the cache (they were label numbers: '1', '3', ...)
    assert names is not None and len(names) > int(classes.max()) and not str(names[int(classes[0])]).isdigit()
