"""The resolution-distillation protocol (RAML; a runner plugin, ``protocol:
benchmarks.protocols.resolution_distillation``): paper Tables 2-4 and the asymmetric-vs-iterations curve, multi-seed,
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
(:func:`pml_extensions.runner.objects.data.validation_split`) is held out from every teacher and student; each
student keeps the checkpoint (iteration 0 included) with the best asymmetric MAP@R on it, and with
``student_lr_grid`` the full student
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

Objects: every dataset, transform, network, loss, miner, sampler, optimizer, scheduler, tester and trainer comes
from one :class:`pml_extensions.runner.objects.builder.Builder` over the settings (:mod:`.settings`), built from the
recipe's specs (:mod:`.recipe`) and the config's ``models``; :mod:`.teacher` and :mod:`.student` are the stages,
:mod:`.chunks` their checkpointing, :mod:`.evaluation` what they measure, :mod:`.variants` the names of the variants
and the comparisons of the paper's claims, :mod:`.plots` the FLOPs figure. The paper-layout tables (Table 2 blocks,
Tables 3-4, the curve, the selection) are rendered from ``results.json`` by ``benchmarks/resolution_distillation.py``.

Writes ``results.json`` (``variants``/``comparisons`` of :mod:`pml_extensions.runner.outputs.results`, plus ``rows``,
``curve``, ``selection`` (per student: learning rate, selected iteration, its validation MAP@R; per seed the
grid's scores), ``config``, ``seconds``), ``results.md`` (every variant and comparison) and
``performance_vs_flops.png``.
"""

import os
import time
from typing import Any, Callable, Dict, Optional

from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.experiment import distributed as dist_utils
from pml_extensions.runner.experiment.folder import Experiment
from pml_extensions.runner.objects.builder import Builder
from pml_extensions.runner.objects.data import dataset_labels, validation_split
from pml_extensions.runner.protocols.base import Protocol

from . import recipe
from .chunks import finish
from .evaluation import METRICS, PRIMARY, evaluate_rows, save_retrieval, selection_lines
from .plots import plot_performance_vs_flops
from .recipe import STUDENT_VARIANTS
from .settings import JOB_DEFAULTS, Settings, job_config
from .student import build_student, choose_student_lr, student_stage
from .teacher import teacher_stage
from .variants import default_comparisons, per_seed_table

__all__ = ["JOB_DEFAULTS", "ResolutionDistillation", "STUDENT_VARIANTS", "build_student", "job_config", "run"]


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
        shown = ", ".join(f"{r['setup']} MAP@R={r[PRIMARY]:.4f}" for r in out["rows"])
        exp.log(f"[{dataset}] seed {seed} {q}px {variant}: {shown} ({time.time() - start:.0f}s)")
    if seed == ctx["first_seed"]:  # retrieval examples for report.html: the full student at the ablation resolution
        full = f"{base}/student_{aq}px_full" + (f"_lr{lr:g}" if tried else "")
        save_retrieval(exp, ctx, teacher, full, aq)
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


def _split_maker(builder, dataset, indices, split):
    """``resolution -> {split: images of indices at that resolution (the paper code's evaluation transform)}``."""
    labels = dataset_labels(dataset)
    return lambda res: {
        split: builder.subset(
            dataset, indices, labels, builder.build_transform(spec=recipe.eval_transform_spec(res)), rgb=True
        )
    }


class ResolutionDistillation(Protocol):
    """RAML's Tables 2-4 and the curve, multi-seed and paired (see the module docstring)."""

    name = "resolution_distillation"
    description = "RAML: teacher at database resolution, students at query resolutions, FLOPs"
    Settings = Settings
    data_folder_note = (
        'reads its data from `datasets:` (e.g. --datasets~OVERRIDE~ "{imagefolder: {root: PATH, '
        'database_resolution: 128, query_resolutions: [64]}}")'
    )

    @classmethod
    def check(cls, config, sources=None):
        job_config(config, sources)

    def run(self) -> Dict[str, Any]:
        return run(self.config, self.folder, self.sources, self.log)


PROTOCOL = ResolutionDistillation


def run(
    config: Dict[str, Any],
    experiment_folder: str,
    sources: Optional[Dict[str, str]] = None,
    log: Callable[..., None] = print,
) -> Dict[str, Any]:
    """Run (or resume) the protocol in ``experiment_folder``; returns what it writes to ``results.json``.

    Raises:
        ConfigError: bad settings (see :func:`.settings.job_config`), a dataset that cannot be loaded.
    """
    from pml_extensions.runner.outputs.results import summarize, write_results

    job = job_config(config, sources)
    exp = Experiment(experiment_folder, {"device": job["device"], "seed": None}, sources, log)
    builder = Builder(job, sources, exp.device, exp.log)
    rank, world = dist_utils.rank(), dist_utils.world_size()
    start, units, unit = time.time(), [], 0
    for dataset, dcfg in job["datasets"].items():
        key = f"datasets.{dataset}"
        train_set, test_set = recipe.load_dataset(dataset, dcfg, builder)
        test_idx = recipe.cap_per_class(test_set.labels, dcfg.get("max_test_per_class"), seed=0)
        train_part, make_validation_dict, held_out = train_set, None, ""
        if job["validation"] is not None:
            try:
                train_idx, val_idx, val_classes = validation_split(
                    train_set.labels, job["validation"]["class_fraction"], job["validation"]["seed"]
                )
            except ConfigError as e:
                raise ConfigError(f"{builder.where(key)}: {e}") from None
            train_part = builder.subset(train_set, train_idx, rgb=True)
            make_validation_dict = _split_maker(builder, train_set, val_idx, "validation")
            held_out = f" ({len(val_idx)} images of {len(val_classes)} training classes held out for validation)"
        exp.log(
            f"[{dataset}] train {len(train_part)} images{held_out}, test {len(test_idx)} images of "
            f"{len(set(test_set.labels.tolist()))} unseen classes; seeds {job['seeds']}"
            + (f"; (dataset, seed) units dealt over {world} ranks" if world > 1 else "")
        )
        tester = builder.build_tester(
            recipe.tester_spec(job["eval_batch_size"], job["num_workers"]), sharded=False, calculator_device=exp.device
        )
        ctx = {
            "dataset": dataset,
            "dcfg": dcfg,
            "db": dcfg["database_resolution"],
            "train_set": train_part,
            "tester": tester,
            "builder": builder,
            "make_dataset_dict": _split_maker(builder, test_set, test_idx, "test"),
            "make_validation_dict": make_validation_dict,
            "first_seed": job["seeds"][0],
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
    curve = [{k: p[k] for k in ("dataset", "seed", "query_resolution", "setup", "iteration", *METRICS)} for p in curve]
    results = summarize(
        per_seed_table(rows),
        default_comparisons(rows),
        metrics=(PRIMARY,),
        extra={"rows": rows, "curve": curve, "selection": selections, "config": job, "seconds": time.time() - start},
    )
    header = (
        f"RAML, seeds {', '.join(map(str, job['seeds']))}: every setup (``<dataset>/<query px>/<setup>[/<student>]``) "
        "on the test classes, mean ± std over seeds; comparisons paired by seed, 95 % Student-t interval (paper "
        "layout: benchmarks/resolution_distillation.py)."
    )
    if dist_utils.is_main():
        write_results(experiment_folder, results, header=header, footer="\n".join(selection_lines(selections)))
        plot_performance_vs_flops(results, os.path.join(experiment_folder, "performance_vs_flops.png"))
        with open(os.path.join(experiment_folder, "results.md"), encoding="utf-8") as f:
            exp.log(f.read())
    dist_utils.barrier()
    return results
