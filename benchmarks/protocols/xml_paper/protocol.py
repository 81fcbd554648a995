"""The XML paper's experiment (Gurbuz & Alatan, ICIP 2023) as a plugin of the ``paired`` protocol: the same units,
plus what the paper reads from them — the ``xml_loss`` each XML variant logged (first and last iterations, spread),
the prototype histograms per unseen class (``prototype_usage.png``, the paper's Fig. 4) — and the paper's claim
beside the comparisons (``protocol: benchmarks.protocols.xml_paper``)."""

import csv
import glob
import os
from typing import Any, Dict, Optional

import numpy as np

from pml_extensions.runner.protocols.paired import Paired
from pml_extensions.runner.protocols.paired.unit import load_models


def xml_weight(cfg: Dict[str, Any]) -> Optional[float]:
    """The XMLWrapper's ``xml_weight`` in a variant's ``loss_funcs`` (``None`` without an XMLWrapper; the wrapper's
    default is read from the class, never copied)."""
    import inspect

    from pml_extensions.losses import XMLWrapper

    default = inspect.signature(XMLWrapper).parameters["xml_weight"].default
    for spec in (cfg.get("loss_funcs") or {}).values():
        if isinstance(spec, dict) and "XMLWrapper" in spec:
            return float((spec["XMLWrapper"] or {}).get("xml_weight", default))
    return None


def xml_loss_curve(stage: str, window: int = 10) -> Optional[Dict[str, float]]:
    """Summary of a unit's logged ``xml_loss`` (record-keeper CSV of its XMLWrapper): the mean of the first and the
    last ``window`` iterations (at most half the run each) and the std over all iterations; ``None`` without a log."""
    files = [
        f for f in glob.glob(os.path.join(stage, "logs", "*XMLWrapper.csv")) if "_modules" not in os.path.basename(f)
    ]
    if not files:
        return None
    with open(files[0], newline="", encoding="utf-8") as f:
        values = [float(r["xml_loss"]) for r in csv.DictReader(f) if r.get("xml_loss") not in (None, "")]
    if not values:
        return None
    w = max(1, min(window, len(values) // 2))
    return {
        "first": float(np.mean(values[:w])),
        "last": float(np.mean(values[-w:])),
        "window": w,
        "std": float(np.std(values)),
        "iterations": len(values),
    }


class XMLPaper(Paired):
    """``paired`` with the XML paper's readings (module docstring)."""

    name = "benchmarks.protocols.xml_paper"
    description = "the XML paper's experiment: paired variants, xml_loss summaries, prototype histograms"

    def extra_results(self, units):
        out = super().extra_results(units)
        out["xml_loss_curves"] = {
            n: {str(s): xml_loss_curve(self.unit_folder(n, s)) for s in self.settings.seeds}
            for n in self.variant_configs
            if (xml_weight(self.variant_configs[n]) or 0) > 0
        }
        return out

    def footer(self, results):
        lines = []
        for n, per in (results.get("xml_loss_curves") or {}).items():
            ok = [c for c in per.values() if c]
            if ok:
                lines.append(
                    f"- `xml_loss` of {n} (logged every iteration, mean over seeds): first {ok[0]['window']} "
                    f"iterations {np.mean([c['first'] for c in ok]):.3f}, last {ok[0]['window']} "
                    f"{np.mean([c['last'] for c in ok]):.3f}, std over iterations {np.mean([c['std'] for c in ok]):.3f}"
                )
        if not lines:
            return ""
        return "The XML term (contrastive: 2.00 is its value when all cross-batch predictions coincide):\n" + "\n".join(
            lines
        )

    def plots(self, units, seed):
        from .plots import save_prototype_usage

        num_prototypes, rows = 64, []
        for name, cfg in self.variant_configs.items():
            trunk = cfg["models"]["trunk"]
            for spec in (trunk.get("Sequential") or []) if isinstance(trunk, dict) else []:
                if isinstance(spec, dict) and "HistogramPooling" in spec:
                    num_prototypes = int((spec["HistogramPooling"] or {}).get("num_prototypes", 64))
            rows.append((name, cfg, units[name], load_models(cfg, self.unit_folder(name, seed), self.device)))
        save_prototype_usage(rows, self.folder, self.device, seed, num_prototypes)


PROTOCOL = XMLPaper
