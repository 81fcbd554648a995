"""Regenerate every result table of the README with one command.

    python benchmarks/reproduce.py --size quick                  # CPU: wall time: docs/benchmarks.md
    python benchmarks/reproduce.py --size full --device cuda     # GPU sizes
    python benchmarks/reproduce.py --size quick --only xml_vs_gap xml_generalization
    python benchmarks/reproduce.py --list                        # the plan: every process, its threads, its order

Each step is one benchmark run by its stable command line (below); it writes ``benchmarks/results/NAME.json`` and
``NAME.md``. The main job's ``results.json`` is copied to ``benchmarks/results/xml_vs_gap.json`` and its table (with the
paper's claim beside it) rendered by ``benchmarks/xml_vs_gap.py``.
Then ``benchmarks/readme_tables.py`` copies every ``NAME.md`` into its README block (every README block has a step
here; a test checks it).

Scheduling: the training steps share the cores first: each of their processes runs with one torch thread
(``OMP_NUM_THREADS=1``), as many at once as ``--jobs`` (default: the CPU count); steps with per-seed or
per-experiment parts run them as parallel processes in the benchmark's experiment folders (template_block: its three
experiments; localization: one process per seed, each training its units in the one experiment folder), and the
step's own call gathers the finished experiments into the tables. Then the
steps whose numbers are wall times or memory peaks (and the main job, whose README table must equal what
``tox -e job`` writes with the machine's default threads) run alone, one after another, with every core; the XML
generalisation probe (it reads the main job's models) comes last. The experiment folders of the selected steps that
would resume (the main job's, resolution distillation's, template_block's, localization's) are deleted first, so every
step starts afresh; with
``--only`` the other steps' folders stay (``--only xml_generalization`` reads the last job's models). A tqdm bar
counts the processes; each process's output goes to ``runs/reproduce/<size>/NAME.log``. A failing process is
reported (with the end of its log), the processes that need it are skipped, the others still run; the exit status is
1 when anything failed. The wall time of every process and of the whole call is written to
``benchmarks/results/reproduce_<size>_<device>.json``. ``--size quick`` leaves out the steps of :data:`FULL_ONLY`.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from typing import List, NamedTuple, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PY = sys.executable
#: steps that ``--size full`` runs and ``--size quick`` leaves out, so that the quick call fits 60 minutes on 2 cores:
#: the k-NN engine at 20k-300k embeddings (18.1 min alone on 2 cores in the last whole quick call; its table is the
#: engine's timing evidence), RAML's Tables 2-4 at 48 / 24 / 32 px (18.2 min on one core; the near-the-floor
#: setting), XML with the last stage trained (two parts of about an hour each on one core), RAML's Table 2 with 10
#: seeds at 64 / 48 px and the template block trained to convergence on Fashion-MNIST (each over an hour on one core)
FULL_ONLY = (
    "accuracy_scale",
    "resolution_distillation",
    "xml_trained",
    "resolution_distillation_off_floor",
    "template_block_converged",
)


class Step(NamedTuple):
    """One README-level benchmark. ``alone``: runs with every core and nothing beside it (timings, memory, the main
    job). ``parts``: ``[(part name, argv)]`` run as parallel single-thread processes before ``argv`` (the merge).
    ``fresh``: folders (relative to the repository) deleted before the step, where a rerun would resume."""

    name: str
    argv: List[str]
    results: List[str]
    alone: bool = False
    parts: Tuple = ()
    needs: Tuple = ()
    fresh: Tuple = ()


def steps(size: str, device: str, runs: str) -> List[Step]:
    """The steps in order; the XML generalisation probe reads the main job's models."""
    dev = ["--device", device]
    job_folder = os.path.join(runs, "xml_glyphs")
    tb_folder, loc_folder = os.path.join(runs, "template_block"), os.path.join(runs, "localization")
    raml_off, tb_converged = os.path.join(runs, "resolution_distillation_off_floor"), os.path.join(runs, "converged")
    tb = [PY, "benchmarks/template_block.py", "--size", "medium" if size == "quick" else size]
    tb += ["--experiment-folder", tb_folder] + dev
    tb_parts = tuple((part, tb + ["--part", part]) for part in ("ablation", "fashion_lambda", "glyphs"))
    loc_seeds = (0, 1, 2) if size == "quick" else (0, 1, 2, 3, 4)
    loc = [PY, "benchmarks/localization.py", "--size", size, "--experiment-folder", loc_folder] + dev
    loc_parts = tuple((f"seed{s}", loc + ["--only-seeds", str(s)]) for s in loc_seeds)
    parts = os.path.join(runs, "parts")
    cached_runs = os.path.join(runs, "xml_cached")
    xc = [PY, "benchmarks/xml_cached.py", "--runs", cached_runs] + dev
    xc += ["--splits", "4"] if size == "quick" else []  # the probe on 3.5k Open Clip Art test images: minutes a split
    shards = tuple((f"rank{r}", xc + ["--part", "cache", "--rank", str(r), "--world-size", "2"]) for r in (0, 1))
    threads = [PY, "benchmarks/thread_sensitivity.py"]
    tbc_runs = os.path.join(runs, "template_block_cached")
    tbc = [PY, "benchmarks/template_block_cached.py", "--size", "quick" if size == "quick" else "medium"]
    tbc += ["--runs", tbc_runs] + dev
    tbc_tasks = ("classification",) if size == "quick" else ("classification", "dml")
    tbc_cache = [tbc + ["--part", "cache", "--task", t] for t in tbc_tasks]
    tbc_train = [
        (f"{t}_shard{i}", tbc + ["--part", "train", "--task", t, "--shard", f"{i}/2"])
        for t in tbc_tasks
        for i in (0, 1)
    ]
    tbc_gather = [tbc + ["--part", "gather", "--task", t] for t in tbc_tasks]
    plan = [
        Step(
            "resolution_distillation",
            [
                PY,
                "benchmarks/resolution_distillation.py",
                "--size",
                size,
                "--experiment-folder",
                os.path.join(runs, "resolution_distillation"),
            ]
            + dev,
            ["resolution_distillation"],
            fresh=(os.path.join(runs, "resolution_distillation"),),
        ),
        Step(
            "resolution_distillation_off_floor",
            [PY, "benchmarks/resolution_distillation.py", "--size", "off_floor", "--experiment-folder", raml_off] + dev,
            ["resolution_distillation_off_floor"],
            fresh=(raml_off,),
        ),
        Step(
            "template_block_converged",
            [PY, "benchmarks/template_block.py", "--size", "medium", "--part", "fashion_converged"]
            + ["--experiment-folder", tb_converged, "--out", "benchmarks/results"]
            + dev,
            ["template_block_converged"],
            fresh=(os.path.join(tb_converged, "fashion_converged"),),
        ),
        Step(
            "template_block",
            tb + ["--out", "benchmarks/results"],
            ["template_block"],
            parts=tb_parts,
            fresh=(tb_folder,),
        ),
        Step(
            "localization",
            loc + ["--out", "benchmarks/results"],
            ["localization"],
            parts=loc_parts,
            fresh=(loc_folder,),
        ),
        # issue 24: the feature caches of the XML evidence (2 shard processes; the merge completes / derives), the
        # three cached experiments (20 seeds each, parallel), the main job at 1 thread (the alone xml_vs_gap run
        # below is the other thread count)
        Step("xml_cached_cache", xc + ["--part", "cache"], [], parts=shards, fresh=(cached_runs,)),
        Step(
            "xml_cached",
            xc + ["--merge"],
            ["xml_cached"],
            parts=tuple((p, xc + ["--part", p]) for p in ("clipart_last", "clipart_frozen", "glyphs")),
            needs=("xml_cached_cache",),
        ),
        # issue 31 item 2: XML where its term shapes the features (features.14-18 trained, 10 seeds per dataset;
        # each part trains its config's variants, then probes them; about an hour per part on one core)
        Step(
            "xml_trained",
            xc + ["--merge", "--setting", "trained"],
            ["xml_trained"],
            parts=tuple((p, xc + ["--part", p]) for p in ("clipart_trained", "glyphs_trained")),
        ),
        # issue 24 item 3: the template block on cached MobileNetV2 features (the caches, one process per task;
        # the seeds in two shard processes per task; then each task's results.json and the table)
        Step(
            "template_block_cached_cache",
            tbc_cache[0],
            [],
            parts=tuple((f"cache_{t}", c) for t, c in zip(tbc_tasks[1:], tbc_cache[1:])),
            fresh=(tbc_runs,),
        ),
        Step(
            "template_block_cached",
            tbc_gather[-1] + ["--merge", "--tasks", *tbc_tasks, "--out", "benchmarks/results"],
            ["template_block_cached_quick" if size == "quick" else "template_block_cached"],
            parts=tuple(tbc_train) + tuple((f"gather_{t}", c) for t, c in zip(tbc_tasks[:-1], tbc_gather[:-1])),
            needs=("template_block_cached_cache",),
        ),
        Step(
            "thread_sensitivity_run",
            threads + ["--run", "1", "--out", parts],
            [],
            fresh=(os.path.join(parts, "threads_1"),),
        ),
        Step("xml_signal", [PY, "benchmarks/xml_signal.py", "--size", size] + dev, ["xml_signal"]),
        Step(
            "explain_fidelity",
            [
                PY,
                "benchmarks/explain_fidelity.py",
                "--seeds",
                "0",
                "1",
                "2",
                "3",
                "4",
                "--queries",
                "12",
                "--steps",
                "8",
                "--images",
                "32",
            ]
            + dev,
            ["explain_fidelity"],
        ),
        Step("mlrc_quick", [PY, "benchmarks/mlrc_quick.py"] + dev, ["mlrc_quick"]),
        Step(
            "xml_vs_gap",
            [PY, "-m", "pml_extensions", "job", "--root_experiment_folder", runs, "--new"] + dev,
            ["xml_vs_gap"],
            alone=True,
            fresh=(job_folder,),
        ),
        Step("explain_speed", [PY, "benchmarks/explain_speed.py"] + dev, ["explain_speed"], alone=True),
        Step("xml_overhead", [PY, "benchmarks/xml_overhead.py"] + dev, ["xml_overhead"], alone=True),
        Step(
            "distill_memory",
            [PY, "benchmarks/distill_memory.py", "--repeats", "3"] + dev,
            ["distill_memory_" + device],
            alone=True,
        ),
        Step(
            "raml_teacher_cache",  # the CPU Table 2 size and the paper's 448 / 160 px (both: under a minute)
            [PY, "benchmarks/raml_teacher_cache.py", "--settings", "quick", "paper"] + dev,
            ["raml_teacher_cache"],
            alone=True,
        ),
        Step(
            "accuracy_scale",
            [PY, "benchmarks/accuracy_scale.py"] + dev,
            ["accuracy_scale" + ("_cuda" if device == "cuda" else "")],
            alone=True,
        ),
        Step(
            "xml_generalization",
            [
                PY,
                "benchmarks/xml_generalization.py",
                "--run-folder",
                job_folder,
                "--splits",
                "200" if size == "quick" else "1000",
            ]
            + dev,
            ["xml_generalization"],
            needs=("xml_vs_gap",),
        ),
        Step(
            "thread_sensitivity",
            threads + ["--compare", os.path.join(parts, "threads_1", "xml_glyphs"), job_folder],
            ["thread_sensitivity"],
            needs=("xml_vs_gap", "thread_sensitivity_run"),
        ),
    ]
    return [s for s in plan if not (size == "quick" and s.name in FULL_ONLY)]


class Process(NamedTuple):
    name: str  # the step's name, or STEP.PART
    argv: List[str]
    alone: bool
    needs: Tuple  # process names that must have succeeded first


def processes(plan: List[Step]) -> List[Process]:
    """Expand the steps into processes in start order: parts before their merge."""
    out = []
    for s in plan:
        part_names = tuple(f"{s.name}.{p}" for p, _ in s.parts)
        out += [Process(n, argv, False, s.needs) for n, (_, argv) in zip(part_names, s.parts)]
        out.append(Process(s.name, s.argv, s.alone, s.needs + part_names))
    return out


def copy_job_results(runs: str) -> None:
    """``<runs>/xml_glyphs/results.json`` -> ``benchmarks/results/xml_vs_gap.json``, and its table (the job's
    ``results.md`` with the paper's claim beside it) by ``benchmarks/xml_vs_gap.py``.

    Raises:
        RuntimeError: when the renderer fails (its output in the message).
    """
    cmd = [PY, os.path.join(ROOT, "benchmarks", "xml_vs_gap.py"), "--run-folder", os.path.join(runs, "xml_glyphs")]
    proc = subprocess.run(cmd + ["--out", RESULTS], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmarks/xml_vs_gap.py failed: {(proc.stdout + proc.stderr)[-600:]}")


def show(argv: List[str]) -> str:
    return " ".join("python" if a == PY else a for a in argv)


def run_plan(procs: List[Process], runs: str, jobs: int, write=None) -> Tuple[dict, list, list]:
    """Run ``procs``: an ``alone`` process starts when nothing runs and nothing starts beside it; the others run
    ``jobs`` at a time with one torch thread each, in list order, each once its ``needs`` have succeeded.
    Returns (seconds per process, failed names, skipped names)."""
    from tqdm import tqdm

    # no progress bars inside the logs (tqdm honours TQDM_DISABLE); the call's own bar counts the processes
    base_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TQDM_DISABLE="1")
    single = dict(base_env, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    pending, running, seconds, failed, skipped = list(procs), {}, {}, [], []
    shown = None
    bar = tqdm(total=len(procs), desc="reproduce", unit="process")
    write = write or bar.write
    while pending or running:
        for p in list(pending):  # a process whose prerequisite failed is skipped
            if any(n in failed or n in skipped for n in p.needs):
                pending.remove(p)
                skipped.append(p.name)
                bar.update(1)
                write(f"{p.name}: skipped ({', '.join(n for n in p.needs if n in failed or n in skipped)} failed)")
        for p in list(pending):
            if running and (p.alone or any(q.alone for q, _, _ in running.values())):
                break
            if len(running) >= jobs or any(n not in seconds for n in p.needs):
                if p.alone:
                    break
                continue
            log_path = os.path.join(ROOT, runs, f"{p.name}.log")
            log = open(log_path, "w", encoding="utf-8")
            proc = subprocess.Popen(
                p.argv, cwd=ROOT, env=base_env if p.alone else single, stdout=log, stderr=subprocess.STDOUT
            )
            running[proc.pid] = (p, proc, (log, log_path, time.time()))
            pending.remove(p)
            if p.alone:
                break
        names = ", ".join(p.name for p, _, _ in running.values())
        if names != shown:  # redraw only on a change (a disabled bar has no postfix to compare with)
            bar.set_postfix_str(names)
            shown = names
        time.sleep(0.5)
        for pid, (p, proc, (log, log_path, start)) in list(running.items()):
            rc = proc.poll()
            if rc is None:
                continue
            log.close()
            del running[pid]
            bar.update(1)
            if rc == 0 and p.name == "xml_vs_gap":
                copy_job_results(os.path.join(ROOT, runs))
            if rc != 0:
                failed.append(p.name)
                with open(log_path, encoding="utf-8", errors="replace") as f:
                    tail = f.read()[-1500:]
                write(f"{p.name} failed (exit {rc}); end of {log_path}:\n{tail}")
            else:
                seconds[p.name] = time.time() - start
                write(f"{p.name}: done in {seconds[p.name]:.0f} s")
    bar.close()
    return seconds, failed, skipped


#: the keys whose numbers are per seed in every results file: a seed's metrics, a comparison's per-seed differences
PER_SEED_KEYS = ("per_seed", "differences")


def per_seed_numbers(tree, path=(), inside=False) -> dict:
    """``{path: number}`` of every number of a results file that belongs to one seed: the leaves below a
    :data:`PER_SEED_KEYS` key (paths of list items carry their index).

    Example::

        >>> per_seed_numbers({"a": {"per_seed": {"0": {"m": 1.5}}}, "c": [{"differences": [0.1, 0.2]}], "n": 3})
        {('a', 'per_seed', '0', 'm'): 1.5, ('c', 0, 'differences', 0): 0.1, ('c', 0, 'differences', 1): 0.2}
    """
    if isinstance(tree, bool):
        return {}
    if isinstance(tree, (int, float)):
        return {path: float(tree)} if inside else {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    out = {}
    for k, v in items:
        out.update(per_seed_numbers(v, path + (k,), inside or k in PER_SEED_KEYS))
    return out


def rerun_line(old: dict, new: dict) -> dict:
    """How a rerun's per-seed numbers compare with the committed file's: ``{"compared", "identical",
    "largest_difference"}`` over the numbers both have (:func:`per_seed_numbers`); ``largest_difference`` is 0.0 when
    every one is bit-identical, None when none is shared.

    Example::

        >>> rerun_line({"per_seed": {"0": 0.5, "1": 0.25}}, {"per_seed": {"0": 0.5, "1": 0.5, "2": 1.0}})
        {'compared': 2, 'identical': 1, 'largest_difference': 0.25}
    """
    a, b = per_seed_numbers(old), per_seed_numbers(new)
    shared = [k for k in a if k in b]
    diffs = [abs(a[k] - b[k]) for k in shared]
    return {
        "compared": len(shared),
        "identical": sum(a[k] == b[k] for k in shared),
        "largest_difference": max(diffs) if diffs else None,
    }


def committed_results(plan) -> dict:
    """``{results file name: its JSON}`` of the plan's steps as they are before the call (what a rerun is compared
    with); files that are missing or unreadable are left out."""
    import json

    out = {}
    for name in (r for s in plan for r in s.results):
        try:
            with open(os.path.join(RESULTS, name + ".json"), encoding="utf-8") as f:
                out[name] = json.load(f)
        except (OSError, ValueError):
            continue
    return out


def rerun_comparison(before: dict) -> dict:
    """:func:`rerun_line` of every results file of ``before`` against its rewritten version."""
    import json

    out = {}
    for name, old in before.items():
        try:
            with open(os.path.join(RESULTS, name + ".json"), encoding="utf-8") as f:
                out[name] = rerun_line(old, json.load(f))
        except (OSError, ValueError):
            continue
    return out


def write_record(args, plan, wall, seconds, failed, skipped, reruns=None) -> None:
    """``benchmarks/results/reproduce_<size>_<device>.{json,md}``: the call's wall time and every process's."""
    from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

    name = f"reproduce_{args.size}_{args.device}"
    record = {
        "size": args.size,
        "device": args.device,
        "jobs": args.jobs,
        "cpu_count": os.cpu_count(),
        "steps": [s.name for s in plan],
        "wall_seconds": wall,
        "process_seconds": seconds,
        "failed": failed,
        "skipped": skipped,
        "reruns": reruns or {},
    }
    atomic_write_json(os.path.join(RESULTS, name + ".json"), record, indent=1)
    status = (
        "every process succeeded"
        if not failed and not skipped
        else f"failed: {', '.join(failed) or '-'}; skipped: {', '.join(skipped) or '-'}"
    )
    lines = [
        f"`python benchmarks/reproduce.py --size {args.size} --device {args.device}`: **{wall / 60:.1f} min** "
        f"wall on {os.cpu_count()} CPU cores ({args.jobs} single-thread processes at once), {status}.",
        "",
        "| process | minutes |",
        "|---|---|",
    ]
    lines += [f"| {n} | {t / 60:.1f} |" for n, t in seconds.items()]
    if reruns:
        lines += [
            "",
            "Per-seed numbers against the files committed before the call (a difference is the machine, or code or "
            "settings changed since that file was written: `git log -- benchmarks/results/NAME.json` tells which):",
            "",
        ]
        lines += ["| results file | per-seed numbers compared | bit-identical | largest difference |"]
        lines += ["|---|---|---|---|"]
        for n, r in reruns.items():
            d = "–" if r["largest_difference"] is None else f"{r['largest_difference']:.3g}"
            lines.append(f"| {n} | {r['compared']} | {r['identical']} of {r['compared']} | {d} |")
    atomic_write_text(os.path.join(RESULTS, name + ".md"), "\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("quick", "full"), default="quick")
    p.add_argument("--device", default="cpu", help="cpu (quick) or cuda (full)")
    p.add_argument("--only", nargs="+", help="run only these steps")
    p.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="single-thread processes run at once (default: the CPU count)",
    )
    p.add_argument("--list", action="store_true", help="print the processes and their commands, run nothing")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    runs = os.path.join("runs", "reproduce", args.size)
    plan = steps(args.size, args.device, runs)
    names = [s.name for s in plan]
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            p.error(f"--only: unknown steps {unknown}; steps are {names}")
        plan = [s._replace(needs=tuple(n for n in s.needs if n in args.only)) for s in plan if s.name in args.only]
    procs = processes(plan)
    if args.list:
        for q in procs:
            print(f"{q.name}: {show(q.argv)}" + ("  [alone, every core]" if q.alone else "  [1 thread]"))
        return 0
    for folder in (f for s in plan for f in s.fresh):
        shutil.rmtree(os.path.join(ROOT, folder), ignore_errors=True)
    os.makedirs(os.path.join(ROOT, runs), exist_ok=True)
    os.makedirs(RESULTS, exist_ok=True)
    before = committed_results(plan)
    t0 = time.time()
    seconds, failed, skipped = run_plan(procs, runs, args.jobs)
    wall = time.time() - t0
    reruns = rerun_comparison(before)
    for name, r in reruns.items():
        d = "none shared" if r["largest_difference"] is None else f"largest difference {r['largest_difference']:.3g}"
        print(f"{name}: {r['identical']} of {r['compared']} per-seed numbers bit-identical to the last file, {d}")
    if not args.only:  # the record of a whole call (a README block); a partial call leaves it alone
        write_record(args, plan, wall, seconds, failed, skipped, reruns)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if subprocess.call([PY, os.path.join("benchmarks", "readme_tables.py")], cwd=ROOT, env=env) != 0:
        failed.append("readme_tables")
    print(
        f"reproduce ({args.size}): {len(procs) - len(failed) - len(skipped)} of {len(procs)} processes done in "
        f"{wall / 60:.1f} min"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + (f"; skipped: {', '.join(skipped)}" if skipped else "")
        + ", README tables updated"
    )
    return 1 if failed or skipped else 0


if __name__ == "__main__":
    sys.exit(main())
