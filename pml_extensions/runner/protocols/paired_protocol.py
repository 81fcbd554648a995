"""The engine of every seeds × variants experiment: :class:`PairedProtocol` (docs/runner.md, "Protocols" and
"Writing a protocol")."""

import dataclasses
import itertools
import os
import shutil
import time
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple

from ..config.loader import source_of
from ..errors import ConfigError
from .base import Protocol, read_settings, seed_list, setting

UNTRAINED = "untrained"
SELECTIONS = ("best_epoch", "mean_validation_curve", "last")


@dataclasses.dataclass
class GridSettings:
    """The experiment-level keys of every paired protocol (a subclass's ``Settings`` adds the unit's)."""

    seeds: List[int] = setting([0, 1, 2], "The paired seeds every variant is trained with; `--seeds 0 1 2`.", "seeds")
    variants: Dict[str, Any] = setting(
        {},
        "`{name: {overrides}}`: each entry merged over the config (markers allowed), trained at every seed.",
        "mapping",
    )
    comparisons: List[Tuple[str, str]] = setting(
        [], "`[[variant, baseline], ...]`: paired per-seed differences of the primary metric.", "name_pairs"
    )
    selection: str = setting(
        "best_epoch",
        "How the tested epoch is chosen: `best_epoch`, `mean_validation_curve` (one epoch per group of compared "
        "variants) or `last`.",
        "choice",
        choices=SELECTIONS,
    )
    untrained: bool = setting(False, "`true` adds the row `untrained`: the first variant's epoch-0 model.", "bool")
    seed: Optional[int] = setting(None, "One seed instead of `seeds` (`seed: 3` is `seeds: [3]`).", "int", minimum=0)
    device: str = setting("auto", "`auto` (CUDA when present), `cpu`, `cuda` or `cuda:N`.", "str")
    experiment_name: Optional[str] = setting(None, "Names the experiment folder (`--experiment_name` wins).", "str")


GRID_KEYS = tuple(f.name for f in dataclasses.fields(GridSettings)) + ("protocol",)


class PairedProtocol(Protocol):
    """Base of the protocols that train variants with paired seeds and compare them: each entry of ``variants`` is
    merged over the config and trained once per seed (a *unit*, :meth:`unit`), tested at the selected epoch
    (:meth:`test`); every unit's ``<variant>/seed_<s>/result.json`` makes a rerun resume.

    Attributes:
        variant_configs: variant name -> its merged config; variant_settings: -> its ``Settings``.
        keep_epochs: the unit must keep every validated epoch's weights (:meth:`epoch_path`) for a later test.
    """

    Settings: ClassVar[type] = GridSettings
    #: the metrics of the test rows, the primary (compared) first
    metrics: ClassVar[Tuple[str, ...]] = ("mean_average_precision_at_r",)
    decimals: int = 4  # of the tables in results.md

    @property
    def selection_metric(self) -> str:
        """The key of the units' validation ``history`` that selects epochs (default: the primary metric)."""
        return self.metrics[0]

    def __init__(self, config, folder, sources=None, log=print):
        from ..experiment.folder import Experiment

        super().__init__(config, folder, sources, log)
        s = self.settings
        self.exp = Experiment(folder, {"device": s.device, "seed": None}, self.sources, log)
        self.device, self.log = self.exp.device, self.exp.log
        self.variant_configs, self.variant_settings, self.variant_sources = self.variants(config, self.sources)
        for key in [k for k, v in self.sources.items() if v == "command line" and k != "variants"]:
            mine = [n for n, where in self.variant_sources.items() if where[key] != "command line"]
            if mine:  # a command-line flag that does not reach some variants is not lost without a word
                self.log(
                    f"note: --{key} (command line) does not reach variant(s) {', '.join(mine)}: they set their own "
                    f"{key} ({self.sources.get('variants', 'config')}); change it there or run other --variants"
                )
        self.keep_epochs = s.selection != "best_epoch" or s.untrained
        self.left_out: Dict[str, str] = {}  # {path: reason} of the files skip_bad_images left out (preflight)
        self.checked_data: List[Any] = []  # the datasets whose image files preflight decoded
        self.class_roles: Dict[str, list] = {}  # {"train"|"validation"|"test": class names} (preflight)

    @classmethod
    def variants(cls, config: Dict[str, Any], sources: Optional[Dict[str, str]] = None):
        """``(configs, settings, sources)`` per variant name: each entry of ``variants`` merged over the config
        (without the grid keys), read with ``Settings``; an error names ``<file> (variants.<name>)``."""
        from ..config.loader import variant_configs

        sources, updates = sources if sources is not None else {}, config.get("variants") or {}
        base = {k: v for k, v in config.items() if k not in GRID_KEYS}
        configs = variant_configs({**base, "variants": updates}, where=sources.get("variants", "config"))
        here = {n: f"{sources.get('variants', 'config')} (variants.{n})" for n in configs}
        where = {n: {**sources, **{str(k).split("~")[0]: here[n] for k in updates.get(n) or {}}} for n in configs}
        settings = {n: read_settings(cls.Settings, {**config, **cfg}, where[n]) for n, cfg in configs.items()}
        return configs, settings, where

    @classmethod
    def normalize(cls, config, sources, log=None):
        """``--seeds 0 1`` (``"0 1"``) becomes the list it means, so the saved ``config.yaml`` holds ``[0, 1]``."""
        if isinstance(config.get("seeds"), str):
            return {**config, "seeds": seed_list(config["seeds"], f"{source_of(sources, 'seeds')}: seeds")}
        return config

    @classmethod
    def read(cls, config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> GridSettings:
        """The experiment-level settings (:class:`GridSettings`; a ConfigError also for ``seed`` and ``seeds``)."""
        grid = read_settings(GridSettings, config, sources)
        if grid.seed is not None:
            if config.get("seeds") is not None:
                raise ConfigError(
                    f"{source_of(sources, 'seed')}: seed: {grid.seed!r} and seeds: {config['seeds']!r} both "
                    "given; keep one (seeds: [...] runs every seed)"
                )
            grid.seeds = [grid.seed]
        return grid

    @classmethod
    def keys(cls) -> Tuple[str, ...]:
        return tuple(dict.fromkeys(GRID_KEYS + super().keys()))

    @classmethod
    def check(cls, config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> GridSettings:
        """The grid (seeds, comparisons naming variants, ``untrained``), every variant's settings, then
        :meth:`check_variants` on the variants' configs (built once)."""
        grid = super().check(config, sources)
        configs, _, where = cls.variants(config, sources)
        names = set(configs) | ({UNTRAINED} if grid.untrained else set())
        if grid.untrained and UNTRAINED in configs:
            raise ConfigError(
                f"{source_of(sources, 'variants')}: variants: {UNTRAINED!r} is the name of "
                "the untrained row (untrained: true); rename it"
            )
        for pair in grid.comparisons:
            if not all(p in names for p in pair):
                raise ConfigError(
                    f"{source_of(sources, 'comparisons')}: comparisons: {list(pair)} names an unknown "
                    f"variant; choose from {', '.join(sorted(names))}"
                )
        cls.check_variants(configs, where)
        return grid

    @classmethod
    def check_variants(cls, configs: Dict[str, Dict[str, Any]], where: Dict[str, Dict[str, str]]) -> None:
        """A subclass's checks of the variants' merged configs (:meth:`variants`: ``where`` is each one's sources);
        default: none."""

    @classmethod
    def objective(cls, results: Dict[str, Any], config: Dict[str, Any]) -> float:
        """The primary metric on the validation classes at each unit's tested epoch, averaged over the units."""
        values = []
        for per_seed in (results.get("units") or {}).values():
            for unit in per_seed.values():
                epoch = unit.get("selected_epoch", unit.get("best_epoch"))
                values += [h[cls.metrics[0]] for h in unit.get("history", []) if h.get("epoch") == epoch]
        if not values:
            raise ConfigError(f"bayes_opt_iters: the {cls.name} run reports no validation {cls.metrics[0]}")
        return float(sum(values) / len(values))

    def unit(self, settings, variant: str, seed: int, folder: str, builder) -> Dict[str, Any]:
        """Train ``variant`` at ``seed`` in ``folder`` (resuming from its checkpoint), validating every epoch; returns
        a JSON-able summary: ``history`` (``[{"epoch": e, <metric>: value}]`` on the validation classes, epoch 0 the
        untrained model), ``best_epoch``, ``train_seconds``, ``test`` (the best epoch's test metrics) when it tested
        right away, and anything else the subclass reports."""
        raise NotImplementedError

    def test(self, settings, variant: str, seed: int, folder: str, builder, epoch: int) -> Dict[str, float]:
        """The test metrics of the unit's weights at ``epoch`` (:meth:`epoch_path`)."""
        raise NotImplementedError

    def examples(self, settings, variant: str, seed: int, folder: str, builder, epoch: int) -> None:
        """Write retrieval examples of the tested model for the report (default: none)."""

    def plots(self, units: Dict[str, Dict[str, Any]], seed: int) -> None:
        """Extra figures (default: none); ``units``: variant -> the unit summary at ``seed``."""

    def header(self, results: Dict[str, Any]) -> str:
        """The text above the tables of ``results.md`` (default: the seeds, selection and environment)."""
        from ..experiment.folder import environment_summary

        text = (
            f"Seeds {', '.join(map(str, results['seeds']))} (paired: same initial weights for shared modules and same "
            f"batches within a seed), device {results['device']}; tested epoch: {results['selection']['mode']}. Test "
            "metrics; differences are paired by seed."
        )
        if results.get("environment"):
            text += f" Environment: {environment_summary(results['environment'])}."
        return text

    def footer(self, results: Dict[str, Any]) -> str:
        """The text below the tables of ``results.md`` (default: none)."""
        return ""

    def extra_results(self, units: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
        """Keys the subclass adds to ``results.json`` (default: none)."""
        return {}

    def stage(self, variant: str, seed: int) -> str:
        return f"{variant}/seed_{seed}"

    def unit_folder(self, variant: str, seed: int) -> str:
        return self.exp.stage_folder(self.stage(variant, seed))

    def epoch_path(self, folder: str, epoch: int) -> str:
        """Where a unit keeps the weights of ``epoch`` when :attr:`keep_epochs` (``epochs/epoch_<e>.pth``)."""
        return os.path.join(folder, "epochs", f"epoch_{epoch}.pth")

    def builder(self, variant: str):
        """A :class:`~pml_extensions.runner.objects.builder.Builder` of the variant's config."""
        from ..objects.builder import Builder

        return Builder(self.variant_configs[variant], self.variant_sources[variant], self.device, self.log)

    def unit_result(self, variant: str, seed: int) -> Dict[str, Any]:
        """The unit's saved summary, after training it when it has not finished (resuming its checkpoint)."""
        stage = self.stage(variant, seed)
        done = self.exp.stage_result(stage)
        if done is not None:
            return done
        folder = self.unit_folder(variant, seed)
        result = self.unit(self.variant_settings[variant], variant, seed, folder, self.builder(variant))
        return self.exp.finish_stage(stage, {k: v for k, v in result.items() if k != "models"})

    def run_units(self, variants: Optional[Sequence[str]] = None, seeds: Optional[Sequence[int]] = None):
        """Train (or find finished) the units of ``variants`` × ``seeds`` (default all), seed after seed:
        ``{variant: {seed: summary}}``, no ``results.json``; a ConfigError for a variant or seed the config lacks."""
        from ..experiment.folder import time_estimate

        names = list(self.variant_configs) if variants is None else list(variants)
        chosen = list(self.settings.seeds) if seeds is None else [int(s) for s in seeds]
        unknown = [n for n in names if n not in self.variant_configs]
        unknown += [s for s in chosen if s not in self.settings.seeds]
        if unknown:
            raise ConfigError(f"{self.name}: {unknown} are not variants / seeds of this config")
        grid = [(n, s) for s in chosen for n in names]
        finished = sum(self.exp.stage_result(self.stage(*u)) is not None for u in grid)
        self.log(
            f"{self.name}: {len(names)} variant(s) × {len(chosen)} seed(s) = {len(grid)} units"
            + (f", {finished} finished before" if finished else "")
        )
        out: Dict[str, Dict[int, Any]] = {n: {} for n in names}
        timed: List[float] = []  # the first two trained units: the first may include one-time work (a feature cache)
        for i, (n, s) in enumerate(grid):
            start = time.time()
            # timed: a unit trained from its start here (a process sharing the grid may finish it; a resumed unit
            # from its checkpoint.pth takes part of a unit's time)
            whole = self.exp.stage_result(self.stage(n, s)) is None
            whole = whole and not os.path.exists(os.path.join(self.unit_folder(n, s), "checkpoint.pth"))
            out[n][s] = self.unit_result(n, s)
            if whole and len(timed) < 2:
                timed.append(time.time() - start)
                left = sum(self.exp.stage_result(self.stage(*u)) is None for u in grid[i + 1 :])
                if left and len(timed) == 1:
                    self.log(
                        f"{self.name}: one unit took {'; '.join(time_estimate(timed[0], left))} for the {left} left"
                    )
                elif left and not 0.5 <= timed[1] / max(timed[0], 1e-9) <= 2:
                    took, rest = time_estimate(timed[1], left)
                    self.log(
                        f"{self.name}: the next unit took {took} (the first included one-time work); {rest} for the "
                        f"{left} left"
                    )
        return out

    def groups(self) -> List[List[str]]:
        """The variants linked by ``comparisons`` (connected components, in ``variants`` order)."""
        names = list(self.variant_configs)
        group = {v: {v} for v in names}
        for pair in self.settings.comparisons:
            if UNTRAINED not in pair:
                merged = group[pair[0]] | group[pair[1]]
                group.update({v: merged for v in merged})
        return [list(g) for g in dict.fromkeys(tuple(w for w in names if w in group[v]) for v in names)]

    def chosen_epochs(self, units) -> Dict[str, Any]:
        """``{"epochs": {variant: epoch}, "curves": {first variant of a group: {variants, mean_val, epoch}}}``."""
        primary, epochs, curves = self.selection_metric, {}, {}
        for group in self.groups():
            rows: Dict[int, List[float]] = {}
            for h in (h for name in group for unit in units[name].values() for h in unit["history"]):
                rows.setdefault(int(h["epoch"]), []).append(float(h[primary]))
            curve = {e: sum(v) / len(v) for e, v in sorted(rows.items())}
            trained = {e: v for e, v in curve.items() if e >= 1}
            if self.settings.selection == "last" or not trained:
                chosen = max(curve)
            else:
                chosen = max(trained, key=lambda e: (trained[e], -e))  # ties: the shorter schedule
            epochs.update({name: chosen for name in group})
            curves[group[0]] = {"variants": group, "mean_val": curve, "epoch": chosen}
            if chosen >= 1 and 0 in curve and curve[0] >= curve[chosen]:  # training never beat the untrained model
                curves[group[0]]["untrained_best"] = True
                self.log(
                    f"warning: {', '.join(group)}: the mean validation curve is highest at the untrained model "
                    f"(epoch 0: {curve[0]:.4f}); epoch {chosen} ({curve[chosen]:.4f}) is tested"
                )
        return {"epochs": epochs, "curves": curves}

    def test_at(self, variant: str, seed: int, epoch: int) -> Dict[str, float]:
        """The unit's test metrics at ``epoch`` (saved: ``test_epoch_<e>.json``, weights ``selected_models.pth``)."""
        from ...utils.atomic_io import atomic_write_json
        from ..experiment import distributed as dist_utils
        from ..experiment.folder import read_json

        folder = self.unit_folder(variant, seed)
        out = os.path.join(folder, f"test_epoch_{epoch}.json")
        saved = read_json(out, "the unit is tested again")
        if saved is not None:
            return saved
        weights = self.epoch_path(folder, epoch)
        test = self.test(self.variant_settings[variant], variant, seed, folder, self.builder(variant), epoch)
        if dist_utils.is_main():
            if epoch >= 1 and os.path.exists(weights):
                shutil.copyfile(weights, os.path.join(folder, "selected_models.pth"))
            atomic_write_json(out, test, indent=2)
        return test

    def run(self) -> Dict[str, Any]:
        """Train every unit (resuming), select on validation, test once, compare, write the outputs."""
        from ..experiment import distributed as dist_utils
        from ..experiment.folder import ENVIRONMENT_NAME, read_json, run_environment
        from ..objects import preflight
        from ..outputs.results import summarize, write_results

        start = time.time()
        s, seeds, names = self.settings, self.settings.seeds, list(self.variant_configs)
        if not self.preflown:  # run_protocol ran it before the folder existed
            self.preflight()
        if dist_utils.is_main():
            # now that the folder exists: the files that decoded (a rerun decodes only new ones) and those left out
            for data in self.checked_data:
                preflight.record_checked_images(data, self.folder)
            preflight.write_bad_images(self.left_out, self.folder)
        units = self.run_units()
        per_seed: Dict[str, Dict[int, Dict[str, float]]] = {n: {} for n in names}
        chosen = None if s.selection == "best_epoch" else self.chosen_epochs(units)
        for n, seed in itertools.product(names, seeds):
            unit = units[n][seed]
            if chosen is not None:
                unit["selected_epoch"] = chosen["epochs"][n]
                per_seed[n][seed] = self.test_at(n, seed, unit["selected_epoch"])
                continue
            per_seed[n][seed] = unit.get("test") or self.test_at(n, seed, unit["best_epoch"])
            if unit["best_epoch"] == 0:
                self.log(f"warning: {n} seed {seed}: the best validation epoch is the untrained model (epoch 0)")
        untrained = None
        if s.untrained:
            first = names[0]
            per_seed[UNTRAINED] = {seed: self.test_at(first, seed, 0) for seed in seeds}
            m = self.selection_metric  # the variants' untrained models should agree: their epoch-0 value per seed
            at0 = [[h[m] for n in names for h in units[n][t]["history"] if h["epoch"] == 0] for t in seeds]
            spread = max([max(v) - min(v) for v in at0 if v], default=0.0)
            untrained = {"variant": first, "max_val_spread_at_epoch_0": float(spread)}
        if self.keep_epochs and dist_utils.is_main():  # the tested weights are in selected_models.pth
            for n, seed in itertools.product(names, seeds):
                shutil.rmtree(os.path.join(self.unit_folder(n, seed), "epochs"), ignore_errors=True)
        # the run's first call made the numbers (a resume keeps its file)
        env_path = os.path.join(self.folder, ENVIRONMENT_NAME)
        environment = read_json(env_path, "the environment is recorded again") or run_environment()
        results = summarize(
            {
                n: {seed: {m: v for m, v in row.items() if m in self.metrics} for seed, row in rows.items()}
                for n, rows in per_seed.items()
            },
            comparisons=[tuple(p) for p in s.comparisons],
            metrics=[self.metrics[0]],
            extra={
                "protocol": self.name,
                "seeds": seeds,
                "device": str(self.device),
                "primary_metric": self.metrics[0],
                "units": {
                    n: {str(seed): {k: v for k, v in u.items() if k != "test"} for seed, u in per.items()}
                    for n, per in units.items()
                },
                "selection": {"mode": s.selection, **(chosen or {})},
                "untrained": untrained,
                "environment": environment,
                "seconds_this_invocation": time.time() - start,
                "train_seconds_sum": sum(u.get("train_seconds", 0.0) for per in units.values() for u in per.values()),
                **self.extra_results(units),
            },
        )
        if not dist_utils.is_main():  # under torchrun the main rank writes the files
            return results
        header, footer = self.header(results), self.footer(results)
        write_results(self.folder, results, list(self.metrics), header, footer=footer, decimals=self.decimals)
        first = {n: units[n][seeds[0]] for n in names}
        self.curves(units)
        self.plots(first, seeds[0])
        for n in names:
            epoch = first[n].get("selected_epoch", first[n].get("best_epoch"))
            self.examples(self.variant_settings[n], n, seeds[0], self.unit_folder(n, seeds[0]), self.builder(n), epoch)
        with open(os.path.join(self.folder, "results.md"), encoding="utf-8") as f:
            self.log(f"{self.folder}/results.md:\n\n{f.read()}")
        return results

    def curves(self, units: Dict[str, Dict[int, Dict[str, Any]]]) -> str:
        """``map_at_r.png``: per variant, the mean validation curve over the seeds (band: lowest to highest), the
        tested epoch starred; variants with identical curves are named together (one would hide the other)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
        from matplotlib.ticker import MaxNLocator

        from ...utils.atomic_io import atomic_savefig
        from ...utils.verdicts import METRIC_NAMES

        primary = self.selection_metric
        curves: Dict[str, Tuple[List[int], Any]] = {}  # name -> (epochs every seed has, [epoch, seed] values)
        for name, per_seed in units.items():
            tables = [{h["epoch"]: h[primary] for h in u["history"]} for u in per_seed.values()]
            common = sorted(set.intersection(*(set(t) for t in tables)))
            curves[name] = common, np.array([[t[e] for t in tables] for e in common], dtype=np.float64)
        same: Dict[str, List[str]] = {}  # the first variant of each distinct set of curves -> its twins
        for name, (epochs, values) in curves.items():
            twin = next((d for d in same if curves[d][0] == epochs and np.array_equal(curves[d][1], values)), None)
            same.setdefault(twin or name, []).append(name)
        fig, ax = plt.subplots(figsize=(6.4, 4))
        one_length = True  # every seed of a variant tested at one epoch (mean_validation_curve, last)
        for k, name in enumerate(same):
            (epochs, values), per_seed = curves[name], units[name]
            label = " = ".join(same[name]) + (" (identical)" if len(same[name]) > 1 else "")
            line = ax.plot(
                epochs, values.mean(1), linestyle=["-", "--", "-.", ":"][k % 4], marker="os^DvPX"[k % 7], label=label
            )[0]
            if values.shape[1] > 1:
                ax.fill_between(epochs, values.min(1), values.max(1), color=line.get_color(), alpha=0.12)
            tested = {u.get("selected_epoch", u.get("best_epoch")) for u in per_seed.values()}
            star = per_seed[min(per_seed)].get("selected_epoch", per_seed[min(per_seed)].get("best_epoch"))
            if star in epochs:
                y = values.mean(1)[epochs.index(star)]
                ax.plot(star, y, marker="*", markersize=16, color=line.get_color(), markeredgecolor="black")
            one_length = one_length and len(tested) == 1
        seeds = sorted(next(iter(units.values())))
        ax.set_xlabel("epoch (★ " + ("the tested epoch)" if one_length else f"the tested epoch of seed {seeds[0]})"))
        ax.set_ylabel(f"{METRIC_NAMES.get(primary, primary)}, validation classes")
        title = f"mean over {len(seeds)} seeds; band: lowest to highest seed" if len(seeds) > 1 else f"seed {seeds[0]}"
        ax.set_title(title, fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(self.folder, "map_at_r.png")
        atomic_savefig(fig, path, dpi=110)
        plt.close(fig)
        return path


__all__ = ["GRID_KEYS", "GridSettings", "PairedProtocol", "SELECTIONS", "UNTRAINED"]
