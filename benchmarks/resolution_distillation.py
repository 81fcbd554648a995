"""RAML job: teacher (ImageNet MobileNetV2, briefly fine-tuned at the database resolution), students distilled at
smaller query resolutions on Open Clip Art (40 classes, unseen-class test) and the glyph set; the four setups ×
resolutions with MAP@R, mAP (PML and trapezoidal), R@1 and query FLOPs (mean ± std of 3 seeds), and a PNG of
performance against query FLOPs (paper's Fig. 4).

    python benchmarks/resolution_distillation.py                 # --quick (CPU, minutes)
    python benchmarks/resolution_distillation.py --gpu           # larger config (448 px database, P = 8)
    python benchmarks/resolution_distillation.py --config my.json  # any config (keys of QUICK_CONFIG)
    python benchmarks/resolution_distillation.py --datasets glyphs --seeds 0

Writes benchmarks/results/resolution_distillation{_gpu}.{json,md,png}.
"""

import argparse
import copy
import json
import os

from pml_extensions.utils.atomic_io import atomic_write_text
from pml_extensions.utils.resolution_job import (
    GPU_CONFIG,
    QUICK_CONFIG,
    markdown_table,
    plot_performance_vs_flops,
    run_resolution_job,
    save_json,
    summarize,
)

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the CPU config (default)")
    p.add_argument("--gpu", action="store_true", help="the larger GPU config")
    p.add_argument("--config", help="JSON file with a full config (see QUICK_CONFIG)")
    p.add_argument("--datasets", nargs="+", help="subset of the config's datasets")
    p.add_argument("--seeds", nargs="+", type=int, help="override the seeds")
    p.add_argument("--student-iterations", type=int)
    p.add_argument("--teacher-iterations", type=int)
    p.add_argument("--tag", default=None, help="suffix of the result files")
    args = p.parse_args(argv)
    if args.config:
        with open(args.config) as f:
            cfg = json.load(f)
    else:
        cfg = copy.deepcopy(GPU_CONFIG if args.gpu else QUICK_CONFIG)
    if args.datasets:
        unknown = [d for d in args.datasets if d not in cfg["datasets"]]
        if unknown:
            p.error(f"unknown datasets {unknown}; config has {list(cfg['datasets'])}")
        cfg["datasets"] = {d: cfg["datasets"][d] for d in args.datasets}
    if args.seeds:
        cfg["seeds"] = args.seeds
    if args.student_iterations is not None:
        cfg["student_iterations"] = args.student_iterations
    if args.teacher_iterations is not None:
        cfg["teacher_iterations"] = args.teacher_iterations
    result = run_resolution_job(cfg)
    summary = summarize(result["rows"])
    table = markdown_table(summary)
    print(table)
    print(f"\n{result['seconds']:.0f} s")
    tag = args.tag or ("gpu" if args.gpu else "quick")
    base = os.path.join(RESULTS, f"resolution_distillation_{tag}")
    save_json(
        {"config": cfg, "rows": result["rows"], "summary": summary, "seconds": result["seconds"]},
        base + ".json",
    )
    atomic_write_text(base + ".md", table + "\n")
    plot_performance_vs_flops(summary, base + ".png")
    print(f"wrote {base}.json/.md/.png")


if __name__ == "__main__":
    main()
