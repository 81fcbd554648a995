"""Tester for asymmetric retrieval: queries by one model/resolution, the database by another (RAML, Suma & Tolias,
WACV 2023, Sec. 5; docs/methods/resolution_distillation.md)."""

from typing import Callable, Dict, Optional, Sequence

import torch
from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester
from pytorch_metric_learning.utils import common_functions as c_f
from torch.utils.flop_counter import FlopCounterMode

from ..knn.asymmetric_accuracy_calculator import AsymmetricAccuracyCalculator
from ..utils.checks import is_int
from ..utils.eval_mode import eval_mode
from ..utils.sharded_embedding import ShardedEmbeddingMixin

SETUPS = ("teacher_student_asymmetric", "student_symmetric", "teacher_symmetric", "teacher_asymmetric")


def _models(pair, name):
    if isinstance(pair, torch.nn.Module):
        return pair, torch.nn.Identity()
    if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(isinstance(m, torch.nn.Module) for m in pair):
        raise TypeError(f"{name} must be a module or a (trunk, embedder) pair of modules, got {type(pair).__name__}")
    return pair[0], (torch.nn.Identity() if pair[1] is None else pair[1])


def _check_resolutions(**values):
    for name, value in values.items():
        if not is_int(value) or value <= 0:
            raise ValueError(f"{name} must be a positive int (pixels), got {value!r}")


class AsymmetricTester(ShardedEmbeddingMixin, GlobalEmbeddingSpaceTester):
    """``GlobalEmbeddingSpaceTester`` whose reference (database) side may use another model and another dataset.

    ``test(dataset_dict, epoch, trunk_model, embedder_model=None, splits_to_eval=None, collate_fn=None, *,
    reference_trunk_model=None, reference_embedder_model=None, reference_dataset_dict=None)``: queries are embedded by
    ``trunk_model``/``embedder_model`` from ``dataset_dict`` (e.g. the small query resolution), references by the
    reference models from ``reference_dataset_dict`` (e.g. the teacher at the database resolution); missing reference
    arguments fall back to the constructor's, then to the query side. A query split among its reference splits excludes
    each query's own image BY INDEX (both dataset dicts must list the same images in the same order) through
    :class:`AsymmetricAccuracyCalculator`, the default calculator. Accuracy keys are PML's (``<metric>_level0``), so
    ``HookContainer`` works unchanged; embeddings are L2-normalised as in PML. Under ``torch.distributed`` each rank
    embeds its shard of every set (every rank calls ``test``).

    Raises:
        ValueError: query and reference splits of one name that list different labels (not the same images), a
            non-positive resolution, query and reference embedding dimensions that differ.
        TypeError: models that are not modules.
    """

    def __init__(
        self,
        *args,
        reference_trunk_model: Optional[torch.nn.Module] = None,
        reference_embedder_model: Optional[torch.nn.Module] = None,
        reference_dataset_dict: Optional[dict] = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.reference_trunk_model = reference_trunk_model
        self.reference_embedder_model = reference_embedder_model
        self.reference_dataset_dict = reference_dataset_dict
        self.reference_embeddings_and_labels = None

    def initialize_accuracy_calculator(self):
        if self.accuracy_calculator is None:
            self.accuracy_calculator = AsymmetricAccuracyCalculator(
                device=self.data_device, distributed=self.distributed
            )

    def test(
        self,
        dataset_dict,
        epoch,
        trunk_model,
        embedder_model=None,
        splits_to_eval=None,
        collate_fn=None,
        *,
        reference_trunk_model: Optional[torch.nn.Module] = None,
        reference_embedder_model: Optional[torch.nn.Module] = None,
        reference_dataset_dict: Optional[dict] = None,
    ):
        self._reference_side = self._reference(reference_trunk_model, reference_embedder_model, reference_dataset_dict)
        try:
            return super().test(dataset_dict, epoch, trunk_model, embedder_model, splits_to_eval, collate_fn)
        finally:
            self._reference_side = None
            self.reference_embeddings_and_labels = None

    def test_reference_sets(
        self,
        dataset_dict,
        epoch,
        trunk_model,
        embedder_model=None,
        query_split: str = "test",
        reference_sets: Optional[Dict[str, Sequence[str]]] = None,
        collate_fn=None,
        *,
        reference_trunk_model: Optional[torch.nn.Module] = None,
        reference_embedder_model: Optional[torch.nn.Module] = None,
        reference_dataset_dict: Optional[dict] = None,
    ) -> Dict[str, dict]:
        """One query split against several reference sets, e.g. ``{"test": ["test"], "test+val": ["test", "val"]}``,
        each split embedded once (without reference arguments the query side's embeddings are reused); a set containing
        the query split excludes each query's own image.

        Returns:
            ``{set_name: {"epoch": epoch, "<metric>_level<L>": value}}``; ``end_of_testing_hook`` is not called.

        Raises:
            ValueError: empty ``reference_sets``, a set naming a split twice, an unknown split, splits of one name
                listing different images.
        """
        if not reference_sets or not isinstance(reference_sets, dict):
            raise ValueError("reference_sets must be a non-empty dict {name: [split names]}")
        for name, splits in reference_sets.items():
            if len(set(splits)) != len(splits):  # its references would count twice in every metric
                raise ValueError(f"reference_sets[{name!r}] names a split twice: {list(splits)}")
        reference = self._reference(reference_trunk_model, reference_embedder_model, reference_dataset_dict)
        needed = sorted({s for splits in reference_sets.values() for s in splits})
        for split in needed + [query_split]:
            if split not in (dataset_dict if reference[2] is None or split == query_split else reference[2]):
                raise ValueError(f"split {split!r} is not in the dataset dict")
        embedder_model = torch.nn.Identity() if embedder_model is None else embedder_model
        same = all(x is None for x in reference)
        query_splits = sorted({query_split, *needed}) if same else [query_split]
        query_side = super().get_all_embeddings_for_all_splits(
            dataset_dict, trunk_model, embedder_model, query_splits, collate_fn
        )
        reference_side = self._embed_reference(reference, dataset_dict, trunk_model, embedder_model, needed, collate_fn)
        if same:
            reference_side = query_side
        elif query_split in reference_side:
            self._check_same_images({query_split: query_side[query_split]}, reference_side)
        results = {name: {"epoch": epoch} for name in reference_sets}
        # the query split first among a set's splits, as PML's layout
        ordered = {n: sorted(splits, key=lambda s: s != query_split) for n, splits in reference_sets.items()}
        self._knn(query_side, reference_side, [(results[n], query_split, s) for n, s in ordered.items()])
        return results

    def _knn(self, query_side, reference_side, jobs):
        """``do_knn_and_accuracies`` for each ``(record, query_split, reference_splits)`` job."""
        self.reference_embeddings_and_labels = reference_side
        try:
            for record, query_split, reference_splits in jobs:
                self.do_knn_and_accuracies(record, query_side, query_split, reference_splits)
        finally:
            self.reference_embeddings_and_labels = None

    def get_all_embeddings_for_all_splits(
        self, dataset_dict, trunk_model, embedder_model, splits_to_compute_embeddings, collate_fn
    ):
        query_side = super().get_all_embeddings_for_all_splits(
            dataset_dict, trunk_model, embedder_model, splits_to_compute_embeddings, collate_fn
        )
        reference = getattr(self, "_reference_side", None) or (None, None, None)
        self.reference_embeddings_and_labels = self._embed_reference(
            reference, dataset_dict, trunk_model, embedder_model, splits_to_compute_embeddings, collate_fn
        )
        if self.reference_embeddings_and_labels is not None:
            self._check_same_images(query_side, self.reference_embeddings_and_labels)
        return query_side

    def _reference(self, trunk, embedder, dataset_dict):
        """A call's reference (trunk, embedder, dataset dict): its arguments, else the constructor's."""
        return (
            self.reference_trunk_model if trunk is None else trunk,
            self.reference_embedder_model if embedder is None else embedder,
            self.reference_dataset_dict if dataset_dict is None else dataset_dict,
        )

    def _embed_reference(self, reference, dataset_dict, trunk_model, embedder_model, splits, collate_fn):
        """The reference side's embeddings of ``splits``, or None when ``reference`` names nothing (the query side)."""
        ref_trunk, ref_embedder, ref_dict = reference
        if ref_trunk is None and ref_embedder is None and ref_dict is None:
            return None
        if ref_trunk is None:  # the query's trunk, and its embedder unless one is given
            ref_trunk, ref_embedder = trunk_model, (embedder_model if ref_embedder is None else ref_embedder)
        ref_embedder = torch.nn.Identity() if ref_embedder is None else ref_embedder
        ref_dict = dataset_dict if ref_dict is None else ref_dict
        return super().get_all_embeddings_for_all_splits(ref_dict, ref_trunk, ref_embedder, splits, collate_fn)

    def set_reference_and_query(self, embeddings_and_labels, query_split_name, reference_split_names):
        query_embeddings, query_labels = embeddings_and_labels[query_split_name]
        reference_side = self.reference_embeddings_and_labels or embeddings_and_labels
        reference_embeddings, reference_labels = self.maybe_combine_splits(reference_side, reference_split_names)
        if query_embeddings.shape[1] != reference_embeddings.shape[1]:
            raise ValueError(
                f"query embeddings have D={query_embeddings.shape[1]} but reference embeddings have "
                f"D={reference_embeddings.shape[1]}"
            )
        return query_embeddings, query_labels, reference_embeddings, reference_labels

    @staticmethod
    def _check_same_images(query_side, reference_side):
        for split, (_, labels) in query_side.items():
            ref_labels = reference_side[split][1]
            if labels.shape != ref_labels.shape or not torch.equal(labels.cpu(), ref_labels.cpu()):
                raise ValueError(
                    f"split {split!r}: the query and reference datasets must list the same images in the same order "
                    "(their labels differ)"
                )

    @staticmethod
    def query_flops(trunk_model, embedder_model=None, image_size: int = 224, in_channels: int = 3) -> int:
        """FLOPs (torch's flop counter: a multiply-add is 2) to embed ONE zero query image ``[1, in_channels, s, s]``
        under ``no_grad``, on the trunk's device; modes restored. ValueError on a non-positive ``image_size``.
        """
        _check_resolutions(image_size=image_size)
        embedder_model = torch.nn.Identity() if embedder_model is None else embedder_model
        param = next(iter(trunk_model.parameters()), None)
        device = param.device if param is not None else torch.device("cpu")
        dtype = param.dtype if param is not None else torch.float32
        counter = FlopCounterMode(display=False)
        with eval_mode(trunk_model, embedder_model), torch.no_grad(), counter:
            embedder_model(trunk_model(torch.zeros(1, in_channels, image_size, image_size, device=device, dtype=dtype)))
        return int(counter.get_total_flops())

    def evaluate_setups(
        self,
        make_dataset_dict: Callable[[int], Dict[str, torch.utils.data.Dataset]],
        teacher,
        student,
        query_resolution: int,
        database_resolution: int,
        teacher_resolution: Optional[int] = None,
        splits_to_eval=None,
        setups: Sequence[str] = SETUPS,
        epoch: int = 0,
        collate_fn=None,
    ) -> Dict[str, dict]:
        """The paper's four evaluation setups (Sec. 5), each with its query cost: ``teacher_student_asymmetric``
        (database by the teacher at ``database_resolution``, queries by the student at ``query_resolution``: eq. 4, the
        proposed setup), ``student_symmetric`` (the student at ``query_resolution`` on both sides, eq. 1),
        ``teacher_symmetric`` (the teacher at ``teacher_resolution`` on both sides, eq. 1), ``teacher_asymmetric`` (the
        teacher at ``database_resolution`` for the database, ``query_resolution`` for the queries, eq. 3).

        Args:
            make_dataset_dict: ``resolution -> {split_name: dataset}``, the same images in the same order at every
                resolution.
            teacher, student: a module or a ``(trunk, embedder)`` pair each; ``student`` may be None for teacher setups.
            query_resolution, database_resolution, teacher_resolution: square input sizes in pixels
                (``teacher_resolution`` default ``database_resolution``).
            splits_to_eval: as in PML's ``test``; setups: a subset of :data:`SETUPS`.

        Returns:
            ``{setup: {"accuracies": {query_split: {metric_level0: value, "epoch": epoch}}, "query_flops": int,
            "query_resolution": int, "reference_resolution": int}}``; each (model, resolution) is embedded once;
            ``end_of_testing_hook`` is not called.

        Raises:
            ValueError: unknown setup names, non-positive resolutions, a student setup without a student.
        """
        teacher_resolution = database_resolution if teacher_resolution is None else teacher_resolution
        _check_resolutions(
            query_resolution=query_resolution,
            database_resolution=database_resolution,
            teacher_resolution=teacher_resolution,
        )
        unknown = [s for s in setups if s not in SETUPS]
        if unknown:
            raise ValueError(f"unknown setups {unknown}; valid: {list(SETUPS)}")
        models = {"teacher": _models(teacher, "teacher")}
        if student is not None:
            models["student"] = _models(student, "student")
        elif any(s.startswith(("teacher_student", "student")) for s in setups):
            raise ValueError("student is required for the teacher_student_asymmetric and student_symmetric setups")
        sides = {
            "teacher_student_asymmetric": (("student", query_resolution), ("teacher", database_resolution)),
            "student_symmetric": (("student", query_resolution), ("student", query_resolution)),
            "teacher_symmetric": (("teacher", teacher_resolution), ("teacher", teacher_resolution)),
            "teacher_asymmetric": (("teacher", query_resolution), ("teacher", database_resolution)),
        }
        datasets, cache = {query_resolution: make_dataset_dict(query_resolution)}, {}

        def embeddings(side):
            if side not in cache:
                name, res = side
                if res not in datasets:
                    datasets[res] = make_dataset_dict(res)
                trunk, embedder = models[name]
                cache[side] = super(AsymmetricTester, self).get_all_embeddings_for_all_splits(
                    datasets[res], trunk, embedder, splits_to_compute, collate_fn
                )
            return cache[side]

        splits, splits_to_compute = self.get_splits_to_compute_embeddings(datasets[query_resolution], splits_to_eval)
        results = {}
        for setup in setups:
            query_side, reference_side = sides[setup]
            query_e, reference_e = embeddings(query_side), embeddings(reference_side)
            self._check_same_images(query_e, reference_e)
            accuracies = {query_split: {"epoch": epoch} for query_split, _ in splits}
            self._knn(query_e, reference_e, [(accuracies[q], q, r) for q, r in splits])
            trunk, embedder = models[query_side[0]]
            results[setup] = {
                "accuracies": accuracies,
                "query_flops": self.query_flops(trunk, embedder, query_side[1]),
                "query_resolution": query_side[1],
                "reference_resolution": reference_side[1],
            }
            c_f.LOGGER.info(f"{setup}: {results[setup]}")
        return results
