import base64
import json
import os
import re

import pytest

from pml_extensions.runner.errors import OutputError
from pml_extensions.runner.experiment.checkpoint import Checkpointer
from pml_extensions.runner.outputs.report import write_report
from pml_extensions.runner.outputs.results import summarize, write_results

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
    results = summarize({"xml": {0: {"mean_average_precision_at_r": 0.4321}}})
    results.update(protocol="xml_vs_gap", folds=[{"best_epoch": 0, "best_val_mean_average_precision_at_r": 0.1}])
    write_results(str(folder), results, header="Glyphs, **one** seed.")
    (folder / "results.md").write_text("not read: the tables come from results.json\n")
    (folder / "config.yaml").write_text("protocol: xml_vs_gap\ndataset: {name: glyphs}\n")
    (folder / "command.txt").write_text("python -m pml_extensions job --epochs 1\n")
    (folder / "map_at_r.png").write_bytes(PNG_1x1)
    html = open(write_report(str(folder))).read()
    assert "<title>xml_vs_gap report</title>" in html
    assert "python -m pml_extensions job --epochs 1" in html
    assert "&quot;name&quot;: &quot;glyphs&quot;" in html
    assert "the untrained model" in html and "<td class='num'>0.4321 ± –</td>" in html
    assert "<h2>Results</h2><p>Glyphs, <b>one</b> seed.</p>" in html and "not read" not in html
    assert "training loss (smoothed)" not in html  # titles live inside the PNGs; count the images instead
    assert len(re.findall(r"src='data:image/png;base64,", html)) == 2  # the losses' figure, map_at_r.png
    from pml_extensions.runner.outputs.report import _figures, _logs

    (losses,) = _figures(_logs(str(folder)), "mean_average_precision_at_r", {})  # no validation logged
    assert [ax.get_title() for ax in losses.axes] == ["total_loss (smoothed)", "xml_loss (smoothed)"]


def test_smoothing_is_a_trailing_mean():
    from pml_extensions.runner.outputs.report import _smooth

    values = [float(v) for v in range(50)]  # window 50 // 25 = 2
    assert _smooth(values)[:3] == [0.0, 0.5, 1.5]
    assert _smooth([1.0, float("nan"), 3.0] * 20)[1] == 1.0  # window 60 // 25 = 2, the NaN skipped


def test_selected_model_of_every_protocol():
    """The report knows no protocol: MLRC's folds, a paired protocol's units (the tested epoch) and the stages any
    protocol names in ``selected``."""
    from pml_extensions.runner.outputs.report import _iterations_per_epoch, _selected

    results = {
        "folds": [{"best_epoch": 2}, {"best_epoch": 0}],
        "units": {"contrastive_xml": {"0": {"best_epoch": 3}, "1": {"best_epoch": 1, "selected_epoch": 2}}},
        "selected": {"glyphs/seed_0/student_16px_full_lr0.001": ["iteration", 4], "bad": ["step", 1]},
    }
    assert _selected(results) == {
        "fold_0": ("epoch", 2),
        "fold_1": ("epoch", 0),
        "contrastive_xml/seed_0": ("epoch", 3),
        "contrastive_xml/seed_1": ("epoch", 2),  # the epoch the selection tested, not the unit's own best
        "glyphs/seed_0/student_16px_full_lr0.001": ("iteration", 4),
    }
    assert _iterations_per_epoch({}, {"trainer": {"MetricLossOnly": {"iterations_per_epoch": 15}}}) == 15
    assert _iterations_per_epoch({"iterations_per_epoch": 40}, {}) == 40
    assert _iterations_per_epoch({}, {"trainer": {"MetricLossOnly": None}}) is None


def test_a_results_md_without_results_tables_is_shown_as_it_is(tmp_path):
    """Written by something else than write_results (no ``variants`` in results.json): its text, never parsed."""
    (tmp_path / "results.md").write_text("| a | b |\n|---|---|\n| x < y | 1 |\n")
    html = open(write_report(str(tmp_path))).read()
    assert "<h2>Results</h2><pre>| a | b |\n|---|---|\n| x &lt; y | 1 |\n</pre>" in html


def test_retrieval_examples_are_marked_and_the_search_page_links_its_trials(tmp_path):
    import torch
    from PIL import Image

    from pml_extensions.runner.outputs.retrieval import save_retrieval_examples

    folder = tmp_path / "search"
    best = folder / "trial_1"
    best.mkdir(parents=True)
    (folder / "trial_0").mkdir()
    for trial in ("trial_0", "trial_1"):
        (folder / trial / "report.html").write_text("<html></html>")
    images = [Image.new("RGB", (8, 8), c) for c in ("red", "blue", "green")]
    save_retrieval_examples(str(best), "test", torch.eye(3)[[0, 0, 1]] + 0.1, [0, 0, 1], images.__getitem__, k=2)
    summary = {
        "n_trials": 2,
        "best": {
            "number": 1,
            "value": 0.5,
            "params": {"lr": 0.01},
            "folder": "trial_1",
            "test": {"concatenated_512D": {"precision_at_1": 0.625}, "per_model": []},
        },
        "trials": [
            {"number": 0, "value": 0.4, "params": {"lr": 0.001}, "folder": "trial_0"},
            {"number": 1, "value": 0.5, "params": {"lr": 0.01}, "folder": "trial_1"},
        ],
        "failed_trials": [2],
        "failures": [{"number": 2, "reason": "its worker stopped"}],
    }
    (folder / "search.json").write_text(json.dumps(summary))
    (folder / "results.md").write_text("not read: the search's tables come from search.json\n")
    (folder / "search.png").write_bytes(PNG_1x1)
    html = open(write_report(str(folder))).read()
    assert "<title>mlrc search report</title>" in html and "<h2>Search: trials</h2>" in html
    assert "<li><a href='trial_1/report.html'>trial_1</a> (best)</li>" in html
    assert html.count("<li>trial 2: its worker stopped</li>") == 1  # the failures as results.md lists them, once
    assert "<tr><td>1 (best)</td><td class='num'>0.5000</td><td class='num'>0.01</td></tr>" in html
    # the best trial's test metrics on the search's front page
    assert "<p>Test metrics of the best trial (trial 1):</p>" in html
    assert "<tr><td>concatenated_512D</td><td class='num'>0.6250</td></tr>" in html and "not read" not in html
    assert "<h2>Retrieval examples (best trial: trial_1)</h2>" in html
    # queries 0 and 1 share class 0: each other's first neighbour, same class; the class-1 image is "other"
    assert html.count("<td class='query'>") == 3
    assert html.count("<td class='same'>") == 2 and html.count("<td class='other'>") == 4
    assert html.index("Search: objective per trial") < html.index("Retrieval examples")  # search.png under the table
    (best / "results.json").write_text('{"folds": [')  # the best trial's, cut short: one error naming it
    with pytest.raises(OutputError, match=r"trial_1/results.json: truncated or corrupt \(.*\); remove it and rerun"):
        write_report(str(folder))
    (folder / "search.json").write_text('{"trials": [')  # read as results.json is: one line naming it, not skipped
    with pytest.raises(OutputError, match=r"search/search.json: truncated or corrupt \(.*\); remove it and rerun"):
        write_report(str(folder))


def test_the_folds_table_shows_the_untrained_models_validation_score(tmp_path):
    """'How good is my model?' had the best epoch's validation score and nothing to hold it against; the folds table
    shows epoch 0 (the untrained model) next to it, or says it was not measured."""
    folder = tmp_path / "exp"
    ck = Checkpointer(str(folder / "fold_0"), epoch_tables={"accuracies_val"})
    for ep, value in enumerate((0.25, 0.5, 0.375)):
        ck.record_keeper.append_data("accuracies_val", "mean_average_precision_at_r", value, ep)
    ck.commit({"epoch": 2, "global_iteration": 4})
    results = {
        "primary_metric": "mean_average_precision_at_r",
        "folds": [
            {"best_epoch": 1, "best_val_mean_average_precision_at_r": 0.5},
            {"best_epoch": 1, "best_val_mean_average_precision_at_r": 0.125},
        ],
    }
    (folder / "results.json").write_text(json.dumps(results))
    html = open(write_report(str(folder))).read()
    assert "<th>untrained (epoch 0) val mean_average_precision_at_r</th>" in html
    assert "<tr><td>0</td><td>1</td><td class='num'>0.5000</td><td class='num'>0.2500</td></tr>" in html
    assert "<tr><td>1</td><td>1</td><td class='num'>0.1250</td><td class='num'>not measured</td></tr>" in html


def test_every_loss_has_its_own_axes_and_every_variant_one_colour(tmp_path):
    """A paired run drew its 15 units' losses on one axes in 10 colours, ContrastiveLoss and ProxyAnchorLoss on one
    scale: now one axes per loss (shared iterations), one colour and one legend entry per variant, its seeds alike;
    variants whose losses differ more than 5-fold (metric_loss of ContrastiveLoss and of ProxyAnchorLoss) get an axes
    each."""
    from pml_extensions.runner.outputs.report import _figures, _logs

    for variant, scale in (("contrastive_gap", 1.0), ("proxy_xml", 12.0)):
        for seed in range(3):
            ck = Checkpointer(str(tmp_path / variant / f"seed_{seed}"), epoch_tables={"accuracies_val"})
            for it in range(1, 21):
                ck.record_keeper.append_data("loss_histories", "metric_loss", scale / it, it)
                ck.record_keeper.append_data("loss_histories", "total_loss", scale / it, it)  # the same: not drawn
                if variant == "proxy_xml":
                    ck.record_keeper.append_data("metric_loss_XMLWrapper", "xml_loss", 2.0 / it, it)
            ck.record_keeper.append_data("accuracies_val", "mean_average_precision_at_r", 0.1 * seed, 0)
            ck.commit({"epoch": 0, "global_iteration": 20})
    selected = {"proxy_xml/seed_1": ("iteration", 8)}
    losses, validation = _figures(_logs(str(tmp_path)), "mean_average_precision_at_r", selected)
    assert [ax.get_title().split(" ")[0] for ax in losses.axes] == ["metric_loss", "metric_loss", "xml_loss"]
    assert all(ax.get_xlabel() == "" for ax in losses.axes[:-1]) and losses.axes[-1].get_xlabel() == "iteration"
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in losses.axes]
    assert legends == [["contrastive_gap"], ["proxy_xml"], ["proxy_xml"]]  # by scale: the smaller first
    assert len({line.get_color() for line in losses.axes[1].get_lines() if line.get_linestyle() == "-"}) == 1
    assert "selected model" in losses.axes[2].get_title() and "selected model" not in losses.axes[0].get_title()
    assert len(validation.axes[0].get_legend().get_texts()) == 2  # 6 units, 2 variants
