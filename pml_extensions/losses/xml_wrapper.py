"""Cross-batch metric learning (XML) as a wrapper around any PML loss (docs/methods/xml.md). No official code exists;
the ridge step follows the authors' ``yetigurbuz/generalized-sum-pooling`` (``pytorch/gsp/zsr_loss.py``) in spirit,
with ``linalg.solve`` for ``inv``, a split by class, not position, and batch embeddings, not proxies, as targets."""

import inspect
import math
from contextlib import contextmanager
from typing import Optional

import torch
from pytorch_metric_learning.utils.module_with_records import ModuleWithRecords

from ..utils.checks import is_number
from ..utils.class_split import class_disjoint_split
from ..utils.ridge import ridge_prototypes
from ..utils.wiring import after_losses


@contextmanager
def _state_left_untouched(module: torch.nn.Module):
    """Inside the block ``module``'s buffers are clones (the originals, which a graph may have saved, come back after
    it), and so its number attributes (queue positions, counters)."""
    saved_buffers, saved_numbers = [], []
    for sub in module.modules():
        for name, buf in sub._buffers.items():
            if buf is not None:
                saved_buffers.append((sub, name, buf))
                sub._buffers[name] = buf.clone()
        numbers = {k: v for k, v in vars(sub).items() if isinstance(v, (bool, int, float)) and not k.startswith("__")}
        saved_numbers.append((sub, numbers))
    try:
        yield
    finally:
        for sub, name, buf in saved_buffers:
            sub._buffers[name] = buf
        for sub, numbers in saved_numbers:
            for key, value in numbers.items():
                setattr(sub, key, value)


def _check_finite(name, tensor):
    if not torch.is_tensor(tensor) or not tensor.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {type(tensor).__name__}")
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{name} contains NaN or inf values")


def _restrict_indices_tuple(indices_tuple, half):
    """Keep the mined tuples whose members all lie in ``half`` and renumber them inside the half."""
    if indices_tuple is None:
        return None
    if len(indices_tuple) not in (3, 4):
        raise ValueError(f"indices_tuple must have 3 or 4 elements, got {len(indices_tuple)}")
    device = indices_tuple[0].device
    size = int(max([int(t.max()) + 1 if len(t) else 0 for t in indices_tuple] + [int(half.max()) + 1]))
    local = torch.full((size,), -1, dtype=torch.long, device=device)
    local[half.to(device)] = torch.arange(len(half), device=device)
    groups = [indices_tuple] if len(indices_tuple) == 3 else [indices_tuple[:2], indices_tuple[2:]]
    out = []
    for group in groups:
        mapped = [local[t] for t in group]
        keep = torch.stack([m >= 0 for m in mapped]).all(dim=0) if len(mapped[0]) else mapped[0] >= 0
        out.extend(m[keep] for m in mapped)
    return tuple(out)


class _Ref:
    """Holds a module unregistered: invisible to record-keeper's walk."""

    __slots__ = ("module",)

    def __init__(self, module):
        self.module = module


class XMLWrapper(ModuleWithRecords):
    """Cross-batch metric learning loss around any PML loss (Y. Z. Gurbuz and A. A. Alatan, "Generalizable Embeddings
    with Cross-batch Metric Learning", ICIP 2023, arXiv 2307.07620, Sec. 2.3).

    The batch is split into two halves with disjoint classes; each half k's ridge prototypes ``V_k = argmin_A ||Z_k A -
    Y_k||² + ridge ||A||²`` predict the OTHER half (``Ŷ_1 = Z_1 V_2``, ``Ŷ_2 = Z_2 V_1``), judged with the true labels:

        L = loss(Y, L) + xml_weight · L_XML,   L_XML = loss(Ŷ_1, L_1) + loss(Ŷ_2, L_2)   (SUM over the halves).

    Nothing is detached. Mined ``indices_tuple`` drive the inner term and, restricted to a half, its XML term;
    ``ref_emb`` / ``ref_labels`` go to the inner term only. A stateful inner loss's buffers and counters stay as the
    real term left them; ``XMLWrapper(CrossBatchMemory(L, ...))`` judges the halves with ``L``.

    Args:
        loss: any PML loss module whose ``forward`` takes ``(embeddings, labels, ...)``.
        xml_weight: λ ≥ 0, weight of L_XML (paper: 0.01). With 0 the inner loss is called with the arguments as given
            (no checks, no precision lift): a drop-in control arm.
        ridge: ε_r > 0 added once to the Gram matrix (paper: 0.05).
        histogram_layer: a module with a ``last_histograms`` attribute ([B, m], e.g.
            :class:`pml_extensions.trunks.HistogramPooling`), read when ``histograms`` is not passed.
        seed: seed of the private generator that draws the class split (the global RNG is untouched).
        ridge_form: ``"auto"``, ``"primal"`` or ``"kernel"`` (:func:`pml_extensions.utils.ridge_prototypes`).
        target: what the ridge prototypes regress: ``"embeddings"`` or ``"pooled"`` (the paper's: the GAP vectors
            ``histogram_layer.last_pooled``, predictions then pass through ``head``).
        head: with ``target="pooled"``, the module mapping a GAP vector ``[N, C]`` to the embedding ``[N, d]``
            (:meth:`attach` builds it); kept out of this module's parameters.

    ``forward(embeddings [N, d], labels [N], indices_tuple=None, ref_emb=None, ref_labels=None, *,
    histograms [N, m] = None, enqueue_mask [N] bool = None) -> scalar``; ``labels`` may be None only with
    ``xml_weight=0``; ``enqueue_mask`` goes to an inner ``CrossBatchMemory``. With ``xml_weight > 0`` float16/bfloat16
    embeddings are lifted to float32 and autocast is disabled: the scalar is float32 (float64 for float64 embeddings).

    Recordable attributes: ``inner_loss``, ``xml_loss`` (L_XML before weighting), ``num_skipped_xml`` (batches
    without two halves that each hold a positive pair: they return the inner loss alone), ``xml_weight``, ``ridge``.

    Raises:
        TypeError: if ``loss`` is not a loss module taking ``(embeddings, labels)``, or inputs are not float tensors.
        ValueError: on negative/non-finite ``xml_weight``, non-positive ``ridge``, NaN/inf embeddings or histograms,
            histograms whose batch size differs from the embeddings', or no histograms at all.
    """

    def __init__(
        self,
        loss: torch.nn.Module,
        xml_weight: float = 0.01,
        ridge: float = 0.05,
        histogram_layer: Optional[torch.nn.Module] = None,
        seed: int = 0,
        ridge_form: str = "auto",
        target: str = "embeddings",
        head: Optional[torch.nn.Module] = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not is_number(xml_weight) or not math.isfinite(xml_weight) or xml_weight < 0:
            raise ValueError(f"xml_weight must be a finite number >= 0, got {xml_weight!r}")
        if not isinstance(loss, torch.nn.Module) or not self._takes_embeddings_and_labels(loss, xml_weight > 0):
            raise TypeError(
                "loss must be a loss module whose forward takes (embeddings, labels, ...), e.g. "
                "pytorch_metric_learning.losses.ContrastiveLoss() (with xml_weight > 0 not SelfSupervisedLoss, "
                f"which takes (embeddings, ref_emb): the XML term splits by class); got {type(loss).__name__}"
            )
        if not is_number(ridge) or not (math.isfinite(ridge) and ridge > 0):
            raise ValueError(f"ridge must be a finite number > 0, got {ridge!r}")
        if histogram_layer is not None and not hasattr(histogram_layer, "last_histograms"):
            raise TypeError(
                "histogram_layer must keep its last histograms in `last_histograms` "
                f"(e.g. pml_extensions.trunks.HistogramPooling), got {type(histogram_layer).__name__}"
            )
        if ridge_form not in ("auto", "primal", "kernel"):
            raise ValueError(f"ridge_form must be 'auto', 'primal' or 'kernel', got {ridge_form!r}")
        if target not in ("embeddings", "pooled"):
            raise ValueError(f"target must be 'embeddings' or 'pooled', got {target!r}")
        if head is not None and not callable(head):
            raise TypeError(
                f"head must be a module mapping [N, C] GAP vectors to embeddings, got {type(head).__name__}"
            )
        self.target = target
        self._head_ref = _Ref(head)  # the head belongs to the model, not to this module's parameters or records
        self.loss = loss
        self.xml_weight = float(xml_weight)
        self.ridge = float(ridge)
        self.ridge_form = ridge_form
        self.__dict__["histogram_layer"] = histogram_layer  # the trunk's layer, out of this module's tree
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self.inner_loss = self.xml_loss = 0.0
        self.num_skipped_xml = 0
        self.add_to_recordable_attributes(
            list_of_names=["xml_weight", "ridge", "inner_loss", "xml_loss", "num_skipped_xml"], is_stat=False
        )

    def attach(self, trunk, embedder: Optional[torch.nn.Module] = None) -> "XMLWrapper":
        """Take the histogram layer and, with ``target="pooled"`` and an embedder, the head from the model; returns
        ``self``.

        Args:
            trunk: the PML trunk holding exactly one :class:`pml_extensions.trunks.HistogramPooling` (e.g. after
                :func:`~pml_extensions.trunks.use_histogram_pooling`), or PML's ``models`` dict (its ``"embedder"`` then
                taken too). The layer stays out of this module's parameters and state dict.
            embedder: with ``target="pooled"``, the head becomes the trunk's modules after the pooling
                (:func:`pml_extensions.trunks.pooling_tail`) followed by ``embedder``.

        Raises:
            ValueError: if ``trunk`` holds no HistogramPooling or more than one, a ``models`` dict has no ``"trunk"``,
                or (``target="pooled"``) the trunk's output is not its modules after the pooling applied to the GAP
                vector.

        Example::

            >>> import torchvision
            >>> from pytorch_metric_learning.losses import ContrastiveLoss
            >>> from pml_extensions.trunks import use_histogram_pooling
            >>> trunk = torchvision.models.resnet18()
            >>> trunk.fc = torch.nn.Identity()  # PML's usual trunk
            >>> trunk = use_histogram_pooling(trunk, num_prototypes=8)
            >>> loss = XMLWrapper(ContrastiveLoss()).attach(trunk)
            >>> loss.histogram_layer is trunk.avgpool
            True
            >>> models = {"trunk": trunk, "embedder": torch.nn.Linear(512, 64)}
            >>> loss = XMLWrapper(ContrastiveLoss(), target="pooled").attach(models)
            >>> tuple(loss.head(torch.zeros(3, 512)).shape)
            (3, 64)
        """
        from ..trunks.histogram_pooling import find_histogram_layers

        if isinstance(trunk, dict):
            if "trunk" not in trunk:
                raise ValueError(f"XMLWrapper.attach: a models dict needs a 'trunk' key, got keys {sorted(trunk)}")
            embedder = trunk.get("embedder", embedder)
            trunk = trunk["trunk"]
        layers = find_histogram_layers(trunk)
        if len(layers) != 1:
            raise ValueError(
                f"XMLWrapper.attach: the trunk must hold exactly one HistogramPooling, found {len(layers)} "
                "(call trunk = pml_extensions.trunks.use_histogram_pooling(trunk) first)"
            )
        self.__dict__["histogram_layer"] = layers[0]
        if self.target == "pooled" and embedder is not None:
            children = list(trunk.children()) if isinstance(trunk, torch.nn.Sequential) else []
            if any(c is layers[0] for c in children):  # a Sequential trunk: its children after the layer
                tail = children[next(i for i, c in enumerate(children) if c is layers[0]) + 1 :]
            else:
                from ..trunks.histogram_pooling_swap import pooling_tail

                tail = pooling_tail(trunk, layers[0])
            self._head_ref = _Ref(torch.nn.Sequential(*tail, embedder))
        return self

    @staticmethod
    def _takes_embeddings_and_labels(loss, needs_labels=True):
        try:
            params = inspect.signature(loss.forward).parameters
        except (TypeError, ValueError):
            return False
        positional = [
            p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
        if not (len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in positional)):
            return False
        if needs_labels and len(positional) >= 2 and positional[1].name in ("ref_emb", "ref_embeddings"):
            return False  # (embeddings, ref_emb): no labels to split by
        # a metric loss, not e.g. nn.MSELoss(input, target): it names labels / mined tuples / a reference set
        return any(name in params for name in ("labels", "indices_tuple", "ref_emb")) or any(
            p.kind == p.VAR_KEYWORD for p in params.values()
        )

    @property
    def head(self) -> Optional[torch.nn.Module]:
        """GAP vector -> embedding module of ``target="pooled"`` (``None`` until given or attached)."""
        return self._head_ref.module

    def get_histograms(self, embeddings: torch.Tensor, histograms: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The histograms ``[N, m]`` of ``embeddings``: the keyword, else ``histogram_layer.last_histograms``."""
        source = "histograms"
        if histograms is None:
            layer = self.histogram_layer
            if layer is None:
                raise ValueError(
                    "XMLWrapper has no histogram_layer: call loss.attach(trunk) once, after "
                    "trunk = pml_extensions.trunks.use_histogram_pooling(trunk) (or pass histogram_layer= to "
                    "XMLWrapper, or histograms=[N, m] to each call)"
                )
            histograms = layer.last_histograms
            source = "histogram_layer.last_histograms"
            if histograms is None:
                raise ValueError("histogram_layer.last_histograms is None: run the trunk forward before the loss")
        if not torch.is_tensor(histograms) or histograms.ndim != 2:
            raise ValueError(f"{source} must be a [N, m] tensor, got {getattr(histograms, 'shape', type(histograms))}")
        if histograms.shape[0] != embeddings.shape[0]:
            raise ValueError(
                f"{source} has batch size {histograms.shape[0]} but embeddings has {embeddings.shape[0]}: "
                "histograms must come from the same forward pass as the embeddings"
            )
        if histograms.is_floating_point() and not bool(torch.isfinite(histograms).all()):
            hint = " (HistogramPooling gives finite histograms for every finite feature map, in every dtype: the "
            hint += "trunk's feature map has NaN/inf values)"
            raise ValueError(f"{source} contains NaN or inf values{hint if source != 'histograms' else ''}")
        return histograms

    def get_pooled(self, embeddings: torch.Tensor, pooled: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The GAP vectors ``[N, C]`` (``target="pooled"``): the keyword, else ``histogram_layer.last_pooled``."""
        if pooled is None:
            pooled = getattr(self.histogram_layer, "last_pooled", None)
            if pooled is None:
                raise ValueError(
                    "target='pooled' needs the GAP vectors: pass pooled=[N, C] or use a histogram_layer "
                    "that keeps last_pooled (HistogramPooling), run after the trunk's forward"
                )
        if not torch.is_tensor(pooled) or pooled.ndim != 2 or pooled.shape[0] != embeddings.shape[0]:
            raise ValueError(
                f"pooled must be [N, C] with N = {embeddings.shape[0]}, got {getattr(pooled, 'shape', type(pooled))}"
            )
        _check_finite("pooled", pooled)
        return pooled

    def extra_tensors_for_gather(self, embeddings: torch.Tensor, histograms: Optional[torch.Tensor] = None) -> dict:
        """``{"histograms": [N, m]}`` (and ``"pooled"``; none when ``xml_weight == 0``) for DistributedLossWrapper."""
        if self.xml_weight == 0:
            return {}
        extra = {"histograms": self.get_histograms(embeddings, histograms)}
        if self.target == "pooled":
            extra["pooled"] = self.get_pooled(embeddings)
        return extra

    def _call_inner(
        self, embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None, loss=None, enqueue_mask=None
    ):
        kwargs = {"indices_tuple": indices_tuple, "ref_emb": ref_emb, "ref_labels": ref_labels}
        kwargs = {k: v for k, v in dict(kwargs, enqueue_mask=enqueue_mask).items() if v is not None}
        # no labels means none passed (SelfSupervisedLoss's second argument is ref_emb)
        args = (embeddings,) if labels is None else (embeddings, labels)
        return (self.loss if loss is None else loss)(*args, **kwargs)

    def cross_predictions(self, targets: torch.Tensor, histograms: torch.Tensor, halves):
        """``(Ŷ_1 = Z_1 V_2, Ŷ_2 = Z_2 V_1)``: each half's ``targets`` predicted by the other half's prototypes."""
        first, second = halves
        z1, z2 = histograms[first], histograms[second]
        v1 = ridge_prototypes(z1, targets[first], self.ridge, self.ridge_form)
        v2 = ridge_prototypes(z2, targets[second], self.ridge, self.ridge_form)
        with torch.autocast(device_type=targets.device.type, enabled=False):
            pred1 = z1.to(v2.dtype) @ v2
            pred2 = z2.to(v1.dtype) @ v1
        return pred1.to(targets.dtype), pred2.to(targets.dtype)

    def forward(
        self,
        embeddings: torch.Tensor,
        labels: Optional[torch.Tensor] = None,
        indices_tuple=None,
        ref_emb: Optional[torch.Tensor] = None,
        ref_labels: Optional[torch.Tensor] = None,
        *,
        histograms: Optional[torch.Tensor] = None,
        pooled: Optional[torch.Tensor] = None,
        enqueue_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        if self.xml_weight == 0:  # the inner loss itself: called as given, in its own precision, state and errors
            inner = self._call_inner(embeddings, labels, indices_tuple, ref_emb, ref_labels, enqueue_mask=enqueue_mask)
            self.inner_loss, self.xml_loss = inner.detach(), 0.0
            return inner
        _check_finite("embeddings", embeddings)
        if embeddings.ndim != 2:
            raise ValueError(f"embeddings must be [N, d], got {tuple(embeddings.shape)}")
        if labels is None:
            raise ValueError("labels is None: the XML term splits the batch by class (xml_weight > 0 needs labels)")
        if not torch.is_tensor(labels) or labels.shape != embeddings.shape[:1]:
            raise ValueError(
                f"labels must be a [N] tensor with N = {embeddings.shape[0]}, got {getattr(labels, 'shape', labels)}"
            )
        # float32 inside for float16/bfloat16 embeddings, autocast off: PML's distances are neither accurate nor
        # always implemented in half precision (cdist has no CPU bfloat16 kernel); float64 stays float64.
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            return self._forward(
                embeddings, labels, indices_tuple, ref_emb, ref_labels, histograms, pooled, enqueue_mask
            )

    def _forward(self, embeddings, labels, indices_tuple, ref_emb, ref_labels, histograms, pooled, enqueue_mask):
        work = torch.promote_types(embeddings.dtype, torch.float32)
        given = embeddings
        embeddings = embeddings.to(work)
        if ref_emb is given:  # PML losses test `ref_emb is embeddings` (self-comparisons, losses that refuse ref_emb)
            ref_emb = embeddings
        elif ref_emb is not None and ref_emb.is_floating_point():
            ref_emb = ref_emb.to(work)
        inner = self._call_inner(embeddings, labels, indices_tuple, ref_emb, ref_labels, enqueue_mask=enqueue_mask)
        self.inner_loss = inner.detach()
        histograms = self.get_histograms(embeddings, histograms)
        _check_finite("histograms", histograms)
        halves = class_disjoint_split(labels, self.generator)
        if halves is None:
            self.num_skipped_xml += 1
            self.xml_loss = 0.0
            return inner
        if self.target == "pooled":
            pooled = self.get_pooled(embeddings, pooled)
            if self.head is None:
                raise ValueError(
                    "target='pooled' needs a head (GAP vector -> embedding): call loss.attach(trunk, embedder) or "
                    "loss.attach(models) with PML's models dict (or pass head=)"
                )
            pred1, pred2 = self.cross_predictions(
                pooled.to(torch.promote_types(pooled.dtype, work)), histograms, halves
            )
            # the head runs in its own parameters' dtype (a half model stays half); the loss sees float32 or wider
            head_dtype = next((p.dtype for p in self.head.parameters() if p.is_floating_point()), pred1.dtype)
            pred1, pred2 = (self.head(p.to(head_dtype)).to(work) for p in (pred1, pred2))
        else:
            pred1, pred2 = self.cross_predictions(embeddings, histograms, halves)
        labels = labels.to(embeddings.device)
        mined = indices_tuple if ref_emb is None else None  # with a reference set they do not index the batch
        # a cross-batch memory (a memory-bank buffer around a wrapped loss) judges the predictions with its wrapped loss
        judge = getattr(self.loss, "loss", None)
        if not (isinstance(judge, torch.nn.Module) and torch.is_tensor(getattr(self.loss, "embedding_memory", None))):
            judge = self.loss
        with _state_left_untouched(judge):
            xml = 0
            for pred, half in ((pred1, halves[0]), (pred2, halves[1])):
                xml = xml + self._call_inner(pred, labels[half], _restrict_indices_tuple(mined, half), loss=judge)
        self.xml_loss = xml.detach()
        return inner + self.xml_weight * xml


@after_losses
def attach_to_models(loss_funcs, models) -> int:
    """Attach to ``models`` each XMLWrapper in ``loss_funcs`` without histogram layer (or head); returns how many."""
    modules = loss_funcs.values() if isinstance(loss_funcs, dict) else loss_funcs
    attached = 0
    for loss in modules:
        for m in loss.modules():
            if isinstance(m, XMLWrapper) and (m.histogram_layer is None or (m.target == "pooled" and m.head is None)):
                m.attach(models)
                attached += 1
    return attached
