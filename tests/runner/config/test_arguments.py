"""runner/config/arguments.py (issue 21, item 4): every class's arguments in a config are checked against its signature
when the config loads (not when a fold starts), with the nearest name; counts that must be positive are refused."""

import os

import pytest

from pml_extensions.runner.config.arguments import check_arguments
from pml_extensions.runner.config.loader import (
    CONFIG_FOLDERS,
    Sources,
    config_layout,
    display_path,
    find_config,
    parse_command_line,
    shipped_configs,
)
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.protocols import load_config


def _shipped_selections():
    for name in shipped_configs():
        root = find_config(name)
        if config_layout(root) == "flat":
            yield name, None
            continue
        yield name, {}
        for folder in CONFIG_FOLDERS:
            path = os.path.join(root, folder)
            for file in sorted(os.listdir(path)) if os.path.isdir(path) else ():
                if file.endswith(".yaml") and file != "default.yaml":
                    yield name, {folder: ["default", file[:-5]]}


@pytest.mark.parametrize("name, selection", list(_shipped_selections()))
def test_every_shipped_config_and_variant_passes(name, selection):
    """No false refusals: PML losses take their base classes' keywords (resolved along the MRO), torchvision's
    model functions take **kwargs, our optimizer keys (prototype_lr, param_groups) are the runner's."""
    load_config(find_config(name), selection or None, allow_search=True)


def test_the_misspelled_argument_in_a_users_file(tmp_path):
    """The issue's input: `ModuleWithRecords.__init__() got an unexpected keyword argument 'xml_wieght'` after the
    data was read; now one line at load time naming the file, the key and the nearest argument."""
    losses = tmp_path / "config_loss_and_miners"
    losses.mkdir()
    (losses / "default.yaml").write_text(
        "loss_funcs:\n  metric_loss:\n    XMLWrapper:\n      loss: {ContrastiveLoss: {}}\n      xml_wieght: 0.01\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config(str(tmp_path))
    assert str(e.value) == (
        f"{display_path(str(losses / 'default.yaml'))}: loss_funcs.metric_loss.XMLWrapper: bad arguments: XMLWrapper "
        "takes no argument 'xml_wieght'; did you mean xml_weight?"
    )


def test_nested_specs_and_the_mro():
    ok = {
        "loss_funcs": {
            "metric_loss": {
                "XMLWrapper": {
                    "loss": {
                        "ContrastiveLoss": {
                            "pos_margin": 0.0,
                            "distance": {"CosineSimilarity": {}},  # BaseMetricLossFunction's, two levels up
                            "reducer": {"AvgNonZeroReducer": {}},
                            "collect_stats": True,  # ModuleWithRecords', at the end of the MRO
                        }
                    },
                    "xml_weight": 0.01,
                }
            }
        },
        "models": {"trunk": [{"resnet18": {"num_classes": 7}}], "embedder": {"MLP": {"layer_sizes": [8]}}},
        "mining_funcs": {"tuple_miner": {"MultiSimilarityMiner": {"epsilon": 0.1}}},
        "optimizers": {"trunk_optimizer": {"Adam": {"lr": 1e-3, "prototype_lr": 0.01}}},
    }
    check_arguments(ok)
    bad = {"loss_funcs": {"metric_loss": {"XMLWrapper": {"loss": {"ContrastiveLoss": {"pos_margn": 0.0}}}}}}
    with pytest.raises(ConfigError, match=r"XMLWrapper.loss.ContrastiveLoss: bad arguments: .*did you mean pos_margin"):
        check_arguments(bad)
    with pytest.raises(ConfigError, match=r"models.trunk\[0\].ConvNetBody: bad arguments: .*did you mean widths"):
        check_arguments({"models": {"trunk": [{"ConvNetBody": {"width": [8]}}, {"Flatten": None}]}})
    with pytest.raises(ConfigError, match=r"transforms.train.Resize: bad arguments: .*did you mean size"):
        check_arguments({"transforms": {"train": {"Resize": {"sise": 32}, "ToTensor": {}}}})


def test_registered_classes_are_read_live():
    import torch

    from pml_extensions.runner.config.registry import _REGISTRY, register

    class Head(torch.nn.Module):
        def __init__(self, width=4):
            super().__init__()

    register(Head, role="model", name="CheckedHead")
    try:
        check_arguments({"models": {"embedder": {"CheckedHead": {"width": 8}}}})
        with pytest.raises(ConfigError, match="did you mean width"):
            check_arguments({"models": {"embedder": {"CheckedHead": {"widht": 8}}}})
    finally:
        _REGISTRY.pop("CheckedHead")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--patience", "-1"], "command line: patience: expected an integer >= 0, got -1"),  # the mlrc Settings'
        (["--num_epochs_train", "0"], "command line: num_epochs_train: expected an integer >= 1, got 0"),
        (["--save_interval", "1.5"], "command line: save_interval: expected an integer >= 1, got 1.5"),
        (["--skip_bad_images", "2"], "command line: skip_bad_images: expected true or false, got 2"),
        (["--trainer~APPLY~2", "{iterations_per_epoch: 0}"], "command line: trainer: iterations_per_epoch must be"),
        (["--trainer~APPLY~2", "{dataloader_num_workers: -2}"], "command line: trainer: dataloader_num_workers must"),
        (["--sampler~APPLY~2", "{m: 0}"], "command line: sampler: m must be a positive integer, got 0"),
        (["--optimizers~APPLY~3", "{lr: -1e-3}"], "command line: optimizers.trunk_optimizer: lr must be a number"),
        (["--tester~APPLY~2", "{batch_size: 0}"], "command line: tester: batch_size must be a positive integer"),
    ],
)
def test_values_that_must_be_positive(argv, message):
    """The issue's input `--patience -1` was accepted. Each problem is one line; `--optimizers~APPLY~3` reaches every
    optimizer, so each one's learning rate is named (in one refusal)."""
    with pytest.raises(ConfigError) as e:
        load_config(find_config("contrastive"), {"config_general": ["default", "quick"]}, parse_command_line(argv))
    lines = getattr(e.value, "problems", [str(e.value)])
    assert lines[0].startswith(message) and all("\n" not in line for line in lines)


def test_patience_null_and_zero_are_fine():
    for value in ("null", "0"):
        load_config(find_config("contrastive"), None, parse_command_line(["--patience", value]))


def test_the_file_named_is_the_one_that_set_the_value(tmp_path):
    """trainer comes from a file; the command line changes its batch size only: a bad iterations_per_epoch in the
    file is the file's, a bad batch size the command line's."""
    general = tmp_path / "config_general"
    general.mkdir()
    (general / "default.yaml").write_text("trainer: {MetricLossOnly: {iterations_per_epoch: 0, batch_size: 8}}\n")
    shown = display_path(str(general / "default.yaml"))
    with pytest.raises(ConfigError, match=f"^{shown}: trainer: iterations_per_epoch must be"):
        load_config(str(tmp_path), None, parse_command_line(["--trainer~APPLY~2", "{batch_size: 4}"]))
    (general / "default.yaml").write_text("trainer: {MetricLossOnly: {iterations_per_epoch: 5, batch_size: 8}}\n")
    with pytest.raises(ConfigError, match="^command line: trainer: batch_size must be"):
        load_config(str(tmp_path), None, parse_command_line(["--trainer~APPLY~2", "{batch_size: -4}"]))


def test_the_cli_prints_one_line_and_exits_2(tmp_path, capsys):
    from pml_extensions.cli import run

    argv = ["contrastive_xml", "--variant", "quick", "--loss_funcs~APPLY~3", "{xml_wieght: 0.1}"]
    assert run.main(argv + ["--root_experiment_folder", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "config error: command line: loss_funcs.metric_loss.XMLWrapper: bad arguments: XMLWrapper takes no "
        "argument 'xml_wieght'; did you mean xml_weight?\n"
    )
    assert not os.listdir(tmp_path)  # refused before anything was written


def test_sources_of_nested_values():
    cfg, sources = load_config(
        find_config("contrastive"),
        {"config_general": ["default", "quick"]},
        parse_command_line(["--trainer~APPLY~2", "{batch_size: 64}"]),
    )
    assert isinstance(sources, Sources)
    assert sources.of("trainer.MetricLossOnly.batch_size") == "command line"
    assert sources.of("trainer.MetricLossOnly.iterations_per_epoch") == "configs/contrastive/config_general/quick.yaml"
    assert sources.of("trainer.MetricLossOnly.set_min_label_to_zero") == (
        "configs/contrastive/config_general/default.yaml"
    )
    assert sources.of("split_manager.ClassDisjointSplitManager.num_training_partitions") == (
        "configs/contrastive/config_dataset/default.yaml"
    )


# ------------------------------------------------------------------------------------- class names at any depth
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NESTED_TYPO = ["--loss_funcs~OVERRIDE~", "{metric_loss: {XMLWrapper: {loss: {ContrastivLoss: {}}}}}"]
NESTED_LINE = "loss_funcs.metric_loss.XMLWrapper.loss: unknown class 'ContrastivLoss'; did you mean ContrastiveLoss?"


def test_a_misspelled_nested_class_is_refused_by_dry_run_before_any_folder(tmp_path, capsys):
    """The issue's input passed --dry-run (rc 0) and the real run stopped only after it created the experiment
    folder (and, with feature_cache, built the cache): now the config check refuses it, rc 2, nothing written."""
    from pml_extensions.cli import run

    argv = ["contrastive_xml", "--variant", "quick"] + NESTED_TYPO + ["--dry-run"]
    assert run.main(argv + ["--root_experiment_folder", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == f"config error: command line: {NESTED_LINE}\n"
    assert not os.listdir(tmp_path)


def test_a_misspelled_nested_class_in_the_paired_protocol():
    with pytest.raises(ConfigError) as e:
        load_config(find_config("xml_glyphs"), None, parse_command_line(NESTED_TYPO))
    assert str(e.value) == f"command line: {NESTED_LINE}"


def test_a_misspelled_nested_class_in_a_users_file_names_the_file(tmp_path):
    """A copy of benchmarks/configs/xml_cached_glyphs (a feature_cache config) with the nested loss misspelled."""
    import shutil

    root = tmp_path / "xml_cached_glyphs"
    shutil.copytree(os.path.join(REPO, "benchmarks", "configs", "xml_cached_glyphs"), root)
    losses = root / "config_loss_and_miners.yaml"
    text = losses.read_text()
    assert "        ContrastiveLoss: {pos_margin: 0.0" in text
    losses.write_text(
        text.replace("        ContrastiveLoss: {pos_margin: 0.0", "        ContrastivLoss: {pos_margin: 0.0")
    )
    with pytest.raises(ConfigError) as e:
        load_config(str(root))
    assert str(e.value) == f"{display_path(str(losses))}: {NESTED_LINE}"


def test_every_unknown_name_and_argument_in_one_pass():
    """Classes in a Sequential list, a Compose's transforms, a loss's distance, a lower-case model function, a
    param_groups' modules, and unknown keyword arguments next to them: all named in one refusal, nearest names
    given, nothing built."""
    config = {
        "models": {
            "trunk": {"Sequential": [{"MobileNetV2Feature": {}}, {"resnet5": {}}]},
            "embedder": {"Linear": {"in_features": 2, "out_feature": 3}},
        },
        "loss_funcs": {
            "metric_loss": {
                "XMLWrapper": {"loss": {"ContrastiveLoss": {"pos_margn": 0, "distance": {"CosineSimilarty": {}}}}}
            }
        },
        "transforms": {"train": {"Compose": {"transforms": [{"Resise": {"size": 3}}, {"ToTensor": None}]}}},
        "optimizers": {"trunk_optimizer": {"Adam": {"lr": 0.1, "param_groups": [{"modules": "GeMPoolin"}]}}},
    }
    with pytest.raises(ConfigError) as e:
        check_arguments(config, {k: "my.yaml" for k in config})
    assert e.value.problems == [
        "my.yaml: models.trunk.Sequential[0]: unknown class 'MobileNetV2Feature'; did you mean MobileNetV2Features?",
        "my.yaml: models.trunk.Sequential[1]: unknown class 'resnet5'; did you mean resnet50?",
        "my.yaml: models.embedder.Linear: bad arguments: Linear takes no argument 'out_feature'; did you mean "
        "out_features?",
        "my.yaml: loss_funcs.metric_loss.XMLWrapper.loss.ContrastiveLoss: bad arguments: ContrastiveLoss takes no "
        "argument 'pos_margn'; did you mean pos_margin?",
        "my.yaml: loss_funcs.metric_loss.XMLWrapper.loss.ContrastiveLoss.distance: unknown class 'CosineSimilarty'; "
        "did you mean CosineSimilarity?",
        "my.yaml: optimizers.trunk_optimizer.Adam.param_groups[0]: unknown class 'GeMPoolin'; did you mean GeMPooling?",
        "my.yaml: transforms.train.Compose.transforms[0]: unknown class 'Resise'; did you mean Resize?",
    ]
    assert str(e.value).startswith("7 problems, nothing was run:\n")


def test_a_variants_own_typo_is_named_with_the_variant_and_the_bases_once():
    config = {
        "loss_funcs": {"metric_loss": {"XMLWrapper": {"loss": {"ContrastivLoss": {}}}}},
        "variants": {
            "a": {},
            "b": {"models": {"embedder": {"Linaer": {}}}},
        },
    }
    with pytest.raises(ConfigError) as e:
        check_arguments(config)
    assert e.value.problems == [
        f"config: {NESTED_LINE}",
        "config: models.embedder: unknown class 'Linaer'; did you mean Linear? (variant b)",
    ]


# ------------------------------------------------------------------------------------- a dataset by name, merged
CLIPART = os.path.join(REPO, "benchmarks", "configs", "xml_cached_clipart")


def test_a_dataset_by_name_merged_over_another_is_refused(tmp_path, capsys):
    """The issue's input: --dataset without ~OVERRIDE~ kept the config's `kwargs: {max_side: 160}` next to the user's
    csv and ended in `ImageCSVSplit.__init__() got an unexpected keyword argument 'max_side'`; now the line the mlrc
    protocol gives for two merged classes, at load time, rc 2, nothing written."""
    from pml_extensions.cli import run

    csv = str(tmp_path / "some.csv")
    argv = [CLIPART, "--dataset", f"{{name: csv, root: {csv}}}", "--dry-run"]
    assert run.main(argv + ["--root_experiment_folder", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == (
        "config error: command line: dataset: name csv (the command line) was merged next to kwargs.max_side of the "
        f"dataset openclipart (your {display_path(os.path.join(CLIPART, 'config_dataset.yaml'))}); a merge keeps "
        "both, write --dataset~OVERRIDE~ to replace it; --data_folder PATH makes your folder or CSV file the dataset\n"
    )
    assert not os.listdir(tmp_path)


def test_a_dataset_by_name_refined_replaced_or_given_by_data_folder_passes(tmp_path):
    csv = tmp_path / "some.csv"
    csv.write_text("label,path,split\n")
    for argv, dataset in [
        (
            ["--dataset", "{kwargs: {max_side: 120}}"],
            {"name": "openclipart", "root": None, "kwargs": {"max_side": 120}},
        ),
        (
            ["--dataset", "{name: openclipart, root: /data}"],
            {"name": "openclipart", "root": "/data", "kwargs": {"max_side": 160}},
        ),
        (["--dataset~OVERRIDE~", f"{{name: csv, root: {csv}}}"], {"name": "csv", "root": str(csv)}),
    ]:
        cfg, _ = load_config(CLIPART, None, parse_command_line(argv))
        assert cfg["dataset"] == dataset
    cfg, _ = load_config(CLIPART, None, None, data_folder=str(csv), columns="label=label,path=path")
    assert cfg["dataset"] == {
        "name": "csv",
        "root": str(csv),
        "kwargs": {"columns": {"label": "label", "path": "path"}},
    }


@pytest.mark.parametrize("name", ["contrastive", "xml_glyphs"])
def test_a_misspelled_tester_is_refused_once_as_the_builder_would(name):
    """The tester's own check (pb_keys.tester_spec, the builder's) runs as the config loads in both protocols (the
    paired one built its tester only after the first epoch), and the mlrc protocol's PB check of the same key does
    not repeat the line."""
    argv = parse_command_line(["--tester~OVERRIDE~", "{GlobalEmbeddingSpaceTestr: {}}"])
    with pytest.raises(ConfigError) as e:
        load_config(find_config(name), None, argv)
    assert str(e.value) == (
        "command line: tester.GlobalEmbeddingSpaceTestr: unknown tester class 'GlobalEmbeddingSpaceTestr'; did you "
        "mean GlobalEmbeddingSpaceTester?"
    )
