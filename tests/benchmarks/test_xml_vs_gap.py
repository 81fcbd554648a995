"""benchmarks/xml_vs_gap.py: the main job's README table from a finished job folder (the ``paired`` protocol) — the
``xml_loss`` summaries read from the units' own logs into ``xml_loss_curves``, the job's header and tables, the paper's
claim for the XML-vs-GAP comparisons only, the XML paper's footer — on a hand-made folder."""

import importlib.util
import json
import os

import pytest
import yaml

from pml_extensions.runner.outputs.results import summarize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEEDS = (0, 1, 2)


def _module():
    spec = importlib.util.spec_from_file_location("xml_vs_gap", os.path.join(ROOT, "benchmarks", "xml_vs_gap.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _job_folder(tmp_path):
    """The shipped job's config (xml_glyphs) and results.json as the paired protocol writes them, MAP@R by hand; an
    XMLWrapper log (xml_loss 2.0 - 0.1 i over 20 iterations, + seed) in every unit of the two XML variants. MAP@R of
    the i-th variant 0.30 + 0.02 i + 0.001 s: any two variants differ by a multiple of 0.02 on every seed."""
    from pml_extensions.cli.job import load_job_config

    config, _ = load_job_config(["--device", "cpu"])
    folder = tmp_path / "xml_glyphs"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    xml = ("contrastive_xml", "contrastive_xml_lambda0", "proxy_anchor_xml")
    values = {n: [0.30 + 0.02 * i + 0.001 * s for s in SEEDS] for i, n in enumerate(config["variants"])}
    per_seed = {n: {s: {"mean_average_precision_at_r": v[s], "precision_at_1": 0.5, "r_precision": 0.4} for s in SEEDS}
                for n, v in values.items()}  # fmt: skip
    units = {
        n: {str(s): {"history": [], "best_epoch": 1, "num_train_classes": 23, "num_val_classes": 8,
                     "xml": {"num_skipped_xml": 0} if n in xml else {}} for s in SEEDS}
        for n in config["variants"]
    }  # fmt: skip
    results = summarize(
        per_seed,
        comparisons=[tuple(p) for p in config["comparisons"]],
        metrics=["mean_average_precision_at_r"],
        extra={"protocol": "paired", "seeds": list(SEEDS), "device": "cpu", "units": units, "dataset": "glyphs",
               "num_epochs": 4, "iterations_per_epoch": 5, "batch_size": 32, "selection": {"mode": "best_epoch"}},
    )  # fmt: skip
    (folder / "results.json").write_text(json.dumps(results))
    for name in ("contrastive_xml", "proxy_anchor_xml"):
        for s in SEEDS:
            logs = folder / name / f"seed_{s}" / "logs"
            logs.mkdir(parents=True)
            rows = "".join(f"{i + 1},{2.0 - 0.1 * i + s}\n" for i in range(20))
            (logs / "metric_loss_XMLWrapper.csv").write_text("~iteration~,xml_loss\n" + rows)
    return folder


def test_the_table_reads_the_xml_loss_from_the_units_logs(tmp_path):
    xvg = _module()
    folder = _job_folder(tmp_path)
    assert xvg.main(["--run-folder", str(folder), "--out", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "xml_vs_gap.json").read_text())
    curves = written["xml_loss_curves"]
    assert sorted(curves) == ["contrastive_xml", "proxy_anchor_xml"]  # xml_weight > 0 only (not the λ = 0 twin)
    c = curves["contrastive_xml"]["1"]  # values 3.0 - 0.1 i, windows of 10: first 2.55, last 1.55
    assert (c["window"], c["iterations"]) == (10, 20)
    assert c["first"] == pytest.approx(2.55) and c["last"] == pytest.approx(1.55)
    md = (tmp_path / "out" / "xml_vs_gap.md").read_text()
    assert md.startswith("Dataset `glyphs`: trained on 23 classes, best epoch chosen on 8 held-out training classes")
    assert "4 epochs × 5 iterations, batch 32, seeds 0, 1, 2" in md
    assert "| contrastive_xml − contrastive_gap | MAP@R |" in md
    claims = md.split("XML-vs-GAP comparison:\n")[1].split("\n\n")[0].splitlines()
    assert [line.split(" MAP@R")[0] for line in claims] == [
        "- contrastive_xml − contrastive_gap",
        "- proxy_anchor_xml − proxy_anchor_gap",
    ]  # the λ = 0 twin has XML counters: it is no GAP baseline
    # XML − GAP is +0.02 on every seed: the interval [0.02, 0.02] excludes 0, the bootstrap's p 2 / 10001 (the t-test's
    # ≈ 0) is 0.0004 after Holm over the two, and 0.02 reaches δ = 0.01 -> shown
    assert all(line.endswith("smallest effect 0.01: shown") for line in claims), claims
    assert "This job is a smoke test (3 seeds from scratch), not evidence on the claim" in md
    # the footer: means over seeds (first window 1.55 + seed, last 0.55 + seed)
    assert "`xml_loss` of contrastive_xml (logged every iteration, mean over seeds): first 10 iterations 2.550" in md
    assert md.rstrip().endswith("last 10 1.550, std over iterations 0.577")
    # --from-json renders the same table again from the copied file alone
    again = tmp_path / "again.json"
    again.write_text(json.dumps(written))
    assert xvg.main(["--from-json", str(again)]) == 0
    assert (tmp_path / "again.md").read_text() == md


def test_a_folder_without_its_config_is_one_error(tmp_path):
    xvg = _module()
    folder = _job_folder(tmp_path)
    os.remove(folder / "config.yaml")
    with pytest.raises(ValueError, match=r"xml_glyphs: no config.yaml \(not a finished job folder\)"):
        xvg.main(["--run-folder", str(folder), "--out", str(tmp_path / "out")])
