"""Which top-level keys each protocol reads, and the check that refuses every other key.

The loader (:func:`pml_extensions.runner.config.loader.load_config`) calls :func:`check_keys` on every merged
config, so a run never starts with a key it would ignore: a typo is an error naming the nearest known key. The
tables live here, below the protocols, so the config layer never imports a protocol to learn its keys; each
protocol reads its own keys (and takes its ``CONFIG_KEYS`` from :data:`PROTOCOL_KEYS`).

Example::

    >>> from pml_extensions.runner.config.keys import check_keys
    >>> try:
    ...     check_keys({"protocol": "xml_vs_gap", "num_epoch": 3}, {"num_epoch": "general.yaml"})
    ... except ValueError as e:
    ...     print(e)
    general.yaml: num_epoch: the xml_vs_gap protocol reads no such key; did you mean num_epochs?
"""

from typing import Any, Dict, Iterable, Set, Tuple

from ..errors import ConfigError
from .eval_keys import _where, nearest
from .old_keys import OLD_TOP_LEVEL_KEYS
from .syntax import split_marker

#: top-level keys the mlrc protocol reads (PB v0.9.33's and ours)
MLRC_KEYS = (
    # config_general (PB)
    "trainer",
    "num_epochs_train",
    "save_interval",
    "patience",
    "check_untrained_accuracy",
    "api_parser",
    "skip_eval_if_already_done",
    "skip_ensemble_eval_if_already_done",
    "log_data_to_tensorboard",
    "save_figures_on_tensorboard",
    "save_lists_in_db",
    "override_required_compatible_factories",
    # other PB categories
    "models",
    "loss_funcs",
    "mining_funcs",
    "sampler",
    "optimizers",
    "transforms",
    "tester",
    "aggregator",
    "ensemble",
    "hook_container",
    "factories",
    "dataset",
    "splits_to_eval",
    "split_manager",
    "bayes_opt_iters",
    # ours
    "bayes_opt_max_failures_in_a_row",  # the search stops after this many failed trials in a row
    "protocol",
    "seed",
    "device",
    "normalize",
    "dataset_root",
    "test_hooks",
    "prototype_init",
    "skip_bad_images",
    "feature_cache",
)
#: top-level keys of the xml_vs_gap protocol (the main job; its flat config form)
XML_VS_GAP_KEYS = (
    "protocol",
    "experiment_name",
    "seed",
    "seeds",
    "num_epochs",
    "iterations_per_epoch",
    "batch_size",
    "dataloader_num_workers",
    "device",
    "validation",
    "prototype_init",
    "comparisons",
    "variants",
    "dataset",
    "dataset_root",
    "models",
    "loss_funcs",
    "mining_funcs",
    "sampler",
    "optimizers",
    "transforms",
    "accuracy_calculator",
    "tester",
    "feature_cache",
    "selection",
    "untrained",
)
#: top-level keys of the resolution_distillation protocol (before the floor plan they sat inside one
#: ``resolution_job:`` mapping, still accepted: :func:`pml_extensions.runner.config.old_keys.map_old_keys`)
RESOLUTION_DISTILLATION_KEYS = (
    "protocol",
    "datasets",
    "seeds",
    "device",
    "validation",
    "models",
    "teacher_iterations",
    "teacher_lr",
    "teacher_classes_per_batch",
    "student_iterations",
    "images_per_batch",
    "num_augmentations",
    "lr",
    "lambda_ts",
    "lambda_ss",
    "eval_batch_size",
    "num_workers",
    "low_resolution_teacher",
    "student_variants",
    "checkpoint_every",
    "student_lr_grid",
)
#: top-level keys of the template_block protocol (the block against its controls, paired over seeds)
TEMPLATE_BLOCK_KEYS = (
    "protocol",
    "experiment_name",
    "seeds",
    "device",
    "task",
    "dataset",
    "test_dataset",
    "dataset_root",
    "split",
    "validation",
    "transforms",
    "normalize",
    "models",
    "template_block",
    "soft_maximizer",
    "match_parameters",
    "feature_cache",
    "loss_funcs",
    "mining_funcs",
    "sampler",
    "optimizers",
    "lr_schedulers",
    "trainer",
    "tester",
    "accuracy_calculator",
    "num_epochs",
    "iterations_per_epoch",
    "batch_size",
    "eval_batch_size",
    "dataloader_num_workers",
    "variants",
    "comparisons",
)
#: top-level keys of the localization protocol (explanation maps scored as weakly supervised localisation)
LOCALIZATION_KEYS = (
    "protocol",
    "experiment_name",
    "seeds",
    "device",
    "dataset",
    "test_dataset",
    "dataset_seed",
    "transforms",
    "normalize",
    "models",
    "frozen_prefix",
    "loss_funcs",
    "mining_funcs",
    "sampler",
    "optimizers",
    "trainer",
    "num_epochs",
    "iterations_per_epoch",
    "batch_size",
    "eval_batch_size",
    "variants",
    "comparisons",
)
#: protocol name -> the top-level keys it reads
PROTOCOL_KEYS: Dict[str, Tuple[str, ...]] = {
    "mlrc": MLRC_KEYS,
    "xml_vs_gap": XML_VS_GAP_KEYS,
    "resolution_distillation": RESOLUTION_DISTILLATION_KEYS,
    "template_block": TEMPLATE_BLOCK_KEYS,
    "localization": LOCALIZATION_KEYS,
}


def known_keys(config: Dict[str, Any]) -> Tuple[str, Set[str]]:
    """``(protocol, top-level keys it reads)`` from :data:`PROTOCOL_KEYS` (an unknown protocol reads none)."""
    name = config.get("protocol") or "mlrc"
    return name, set(PROTOCOL_KEYS.get(name, ())) | {"protocol"}


def check_keys(config: Dict[str, Any], sources: Dict[str, str], file_keys: Iterable[str] = ()) -> None:
    """Refuse top-level keys the config's protocol does not read.

    A file key must be known to the protocol (or be one of its older spellings,
    :data:`pml_extensions.runner.config.old_keys.OLD_TOP_LEVEL_KEYS`); a command-line key must be defined by a
    config file or known to the protocol.

    Raises:
        ConfigError: ``"<file>: key 'num_epoch_train': the mlrc protocol reads no such key; did you mean
        num_epochs_train?"`` or ``"command line: --bogus_key: no config file defines this key ..."``.
    """
    protocol, known = known_keys(config)
    if protocol not in PROTOCOL_KEYS:
        return  # unknown protocol: protocols.protocol_name() reports it
    allowed = known | set(OLD_TOP_LEVEL_KEYS.get(protocol, ()))
    file_keys = {split_marker(k)[0] for k in file_keys}
    for key in config:
        name = split_marker(key)[0]
        if name in allowed:
            continue
        command_line = sources.get(name) == "command line" and name not in file_keys
        hint = _hint(name, protocol, known | file_keys if command_line else known)
        if command_line:
            raise ConfigError(
                f"command line: --{name}: no config file defines this key and the {protocol} protocol does not "
                f"read it{hint} (all keys: run CONFIG --dry-run)"
            )
        raise ConfigError(f"{_where(sources, name)}: the {protocol} protocol reads no such key{hint}")


def _hint(name: str, protocol: str, known: Set[str]) -> str:
    """What follows "reads no such key": the nearest known key when one is close (``"; did you mean X?"``), and,
    for a key of other protocols, which ones read it (``"; it is a key of the mlrc protocol"``); a key of no
    protocol gets the nearest known key however far (``cutoff=0``)."""
    others = [p for p, keys in PROTOCOL_KEYS.items() if p != protocol and name in keys]
    if not others:
        return nearest(name, known, cutoff=0)
    names = others[0] if len(others) == 1 else f"{', '.join(others[:-1])} and {others[-1]}"
    close = nearest(name, known)
    lead = f"{close} It" if close else "; it"
    return f"{lead} is a key of the {names} protocol{'s' if len(others) > 1 else ''}"


def seed_list(value: Any) -> Any:
    """The ``seeds`` key as a list: ``--seeds 0 1 2`` (or ``0,1,2``) on the command line is the string
    ``"0 1 2"``, one seed an int; other values are returned as they are (the protocol checks them).

    Example::

        >>> seed_list("0 1 2"), seed_list(7), seed_list([3, 4])
        ([0, 1, 2], [7], [3, 4])
    """
    if isinstance(value, str):
        try:
            return [int(s) for s in value.replace(",", " ").split()]
        except ValueError:
            return value
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    return value
