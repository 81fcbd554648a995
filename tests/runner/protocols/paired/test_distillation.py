"""The paired protocol's distillation path (``teacher`` + ``coupled_augmentation`` + a distilling trainer such as
ResolutionDistillationTrainer), on the shipped ``distillation_glyphs`` config at toy size."""

import os
from unittest import mock

import pytest
import torch

from pml_extensions.cli.job import load_job_config
from pml_extensions.runner.config.loader import variant_configs
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.objects.builder import Builder
from pml_extensions.runner.protocols.paired import unit as train
from pml_extensions.trainers import distillation_keys
from pml_extensions.utils.wiring import KeyProblem
from tests.runner.runner_testing_utils import dejavu_fonts

CPU = torch.device("cpu")
#: the glyphs of the DejaVu Sans fonts only (248 of the 682 images of a split: each evaluation embeds every image of
#: its split)
SMALL_GLYPHS = "{kwargs: {image_size: 32, font_files: [%s]}}" % ", ".join(dejavu_fonts())
QUIET = lambda *a, **k: None  # noqa: E731


def _variant(name, **overrides):
    cfg, _ = load_job_config(
        ["distillation_glyphs", "--num_epochs", "1", "--iterations_per_epoch", "2", "--dataset", SMALL_GLYPHS]
    )
    out = variant_configs(cfg)[name]
    out.update(overrides)
    return out


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A teacher checkpoint laid out as a paired run writes one: ``<run>/teacher/seed_0/best_models.pth`` and the
    run's ``config.yaml`` two folders above it. Its weights are the models built with seed 5, so they differ from
    any student's own seed-0 start."""
    import yaml

    cfg, _ = load_job_config(["distillation_glyphs"])
    root = tmp_path_factory.mktemp("teacher_run")
    os.makedirs(root / "teacher" / "seed_0")
    with open(root / "config.yaml", "w") as f:
        yaml.safe_dump(cfg, f)
    models = train.build_models(variant_configs(cfg)["teacher"], 5, CPU, losses=False)
    weights = {k: models[k].state_dict() for k in ("trunk", "embedder")}
    torch.save(weights, root / "teacher" / "seed_0" / "best_models.pth")
    return str(root / "teacher" / "seed_{seed}"), weights


def test_teacher_spec_forms():
    teacher_spec = distillation_keys.teacher_spec
    assert teacher_spec({}) is None
    assert teacher_spec({"teacher": "a/seed_{seed}"}) == ("a/seed_{seed}", True)
    assert teacher_spec({"teacher": {"checkpoint": "t.pth", "init_student": False}}) == ("t.pth", False)
    for bad in ("", 3, {"checkpoint": "t.pth", "init_student": "no"}, {"path": "t.pth"}, {"checkpoint": None}):
        with pytest.raises(KeyProblem, match=r"^expected a checkpoint path or \{checkpoint: PATH") as e:
            teacher_spec({"teacher": bad})
        assert e.value.key == "teacher"
        # the runner's check names the file and the key
        with pytest.raises(ConfigError, match=r"^f.yaml: teacher: expected a checkpoint path or \{checkpoint: PATH"):
            train.hooks(Builder({"teacher": bad}, {"teacher": "f.yaml"}, CPU, QUIET), "check", [0], None, set())


def _capture(cfg, tmp_path, name):
    """Train ``cfg`` and record what the trainer holds at its first batch (before any update)."""
    from pml_extensions.trainers import MetricLossOnly, ResolutionDistillationTrainer

    seen = {}
    originals = {cls: cls.get_batch for cls in (MetricLossOnly, ResolutionDistillationTrainer)}

    def get_batch(trainer):
        batch = originals[type(trainer)](trainer)
        if not seen:
            seen["models"] = {k: {n: t.clone() for n, t in m.state_dict().items()} for k, m in trainer.models.items()}
            seen["batch"], seen["trainer"] = batch, trainer
        return batch

    from unittest import mock

    with mock.patch.object(MetricLossOnly, "get_batch", get_batch):
        with mock.patch.object(ResolutionDistillationTrainer, "get_batch", get_batch):
            r = train.train_and_select(name, cfg, 0, str(tmp_path / name), CPU, log=QUIET)
    return seen, r


def _same(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # trains two tiny units (over 3 s on 2 cores)
def test_students_start_from_the_teacher_and_the_teacher_stays_frozen(teacher, tmp_path):
    path, weights = teacher
    distilled, r = _capture(_variant("distilled", teacher=path), tmp_path, "distilled")
    finetuned, f = _capture(_variant("finetuned", teacher=path), tmp_path, "finetuned")
    from pml_extensions.trainers import ResolutionDistillationTrainer

    assert isinstance(distilled["trainer"], ResolutionDistillationTrainer)
    for seen in (distilled, finetuned):  # both students start from the teacher's weights
        assert _same(seen["models"]["trunk"], weights["trunk"]) and _same(
            seen["models"]["embedder"], weights["embedder"]
        )
    # the teacher is the checkpoint's, frozen: unchanged after training, and no parameter of it trains
    assert _same(distilled["models"]["teacher_trunk"], weights["trunk"])
    teacher_trunk = distilled["trainer"].models["teacher_trunk"]
    assert _same(teacher_trunk.state_dict(), weights["trunk"])
    assert not any(p.requires_grad for p in teacher_trunk.parameters())
    # the distilling trainer's batch: coupled views, 16 px for the student and 32 px for the teacher
    (student, large, _), ids = distilled["batch"]
    assert tuple(student.shape[1:]) == (3, 16, 16) and tuple(large.shape[1:]) == (3, 32, 32)
    assert student.shape[0] == large.shape[0] == 16 * 4 and len(ids) == 64
    # the untrained row of both students is the teacher on 16-px images: the same numbers
    assert r["history"][0] == f["history"][0]
    assert r["history"][0]["epoch"] == 0


@pytest.mark.slow  # trains two tiny units (over 3 s on 2 cores)
def test_init_student_false_keeps_the_students_own_initial_weights(teacher, tmp_path):
    path, weights = teacher
    cfg = _variant("finetuned", teacher={"checkpoint": path, "init_student": False})
    seen, _ = _capture(cfg, tmp_path, "own")
    own = train.build_models(cfg, 0, CPU, losses=False)  # the student's seed-0 start
    assert _same(seen["models"]["embedder"], own["embedder"].state_dict())
    assert not torch.equal(seen["models"]["embedder"]["weight"], weights["embedder"]["weight"])


def _refusal(cfg):
    """The preflight's check of the keys the methods register (here: the distillation keys), at seed 0."""
    b = Builder(cfg, {"teacher": "cfg.yaml", "trainer": "cfg.yaml"}, CPU, QUIET)
    with pytest.raises(ConfigError) as e:
        train.hooks(b, "check", [0], train.load_run_models, set())
    return str(e.value)


def test_bad_distillation_configs_are_refused_in_one_line(teacher, tmp_path):
    path, _ = teacher
    cfg = _variant("distilled", teacher=path)
    assert _refusal({**cfg, "teacher": None}) == (
        "cfg.yaml: trainer: ResolutionDistillationTrainer distils from a teacher: set teacher: <checkpoint of a "
        "finished run, e.g. experiments/teacher/teacher/seed_{seed}>"
    )
    got = _refusal({**cfg, "coupled_augmentation": None})
    assert got.endswith("set coupled_augmentation: {query_size: <student px>, database_size: <teacher px>}")
    got = _refusal({**cfg, "trainer": {"ResolutionDistillationTrainer": {"init_student_from_teacher": True}}})
    assert got.startswith("cfg.yaml: trainer.ResolutionDistillationTrainer.init_student_from_teacher: the runner")
    missing = str(tmp_path / "nowhere" / "seed_{seed}")
    assert _refusal({**cfg, "teacher": missing}) == (
        f"cfg.yaml: teacher: checkpoint {missing.replace('{seed}', '0')} not found (train the teacher first, or "
        "name a finished run)"
    )
    transforms = {k: v for k, v in cfg["transforms"].items() if k != "reference"}
    assert _refusal({**cfg, "transforms": transforms}) == (
        "config: transforms: an asymmetric tester with a teacher needs transforms.reference (the teacher's "
        "database images, e.g. {Resize: {size: [32, 32]}})"
    )
    got = _refusal({**cfg, "coupled_augmentation": {"query_size": 0, "database_size": 32}})
    assert got == "config: coupled_augmentation.CoupledAugmentationDataset: query_size must be an int >= 1, got 0"
    # a student that does not have the teacher's architecture: one line, what to change
    narrow = {**cfg["models"], "embedder": {"Linear": {"in_features": 128, "out_features": 32}}}
    with pytest.raises(ConfigError, match=r"^cfg.yaml: teacher: the teacher's embedder does not fit models.embedder"):
        train.train_and_select(
            "d", {**cfg, "models": narrow}, 0, str(tmp_path / "d"), CPU, log=QUIET, sources={"teacher": "cfg.yaml"}
        )


def test_the_shipped_config_dry_runs_and_names_a_missing_teacher(tmp_path, monkeypatch, capsys):
    from pml_extensions.cli import run

    monkeypatch.chdir(tmp_path)
    assert run.main(["distillation_glyphs", "--variants", "teacher", "--dry-run"]) == 0
    capsys.readouterr()
    assert run.main(["distillation_glyphs", "--variants", "distilled", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "config error: configs/distillation_glyphs/config_general.yaml (variants.distilled): teacher: checkpoint "
        "experiments/distillation_glyphs_teacher/teacher/seed_0 not found (train the teacher first, or name a "
        "finished run)"
    )
    assert not os.path.exists(tmp_path / "experiments")  # a dry run writes nothing


@pytest.mark.slow  # trains one tiny unit (over 3 s on 2 cores)
def test_the_asymmetric_tester_gets_the_teacher_and_the_same_images_at_the_database_size(teacher, tmp_path):
    from unittest import mock

    from pml_extensions.testers import AsymmetricTester

    path, weights = teacher
    calls = []
    original = AsymmetricTester.test

    def test(self, dataset_dict, epoch, trunk, embedder=None, *args, **kwargs):
        calls.append((dataset_dict, kwargs))
        return original(self, dataset_dict, epoch, trunk, embedder, *args, **kwargs)

    with mock.patch.object(AsymmetricTester, "test", test):
        r = train.train_and_select("finetuned", _variant("finetuned", teacher=path), 0, str(tmp_path), CPU, log=QUIET)
    assert len(calls) == 2  # epochs 0 and 1
    queries, kwargs = calls[0]
    references = kwargs["reference_dataset_dict"]
    assert list(queries) == list(references) == ["val"]
    assert list(queries["val"].labels) == list(references["val"].labels)
    assert tuple(queries["val"][0][0].shape) == (3, 16, 16) and tuple(references["val"][0][0].shape) == (3, 32, 32)
    assert _same(kwargs["reference_trunk_model"].state_dict(), weights["trunk"])
    assert _same(kwargs["reference_embedder_model"].state_dict(), weights["embedder"])
    # the test split too, against the teacher of the unit's seed
    calls.clear()
    with mock.patch.object(AsymmetricTester, "test", test):
        train.evaluate(_variant("finetuned", teacher=path), r["models"], CPU, "test", seed=0)
    ((queries, kwargs),) = calls
    assert list(kwargs["reference_dataset_dict"]) == ["test"]
    assert len(kwargs["reference_dataset_dict"]["test"]) == len(queries["test"])


@pytest.mark.slow  # two runs of the CLI at toy size
def test_the_two_commands_of_the_docs_run_the_teacher_then_the_students(tmp_path, monkeypatch, capsys):
    """docs/methods/resolution_distillation.md's two commands, at toy size: the second finds the first's teacher of
    each seed (`seed_{seed}`), and its results say the metrics are asymmetric."""
    import json

    from pml_extensions.cli import run

    monkeypatch.chdir(tmp_path)
    # one iteration per epoch, on the four DejaVu Sans faces (no Mono): each of its 6 units embeds its splits 3 times
    fonts = [f for f in dejavu_fonts() if not os.path.basename(f).startswith("DejaVuSansMono")]
    glyphs = "{kwargs: {image_size: 32, font_files: [%s]}}" % ", ".join(fonts)
    small = ["--num_epochs", "1", "--iterations_per_epoch", "1", "--seeds", "0", "1", "--dataset", glyphs]
    teacher_run = ["--variants", "teacher", "--experiment_name", "distillation_glyphs_teacher"]
    assert run.main(["distillation_glyphs", *teacher_run, *small]) == 0
    for seed in (0, 1):
        assert os.path.isfile(tmp_path / f"experiments/distillation_glyphs_teacher/teacher/seed_{seed}/best_models.pth")
    capsys.readouterr()
    from pml_extensions.runner.outputs import retrieval

    embedded, embed = [], retrieval.embed

    def recording_embed(trunk, embedder, dataset, device, batch_size=64):
        embedded.append((trunk, tuple(dataset[0][0].shape)))
        return embed(trunk, embedder, dataset, device, batch_size)

    with mock.patch.object(retrieval, "embed", recording_embed):
        assert run.main(["distillation_glyphs", "--variants", "finetuned", "distilled", *small]) == 0
    # the report's examples are the test's: each variant's student on 16-px queries, the teacher on 32-px references
    assert [size for _, size in embedded] == [(3, 32, 32), (3, 16, 16)] * 2
    assert all(not any(p.requires_grad for p in trunk.parameters()) for trunk, _ in embedded[0::2])
    with open(tmp_path / "experiments/distillation_glyphs/retrieval/distilled.json") as f:
        assert "against the teacher's references (transforms.reference)" in json.load(f)["note"]
    with open(tmp_path / "experiments/distillation_glyphs/results.json") as f:
        results = json.load(f)
    assert sorted(results["variants"]) == ["distilled", "finetuned"]
    assert [c["variant"] + " - " + c["baseline"] for c in results["comparisons"]] == ["distilled - finetuned"]
    for seed in ("0", "1"):  # both students start from the teacher of their seed: the same epoch-0 validation
        first = [results["units"][v][seed]["history"][0] for v in ("distilled", "finetuned")]
        assert first[0] == first[1] and first[0]["epoch"] == 0
    text = (tmp_path / "experiments/distillation_glyphs/results.md").read_text()
    assert "start from the frozen teacher `experiments/distillation_glyphs_teacher/teacher/seed_{seed}`" in text
    assert "their metrics are asymmetric" in text
