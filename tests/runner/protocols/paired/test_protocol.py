"""runner/protocols/paired: seeds, variants, comparisons and selection of the paired protocol (the engine,
protocols/paired_protocol.py)."""

import tempfile
import unittest
from unittest import mock

import pytest

from pml_extensions.runner.protocols.paired import Paired
from tests.runner.protocols.paired.test_unit import tiny_config


def _run(config, folder=None):
    from pml_extensions.runner.protocols import run_protocol

    return run_protocol(config, folder or tempfile.mkdtemp(), log=lambda *a, **k: None)


def _protocol(config):
    return Paired(config, tempfile.mkdtemp(), log=lambda *a, **k: None)


class TestProtocol(unittest.TestCase):
    def test_seed_zero_is_one_seed(self):
        # `run xml_glyphs --seeds 0` ran seeds 0, 1 and 2: `cfg.pop("seeds") or DEFAULT_SEEDS` took 0 for missing
        for config, seeds in (({"seeds": 0}, [0]), ({"seeds": "0"}, [0]), ({"seeds": [0]}, [0]), ({"seed": 0}, [0])):
            self.assertEqual(Paired.read(config).seeds, seeds)
        self.assertEqual(Paired.read({}).seeds, [0, 1, 2])

    def test_bad_input(self):
        with self.assertRaisesRegex(Exception, "seeds: expected distinct seeds"):
            Paired.read({"seeds": [0, 0]})
        with self.assertRaisesRegex(Exception, "both given; keep one"):
            _run({**tiny_config(), "seed": 0})
        with self.assertRaisesRegex(Exception, "comparisons"):
            _run({**tiny_config(), "comparisons": [["contrastive_xml", "nope"]]})


class TestSelection(unittest.TestCase):
    def test_groups_are_the_variants_linked_by_comparisons(self):
        base = tiny_config(seeds=[0])
        one = {"loss_funcs": base["loss_funcs"]}
        variants = {n: dict(one) for n in ["g", "x", "l", "pg", "px", "o"]}
        config = {**base, "variants": variants, "comparisons": [["x", "g"], ["l", "g"], ["px", "pg"]]}
        self.assertEqual(_protocol(config).groups(), [["g", "x", "l"], ["pg", "px"], ["o"]])
        config = {**base, "variants": {"g": one, "x": one}, "comparisons": [["g", "untrained"]], "untrained": True}
        self.assertEqual(_protocol(config).groups(), [["g"], ["x"]])

    def test_one_epoch_per_group_from_the_mean_validation_curve(self):
        def unit(*values):
            return {"history": [{"epoch": e, "mean_average_precision_at_r": v} for e, v in enumerate(values)]}

        units = {  # mean over g and x, seeds 0 and 1: epoch 0 0.5 (not a length), 1 0.30, 2 0.35, 3 0.325
            "g": {0: unit(0.5, 0.2, 0.4, 0.3), 1: unit(0.5, 0.4, 0.3, 0.3)},
            "x": {0: unit(0.5, 0.3, 0.3, 0.4), 1: unit(0.5, 0.3, 0.4, 0.3)},
            "o": {0: unit(0.1, 0.2, 0.2, 0.1), 1: unit(0.1, 0.2, 0.2, 0.1)},  # a tie: the shorter length
        }
        base = tiny_config(seeds=[0, 1])
        one = {"loss_funcs": base["loss_funcs"]}
        config = {**base, "variants": {"g": one, "x": one, "o": one}, "comparisons": [["x", "g"]]}
        out = _protocol({**config, "selection": "mean_validation_curve"}).chosen_epochs(units)
        self.assertEqual(out["epochs"], {"g": 2, "x": 2, "o": 1})
        for epoch, value in {0: 0.5, 1: 0.3, 2: 0.35, 3: 0.325}.items():
            self.assertAlmostEqual(out["curves"]["g"]["mean_val"][epoch], value, places=12)
        # a user trial: a group whose training never beat its untrained model was tested with no word; it is flagged
        self.assertTrue(out["curves"]["g"]["untrained_best"])  # epoch 0: 0.5 >= epoch 2: 0.35
        self.assertNotIn("untrained_best", out["curves"]["o"])  # epoch 0: 0.1 < epoch 1: 0.2
        last = _protocol({**config, "selection": "last"}).chosen_epochs(units)
        self.assertEqual(last["epochs"], {"g": 3, "x": 3, "o": 3})

    def test_bad_selection_and_untrained(self):
        with self.assertRaisesRegex(Exception, "selection: expected one of best_epoch, mean_validation_curve, last"):
            _run({**tiny_config(), "selection": "best"})
        with self.assertRaisesRegex(Exception, "untrained: expected true or false"):
            _run({**tiny_config(), "untrained": "yes"})
        with self.assertRaisesRegex(Exception, "comparisons: .* names an unknown variant"):
            _run({**tiny_config(), "comparisons": [["contrastive_gap", "untrained"]]})


def cached_config(**overrides):
    """The main job's glyph config at 32 px on a fixed (pretrained-like) conv body, its first block cached."""
    from tests.runner.runner_testing_utils import register_tiny

    register_tiny()
    body = {"FixedConvNetBody": {"in_channels": 1, "widths": [8, 16], "blocks_per_stage": 1}}
    cfg = tiny_config(
        num_epochs=2,
        iterations_per_epoch=3,
        seeds=[0, 1],
        device="cpu",
        feature_cache={"boundary": "0.features.2", "num_views": 2, "dtype": "float32"},
        selection="mean_validation_curve",
        untrained=True,
        comparisons=[
            ["contrastive_xml", "contrastive_gap"],
            ["contrastive_xml_lambda0", "contrastive_gap"],
            ["contrastive_gap", "untrained"],
        ],
    )
    cfg["models"] = {
        "trunk": {"Sequential": [body, {"HistogramPooling": {"in_channels": 16, "num_prototypes": 8}}]},
        "embedder": {"Linear": {"in_features": 16, "out_features": 8}},
    }
    cfg["variants"] = {
        "contrastive_gap": {
            "models": {
                "trunk~OVERRIDE~": {"Sequential": [body, {"AdaptiveAvgPool2d": {"output_size": 1}}, {"Flatten": {}}]}
            },
            "loss_funcs": {"metric_loss~OVERRIDE~": {"ContrastiveLoss": {"pos_margin": 0.0, "neg_margin": 1.0}}},
        },
        "contrastive_xml": {},
        "contrastive_xml_lambda0": {"loss_funcs": {"metric_loss": {"XMLWrapper": {"xml_weight": 0.0}}}},
    }
    cfg.update(overrides)
    return cfg


@pytest.mark.slow
def test_a_cached_run_selects_one_length_per_group_and_tests_it_once(tmp_path):
    import torch

    from pml_extensions.datasets import CachedFeatureDataset
    from pml_extensions.runner.config.loader import variant_configs
    from pml_extensions.runner.protocols import run_protocol
    from pml_extensions.runner.protocols.paired import unit

    cfg = cached_config()
    epochs_set = []
    original = CachedFeatureDataset.set_epoch

    def spy(self, epoch):
        if self.num_views == 2:
            epochs_set.append(epoch)
        return original(self, epoch)

    with mock.patch.object(CachedFeatureDataset, "set_epoch", spy):
        results = run_protocol(cfg, str(tmp_path / "exp"), log=lambda *a, **k: None)
    assert epochs_set == [0, 1, 2] * 6  # each unit: its first epoch's views, then after each epoch
    per_seed = {n: v["per_seed"] for n, v in results["variants"].items()}
    assert per_seed["contrastive_xml_lambda0"] == per_seed["contrastive_gap"]  # the pairing test
    chosen = results["selection"]["epochs"]
    assert len(set(chosen.values())) == 1
    mean_val = [
        sum(
            h["mean_average_precision_at_r"]
            for n in chosen
            for s in "01"
            for h in results["units"][n][s]["history"]
            if h["epoch"] == e
        )
        / 6
        for e in (1, 2)
    ]
    assert chosen["contrastive_gap"] == 1 + int(mean_val[1] > mean_val[0])
    assert results["untrained"]["max_val_spread_at_epoch_0"] == 0.0  # the same untrained network in every variant
    # the tested number is the selected model's metric on the test images through the whole (uncached) trunk
    stage = tmp_path / "exp" / "contrastive_xml" / "seed_1"
    assert not (stage / "epochs").exists() and (stage / "selected_models.pth").exists()
    vcfg = unit.resolve_cache_folder(variant_configs(cfg)["contrastive_xml"], str(tmp_path / "exp"))
    models = unit.load_models(vcfg, str(stage), torch.device("cpu"))
    whole = {**vcfg, "feature_cache": None, "models": dict(vcfg["models"])}
    whole_models = {
        "trunk": torch.nn.Sequential(models["frozen"].prefix, models["trunk"]),
        "embedder": models["embedder"],
    }
    test = unit.evaluate(whole, whole_models, torch.device("cpu"))
    for metric, value in per_seed["contrastive_xml"]["1"].items():
        assert abs(value - test[metric]) < 1e-6, metric
    assert per_seed["untrained"]["0"] != per_seed["contrastive_gap"]["0"]
    _explain_a_cached_run(tmp_path, stage, whole_models, vcfg)
    # a rerun trains, tests and caches nothing again
    lines = []
    again = run_protocol(cfg, str(tmp_path / "exp"), log=lines.append)
    assert not any("feature cache" in str(line) for line in lines)
    assert {n: v["per_seed"] for n, v in again["variants"].items()} == per_seed


def _explain_a_cached_run(tmp_path, stage, whole_models, vcfg):
    """A cached run's report shows the raw test images, and ``explain --checkpoint`` takes its selected model: the
    saved trunk is the rest after the frozen prefix, the loader puts the prefix back (the error was "models.trunk
    takes 16 input channel(s) ... have 1 after transforms.eval")."""
    import json

    import numpy as np
    import torch
    from PIL import Image

    from pml_extensions.cli.explain import main as explain_main
    from pml_extensions.explain.reference_images import load_image
    from pml_extensions.runner.objects.saved_models import load_models

    examples = json.load(open(tmp_path / "exp" / "retrieval" / "contrastive_xml.json"))
    thumb = Image.open(tmp_path / "exp" / "retrieval" / examples["queries"][0]["image"])
    assert min(thumb.size) >= 32  # the 32 px glyph, scaled up to the thumbnail; a cached map would be 8 px or less
    ckpt = str(stage / "selected_models.pth")
    trunk, embedder = load_models(ckpt)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(2):
        paths.append(str(tmp_path / f"img{i}.png"))
        Image.fromarray((rng.random((32, 32)) * 255).astype(np.uint8)).save(paths[-1])
    x = torch.stack([load_image(p, 32, 1, True, ([0.5], [0.5])) for p in paths])
    with torch.no_grad():
        got = embedder.eval()(trunk.eval()(x))
        want = whole_models["embedder"].eval()(whole_models["trunk"].eval()(x))
    assert torch.allclose(got, want, atol=1e-6)
    out = str(tmp_path / "why")
    assert explain_main([paths[0], paths[1], "--checkpoint", ckpt, "--out", out]) == 0
    cosine = json.load(open(tmp_path / "why" / "similarity.json"))["results"][0]["cosine_similarity"]
    assert abs(cosine - float(torch.nn.functional.cosine_similarity(want[:1], want[1:])[0])) < 1e-5


@pytest.mark.slow
def test_shard_builds_then_a_run_finds_the_caches(tmp_path):
    cfg = cached_config(seeds=[0])
    folder = str(tmp_path / "exp")
    protocol = Paired(cfg, folder, log=lambda *a: None)
    assert protocol.build_caches(rank=1, world_size=2) is False
    assert protocol.build_caches(rank=0, world_size=2) is True
    lines = []
    Paired(cfg, folder, log=lines.append).run()
    assert not any("feature cache" in str(line) for line in lines)


def test_a_bad_image_stops_the_job_before_any_unit_trains(tmp_path):
    """`job --data_folder photos` with a truncated PNG among the test classes trained every variant, then died in
    PIL's traceback; the files are checked once before the first unit, as the MLRC protocol does."""
    import os

    from PIL import Image

    from pml_extensions.runner.errors import ConfigError

    root = tmp_path / "photos"
    for c in range(4):
        os.makedirs(root / f"c{c}")
        for k in range(3):
            Image.new("RGB", (16, 16), (60 * c, k, 0)).save(root / f"c{c}" / f"{k}.png")
    bad = str(root / "c3" / "1.png")
    with open(bad, "rb") as f:
        head = f.read(60)
    with open(bad, "wb") as f:
        f.write(head)
    folder = str(tmp_path / "exp")
    cfg = tiny_config(dataset={"name": "imagefolder", "root": str(root)})
    with mock.patch.object(Paired, "unit", side_effect=AssertionError("trained")):
        with pytest.raises(ConfigError) as e:
            Paired(cfg, folder, sources={"dataset": "command line"}, log=lambda *a, **k: None).run()
    # every problem in one refusal: the bad file, and (4 classes: 2 for training) no room for a validation part
    assert e.value.problems == [
        "config: validation: validation.class_fraction 0.25 of 2 training classes leaves 0 validation and 2 training "
        f"classes; each side needs at least 2 (the dataset imagefolder ({root}) has 2 training classes)",
        f"command line: dataset: 1 of 6 images do not decode: {bad} (image file is truncated); replace or remove "
        "them, or leave them out with --skip_bad_images true",
    ]
    assert not os.path.exists(folder)  # a refused run leaves no folder behind


def test_skip_bad_images_keeps_the_left_out_files_for_bad_images_txt(tmp_path):
    import os

    from PIL import Image

    from pml_extensions.runner.objects import preflight

    root = tmp_path / "photos"
    for c in range(16):
        os.makedirs(root / f"c{c}")
        for k in range(4):
            Image.new("RGB", (16, 16), (30 * c, k, 0)).save(root / f"c{c}" / f"{k}.png")
    bad = str(root / "c0" / "broken.png")
    open(bad, "wb").close()
    cfg = tiny_config(dataset={"name": "imagefolder", "root": str(root)}, skip_bad_images=True, batch_size=8)
    protocol = Paired(cfg, str(tmp_path / "exp"), log=lambda *a, **k: None)
    protocol.preflight()
    assert list(protocol.left_out) == [bad]
    os.makedirs(tmp_path / "exp")
    listing = preflight.write_bad_images(protocol.left_out, str(tmp_path / "exp"))
    assert open(listing, encoding="utf-8").read().startswith(bad + "\t")


def test_a_command_line_key_that_a_variant_replaces_gets_a_note(tmp_path):
    """`--feature_cache null` on a config whose variants set their own feature_cache was silently not applied to
    them (the run built caches); the note names the variants and where they set it."""
    cfg = tiny_config(seed=None, seeds=[0])
    cfg["variants"] = {"a": {"batch_size~OVERRIDE~": 4}, "b": {}}
    cfg["comparisons"] = [["a", "b"]]
    lines = []
    Paired(cfg, str(tmp_path / "exp"), sources={"batch_size": "command line", "variants": "my/config.yaml"},
           log=lines.append)  # fmt: skip
    assert lines == [
        "note: --batch_size (command line) does not reach variant(s) a: they set their own batch_size "
        "(my/config.yaml); change it there or run other --variants"
    ]


def _csv_with_validation_rows(tmp_path):
    from PIL import Image

    lines = ["path,label,split"]
    for c, side in [(c, "train") for c in range(12)] + [(12, "val"), (13, "val")] + [(c, "test") for c in (14, 15)]:
        for k in range(4):
            name = f"{c}_{k}.png"
            Image.new("RGB", (16, 16), (15 * c, 40 * k, 0)).save(tmp_path / name)
            lines.append(f"{name},Class {c} / é,{side}")
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tiny_config(dataset={"name": "csv", "root": str(tmp_path / "t.csv")}, batch_size=8)


def test_the_validation_rows_of_a_csv_select_the_epoch(tmp_path):
    """A catalogue's `val` rows (two classes of their own) were noted and dropped: the paired protocol validated on
    classes drawn from the train rows. Now they validate (OML's split column), and every train row trains."""
    cfg = _csv_with_validation_rows(tmp_path)
    notes = []
    protocol = Paired(cfg, str(tmp_path / "exp"), sources={"dataset": "command line"}, log=notes.append)
    protocol.preflight()
    assert notes[0] == (
        "note: command line: dataset: the split column's validation rows (classes Class 12 / é, Class 13 / é) select "
        "the tested epoch; every train row trains (validation.class_fraction is not used)"
    )
    # the classes of each role by name (console and results.json)
    roles = protocol.class_roles
    assert roles == {
        "train": [f"Class {c} / é" for c in sorted(range(12), key=str)],
        "validation": ["Class 12 / é", "Class 13 / é"],
        "test": ["Class 14 / é", "Class 15 / é"],
    }
    assert notes[1].startswith("classes: train 12 (Class ") and notes[1].endswith(
        "validation 2 (Class 12 / é, Class 13 / é); test 2 (Class 14 / é, Class 15 / é)"
    )
    assert protocol.extra_results({})["classes"] == roles


def test_a_one_class_folder_is_named_with_its_class_counts(tmp_path):
    """A user trial: `--data_folder oneclass` blamed the shipped config's validation fraction and logged `classes: test
    0 ()`; the refusal names the folder, its training classes and its empty test split."""
    from PIL import Image

    from pml_extensions.runner.errors import ConfigError

    root = tmp_path / "oneclass"
    (root / "a").mkdir(parents=True)
    for k in range(6):
        Image.new("RGB", (16, 16), (40 * k, 0, 0)).save(root / "a" / f"{k}.png")
    cfg = tiny_config(dataset={"name": "imagefolder", "root": str(root)})
    with mock.patch.object(Paired, "unit", side_effect=AssertionError("trained")):
        with pytest.raises(ConfigError) as e:
            Paired(cfg, str(tmp_path / "exp"), sources={"dataset": "command line"}, log=lambda *a, **k: None).run()
    assert e.value.problems == [
        "config: validation: validation.class_fraction 0.25 of 1 training classes leaves 0 validation and 1 training "
        f"classes; each side needs at least 2 (the dataset imagefolder ({root}) has 1 training classes)",
        f"command line: dataset: the test split of the dataset imagefolder ({root}) has 0 class(es); retrieval on "
        "unseen classes needs at least 2",
    ]
