"""runner/protocols/paired_protocol.py: the grid's announcements (how long the rest will take)."""

import dataclasses
import os
import types

import pytest

from pml_extensions.runner.protocols import paired_protocol
from pml_extensions.runner.protocols.base import setting
from pml_extensions.runner.protocols.paired_protocol import GridSettings, PairedProtocol


@dataclasses.dataclass
class _Settings(GridSettings):
    gain: float = setting(0.0, "what the unit adds", kind="float")


_GRID = {"seeds": [0, 1], "variants": {"a": {}, "b": {"gain": 0.05}}, "comparisons": [["b", "a"]], "device": "cpu"}


def _timed_toy(monkeypatch, durations, during=None):
    """A two-variant, two-seed grid whose units take ``durations`` seconds of a fake clock, in order (``during``:
    called with the protocol, variant and seed inside each unit); ``(protocol class, log lines)``."""
    clock, durations, logs = {"now": 0.0}, iter(durations), []
    monkeypatch.setattr(paired_protocol, "time", types.SimpleNamespace(time=lambda: clock["now"]))

    class Toy(PairedProtocol):
        name, Settings, metrics = "toy", _Settings, ("score",)

        def unit(self, settings, variant, seed, folder, builder):
            clock["now"] += next(durations)
            if during is not None:
                during(self, variant, seed)
            return {"history": [{"epoch": 0, "score": settings.gain}], "best_epoch": 0, "train_seconds": 0.0}

        def test(self, settings, variant, seed, folder, builder, epoch):
            return {"score": settings.gain}

    return Toy, logs


@pytest.mark.parametrize(
    "durations, lines",
    [
        (
            [100.0, 10.0, 10.0, 10.0],
            [
                "toy: one unit took 100 s; about 5.0 min for the 3 left",
                "toy: the next unit took 10 s (the first included one-time work); about 0.3 min for the 2 left",
            ],
        ),
        # a user trial: tiny units said "one fold took 0 s; about 0.0 min for the rest"
        ([0.4, 0.3, 0.3, 0.3], ["toy: one unit took under 1 s; a few seconds for the 3 left"]),
    ],
)
def test_the_estimate_is_given_again_when_the_first_unit_included_one_time_work(
    tmp_path, monkeypatch, durations, lines
):
    """The first unit of a cached run built the feature cache (693 s) and the estimate said 335 min for 29 units that
    took minutes each; the second unit's time now corrects it when the two differ by more than 2x."""
    Toy, logs = _timed_toy(monkeypatch, durations)
    Toy(_GRID, str(tmp_path), log=logs.append).run_units()
    assert [line for line in logs if "took" in line] == lines


def test_a_unit_another_process_finished_meanwhile_is_neither_timed_nor_counted(tmp_path, monkeypatch):
    """Processes share a grid out by seeds or variants: a unit that was new when the grid was announced but that
    another process finished meanwhile took no time here; it is not timed as a unit, nor counted among those left."""

    def finish_b(protocol, variant, seed):  # meanwhile another process finishes b at seed 0
        if (variant, seed) == ("a", 0):
            protocol.exp.finish_stage(protocol.stage("b", 0), {"history": [], "best_epoch": 0, "train_seconds": 0.0})

    Toy, logs = _timed_toy(monkeypatch, [100.0, 10.0, 10.0], during=finish_b)
    Toy(_GRID, str(tmp_path), log=logs.append).run_units()
    assert [line for line in logs if "took" in line] == [
        "toy: one unit took 100 s; about 3.3 min for the 2 left",
        "toy: the next unit took 10 s (the first included one-time work); about 0.2 min for the 1 left",
    ]


def test_a_unit_resumed_from_its_checkpoint_is_not_timed_as_a_whole_unit(tmp_path, monkeypatch):
    """A resumed run's first unit continued from its checkpoint.pth (10 s of a 100 s unit) and the estimate said
    "about 0.5 min for the 3 left"; a resumed unit is not timed, the next whole unit is."""
    Toy, logs = _timed_toy(monkeypatch, [10.0, 100.0, 100.0, 100.0])
    toy = Toy(_GRID, str(tmp_path), log=logs.append)
    os.makedirs(toy.unit_folder("a", 0))
    open(os.path.join(toy.unit_folder("a", 0), "checkpoint.pth"), "wb").close()  # killed part-way before
    toy.run_units()
    assert [line for line in logs if "took" in line] == ["toy: one unit took 100 s; about 3.3 min for the 2 left"]


def test_a_resumed_paired_run_decodes_no_image_again(tmp_path, monkeypatch):
    """A paired run on a user's folder said "checking that 3499 image files decode (once; a rerun checks only new or
    changed files)" and decoded all of them again on every resume: its preflight ran before the folder existed and
    nothing recorded the files. Now the run records them (train and test data, one record) and a resumed run's
    preflight decodes only a new file."""
    from PIL import Image

    from pml_extensions.datasets import image_files
    from pml_extensions.runner.objects import preflight
    from pml_extensions.runner.protocols.paired import Paired

    root = tmp_path / "photos"
    for c in range(8):
        (root / f"class_{c}").mkdir(parents=True)
        for k in range(4):
            Image.new("RGB", (12, 12), (30 * c, 60 * k, 0)).save(root / f"class_{c}" / f"{k}.png")
    eval_ = {"Compose": {"transforms": [{"ToTensor": None}]}}
    config = {
        "protocol": "paired",
        "dataset": {"name": "imagefolder", "root": str(root)},
        "seeds": [0],
        "batch_size": 4,
        "sampler": {"MPerClassSampler": {"m": 2}},
        "transforms": {"train": eval_, "eval": eval_},
        "models": {
            "trunk": [
                {"Conv2d": {"in_channels": 3, "out_channels": 4, "kernel_size": 3}},
                {"AdaptiveAvgPool2d": [1]},
                {"Flatten": None},
            ],
            "embedder": {"Linear": {"in_features": 4, "out_features": 2}},
        },
        "loss_funcs": {"metric_loss": {"ContrastiveLoss": {}}},
        "optimizers": {"trunk_optimizer": {"Adam": {"lr": 0.001}}},
        "num_epochs": 1,
        "iterations_per_epoch": 1,
        "validation": {"class_fraction": 0.5, "seed": 0},
        "variants": {"a": {}},
        "device": "cpu",
    }
    decoded = []
    real = image_files.find_unreadable_images
    monkeypatch.setattr(image_files, "find_unreadable_images", lambda paths: decoded.append(len(paths)) or real(paths))
    folder = tmp_path / "exp"

    def fresh_process():
        monkeypatch.setattr(preflight, "_DECODED", {})
        decoded.clear()
        p = Paired(dict(config), str(folder), log=lambda *a, **k: None)
        p.preflight()
        return p

    first = fresh_process()  # a first run: its preflight comes before the folder (a refusal leaves none)
    assert sum(decoded) == 32 and not folder.exists()
    folder.mkdir()  # run_protocol makes it between the preflight and the run
    for data in first.checked_data:  # what PairedProtocol.run does once the folder exists
        preflight.record_checked_images(data, str(folder))
    import json

    assert len(json.loads((folder / preflight.IMAGE_CHECK_FILE).read_text())) == 32  # train and test classes
    fresh_process()
    assert sum(decoded) == 0
    Image.new("RGB", (12, 12)).save(root / "class_7" / "new.png")
    fresh_process()
    assert sum(decoded) == 1


def test_map_at_r_png_draws_the_mean_curve_the_selection_reads_and_names_identical_ones(tmp_path, monkeypatch):
    """The XML run's map_at_r.png drew seed 0 alone while the selection read the mean over 10 seeds, and the
    λ = 0 curve (bit-identical to GAP's) hid GAP's. Now: the mean over seeds, twins named together, a star at the
    tested epoch."""
    from pml_extensions.utils import atomic_io

    figures = []
    monkeypatch.setattr(atomic_io, "atomic_savefig", lambda fig, path, **kw: figures.append(fig))

    class Toy(PairedProtocol):
        name, Settings, metrics = "toy", _Settings, ("score",)

    def unit(values, selected):
        return {"history": [{"epoch": e, "score": v} for e, v in enumerate(values)], "selected_epoch": selected}

    units = {
        "gap": {0: unit([0.1, 0.3], 1), 1: unit([0.2, 0.6], 1)},
        "xml": {0: unit([0.1, 0.2], 1), 1: unit([0.2, 0.1], 1)},
        "lambda0": {0: unit([0.1, 0.3], 1), 1: unit([0.2, 0.6], 1)},
    }
    toy = Toy({"seeds": [0, 1], "variants": {n: {} for n in units}, "device": "cpu"}, str(tmp_path))
    toy.curves(units)
    (ax,) = figures[0].axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["gap = lambda0 (identical)", "xml"]
    means = [
        line.get_ydata().tolist() for line in ax.get_lines() if line.get_label() in ("gap = lambda0 (identical)", "xml")
    ]
    assert means == [[0.15000000000000002, 0.44999999999999996], [0.15000000000000002, 0.15000000000000002]]
    stars = [(line.get_xdata()[0], line.get_ydata()[0]) for line in ax.get_lines() if line.get_marker() == "*"]
    assert stars == [(1, 0.44999999999999996), (1, 0.15000000000000002)]
    assert ax.get_xlabel() == "epoch (★ the tested epoch)" and ax.get_title().startswith("mean over 2 seeds")


def test_a_toy_protocol_runs_and_compares_by_seed(tmp_path):
    """(the example that was in runner/protocols/paired_protocol.py's docstring: a unit whose "training" is a table)"""

    class Toy(PairedProtocol):
        name, Settings, metrics = "toy", _Settings, ("score",)

        def unit(self, settings, variant, seed, folder, builder):
            history = [{"epoch": e, "score": 0.1 * e + settings.gain} for e in range(3)]
            return {"history": history, "best_epoch": 2, "train_seconds": 0.0}

        def test(self, settings, variant, seed, folder, builder, epoch):
            return {"score": 0.1 * epoch + settings.gain + 0.01 * seed}

    config = {"seeds": [0, 1], "variants": {"a": {}, "b": {"gain": 0.05}}, "comparisons": [["b", "a"]], "device": "cpu"}
    results = Toy(config, str(tmp_path), log=lambda *a: None).run()
    assert [round(d, 4) for d in results["comparisons"][0]["differences"]] == [0.05, 0.05]


def test_the_paired_dataset_words():
    """(the examples that were in the docstrings of runner/protocols/paired/)"""
    from pml_extensions.runner.protocols.paired.protocol import dataset_name
    from pml_extensions.runner.protocols.paired.unit import test_classes_words

    assert (dataset_name("glyphs"), dataset_name({"name": "csv", "root": "x"}), dataset_name({"OpenClipArt": {}})) == (
        "glyphs",
        "csv",
        "OpenClipArt",
    )
    assert test_classes_words({"name": "csv", "kwargs": {"class_overlap": "allowed"}}) == (
        "test rows of classes also trained on (class_overlap: allowed, same-class retrieval)"
    )
    assert test_classes_words({"name": "glyphs"}) == "unseen test classes"


def test_a_damaged_saved_test_result_is_one_line_naming_the_file(tmp_path):
    """A test_epoch_<e>.json damaged outside the run was a raw JSONDecodeError traceback; now the one-line
    OutputError that a damaged stage result gives, naming the file and what to do."""
    from pml_extensions.runner.errors import OutputError

    class Toy(PairedProtocol):
        name, Settings, metrics = "toy", _Settings, ("score",)

        def unit(self, settings, variant, seed, folder, builder):
            return {"history": [{"epoch": e, "score": 0.1 * e} for e in range(2)], "best_epoch": 1}

        def test(self, settings, variant, seed, folder, builder, epoch):
            return {"score": 0.5}

    config = {"seeds": [0], "variants": {"a": {}, "b": {}}, "comparisons": [["b", "a"]], "device": "cpu"}
    toy = Toy(config, str(tmp_path), log=lambda *a: None)
    toy.run()
    saved = tmp_path / "a" / "seed_0" / "test_epoch_1.json"
    assert saved.read_text() and toy.test_at("a", 0, 1) == {"score": 0.5}
    saved.write_text('{"score": 0.')
    with pytest.raises(OutputError) as e:
        toy.test_at("a", 0, 1)
    assert str(e.value).startswith(f"{saved}: truncated or corrupt (")
    assert str(e.value).endswith("); remove it and rerun: the unit is tested again")
    assert "\n" not in str(e.value)
