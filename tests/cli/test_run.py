"""The CLI and the shipped MLRC-layout configs."""

import json
import os
import shutil

import pytest
import torch

from pml_extensions.cli import run as cli
from pml_extensions.runner.protocols import load_config
from pml_extensions.runner.protocols.mlrc.runner import MLRCRunner
from tests.runner.runner_testing_utils import dejavu_fonts

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHIPPED = (
    "contrastive",
    "contrastive_xml",
    "proxy_anchor",
    "proxy_anchor_xml",
    "template_block",
    "explanation",
)
CONFIGS = os.path.join(os.path.dirname(cli.__file__), "..", "configs")


def _dataset_or_skip():
    try:
        from pml_extensions.datasets import GlyphDataset  # noqa: F401
    except ImportError as e:  # pragma: no cover
        pytest.skip(f"pml_extensions.datasets not available: {e}")


class TestShippedConfigs:
    @pytest.mark.parametrize("name", SHIPPED)
    def test_full_variant_is_mlrc(self, name):
        cfg, _ = load_config(cli.loader.find_config(name))
        for key in ("trunk_optimizer", "embedder_optimizer"):
            assert cfg["optimizers"][key] == {"RMSprop": {"lr": 1e-6, "weight_decay": 1e-4, "momentum": 0.9}}
        assert cfg["models"]["embedder"] == {"MLP": {"layer_sizes": [128]}}
        (trainer_kwargs,) = cfg["trainer"].values()
        assert trainer_kwargs["freeze_trunk_batchnorm"] is True and trainer_kwargs["batch_size"] == 32
        assert cfg["hook_container"]["HookContainer"]["primary_metric"] == "mean_average_precision_at_r"
        split = cfg["split_manager"]["ClassDisjointSplitManager"]
        assert (split["test_size"], split["test_start_idx"], split["num_training_partitions"]) == (0.5, 0.5, 4)
        assert list(cfg["dataset"]) == ["CUB"]
        for extra, cls in (("with_cars196", "Cars196"), ("with_sop", "StanfordOnlineProducts")):
            other, _ = load_config(cli.loader.find_config(name), {"config_dataset": ["default", extra]})
            assert list(other["dataset"]) == [cls]

    @pytest.mark.parametrize("name", SHIPPED)
    def test_quick_variant_builds(self, name, tmp_path):
        _dataset_or_skip()
        root = cli.loader.find_config(name)
        cfg, sources = load_config(root, cli._variant_selection(root, "quick", {}))
        assert list(cfg["dataset"]) == ["GlyphDataset"]
        runner = MLRCRunner(cfg, str(tmp_path), sources, log=lambda *a: None)
        channels = 3 if name == "explanation" else 1
        models = runner.builder.build_models(torch.zeros(channels, 32, 32), num_classes=23)
        losses, _ = runner.builder.build_losses(models, num_classes=23)
        optimizers = runner.builder.build_optimizers(models, losses)
        assert set(optimizers) >= {"trunk_optimizer", "embedder_optimizer"}
        if name.startswith("proxy"):
            assert "metric_loss_optimizer" in optimizers
        emb = models["embedder"](models["trunk"](torch.randn(8, channels, 32, 32)))
        assert emb.shape == (8, 128)
        loss = losses["metric_loss"](emb, torch.arange(4).repeat_interleave(2))
        assert torch.isfinite(loss)
        if name.endswith("_xml"):
            assert losses["metric_loss"].histogram_layer is not None  # wired to the trunk's HistogramPooling
        if name == "template_block":
            from pml_extensions.trunks.template_matching_block import TemplateMatchingBlock

            (block,) = [m for m in models["trunk"].modules() if isinstance(m, TemplateMatchingBlock)]
            assert block.num_classes == 23  # filled in per fold
        if name == "explanation":
            assert list(cfg["test_hooks"]["explanations"]) == ["ExplanationHook"]


def _copy(name, tmp_path):
    dst = str(tmp_path / name)
    shutil.copytree(cli.loader.find_config(name), dst)
    return dst


def _edit(path, old, new):
    with open(path) as f:
        text = f.read()
    assert old in text
    with open(path, "w") as f:
        f.write(text.replace(old, new))


class TestErrors:
    """Each kind of config error: exit status 2 and one line naming the file and the key."""

    def _check(self, capsys, argv, *needles):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0, err
        for n in needles:
            assert n in err, err

    def test_unknown_class(self, tmp_path, capsys):
        _dataset_or_skip()
        root = _copy("contrastive", tmp_path)
        _edit(os.path.join(root, "config_dataset", "quick.yaml"), "GlyphDataset:", "GlyphDatasett:")
        self._check(
            capsys,
            [root, "--variant", "quick", "--root_experiment_folder", str(tmp_path / "e")],
            os.path.join("config_dataset", "quick.yaml"),
            "dataset",
            "unknown class 'GlyphDatasett'",
        )

    def test_bad_keyword(self, tmp_path, capsys):
        _dataset_or_skip()
        root = _copy("contrastive", tmp_path)
        _edit(os.path.join(root, "config_loss_and_miners", "default.yaml"), "neg_margin", "neg_margn")
        self._check(
            capsys,
            [root, "--variant", "quick", "--root_experiment_folder", str(tmp_path / "e")],
            os.path.join("config_loss_and_miners", "default.yaml"),
            "loss_funcs.metric_loss.ContrastiveLoss",
            "neg_margn",
        )

    def test_missing_file(self, tmp_path, capsys):
        self._check(
            capsys,
            ["contrastive", "--config_general", "[default, with_nothing]"],
            os.path.join("config_general", "with_nothing.yaml"),
            "missing config file",
            "config_general",
        )

    def test_missing_config_folder(self, tmp_path, capsys):
        self._check(capsys, [str(tmp_path / "nowhere")], "nowhere", "missing config folder")

    def test_malformed_yaml(self, tmp_path, capsys):
        root = _copy("contrastive", tmp_path)
        _edit(
            os.path.join(root, "config_optimizers", "default.yaml"),
            "RMSprop: {lr: 0.000001,",
            "RMSprop: {lr: [0.000001,",
        )
        self._check(capsys, [root], os.path.join("config_optimizers", "default.yaml:"), "malformed YAML", "RMSprop")

    def test_search_needs_the_number_of_trials(self, tmp_path, capsys):
        pytest.importorskip("optuna")
        self._check(
            capsys,
            [
                "contrastive",
                "--variant",
                "quick",
                "--root_experiment_folder",
                str(tmp_path),
                "--loss_funcs~APPLY~3",
                "{neg_margin~BAYESIAN~:",
                "[0.5,",
                "2]}",
            ],
            "bayes_opt_iters",
            "--bayes_opt_iters 20",
        )

    def test_unknown_variant_lists_the_variants(self, capsys):
        self._check(
            capsys,
            ["contrastive", "--variant", "quik"],
            "--variant quik: no such variant",
            "quick",
            "with_cars196",
            "with_sop",
        )

    def test_bare_variant_is_an_error(self, capsys):
        self._check(capsys, ["contrastive", "--variant"], "--variant: needs a name", "quick")

    def test_unknown_key_names_the_nearest(self, capsys):
        self._check(
            capsys,
            ["contrastive", "--variant", "quick", "--num_epochs", "1"],
            "command line: --num_epochs",
            "did you mean num_epochs_train",
        )


def test_dry_run_prints_the_merged_config_and_trains_nothing(tmp_path, capsys):
    import yaml

    argv = [
        "contrastive",
        "--variant",
        "quick",
        "--root_experiment_folder",
        str(tmp_path),
        "--dry-run",
        "--tester~APPLY~2",
        "{accuracy_calculator~OVERRIDE~:",
        "{ChunkedAccuracyCalculator:",
        "{chunk_size:",
        "64}}}",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    cfg = yaml.safe_load(out)
    assert cfg["num_epochs_train"] == 3 and list(cfg["dataset"]) == ["GlyphDataset"]
    assert cfg["tester"]["GlobalEmbeddingSpaceTester"]["accuracy_calculator"] == {
        "ChunkedAccuracyCalculator": {"chunk_size": 64}
    }
    assert not os.listdir(tmp_path)  # nothing written
    assert os.path.abspath(CONFIGS) not in out and "site-packages" not in out


def test_help_has_a_usage_line_and_no_rst(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m pml_extensions run") and "``" not in out and ":func:" not in out


def test_list_protocols(capsys):
    assert cli.main(["--list", "protocol"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {p}: " in out for p in ("mlrc", "paired"))


def test_list_roles(capsys):
    assert cli.main(["--list", "loss"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Classes a config can name") and "torchvision" in out.splitlines()[1]
    assert "\nloss:\n" in out and "XMLWrapper" in out
    assert "pytorch_metric_learning.losses: " in out and "ContrastiveLoss" in out


@pytest.mark.slow
def test_new_user_changes_dataset_and_trunk_lines_and_runs(tmp_path, capsys):
    """Tried as a new user would: copy a config folder in powerful-benchmarker's layout, change only the
    dataset
    and trunk lines to offline ones, run it with the CLI (here shortened from the command line)."""
    _dataset_or_skip()
    root = _copy("contrastive", tmp_path)
    _edit(
        os.path.join(root, "config_dataset", "default.yaml"),
        "  CUB:\n    split: train+test\n    download: false",
        "  GlyphDataset:\n    split: all",
    )
    _edit(
        os.path.join(root, "config_models", "default.yaml"),
        "    - mobilenet_v2_features: {pretrained: true}",
        "    - ConvNetBody: {in_channels: 3, widths: [8, 16], blocks_per_stage: 1}",
    )
    argv = [
        root,
        "--root_experiment_folder",
        str(tmp_path / "exp"),
        "--num_epochs_train",
        "1",
        "--num_training_sets",
        "1",
        "--check_untrained_accuracy",
        "false",
        "--trainer~APPLY~2",
        "{iterations_per_epoch:",
        "2,",
        "dataloader_num_workers:",
        "0}",
        "--eval_dataloader_num_workers",
        "0",
        # the glyphs of the DejaVu Sans fonts only (496 of the 1364 images, every one of the 62 classes): the
        # evaluation embeds every image at the config's crop size
        "--dataset~APPLY~2",
        json.dumps({"font_files": dejavu_fonts()}),
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "test separate_128D" in out
    results = json.load(open(tmp_path / "exp" / "contrastive" / "results.json"))
    assert results["test_classes"] == list(range(31, 62))  # second half of the 62 glyph classes
    html = open(tmp_path / "exp" / "contrastive" / "report.html").read()
    assert "data:image/png;base64," in html and "mean_average_precision_at_r" in html


def test_full_variant_without_data_folder_says_how_to_fix(tmp_path, capsys):
    assert cli.main(["contrastive", "--root_experiment_folder", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "config_dataset" in err and "dataset.CUB" in err and "--dataset_root" in err and "\n" not in err


def test_variants_keep_only_the_named_entries_of_a_flat_config(capsys):
    import yaml

    assert cli.main(["xml_glyphs", "--variants", "contrastive_xml", "contrastive_gap", "--dry-run"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert list(cfg["variants"]) == ["contrastive_gap", "contrastive_xml"]
    assert cfg["comparisons"] == [["contrastive_xml", "contrastive_gap"]]
    assert cli.main(["xml_glyphs", "--variants", "nope", "--dry-run"]) == 2
    assert "--variants: unknown ['nope']" in capsys.readouterr().err
    assert cli.main(["contrastive", "--variants", "a", "--dry-run"]) == 2
    assert "this config has no variants" in capsys.readouterr().err


def test_a_flat_config_names_its_experiment_folder(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_run_protocol(config, folder, sources, **kwargs):
        seen["folder"], seen["command"] = folder, kwargs["command"]
        return {}

    monkeypatch.setattr("pml_extensions.runner.protocols.run_protocol", fake_run_protocol)
    copy = str(tmp_path / "my_copy")
    shutil.copytree(cli.loader.find_config("xml_glyphs"), copy)
    assert cli.main([copy, "--root_experiment_folder", str(tmp_path / "exp")]) == 0
    assert seen["folder"] == os.path.join(str(tmp_path / "exp"), "xml_glyphs")  # experiment_name: xml_glyphs
    assert seen["command"][:5] == ["python", "-m", "pml_extensions", "run", copy]
    assert cli.main([copy, "--root_experiment_folder", str(tmp_path / "exp"), "--experiment_name", "mine"]) == 0
    assert seen["folder"] == os.path.join(str(tmp_path / "exp"), "mine")


def test_a_search_stopped_by_its_failure_rule_exits_1_and_names_search_json(tmp_path, monkeypatch, capsys):
    pytest.importorskip("optuna")
    summary = {"trials": [], "n_trials": 0, "best": None, "failed_trials": [0, 1, 2]}

    def fake_run_search(config, folder, sources, **kwargs):
        return dict(summary, stopped=stopped)

    monkeypatch.setattr("pml_extensions.runner.protocols.search.run_search", fake_run_search)
    argv = ["contrastive", "--variant", "quick", "--root_experiment_folder", str(tmp_path), "--bayes_opt_iters", "3"]
    argv += ["--loss_funcs~APPLY~3", "{neg_margin~BAYESIAN~: [0.5, 2]}"]
    stopped = {"rule": "bayes_opt_max_failures_in_a_row=3", "trials": [0, 1, 2], "message": "search stopped: ..."}
    assert cli.main(argv) == 1
    assert "search.json" in capsys.readouterr().out.splitlines()[-1]  # no trial completed: still the search's file
    stopped = None
    assert cli.main(argv) == 0


# ---------------------------------------------------------------------------------------------------------------------
# Issue 21: --data_folder, and the one line for an output folder that takes no files, an interrupt, a config error.
def test_an_output_folder_that_takes_no_files_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    argv = ["contrastive", "--variant", "quick", "--root_experiment_folder", str(blocker)]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err == (
        f"error: {blocker}/contrastive_quick: cannot write (Not a directory); choose a writable "
        "--root_experiment_folder or fix its permissions, then rerun\n"
    )


@pytest.mark.parametrize(
    "error, status, line",
    [
        (lambda: __import__("pml_extensions.runner.errors").runner.errors.Interrupted(15), 143, "interrupted"),
        (lambda: KeyboardInterrupt(), 130, "interrupted"),
        (lambda: PermissionError(13, "Permission denied", "/x/y"), 1, "error: /x/y: cannot write (Permission denied)"),
    ],
)
def test_guarded_turns_what_stopped_a_run_into_one_line(capsys, error, status, line):
    def stop():
        raise error()

    assert cli.guarded(stop) == status
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1
    if status != 1:
        assert err == "interrupted before the first epoch; rerun the same command to resume\n"


def test_data_folder_is_your_dataset_for_each_protocol(tmp_path, capsys):
    import yaml
    from PIL import Image

    rows = []  # 24 classes of 4 images: the quick contrastive config's split and sampler need them (dry-run checks)
    for c in range(24):
        (tmp_path / "photos" / f"class_{c:02d}").mkdir(parents=True)
        for k in range(4):
            Image.new("RGB", (8, 8), (10 * c, 5 * k, 0)).save(tmp_path / "photos" / f"class_{c:02d}" / f"{k}.png")
            rows.append(f"class_{c:02d},photos/class_{c:02d}/{k}.png\n")
    table = tmp_path / "photos.csv"
    table.write_text("label,path\n" + "".join(rows))
    assert cli.main(["contrastive", "--variant", "quick", "--data_folder", str(tmp_path / "photos"), "--dry-run"]) == 0
    dataset = yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])["dataset"]
    assert dataset == {"ImageFolderSplit": {"root": str(tmp_path / "photos"), "split": "all"}}
    assert cli.main(["contrastive", "--data_folder", str(table), "--dry-run"]) == 0
    dataset = yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])["dataset"]
    assert dataset == {"ImageCSVSplit": {"csv_file": str(table), "split": "all"}}
    assert cli.main(["xml_glyphs", "--data_folder", str(tmp_path / "photos"), "--dry-run"]) == 0
    dataset = yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])["dataset"]
    assert dataset == {"name": "imagefolder", "root": str(tmp_path / "photos")}
    # the command line's flags on the dataset refine --data_folder's (they were lost: a CSV's class_overlap refusal
    # named a kwarg the command line could not give)
    argv = ["xml_glyphs", "--data_folder", str(table), "--dataset", "{kwargs: {class_overlap: allowed}}", "--dry-run"]
    assert cli.main(argv) == 0
    dataset = yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])["dataset"]
    assert dataset == {"name": "csv", "root": str(table), "kwargs": {"class_overlap": "allowed"}}
    assert cli.main(["contrastive", "--data_folder", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith(f"config error: command line: --data_folder {tmp_path / 'nothing'}: no")
    # the plugins say where they read their images (the rule is the plugin's, not a table of the command line)
    configs = os.path.join(REPO, "benchmarks", "configs")
    assert cli.main([os.path.join(configs, "resolution_distillation"), "--data_folder", str(tmp_path / "photos")]) == 2
    assert "the resolution_distillation protocol reads its data from `datasets:`" in capsys.readouterr().err
    for name, protocol in (("template_block_table1", "template_block"), ("localization", "localization")):
        assert cli.main([os.path.join(configs, name), "--data_folder", str(tmp_path / "photos")]) == 2
        assert capsys.readouterr().err == (
            f"config error: command line: --data_folder: the {protocol} protocol does not read a folder of your "
            "images\n"
        )


@pytest.mark.slow
def test_a_corrupt_image_among_the_test_classes_stops_before_training(tmp_path, capsys):
    """The issue's input: a truncated PNG surfaced as `OSError: image file is truncated` (no file named) after all
    folds trained. Now one line names every bad file before the first epoch; --skip_bad_images true runs without."""

    from pml_extensions.datasets import GlyphDataset

    glyphs = GlyphDataset(split="all", image_size=16, font_files=dejavu_fonts())  # 8 images a class: 6 are taken
    for label in range(22):
        folder = tmp_path / "photos" / f"class_{label:02d}"
        folder.mkdir(parents=True)
        for k, i in enumerate([i for i, y in enumerate(glyphs.labels) if y == label][:6]):
            glyphs[i][0].save(folder / f"{k}.png")
    truncated = tmp_path / "photos" / "class_20" / "3.png"  # a test class (the second half)
    truncated.write_bytes(truncated.read_bytes()[:60])
    junk = tmp_path / "photos" / "class_21" / "junk.png"
    junk.write_bytes(b"not a png")
    base = ["contrastive", "--variant", "quick", "--data_folder", str(tmp_path / "photos")]
    argv = base + ["--root_experiment_folder", str(tmp_path / "exp"), "--num_epochs_train", "1"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: command line: dataset: 2 of 133 images do not decode: ")
    assert f"{truncated} (image file is truncated" in err and f"{junk} (cannot identify image file)" in err
    assert err.rstrip().endswith("replace or remove them, or leave them out with --skip_bad_images true")
    assert not os.path.exists(tmp_path / "exp")  # refused before any work: no experiment folder
    assert cli.main(argv + ["--skip_bad_images", "true"]) == 0
    out = capsys.readouterr().out
    assert "note: command line: dataset: left out 2 image(s) that do not decode" in out
    assert "131 items, 22 classes" in out


def test_a_misspelled_class_and_bad_images_are_one_refusal(tmp_path, capsys):
    """A user's misspelled model was refused alone; after fixing it the next run named the bad images: the config's
    problems and the data's come in one refusal, before any folder."""
    from PIL import Image

    root = tmp_path / "photos"
    for label in range(22):
        (root / f"class_{label:02d}").mkdir(parents=True)
        for k in range(4):
            Image.new("RGB", (16, 16), (10 * label, 40 * k, 0)).save(root / f"class_{label:02d}" / f"{k}.png")
    junk = root / "class_21" / "junk.png"
    junk.write_bytes(b"not a png")
    argv = ["contrastive", "--variant", "quick", "--data_folder", str(root), "--root_experiment_folder",
            str(tmp_path / "exp"), "--loss_funcs~OVERRIDE~", "{metric_loss: {ContrastivLoss: {}}}"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: 2 problems, nothing was run:")
    assert "unknown class 'ContrastivLoss'; did you mean ContrastiveLoss?" in err
    assert f"1 of 89 images do not decode: {junk} (cannot identify image file)" in err
    assert not os.path.exists(tmp_path / "exp")


def test_dry_run_refuses_what_the_run_refuses(capsys):
    """A PB client's custom factory passed --dry-run (rc 0) and was refused by the real run: the loader runs the
    protocol's checks, so --dry-run stops on it with the same line."""
    argv = ["contrastive", "--variant", "quick", "--factories", "{hook~OVERRIDE~: {CustomHookFactory: {}}}"]
    assert cli.main(argv + ["--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: command line: factories.hook: custom factory 'CustomHookFactory' is not ")
    assert cli.main(argv + ["--root_experiment_folder", "/nonexistent/never"]) == 2
    assert capsys.readouterr().err == err


def test_a_paired_run_refuses_images_of_several_sizes_before_any_work(tmp_path, capsys):
    """A catalogue of mixed image sizes through a config without Resize passed the paired preflight and failed
    minutes later in the feature cache ("stack expects each tensor to be equal size"); the preflight names it."""
    from PIL import Image

    for c in range(20):
        (tmp_path / "photos" / f"class_{c:02d}").mkdir(parents=True)
        for k in range(4):
            size = (8, 8) if (c + k) % 2 else (12, 10)
            Image.new("L", size, 10 * c + k).save(tmp_path / "photos" / f"class_{c:02d}" / f"{k}.png")
    argv = ["xml_glyphs", "--data_folder", str(tmp_path / "photos"), "--root_experiment_folder", str(tmp_path / "exp")]
    no_resize = ["--transforms~OVERRIDE~", "{train: {ToTensor: null}, eval: {ToTensor: null}}"]
    assert cli.main(argv + no_resize) == 2
    err = capsys.readouterr().err
    assert (
        "transforms.eval gives images of different sizes" in err
        and "start transforms train and eval with Resize" in err
    )
    assert not os.path.exists(tmp_path / "exp")  # refused before any work


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--num_epochs", "true"], "config error: command line: num_epochs: expected an integer >= 1, got True"),
        (["--batch_size", "0"], "config error: command line: batch_size: expected an integer >= 1, got 0"),
        (
            ["--variant", "quick"],
            "config error: command line: --variant quick: configs/xml_glyphs is a flat config, without variant files; "
            "--variants NAME ... keeps entries of its `variants` key",
        ),
    ],
)
def test_one_mistake_is_one_line(argv, line, capsys):
    """A user trial: `--num_epochs true` gave two lines (the protocol's Settings and a second per-key rule), and
    `--variant quick` on a flat config listed its variant files as `-`."""
    assert cli.main(["xml_glyphs", *argv, "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == line


def test_report_only_on_a_missing_folder_is_one_line_and_on_a_run_folder_writes_its_report(tmp_path, capsys):
    """A user trial: `run --report_only FOLDER` with a folder that does not exist printed a traceback naming
    `experiments/None`."""
    missing = str(tmp_path / "nope")
    assert cli.main(["--report_only", missing]) == 2
    assert capsys.readouterr().err.strip() == (
        f"config error: command line: --report_only: {missing}: no such experiment folder (give a run's folder, or "
        "the CONFIG and options of a run)"
    )
    assert cli.main(["--report_only", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "report.html")
    assert os.path.exists(tmp_path / "report.html")
    (tmp_path / "results.json").write_text('{"protocol": "mlrc", "fol')  # cut short: one line, not a traceback
    assert cli.main(["--report_only", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'results.json'}: truncated or corrupt (Unterminated string starting at: line 1 column 22 "
        "(char 21)); remove it and rerun: the run writes it again at its end\n"
    )


def test_a_misspelt_required_key_is_one_line_naming_its_file(tmp_path, monkeypatch, capsys):
    import shutil

    shutil.copytree(os.path.join(CONFIGS, "xml_glyphs"), tmp_path / "mine")
    path = tmp_path / "mine" / "config_general.yaml"
    path.write_text(path.read_text().replace("\nnum_epochs:", "\nnum_epoch:"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["./mine", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        "config error: mine/config_general.yaml: num_epoch: missing key 'num_epochs' (the config has 'num_epoch': a "
        "misspelling?)"
    )


def test_seeds_from_the_command_line_are_saved_as_a_list(capsys):
    """A user trial: `--seeds 0 1` was saved in config.yaml as the string `0 1` (the docs say a list)."""
    import yaml

    assert cli.main(["xml_glyphs", "--seeds", "0", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert yaml.safe_load(out[out.index("\n") + 1 :])["seeds"] == [0, 1]
