import base64
import json
import os
import re

import pytest

from pml_extensions.runner.experiment.checkpoint import Checkpointer
from pml_extensions.runner.outputs.report import write_report

PNG_1x1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def test_self_contained_report(tmp_path):
    folder = tmp_path / "exp"
    for fold in range(2):
        ck = Checkpointer(str(folder / f"fold_{fold}"), epoch_tables={"accuracies_val"})
        for it in range(1, 5):
            ck.record_keeper.append_data("loss_histories", "total_loss", 1.0 / it, it)
        for ep in range(3):
            ck.record_keeper.append_data("accuracies_val", "mean_average_precision_at_r", 0.1 * ep, ep)
        ck.commit({"epoch": 2, "global_iteration": 4})
    results = {
        "primary_metric": "mean_average_precision_at_r",
        "folds": [{"best_epoch": 2, "best_val_mean_average_precision_at_r": 0.2}] * 2,
        "test": {
            "separate_128D": {"mean_average_precision_at_r": 0.25, "precision_at_1": 0.5, "r_precision": 0.3},
            "concatenated_512D": {
                "mean_average_precision_at_r": 0.3,
                "precision_at_1": 0.6,
                "r_precision": 0.35,
            },
            "per_model": [],
        },
    }
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "config.yaml").write_text("loss_funcs:\n  metric_loss:\n    ContrastiveLoss: {}\n")
    os.makedirs(folder / "explanations")
    (folder / "explanations" / "top5_query0.png").write_bytes(PNG_1x1)

    html = open(write_report(str(folder))).read()
    assert "concatenated_512D" in html and "0.3000" in html and "ContrastiveLoss" in html
    images = re.findall(r"src='data:image/png;base64,", html)
    assert len(images) == 3  # loss curve, validation curve, one explanation grid
    assert base64.b64encode(PNG_1x1).decode() in html
    assert "http://" not in html and "https://" not in html and "src='/" not in html  # nothing external


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_report(str(tmp_path / "nope"))


def test_empty_folder_still_writes(tmp_path):
    assert os.path.exists(write_report(str(tmp_path)))


def test_any_protocol_layout_command_dataset_xml_loss_and_untrained_flag(tmp_path):
    folder = tmp_path / "exp"
    # a nested stage (resolution_distillation style) that logged an XMLWrapper's xml_loss
    ck = Checkpointer(str(folder / "glyphs" / "seed_0" / "student"), epoch_tables={"accuracies"})
    for it in range(1, 41):
        ck.record_keeper.append_data("loss_histories", "total_loss", 1.0 / it, it)
        ck.record_keeper.append_data("metric_loss", "xml_loss", 2.0 / it, it)
    ck.commit({"epoch": 1, "global_iteration": 40})
    (folder / "results.json").write_text(
        json.dumps(
            {"protocol": "xml_vs_gap", "folds": [{"best_epoch": 0, "best_val_mean_average_precision_at_r": 0.1}]}
        )
    )
    (folder / "results.md").write_text("| variant | MAP@R |\n|---|---|\n| xml | 0.4321 |\n")
    (folder / "config.yaml").write_text("protocol: xml_vs_gap\ndataset: {name: glyphs}\n")
    (folder / "command.txt").write_text("python -m pml_extensions job --epochs 1\n")
    (folder / "map_at_r.png").write_bytes(PNG_1x1)
    html = open(write_report(str(folder))).read()
    assert "<title>xml_vs_gap report</title>" in html
    assert "python -m pml_extensions job --epochs 1" in html
    assert "&quot;name&quot;: &quot;glyphs&quot;" in html
    assert "the untrained model" in html and "0.4321" in html
    assert "training loss (smoothed)" not in html  # titles live inside the PNGs; count the images instead
    assert len(re.findall(r"src='data:image/png;base64,", html)) == 3  # loss, xml_loss, map_at_r.png


def test_smoothing_is_a_trailing_mean():
    from pml_extensions.runner.outputs.report import _smooth

    values = [float(v) for v in range(50)]  # window 50 // 25 = 2
    assert _smooth(values)[:3] == [0.0, 0.5, 1.5]
    assert _smooth([1.0, float("nan"), 3.0] * 20)[1] == 1.0  # window 60 // 25 = 2, the NaN skipped
