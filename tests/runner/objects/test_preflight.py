"""runner/objects/preflight.py (issue 21, item 2): checks before training, each one line naming the key or file, the
source of its value and the fix — on the exact inputs of the issue."""

import os

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

from pml_extensions.runner.config.loader import find_config, parse_command_line
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.objects import preflight
from pml_extensions.runner.objects.builder import Builder
from pml_extensions.runner.protocols import load_config
from pml_extensions.runner.protocols.mlrc import mlrc_class_splits


def _builder(argv=(), variant="quick", name="contrastive"):
    """The config as `run NAME --variant quick ARGV` merges it."""
    from pml_extensions.cli.run import _variant_selection

    root = find_config(name)
    selection = _variant_selection(root, variant, {}) if variant else None
    config, sources = load_config(root, selection, parse_command_line(list(argv)))
    return Builder(config, sources, log=lambda *a: None)


def _mlrc(labels, parts):
    return mlrc_class_splits(labels, 0.5, 0.5, parts)


def test_too_few_classes_names_the_real_sources_what_is_needed_and_what_fits():
    """The issue's input: `config_dataset/default.yaml: split_manager: num_training_partitions must be >= 2` blamed a
    shipped file the user never touched, for a folder of 10 classes given on the command line."""
    builder = _builder(["--dataset~OVERRIDE~", "{ImageFolderSplit: {root: photos, split: all}}"])
    with pytest.raises(ConfigError) as e:
        preflight.class_splits(builder, np.repeat(np.arange(10), 20), _mlrc, 4, 4)
    assert str(e.value) == (
        "command line: dataset: 10 classes are too few for split_manager (the shipped "
        "configs/contrastive/config_dataset/default.yaml: num_training_partitions must be >= 2 with >= 2 classes "
        "each; got 4 partitions for 5 train/val classes) and MPerClassSampler (m=4) batches of 32: this config needs "
        '>= 22 classes; for these 10 classes add --split_manager~APPLY~2 "{num_training_partitions: 2, '
        'num_training_sets: 2}" --trainer~APPLY~2 "{batch_size: 8}"'
    )
    assert preflight.class_splits(builder, np.repeat(np.arange(22), 2), _mlrc, 4, 4)["test"] == list(range(11, 22))


def test_too_few_classes_for_any_split_says_the_fewest_and_one_class_is_singular():
    """A folder with 1, 3 or 5 classes got only 'this config needs >= 22 classes' (and '1 classes'), not that even
    the smallest split (2 partitions) needs 8."""
    builder = _builder(["--dataset~OVERRIDE~", "{ImageFolderSplit: {root: photos, split: all}}"])
    for classes, problem in (
        (1, "the test split needs at least 2 classes, got 1 of 1"),
        (5, "num_training_partitions must be >= 2 with >= 2 classes each; got 4 partitions for 2 train/val classes"),
    ):
        with pytest.raises(ConfigError) as e:
            preflight.class_splits(builder, np.repeat(np.arange(classes), 4), _mlrc, 4, 4)
        count = "1 class is" if classes == 1 else f"{classes} classes are"
        assert str(e.value) == (
            f"command line: dataset: {count} too few for split_manager (the shipped "
            f"configs/contrastive/config_dataset/default.yaml: {problem}) and MPerClassSampler (m=4) batches of 32: "
            "this config needs >= 22 classes; 2 partitions, the fewest, need >= 8 classes at this test_size"
        )


def test_sampler_m_times_classes_below_the_batch_size():
    """The issue's input: a raw `AssertionError: m * (number of unique labels) must be >= batch_size` in fold 0."""
    builder = _builder()
    labels = [np.repeat(np.arange(6), 3), np.repeat(np.arange(8), 3)]
    with pytest.raises(ConfigError) as e:
        preflight.check_sampler(builder, labels, 32)
    assert str(e.value) == (
        "configs/contrastive/config_loss_and_miners/default.yaml: sampler.MPerClassSampler: m=4 (the shipped "
        "configs/contrastive/config_loss_and_miners/default.yaml) x 6 training classes of fold 0 = 24 < batch_size 32 "
        '(the shipped configs/contrastive/config_general/default.yaml); add --trainer~APPLY~2 "{batch_size: 24}" or '
        "use a dataset with more classes"
    )
    preflight.check_sampler(builder, [np.arange(8)], 32)
    with pytest.raises(ConfigError, match=r"m: 4 \(.*\) does not divide the batch size 30"):
        preflight.check_sampler(builder, [np.arange(8)], 30)


def _folder(root, classes=4, per_class=3, mode="RGB", size=(40, 30)):
    for c in range(classes):
        os.makedirs(os.path.join(root, f"c{c}"), exist_ok=True)
        for k in range(per_class):
            Image.new(mode, size, (c * 40,) * (3 if mode == "RGB" else 1)).save(os.path.join(root, f"c{c}", f"{k}.png"))
    return root


def test_rgb_images_fill_a_first_layer_that_leaves_in_channels_out(tmp_path):
    from pml_extensions.datasets import ImageFolderSplit

    builder = _builder()
    dataset = ImageFolderSplit(_folder(str(tmp_path / "photos")), split="all")
    transforms = {"train": builder.build_transform("train"), "eval": builder.build_transform("eval")}
    assert preflight.fit_channels(builder, dataset, transforms, 2) is transforms
    models = builder.build_models(builder.subset(dataset, [0], transform=transforms["eval"])[0][0], 2)
    assert preflight.trunk_input_channels(models["trunk"]) == 3


def test_rgb_images_into_a_one_channel_trunk_say_what_to_change(tmp_path):
    """The issue's input: a raw traceback ending `expected input[1, 3, 64, 64] to have 1 channels, but got 3`."""
    from pml_extensions.datasets import ImageFolderSplit

    trunk = (
        "{trunk~OVERRIDE~: [{ConvNetBody: {in_channels: 1, widths: [8]}}, {AdaptiveAvgPool2d: [1]}, {Flatten: null}]}"
    )
    builder = _builder(["--models", trunk])
    dataset = ImageFolderSplit(_folder(str(tmp_path / "photos")), split="all")
    transforms = {"train": builder.build_transform("train"), "eval": builder.build_transform("eval")}
    with pytest.raises(preflight.ChannelMismatch) as e:
        preflight.fit_channels(builder, dataset, transforms, 2)
    assert str(e.value) == (
        "command line: models.trunk takes 1 input channel(s) (the command line) (its first layer ConvNetBody sets "
        "in_channels: 1; leave it out and the images' count is used), but the images of dataset (the shipped "
        "configs/contrastive/config_dataset/quick.yaml) have 3 after transforms.eval; convert the images to grey "
        "(add Grayscale: {num_output_channels: 1} first in transforms)"
    )


def test_grey_images_become_three_channels_for_a_three_channel_trunk():
    from pml_extensions.datasets import GlyphDataset

    trunk = (
        "{trunk~OVERRIDE~: [{ConvNetBody: {in_channels: 3, widths: [8]}}, {AdaptiveAvgPool2d: [1]}, {Flatten: null}]}"
    )
    builder = _builder(["--models", trunk])
    glyphs = GlyphDataset(split="all", image_size=32)  # mode L
    transforms = {"train": builder.build_transform("train"), "eval": builder.build_transform("eval")}
    notes = []
    fitted = preflight.fit_channels(builder, glyphs, transforms, 2, log=notes.append)
    assert notes == ["note: the images are grey and models.trunk takes 3 channels: they are read as RGB"]
    assert builder.subset(glyphs, [0], transform=fitted["train"])[0][0].shape == (3, 32, 32)


def test_images_of_different_sizes_name_two_files_and_the_resize(tmp_path):
    from pml_extensions.datasets import ImageFolderSplit

    root = _folder(str(tmp_path / "photos"))
    Image.new("RGB", (50, 20)).save(os.path.join(root, "c3", "2.png"))
    builder = _builder(["--transforms~OVERRIDE~", "{train: {ToTensor: {}}, eval: {ToTensor: {}}}"])
    dataset = ImageFolderSplit(root, split="all")
    transforms = {"train": builder.build_transform("train"), "eval": builder.build_transform("eval")}
    with pytest.raises(ConfigError) as e:
        preflight.fit_channels(builder, dataset, transforms, 2)
    assert str(e.value) == (
        f"command line: transforms.eval gives images of different sizes ([3, 30, 40] and [3, 20, 50] for "
        f"{os.path.join(root, 'c0', '0.png')} and {os.path.join(root, 'c3', '2.png')}), which cannot be batched; "
        "start transforms train and eval with Resize: {size: [20, 20]} (or the size the trunk expects)"
    )  # the smallest side of the two (a user trial: the first photo's 1052 x 744 was suggested to a MobileNet)


def test_fill_input_channels():
    spec = {"Sequential": [{"ConvNetBody": {"widths": [8]}}, {"Flatten": None}]}
    assert preflight.fill_input_channels(spec, 1) == {
        "Sequential": [{"ConvNetBody": {"widths": [8], "in_channels": 1}}, {"Flatten": None}]
    }
    assert preflight.fill_input_channels([{"mobilenet_v2_features": {}}], 1) == [{"mobilenet_v2_features": {}}]
    assert preflight.fill_input_channels({"Flatten": None}, 3) == {"Flatten": None}
    assert preflight.fill_input_channels([{"ConvNetBody": {"in_channels": 1}}], 3) == [
        {"ConvNetBody": {"in_channels": 1}}
    ]


def test_every_image_decodes_before_the_first_epoch(tmp_path):
    """The issue's inputs: a truncated PNG gave `OSError: image file is truncated` without the file's name, after
    all folds trained. One pass names every bad file; a rerun decodes only new or changed files."""
    from pml_extensions.datasets import ImageFolderSplit

    root = _folder(str(tmp_path / "photos"), size=(64, 64))
    truncated = os.path.join(root, "c3", "1.png")
    with open(truncated, "rb") as f:
        head = f.read(80)
    with open(truncated, "wb") as f:
        f.write(head)
    dataset = ImageFolderSplit(root, split="all")
    folder = str(tmp_path / "exp")
    os.makedirs(folder)
    with pytest.raises(ConfigError) as e:
        preflight.check_images(dataset, folder, where="command line: dataset")
    listing = os.path.join(folder, "bad_images.txt")
    assert str(e.value) == (
        f"command line: dataset: 1 of 12 images do not decode (all in {listing}): {truncated} (image file is "
        "truncated); replace or remove them, or leave them out with --skip_bad_images true"
    )
    notes = []
    kept = preflight.check_images(dataset, folder, skip=True, where="command line: dataset", log=notes.append)
    assert len(kept) == 11 and truncated not in [dataset.paths[i] for i in kept.indices]
    assert notes[0].startswith("note: command line: dataset: left out 1 image(s) that do not decode")
    import json

    record = json.load(open(os.path.join(folder, preflight.IMAGE_CHECK_FILE)))
    assert len(record) == 11 and truncated not in record  # a rerun decodes only the bad file again


def test_files_left_out_before_the_folder_existed_are_listed_in_it_once_it_does(tmp_path):
    """A refused run leaves no folder, so the check runs before it; a run that goes on with skip_bad_images lists the
    files it left out in the folder it then makes (own_data.md promises bad_images.txt)."""
    from pml_extensions.datasets import ImageFolderSplit

    root = _folder(str(tmp_path / "photos"), size=(64, 64))
    empty = os.path.join(root, "c1", "empty.png")
    open(empty, "wb").close()
    kept = preflight.check_images(ImageFolderSplit(root, split="all"), None, skip=True, log=lambda *a: None)
    folder = tmp_path / "exp"
    assert preflight.write_bad_images(kept.left_out, str(folder)) is None  # no folder yet: nothing written
    folder.mkdir()
    preflight.record_checked_images(kept, str(folder))
    (line,) = (folder / "bad_images.txt").read_text(encoding="utf-8").splitlines()
    assert line.startswith(empty + "\t") and "cannot identify image file" in line
    assert preflight.write_bad_images({}, str(folder)) is None


def test_an_image_above_pils_pixel_limit_is_named_once_in_a_note(tmp_path, monkeypatch, recwarn):
    """A user's 10524 x 16000 drawing printed PIL's two-line DecompressionBombWarning at every epoch and made an
    8-class quick run 7x slower with no word why; the check names it once, the reads stay quiet."""
    from pml_extensions.datasets import ImageFolderSplit

    root = _folder(str(tmp_path / "photos"), size=(40, 30))
    big = os.path.join(root, "c2", "big.png")
    Image.new("RGB", (60, 50)).save(big)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2000)  # 60 x 50 is above it (not twice: PIL would refuse it)
    dataset = ImageFolderSplit(root, split="all")
    notes = []
    assert preflight.check_images(dataset, None, where="command line: dataset", log=notes.append) is dataset
    assert notes == [
        "note: command line: dataset: 1 image(s) above PIL's decompression-bomb limit (2000 pixels), decoded in full "
        f"at every read (slow; shrink them to speed up each epoch): {big} (60 × 50)"
    ]
    assert dataset[dataset.paths.index(big)][0].size == (60, 50)
    assert [w for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)] == []


def test_an_empty_class_folder(tmp_path):
    from pml_extensions.datasets import ImageFolderSplit

    root = _folder(str(tmp_path / "photos"))
    os.makedirs(os.path.join(root, "c9_empty", "sub"))
    with pytest.raises(ValueError) as e:
        ImageFolderSplit(root, split="all")
    assert str(e.value).startswith(f"1 class folder(s) of {root!r} hold no image (")
    assert str(e.value).endswith(f": {os.path.join(root, 'c9_empty')}; add images or remove the folders")


def test_tensors_pass_through(tmp_path):
    """Data that is not image files (a dataset of tensors) has nothing to decode and keeps its transforms."""
    dataset = torch.utils.data.TensorDataset(torch.zeros(4, 1, 4, 4), torch.tensor([0, 0, 1, 1]))
    assert preflight.check_images(dataset, str(tmp_path)) is dataset
    builder = _builder()
    transforms = {"train": T.Compose([]), "eval": T.Compose([])}
    assert preflight.image_paths(dataset) is None
    assert preflight.minimum_classes(lambda ls: _mlrc(ls, 4)) == 16  # 8 test classes, 4 partitions of 2
    assert preflight.minimum_classes(lambda ls: _mlrc(ls, 4), m=4, batch_size=32) == 22
    del builder, transforms
