"""The resolution-distillation protocol (RAML): paper Tables 2-4 and the asymmetric-vs-iterations curve, multi-seed,
paired, resumable after SIGKILL.

Source: P. Suma and G. Tolias, "Large-to-small Image Resolution Asymmetry in Deep Metric Learning", WACV 2023, Sec. 5
(teacher trained with triplet loss + distance-weighted mining at the database resolution; student initialised from
it and distilled label-free with coupled augmentations; unseen-class evaluation, every test image a query against
the whole test set with itself excluded; mean of 3 seeds). Deviations (a CPU size exists): ImageNet MobileNetV2
instead of ResNet50, small resolutions, few iterations, capped test sets; every size is a config entry.

Per dataset and seed ``s`` (stages under ``<experiment_folder>/<dataset>/seed_<s>/``, each resumable):

- ``teacher``: trained at ``database_resolution`` -> ``teacher_symmetric`` (Table 2 block 1) and, per query
  resolution q, ``teacher_asymmetric`` (block 2: the teacher on q-px queries against its database);
- ``low_res_teacher_<q>px`` (``low_resolution_teacher: true``): the same recipe trained AT q from ImageNet ->
  ``low_resolution_teacher_symmetric`` (block 1: a model trained and tested at the query resolution);
- ``student_<q>px_full`` per q: distilled from the teacher -> ``teacher_student_asymmetric`` (block 3) and
  ``student_symmetric`` (block 4); at ``ablation_query_resolution`` also the asymmetric/symmetric curve at every
  ``checkpoint_every`` iterations; with ``student_lr_grid`` the full students at ``ablation_query_resolution`` are
  ``student_<q>px_full_lr<lr>`` (one per rate; the chosen one fills blocks 3-4);
- ``student_<q>px_<variant>`` at ``ablation_query_resolution`` for every ``student_variants`` entry of
  :data:`STUDENT_VARIANTS` (Table 3: each loss term alone, augmentation groups; Table 4: initialisation).

Pairing: within a seed every student starts from the same weights (the seed's teacher, or for the ImageNet-init
variant the same seeded head) and sees the same batches and augmentation draws (a :class:`PassShuffleSampler` and
the dataset's draws both keyed by (seed, pass)); the seed's teacher is shared by all its setups.

Selection (``validation: {class_fraction, seed}``): a class-disjoint part of the training classes
(:func:`~.xml_vs_gap_train.validation_split`) is held out from every teacher and student; each student keeps the
checkpoint (iteration 0 included) with the best asymmetric MAP@R on it, and with ``student_lr_grid`` the full student
at ``ablation_query_resolution`` is distilled once per learning rate and the rate with the best validation score is
used by every student of that seed (the paper code's ``optimize.py`` also tunes the rate on held-out training
classes). The test classes are read only to evaluate the selected weights (and for the reported curve, never for a
choice). Without ``validation`` the schedule is fixed and the last weights are evaluated.

Resume: each stage saves ``checkpoint.pth`` + record-keeper logs every ``checkpoint_every`` iterations and
``result.json`` when done; a rerun skips finished stages and continues a killed one from its last checkpoint.
Students resume bit-exactly (their randomness is keyed by (seed, pass)); teachers reseed torch/numpy/PML's RNG
at every chunk from (seed, chunk) and checkpoint the order of the MPerClassSampler's label list, so they resume
exactly too.

Under ``torchrun`` the (dataset, seed) units are dealt round-robin over the ranks: each rank trains and evaluates
its units alone (rank-local stages and testers, no collective inside a unit; a rank's GPU is ``cuda:LOCAL_RANK``),
then the rows are gathered and rank 0 writes the results, equal to one process's. A rerun with the same world size
resumes each unit where its rank left it. Ranks beyond the number of units wait.

Writes ``results.json`` (``variants``/``comparisons`` of :mod:`pml_extensions.runner.results`, plus ``rows``,
``curve``, ``selection`` (per student: learning rate, selected iteration, its validation MAP@R; per seed the
grid's scores), ``config``, ``seconds``), ``results.md`` and ``performance_vs_flops.png``.
"""

import copy
import difflib
import os
import time
from typing import Any, Callable, Dict, Optional

from ....testers.asymmetric_tester import AsymmetricTester
from ....utils.asymmetric_accuracy_calculator import AsymmetricAccuracyCalculator
from ....utils.atomic_io import atomic_write_text
from ...errors import ConfigError
from ...experiment import distributed as dist_utils
from ...experiment.folder import Experiment
from ..xml_vs_gap.unit import validation_split
from . import tables as parts
from .student import (
    STUDENT_VARIANTS,
    build_student,
    choose_student_lr,
    evaluate_rows,
    finish,
    student_stage,
    teacher_stage,
)

CONFIG_KEYS = ("protocol", "resolution_job", "seeds")
__all__ = ["CONFIG_KEYS", "JOB_DEFAULTS", "STUDENT_VARIANTS", "build_student", "job_config", "run"]

#: every key of ``resolution_job`` with its default (``None``: required)
JOB_DEFAULTS: Dict[str, Any] = {
    "datasets": None,
    "seeds": [0],
    "teacher_iterations": 40,
    "teacher_lr": 1e-4,
    "teacher_classes_per_batch": 2,
    "student_iterations": 40,
    "images_per_batch": 8,
    "num_augmentations": 4,
    "lr": 1e-4,
    "lambda_ts": 0.7,
    "lambda_ss": 0.7,
    "embedding_dim": 512,
    "eval_batch_size": 64,
    "device": "cpu",
    "num_workers": 0,
    "low_resolution_teacher": True,
    "student_variants": [],
    "checkpoint_every": 0,
    "validation": None,
    "student_lr_grid": None,
}
VALIDATION_KEYS = ("class_fraction", "seed")
DATASET_KEYS = (
    "database_resolution",
    "query_resolutions",
    "max_test_per_class",
    "crop_scale",
    "image_size",
    "source",
    "max_classes",
    "max_side",
    "root",
    "ablation_query_resolution",
)


def _unknown(keys, known, where):
    for k in keys:
        if k not in known:
            near = difflib.get_close_matches(str(k), list(known), n=1)
            raise ConfigError(f"{where}: unknown key {k!r}" + (f"; did you mean {near[0]!r}?" if near else ""))


def job_config(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """The validated ``resolution_job`` settings with defaults filled in (top-level ``seeds`` wins).

    Raises:
        ConfigError: one line naming the key: a missing or non-mapping ``resolution_job``, an unknown key (with
        the nearest known one), a query resolution not in (0, database_resolution), an unknown student variant,
        ``checkpoint_every`` that does not divide the iterations, a non-positive size.
    """
    where = (sources or {}).get("resolution_job", "config_general") + ": resolution_job"
    spec = config.get("resolution_job")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: must be a mapping (the job settings), got {type(spec).__name__}")
    _unknown(spec, JOB_DEFAULTS, where)
    job = copy.deepcopy(JOB_DEFAULTS)
    job.update(copy.deepcopy(spec))
    if config.get("seeds") is not None:  # top level (--seeds 0 1 2 on the command line) wins
        job["seeds"] = config["seeds"]
    if isinstance(job["seeds"], str):  # "0 1 2" or "0,1,2" from the command line
        try:
            job["seeds"] = [int(s) for s in job["seeds"].replace(",", " ").split()]
        except ValueError:
            raise ConfigError(f"{where}.seeds: a list of distinct ints is required, got {job['seeds']!r}") from None
    if not isinstance(job["datasets"], dict) or not job["datasets"]:
        raise ConfigError(f"{where}.datasets: a non-empty mapping {{name: settings}} is required")
    seeds = job["seeds"] if isinstance(job["seeds"], (list, tuple)) else [job["seeds"]]
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}.seeds: a list of distinct ints is required, got {job['seeds']!r}")
    job["seeds"] = list(seeds)
    for key in (
        "teacher_iterations",
        "student_iterations",
        "images_per_batch",
        "num_augmentations",
        "embedding_dim",
        "eval_batch_size",
        "teacher_classes_per_batch",
    ):
        v = job[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "teacher_iterations" else 1):
            raise ConfigError(f"{where}.{key}: a positive int is required, got {v!r}")
    every = job["checkpoint_every"]
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ConfigError(f"{where}.checkpoint_every: an int >= 0 is required (0: once at the end), got {every!r}")
    for key in ("teacher_iterations", "student_iterations"):
        if every and job[key] % every:
            raise ConfigError(f"{where}.checkpoint_every: {every} must divide {key} ({job[key]})")
    bad = [v for v in job["student_variants"] if v not in STUDENT_VARIANTS or v == "full"]
    if bad:
        raise ConfigError(
            f"{where}.student_variants: unknown {bad}; choose from "
            f"{', '.join(v for v in STUDENT_VARIANTS if v != 'full')}"
        )
    val = job["validation"]
    if val is not None:
        if not isinstance(val, dict):
            raise ConfigError(
                f"{where}.validation: a mapping {{class_fraction, seed}} or null is required, got {val!r}"
            )
        _unknown(val, VALIDATION_KEYS, f"{where}.validation")
        job["validation"] = val = {"class_fraction": val.get("class_fraction", 0.25), "seed": val.get("seed", 0)}
        fraction = val["class_fraction"]
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
            raise ConfigError(f"{where}.validation.class_fraction: a number in (0, 1) is required, got {fraction!r}")
        if isinstance(val["seed"], bool) or not isinstance(val["seed"], int):
            raise ConfigError(f"{where}.validation.seed: an int is required, got {val['seed']!r}")
    grid = job["student_lr_grid"]
    if grid is not None:
        if (
            not isinstance(grid, (list, tuple))
            or not grid
            or len(set(grid)) != len(grid)
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in grid)
        ):
            raise ConfigError(
                f"{where}.student_lr_grid: a non-empty list of distinct positive numbers is required, got {grid!r}"
            )
        if "lr" in spec:
            raise ConfigError(
                f"{where}: give lr (one learning rate) or student_lr_grid (chosen on validation), not both"
            )
        if val is None:
            raise ConfigError(
                f"{where}.student_lr_grid: needs validation (the learning rate is chosen on the validation classes)"
            )
        job["student_lr_grid"] = [float(v) for v in grid]
    if "init_low_resolution_teacher" in job["student_variants"] and not job["low_resolution_teacher"]:
        raise ConfigError(f"{where}.student_variants: init_low_resolution_teacher needs low_resolution_teacher: true")
    for name, d in job["datasets"].items():
        dw = f"{where}.datasets.{name}"
        if name not in parts.DATASETS:
            raise ConfigError(f"{dw}: unknown dataset; valid: {', '.join(parts.DATASETS)}")
        if not isinstance(d, dict):
            raise ConfigError(f"{dw}: must be a mapping")
        _unknown(d, DATASET_KEYS, dw)
        db, qs = d.get("database_resolution"), d.get("query_resolutions")
        if isinstance(db, bool) or not isinstance(db, int) or db <= 0:
            raise ConfigError(f"{dw}.database_resolution: a positive int is required, got {db!r}")
        if not isinstance(qs, (list, tuple)) or not qs:
            raise ConfigError(f"{dw}.query_resolutions: a non-empty list is required, got {qs!r}")
        for q in qs:
            if isinstance(q, bool) or not isinstance(q, int) or not 0 < q < db:
                raise ConfigError(
                    f"{dw}.query_resolutions: query resolution {q!r} must be in (0, database_resolution={db})"
                )
        aq = d.setdefault("ablation_query_resolution", qs[0])
        if aq not in qs:
            raise ConfigError(f"{dw}.ablation_query_resolution: {aq!r} is not one of query_resolutions {list(qs)}")
    return job


def _seed_unit(exp, ctx, job, start):
    """Every stage of one (dataset, seed): teacher, low-resolution teachers, the student learning-rate choice,
    students; returns (rows, curve, selections)."""
    dataset, seed, db, tester = ctx["dataset"], ctx["seed"], ctx["db"], ctx["tester"]
    qs, aq = ctx["dcfg"]["query_resolutions"], ctx["dcfg"]["ablation_query_resolution"]
    base, rows, curve = f"{dataset}/seed_{seed}", [], []
    teacher = teacher_stage(exp, f"{base}/teacher", ctx, db, job)
    if exp.stage_result(f"{base}/teacher") is None:
        fields = {"dataset": dataset, "seed": seed, "student_variant": None}
        t_rows = evaluate_rows(
            tester,
            ctx["make_dataset_dict"],
            teacher,
            None,
            qs[0],
            db,
            ("teacher_symmetric", "teacher_asymmetric"),
            fields,
        )
        for q in qs[1:]:
            t_rows += evaluate_rows(
                tester, ctx["make_dataset_dict"], teacher, None, q, db, ("teacher_asymmetric",), fields
            )
        finish(exp, f"{base}/teacher", {"rows": t_rows})
    rows += exp.stage_result(f"{base}/teacher")["rows"]
    low = {}
    if job["low_resolution_teacher"]:
        for q in qs:
            stage = f"{base}/low_res_teacher_{q}px"
            low[q] = teacher_stage(exp, stage, ctx, q, job)
            if exp.stage_result(stage) is None:
                finish(
                    exp,
                    stage,
                    {
                        "rows": evaluate_rows(
                            tester,
                            ctx["make_dataset_dict"],
                            low[q],
                            None,
                            q,
                            q,
                            ("teacher_symmetric",),
                            {"dataset": dataset, "seed": seed, "student_variant": None},
                            teacher_resolution=q,
                            rename={"teacher_symmetric": "low_resolution_teacher_symmetric"},
                        )
                    },
                )
            rows += [dict(r, database_resolution=db) for r in exp.stage_result(stage)["rows"]]
    lr, tried = choose_student_lr(exp, ctx, job, teacher, low, base)
    plan = [(q, "full") for q in qs] + [(aq, v) for v in job["student_variants"]]
    selections = []
    for q, variant in plan:
        if variant == "full" and q == aq and tried:
            out = tried[lr]  # the grid's winner is the full student at this resolution
        else:
            out = student_stage(
                exp,
                f"{base}/student_{q}px_{variant}",
                ctx,
                q,
                variant,
                job,
                teacher,
                low.get(q),
                curve=(variant == "full" and q == aq),
                lr=lr,
            )
        rows += out["rows"]
        curve += out["curve"]
        if out.get("selection") is not None:
            selections.append(
                {
                    "dataset": dataset,
                    "seed": seed,
                    "query_resolution": q,
                    "student_variant": variant,
                    **{k: v for k, v in out["selection"].items() if k != "curve"},
                }
            )
        shown = ", ".join(f"{r['setup']} MAP@R={r[parts.PRIMARY]:.4f}" for r in out["rows"])
        exp.log(f"[{dataset}] seed {seed} {q}px {variant}: {shown} ({time.time() - start:.0f}s)")
    if tried:
        selections.append(
            {
                "dataset": dataset,
                "seed": seed,
                "query_resolution": aq,
                "student_variant": "lr_grid",
                "lr": lr,
                "validation_by_lr": {f"{k:g}": v["selection"]["validation"] for k, v in tried.items()},
            }
        )
    return rows, curve, selections


def _split_maker(dataset, indices, split):
    """``resolution -> {split: images of indices at that resolution (the paper code's evaluation transform)}``."""
    return lambda res: {split: parts.Transformed(dataset, indices, parts.eval_transform(res))}


def run(
    config: Dict[str, Any],
    experiment_folder: str,
    sources: Optional[Dict[str, str]] = None,
    log: Callable[..., None] = print,
) -> Dict[str, Any]:
    """Run (or resume) the protocol in ``experiment_folder``; returns what it writes to ``results.json``.

    Raises:
        ConfigError: bad settings (see :func:`job_config`), a dataset that cannot be loaded.
    """
    from ...outputs.results import render_markdown, summarize

    job = job_config(config, sources)
    exp = Experiment(experiment_folder, {"device": job["device"], "seed": None}, sources, log)
    rank, world = dist_utils.rank(), dist_utils.world_size()
    start, units, unit = time.time(), [], 0
    for dataset, dcfg in job["datasets"].items():
        try:
            train_set, test_set = parts.load_dataset(dataset, dcfg)
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(f"resolution_job.datasets.{dataset}: {str(e).splitlines()[0]}") from e
        test_idx = parts.cap_per_class(test_set.labels, dcfg.get("max_test_per_class"), seed=0)
        train_part, make_validation_dict, held_out = train_set, None, ""
        if job["validation"] is not None:
            try:
                train_idx, val_idx, val_classes = validation_split(
                    train_set.labels, job["validation"]["class_fraction"], job["validation"]["seed"]
                )
            except ConfigError as e:
                raise ConfigError(f"resolution_job.datasets.{dataset}: {e}") from None
            train_part = parts.Transformed(train_set, train_idx, None)
            make_validation_dict = _split_maker(train_set, val_idx, "validation")
            held_out = f" ({len(val_idx)} images of {len(val_classes)} training classes held out for validation)"
        exp.log(
            f"[{dataset}] train {len(train_part)} images{held_out}, test {len(test_idx)} images of "
            f"{len(set(test_set.labels.tolist()))} unseen classes; seeds {job['seeds']}"
            + (f"; (dataset, seed) units dealt over {world} ranks" if world > 1 else "")
        )
        tester = AsymmetricTester(  # rank-local: under torchrun each rank evaluates its own units' models
            batch_size=job["eval_batch_size"],
            dataloader_num_workers=job["num_workers"],
            data_device=exp.device,
            accuracy_calculator=AsymmetricAccuracyCalculator(include=tuple(parts.METRICS), device=exp.device),
            distributed=False,
        )
        ctx = {
            "dataset": dataset,
            "dcfg": dcfg,
            "db": dcfg["database_resolution"],
            "train_set": train_part,
            "tester": tester,
            "make_dataset_dict": _split_maker(test_set, test_idx, "test"),
            "make_validation_dict": make_validation_dict,
        }
        for seed in job["seeds"]:
            if unit % world == rank:
                ctx["seed"] = seed
                units.append((unit, *_seed_unit(exp, ctx, job, start)))
            unit += 1
    # every rank's (unit, rows, curve), back in the one-process order
    units = sorted((u for part in dist_utils.gather_objects(units) for u in part), key=lambda u: u[0])
    rows = [r for _, unit_rows, _, _ in units for r in unit_rows]
    curve = [p for _, _, unit_curve, _ in units for p in unit_curve]
    selections = [s for _, _, _, unit_selections in units for s in unit_selections]
    curve = [
        {k: p[k] for k in ("dataset", "seed", "query_resolution", "setup", "iteration", *parts.METRICS)} for p in curve
    ]
    results = summarize(
        parts.per_seed_table(rows),
        parts.default_comparisons(rows),
        metrics=(parts.PRIMARY,),
        extra={"rows": rows, "curve": curve, "selection": selections, "config": job, "seconds": time.time() - start},
    )
    exp.write_results(results)
    tables = parts.markdown_tables(results)
    if dist_utils.is_main():
        atomic_write_text(
            os.path.join(experiment_folder, "results.md"),
            tables + "\n## Every variant and comparison\n\n" + render_markdown(results),
        )
        parts.plot_performance_vs_flops(results, os.path.join(experiment_folder, "performance_vs_flops.png"))
    exp.log(tables)
    return results
