"""report.html in a real browser: headless Chromium (Debian's ``chromium``; .ci/run installs it) opens the report of
every protocol and of a search, the page loads without a console error or an uncaught exception, every image
decodes, and a full-page screenshot is saved under the experiment folder (``report.png``, which the report itself
never embeds). The driver is tests/runner/outputs/chromium.py (the DevTools protocol over websocket-client). Without
Chromium or websocket-client the tests skip, saying which is missing.

The fast test renders a report written from a hand-made folder that has every section; the slow ones run each
protocol (and a search) at toy size through the command line and render what it wrote.
"""

import json
import os

import pytest

from pml_extensions.runner.outputs.report import SCREENSHOT, write_report
from tests.runner.outputs.chromium import missing_reason, render
from tests.runner.runner_testing_utils import dejavu_fonts

pytestmark = pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason()))


def _check(folder, min_retrieval_rows=1):
    """Render ``folder/report.html``; assert what a user's browser must show; return the page and the html."""
    path = os.path.join(folder, "report.html")
    with open(path, encoding="utf-8") as f:
        html = f.read()
    page = render(path, os.path.join(folder, SCREENSHOT))
    assert page["console_errors"] == [] and page["exceptions"] == []
    assert page["images"] and [i for i in page["images"] if not i["decoded"]] == []
    assert os.path.getsize(os.path.join(folder, SCREENSHOT)) > 5000
    rows = html.count("<td class='query'>")
    assert rows >= min_retrieval_rows, "retrieval examples"
    assert html.count("<td class='same'>") + html.count("<td class='other'>") >= rows  # each neighbour is marked
    assert "http://" not in html and "https://" not in html  # self-contained
    return page, html


@pytest.mark.slow  # over 3 s on 2 cores: tox runs it, -m 'not slow' leaves it out
def test_a_report_with_every_section_renders(tmp_path):
    import torch
    from PIL import Image

    from pml_extensions.runner.experiment.checkpoint import Checkpointer
    from pml_extensions.runner.outputs.results import summarize, write_results
    from pml_extensions.runner.outputs.retrieval import save_retrieval_examples

    folder = tmp_path / "exp"
    for fold in range(2):
        ck = Checkpointer(str(folder / f"fold_{fold}"), epoch_tables={"accuracies_val"})
        for it in range(1, 13):
            ck.record_keeper.append_data("loss_histories", "total_loss", 1.0 / it, it)
            ck.record_keeper.append_data("metric_loss", "xml_loss", 2.0 - 0.01 * it, it)
        for ep in range(4):
            ck.record_keeper.append_data("accuracies_val", "mean_average_precision_at_r", 0.1 * ep, ep)
        ck.commit({"epoch": 3, "global_iteration": 12})
    m = "mean_average_precision_at_r"
    per_seed = {"gap": {s: {m: 0.30 + 0.01 * s} for s in range(3)}, "xml": {s: {m: 0.32 + 0.012 * s} for s in range(3)}}
    results = summarize(per_seed, [("xml", "gap")], metrics=[m], smallest_effects=0.01)
    results.update(folds=[{"best_epoch": 3, "best_val_mean_average_precision_at_r": 0.3}] * 2, test={})
    write_results(str(folder), results, header="Two folds, three seeds.", footer=["Line one\nline two"])
    (folder / "config.yaml").write_text("trainer:\n  MetricLossOnly: {iterations_per_epoch: 4}\n")
    colours = [(200, 30, 30), (220, 60, 60), (30, 30, 200), (60, 60, 220), (30, 160, 30)]
    images = [Image.new("RGB", (40, 30), c) for c in colours]
    emb = torch.tensor([[1.0, 0.0], [0.9, 0.2], [0.0, 1.0], [0.2, 0.9], [0.7, 0.7]])
    save_retrieval_examples(str(folder), "test", emb, [0, 0, 1, 1, 2], images.__getitem__, n_queries=3, k=3)
    write_report(str(folder))
    page, html = _check(str(folder), min_retrieval_rows=3)
    assert page["title"] == "mlrc report" and len(page["images"]) == 3 * 4 + 2  # 3 rows of 1 + 3; losses, validation
    assert "<th>95 % CI (bootstrap)</th>" in html and "<td>shown</td>" in html  # the tables, from results.json
    # the screenshot is never embedded in the page it shows
    write_report(str(folder))
    assert open(folder / "report.html").read().count("data:image/png") == len(page["images"])


def _run(argv):
    from pml_extensions.cli import run as cli

    assert cli.main(argv) == 0


@pytest.mark.slow
def test_mlrc_report(tmp_path):
    root = str(tmp_path / "exp")
    _run(
        ["contrastive", "--variant", "quick", "--root_experiment_folder", root, "--experiment_name", "m",
         "--num_epochs_train", "2", "--trainer~APPLY~2", "{iterations_per_epoch: 3}", "--split_manager~APPLY~2",
         "{num_training_sets: 2}", "--device", "cpu", "--dataset~APPLY~2", json.dumps({"font_files": dejavu_fonts()})]
    )  # fmt: skip
    folder = os.path.join(root, "m")
    with open(os.path.join(folder, "retrieval", "test.json")) as f:
        examples = json.load(f)
    assert len(examples["queries"]) == 4 and all(len(q["neighbours"]) == 5 for q in examples["queries"])
    _check(folder, min_retrieval_rows=4)


@pytest.mark.slow
def test_xml_vs_gap_report(tmp_path):
    from pml_extensions.cli import job

    root = str(tmp_path / "runs")
    argv = ["--num_epochs", "1", "--iterations_per_epoch", "3", "--seeds", "[0]", "--variants", "contrastive_gap",
            "contrastive_xml", "--root_experiment_folder", root, "--device", "cpu"]  # fmt: skip
    argv += ["--dataset", json.dumps({"kwargs": {"font_files": dejavu_fonts()}})]  # 248 of the 682 images a split
    assert job.main(argv) == 0
    folder = os.path.join(root, "xml_glyphs")
    assert sorted(os.listdir(os.path.join(folder, "retrieval"))) == [
        "contrastive_gap",
        "contrastive_gap.json",
        "contrastive_xml",
        "contrastive_xml.json",
    ]
    queries = [json.load(open(os.path.join(folder, "retrieval", f"{v}.json")))["queries"] for v in ("contrastive_gap",
               "contrastive_xml")]  # fmt: skip
    assert [q["index"] for q in queries[0]] == [q["index"] for q in queries[1]]  # the same queries per variant
    _check(folder, min_retrieval_rows=8)


@pytest.mark.slow
@pytest.mark.usefixtures("mobilenet_weights")
def test_resolution_distillation_report(tmp_path):
    import yaml

    cfg = tmp_path / "cfg" / "config_general"
    cfg.mkdir(parents=True)
    general = {
        "protocol": "benchmarks.protocols.resolution_distillation",  # a plugin in benchmarks/
        "datasets": {
            "glyphs": {"database_resolution": 32, "query_resolutions": [16], "image_size": 32, "max_test_per_class": 2}
        },  # fmt: skip
        "models": {
            "trunk": {"mobilenet_v2_features": {"pretrained": True}},
            "embedder": {"RetrievalHead": {"in_channels": 1280, "out_dim": 16}},
        },  # fmt: skip
        "seeds": [0],
        "teacher_iterations": 2,
        "student_iterations": 2,
        "images_per_batch": 2,
        "num_augmentations": 2,
        "low_resolution_teacher": False,
        "validation": {"class_fraction": 0.25, "seed": 0},
        "checkpoint_every": 1,
    }
    (cfg / "default.yaml").write_text(yaml.safe_dump(general))
    root = str(tmp_path / "exp")
    _run([str(tmp_path / "cfg"), "--root_experiment_folder", root, "--experiment_name", "r"])
    folder = os.path.join(root, "r")
    with open(os.path.join(folder, "retrieval", "glyphs_seed_0.json")) as f:
        assert "queries at 16 px by the distilled student" in json.load(f)["note"]
    _check(folder, min_retrieval_rows=4)


@pytest.mark.slow
def test_search_report(tmp_path, tiny_mlrc_config):
    root = str(tmp_path / "exp")
    _run(
        [tiny_mlrc_config, "--root_experiment_folder", root, "--experiment_name", "s", "--bayes_opt_iters", "2",
         "--num_epochs_train", "1", "--num_training_sets", "1", "--optimizers~APPLY~3",
         "{lr~LOG_BAYESIAN~: [0.0001, 0.01]}"]
    )  # fmt: skip
    folder = os.path.join(root, "s")
    page, html = _check(folder, min_retrieval_rows=4)
    assert page["title"] == "mlrc search report"
    assert "<h2>Search: trials</h2>" in html and "<table><tr><th>trial</th><th>objective</th>" in html
    assert html.count("report.html'>trial_") == 2  # links to each trial's own report
    assert "Retrieval examples (best trial: trial_" in html
