"""benchmarks/paper_scale.py: the full-size commands are valid configs of their protocols (what each piece trains),
the summary's verdicts on a hand-made results.json, and the tiny CPU run of all three pieces (slow)."""

import contextlib
import importlib.util
import io
import json
import os
from unittest import mock

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "paper_scale.py")


def _module():
    spec = importlib.util.spec_from_file_location("paper_scale", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _merged(ps, piece, tiny=False):
    """The config the runner would run for the piece (merged and checked against its protocol; nothing read)."""
    from pml_extensions.cli.run import load

    cmd = ps.piece_command(piece, tiny, "cuda", ps.SEEDS[piece], "/nonexistent/paper_scale")
    assert cmd[1:4] == ["-m", "pml_extensions", "run"]
    config, sources, folder, _, _ = load(cmd[4:])
    assert folder == os.path.join("/nonexistent/paper_scale", piece)
    return config, sources


def test_budgets_fit_ten_minutes_and_every_flag_is_given_once():
    ps = _module()
    assert sum(ps.BUDGET_S.values()) + ps.GRACE_S <= ps.TOTAL_S <= 600
    for piece in ps.PIECES:
        for tiny in (False, True):
            cmd = ps.piece_command(piece, tiny, "cpu", 2, "/tmp/x")
            flags = [w for w in cmd if w.startswith("--")]
            assert len(flags) == len(set(flags)), flags
            args = ps.piece_args(piece, tiny, "cpu", 2)
            assert args["seeds"] == "[0, 1]" and args["device"] == "cpu"
    assert "variant" not in ps.piece_args("template_block", True, "cpu", 2)  # tiny: the default's narrow network
    with pytest.raises(ValueError, match="piece must be one of"):
        ps.piece_args("explain", False, "cpu", 2)


def test_xml_piece_fine_tunes_every_layer_at_224_px_against_gap():
    from benchmarks.protocols.xml_paper import PROTOCOL

    ps = _module()
    config, sources = _merged(ps, "xml")
    assert config["seeds"] == list(range(ps.SEEDS["xml"])) and config["untrained"] is True
    assert config["comparisons"] == [["contrastive_xml", "contrastive_gap"], ["contrastive_gap", "untrained"]]
    variants, _, _ = PROTOCOL.variants(config, sources)
    assert list(variants) == ["contrastive_gap", "contrastive_xml"]
    for cfg in variants.values():
        assert cfg["feature_cache"] is None  # no cached prefix: every layer trains
        assert cfg["dataset"]["name"] == "openclipart"
        assert cfg["transforms"]["train"]["Compose"]["transforms"][0] == {
            "RandomResizedCrop": {"size": 224, "scale": [0.6, 1.0]}
        }
        assert {"CenterCrop": {"size": 224}} in cfg["transforms"]["eval"]["Compose"]["transforms"]
        assert cfg["models"]["trunk"]["Sequential"][0] == {"MobileNetV2Features": {"pretrained": True}}
    assert list(variants["contrastive_gap"]["loss_funcs"]["metric_loss"]) == ["ContrastiveLoss"]
    assert list(variants["contrastive_xml"]["loss_funcs"]["metric_loss"]) == ["XMLWrapper"]
    assert "HistogramPooling" in variants["contrastive_xml"]["models"]["trunk"]["Sequential"][1]


def test_template_block_piece_trains_the_wide_resnet_from_scratch():
    ps = _module()
    config, _ = _merged(ps, "template_block")
    assert list(config["variants"]) == ["baseline", "block", "aux_only"]
    assert all(v["template_block"]["init"] == "paper" for k, v in config["variants"].items() if k != "baseline")
    assert config["models"]["trunk"]["SmallResNet"]["widths"] == [32, 64, 128, 128]
    assert config["num_epochs"] * config["iterations_per_epoch"] == 1500 and config["batch_size"] == 64
    assert config["split"]["train"] == 5400 and config["device"] == "cuda"
    assert ["block", "baseline"] in config["comparisons"] and ["block", "aux_only"] in config["comparisons"]


def test_raml_piece_runs_the_papers_resolutions():
    ps = _module()
    config, _ = _merged(ps, "raml")
    assert list(config["datasets"]) == ["openclipart"]
    d = config["datasets"]["openclipart"]
    assert (d["database_resolution"], d["query_resolutions"]) == (448, [160])
    assert config["student_lr_grid"] is None and config["student_variants"] == []
    assert config["images_per_batch"] * config["num_augmentations"] == 200  # the paper's views per step


def test_summary_reads_claims_with_holm_and_verdicts(tmp_path):
    """Hand-checked (points): XML − GAP 2, 2.5, 3 → +2.50 [1.26, 3.74], t-test p 0.0131; GAP − untrained 0.10,
    0.12, 0.14 → p 0.0091. Holm over the two: 0.0183 and 0.0183; δ = 1: shown, no effect of practical size."""
    ps = _module()
    gap = [0.30, 0.31, 0.32]
    rows = {
        "contrastive_gap": gap,
        "contrastive_xml": [g + d for g, d in zip(gap, (0.020, 0.025, 0.030))],
        "untrained": [g - d for g, d in zip(gap, (0.0010, 0.0012, 0.0014))],
    }
    results = {
        "variants": {
            n: {"per_seed": {str(s): {ps.MAP_AT_R: v} for s, v in enumerate(vals)}} for n, vals in rows.items()
        },
        "comparisons": [],
    }
    (tmp_path / "results.json").write_text(json.dumps(results))
    out = ps.read_piece("xml", str(tmp_path), tiny=False)
    assert [c["verdict"] for c in out["claims"]] == ["shown", "no effect of practical size"]
    assert [round(c["p_holm"], 4) for c in out["claims"]] == [0.0183, 0.0183]
    assert out["verdict_lines"][0].startswith("contrastive_xml − contrastive_gap: +2.50 [+1.26, +3.74] MAP@R points")
    assert out["seed_list"] == [0, 1, 2] and out["variants"] == ["contrastive_gap", "contrastive_xml", "untrained"]
    assert ps.read_piece("xml", str(tmp_path / "missing"), tiny=False) == {"results": None}


def _main(argv):
    """``python benchmarks/paper_scale.py ARGV`` through its ``main(argv)`` in this process (a child interpreter would
    import torch and torchvision again, ~7 s): (exit status, what it printed)."""
    from benchmarks import gpu_check

    tiny = dict(gpu_check.IN_PROCESS)
    out = io.StringIO()
    try:
        with mock.patch.dict(os.environ, {"MPLBACKEND": "Agg"}), contextlib.redirect_stdout(out):
            code = _module().main(argv)
    finally:
        gpu_check.IN_PROCESS.update(tiny)  # --tiny sets it for the whole interpreter
    return code, out.getvalue()


@pytest.mark.slow
def test_without_cuda_one_line_and_exit_0(tmp_path):
    with mock.patch("torch.cuda.is_available", return_value=False):
        code, stdout = _main(["--out", str(tmp_path)])
    assert code == 0, stdout
    assert stdout.strip().splitlines() == [
        "paper_scale: no CUDA device here; nothing to run (the CPU smoke run is --device cpu --tiny)"
    ]
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_tiny_cpu_run_gives_every_piece_its_results(tmp_path):
    """The three pieces at toy size on CPU (about a minute on 2 cores): each experiment folder holds its protocol's
    results.json with the expected variants, and the summary sits in --out, not in benchmarks/results."""
    from pml_extensions.utils.verdicts import VERDICTS

    code, stdout = _main(["--device", "cpu", "--tiny", "--out", str(tmp_path)])
    assert code == 0, stdout[-6000:]
    with open(tmp_path / "paper_scale.json", encoding="utf-8") as f:
        summary = json.load(f)
    assert summary["tiny"] is True
    expected = {
        "xml": ["contrastive_gap", "contrastive_xml", "untrained"],
        "template_block": ["aux_only", "baseline", "block"],
        "raml": [
            "glyphs/16px/student_symmetric",
            "glyphs/16px/teacher_asymmetric",
            "glyphs/16px/teacher_student_asymmetric",
            "glyphs/32px/teacher_symmetric",
        ],
    }
    pieces = {p["name"]: p for p in summary["pieces"]}
    assert list(pieces) == list(expected)
    for name, variants in expected.items():
        p = pieces[name]
        assert p["status"] == "ok", p["note"]
        path = tmp_path / "experiments" / name / "results.json"
        assert p["results"] == str(path)
        with open(path, encoding="utf-8") as f:
            assert sorted(json.load(f)["variants"]) == variants
        assert p["seed_list"] == [0, 1] and p["seconds"] > 0
        assert len(p["verdict_lines"]) == len(p["claims"]) >= 1
        assert all(line.split("): ")[-1].startswith(VERDICTS) for line in p["verdict_lines"]), p["verdict_lines"]
    table = (tmp_path / "paper_scale.md").read_text(encoding="utf-8")
    assert "| xml | ok |" in table and "| raml | ok |" in table
