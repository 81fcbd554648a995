"""RAML (Suma & Tolias, WACV 2023) paper Tables 2-4 and the asymmetric-vs-iterations curve: a thin caller of the
runner's ``resolution_distillation`` protocol with the shipped config.

    python benchmarks/resolution_distillation.py --size quick             # CPU, glyphs, 3 seeds (~15-30 min, 2 cores)
    python benchmarks/resolution_distillation.py --size full --device cuda
    python benchmarks/resolution_distillation.py --size quick --seeds 0 1 2 3 4

The same run as ``python -m pml_extensions run resolution_distillation --variant quick`` (``--size full``: no
variant); the experiment folder (default ``experiments/resolution_distillation_<size>``) resumes after a kill.
Writes ``benchmarks/results/resolution_distillation{,_full}.json`` (the protocol's results.json) and ``.md`` (the
paper-layout tables and, beside each of the paper's claims, what this run measured).
"""

import argparse
import os
import sys

from pml_extensions.runner.config.loader import find_config, load_config
from pml_extensions.runner.protocols import run_protocol
from pml_extensions.runner.protocols.resolution_distillation.tables import PRIMARY, markdown_tables, variant_name
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _delta(results, variant, baseline):
    for c in results["comparisons"]:
        if c["variant"] == variant and c["baseline"] == baseline and c["metric"] == PRIMARY:
            return c
    return None


def _verdict(c, want):
    """``want``: "above" (the paper says the variant is better) or "below" (the paper says it is worse)."""
    if c is None or c["ci95"] is None:
        return "undecided (fewer than 2 seeds)"
    lo, hi = c["ci95"]
    good = lo > 0 if want == "above" else hi < 0
    bad = hi < 0 if want == "above" else lo > 0
    same_sign = c["mean_difference"] > 0 if want == "above" else c["mean_difference"] < 0
    if good:
        return "reproduces"
    if bad:
        return "does not reproduce (significantly the other way)"
    return "same direction, not significant" if same_sign else "does not reproduce (other direction, not significant)"


def _say(c):
    if c is None:
        return "not measured"
    ci = c["ci95"]
    text = f"{100 * c['mean_difference']:+.2f} MAP@R points"
    if ci is None:
        return text + " (1 seed, no CI)"
    sign = "CI excludes 0" if ci[0] > 0 or ci[1] < 0 else "CI includes 0"
    return text + f" (95 % CI [{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}], {sign})"


_NO_GAP = "no significant gap (the CI includes 0, which does not show that the gap is small)"


def claims(results) -> str:
    """The paper's claims, each with this run's paired difference (generated, never typed)."""
    rows = results["rows"]
    lines = ["**The paper's claims at our scale** (paired differences of MAP@R over seeds):", ""]
    for dataset in sorted({r["dataset"] for r in rows}):
        db = max(r["database_resolution"] for r in rows if r["dataset"] == dataset)
        qs = sorted({r["query_resolution"] for r in rows if r["dataset"] == dataset and r["query_resolution"] != db})
        for q in qs:
            asym = variant_name(dataset, q, "teacher_student_asymmetric")
            naive = _delta(results, asym, variant_name(dataset, q, "teacher_asymmetric"))
            low = _delta(results, asym, variant_name(dataset, q, "low_resolution_teacher_symmetric"))
            sym = _delta(results, asym, variant_name(dataset, q, "student_symmetric"))
            close = sym is not None and sym["ci95"] is not None and sym["ci95"][0] <= 0 <= sym["ci95"][1]
            lines.append(
                f"- {dataset}, {q} px queries against the {db} px database. Paper: distilled asymmetric retrieval "
                f"beats the teacher on small queries (naive asymmetric) and the model trained at the small resolution, "
                f"and comes close to symmetric retrieval. Ours: vs naive asymmetric "
                f"{_say(naive)}: **{_verdict(naive, 'above')}**; vs low-resolution teacher {_say(low)}: "
                f"**{_verdict(low, 'above')}**; vs the student's own symmetric {_say(sym)}: "
                f"**{_NO_GAP if close else 'does not reproduce (asymmetric stays below)'}**."
            )
        ablated = sorted(
            {
                (r["query_resolution"], r["student_variant"])
                for r in rows
                if r["dataset"] == dataset and r.get("student_variant") not in (None, "full")
            }
        )
        if ablated:
            q = ablated[0][0]
            full = variant_name(dataset, q, "teacher_student_asymmetric")
            parts = []
            for _, v in ablated:
                c = _delta(results, variant_name(dataset, q, "teacher_student_asymmetric", v), full)
                parts.append(f"{v} {_say(c)}: **{_verdict(c, 'below')}**")
            lines.append(
                f"- {dataset}, Tables 3-4 at {q} px. Paper: every loss term and augmentation group helps, the "
                f"combination is best, L_abs alone is strong, initialising from the teacher beats ImageNet and the "
                f"low-resolution teacher. Ours (variant − full student, asymmetric): " + "; ".join(parts) + "."
            )
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=("quick", "full"), default="quick")
    p.add_argument("--quick", action="store_true", help="same as --size quick (the default)")
    p.add_argument("--seeds", nargs="+", type=int, help="override the config's seeds")
    p.add_argument("--device", help="override the config's device (e.g. cpu, cuda)")
    p.add_argument("--experiment-folder", help="default experiments/resolution_distillation_<size>")
    p.add_argument("--resume-anyway", action="store_true", help="continue a folder whose saved config differs")
    p.add_argument("--render-only", action="store_true", help="rewrite the .md from the saved results JSON, no run")
    args = p.parse_args(argv)
    name = "resolution_distillation" if args.size == "quick" else "resolution_distillation_full"
    if args.render_only:
        import json

        with open(os.path.join(RESULTS, name + ".json"), encoding="utf-8") as f:
            results = json.load(f)
        return _write_md(results, name, results["command"].split())
    selection = {"config_general": ["default", "quick"] if args.size == "quick" else ["default"]}
    config, sources = load_config(find_config("resolution_distillation"), selection, {})
    if args.seeds:
        config["seeds"] = list(args.seeds)
    if args.device:
        config["device"] = args.device
    folder = args.experiment_folder or os.path.join("experiments", f"resolution_distillation_{args.size}")
    command = [os.path.basename(sys.executable), "benchmarks/resolution_distillation.py"] + list(
        sys.argv[1:] if argv is None else argv
    )
    results = run_protocol(
        config, folder, sources, on_change="resume" if args.resume_anyway else "stop", command=command
    )
    results = dict(results, command=" ".join(command))
    atomic_write_json(os.path.join(RESULTS, name + ".json"), results, indent=1)
    _write_md(results, name, command)
    print(f"experiment folder {folder}")


def _write_md(results, name, command):
    text = markdown_tables(results) + "\n" + claims(results)
    text += f"\nCommand: `{' '.join(command)}`; {results['seconds'] / 60:.1f} min wall for this call.\n"
    atomic_write_text(os.path.join(RESULTS, name + ".md"), text)
    print(text)
    print(f"wrote {os.path.join(RESULTS, name)}.json/.md")


if __name__ == "__main__":
    main()
