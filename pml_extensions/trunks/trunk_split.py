"""Split a trunk where its frozen part ends: ``(prefix, rest)`` with ``rest(prefix(x)) == model(x)``, so that the
prefix's features can be cached (docs/feature_cache.md)."""

import difflib
import itertools
from typing import List, Sequence, Tuple, Union

import torch
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp

from ..utils.checks import is_int
from ..utils.eval_mode import eval_mode

#: spatial size of the probe image that :func:`trunk_stages` runs through the model
DEFAULT_INPUT_SHAPE = (3, 224, 224)


class _PathTracer(fx.Tracer):
    # traces through the root and the modules named in ``descend``; every other module is one ``call_module``
    def __init__(self, descend):
        super().__init__()
        self.descend = frozenset(descend)

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return module_qualified_name not in self.descend


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _trace(model: torch.nn.Module, descend) -> fx.Graph:
    try:
        return _PathTracer(descend).trace(model)
    except Exception as e:  # fx raises TraceError, TypeError, NotImplementedError, ... on untraceable code
        raise ValueError(
            f"torch.fx cannot trace {type(model).__name__}.forward through {sorted(descend) or 'its root'} "
            f"({_first_line(e)}); name a boundary that is not inside an untraceable module"
        ) from None


def _crossing(nodes: Sequence[fx.Node], cut: fx.Node):
    # the first node computed up to ``cut`` (other than ``cut`` and constants) that a node after ``cut`` uses
    position = {n: i for i, n in enumerate(nodes)}
    end = position[cut]
    for n in nodes[: end + 1]:
        if n is cut or n.op == "get_attr":
            continue
        if any(position[u] > end for u in n.users):
            return n
    return None


def _clean_cuts(nodes: Sequence[fx.Node]) -> List[str]:
    calls = [n.target for n in nodes if n.op == "call_module"]
    return [
        n.target for n in nodes if n.op == "call_module" and calls.count(n.target) == 1 and _crossing(nodes, n) is None
    ]


def _describe(node: fx.Node) -> str:
    if node.op == "placeholder":
        return f"the input {node.target!r}"
    if node.op == "call_module":
        return f"the output of {node.target!r}"
    return f"the value {node.name!r} ({node.op} {getattr(node.target, '__name__', node.target)})"


def _float_like(model: torch.nn.Module) -> dict:
    """``device`` and ``dtype`` of the model's first floating-point parameter or buffer (CPU, float32 without one)."""
    floats = (t for t in itertools.chain(model.parameters(), model.buffers()) if t.is_floating_point())
    t = next(floats, torch.empty(0, dtype=torch.float32, device="cpu"))
    return {"device": t.device, "dtype": t.dtype}


def _spatial(node: fx.Node):
    meta = node.meta.get("tensor_meta")
    shape = getattr(meta, "shape", None)
    return tuple(shape[2:]) if shape is not None and len(shape) == 4 else None


def trunk_stages(model: torch.nn.Module, input_shape: Sequence[int] = DEFAULT_INPUT_SHAPE) -> List[str]:
    """Module paths where the stages of a CNN trunk end: the last module at each spatial resolution (stride 2, 4, 8,
    ...) whose output is a clean cut; a global pool to 1 × 1 is not a stage.

    Found by running a zero image ``[1, *input_shape]`` through the ``torch.fx`` graph (eval mode, no gradients,
    modes restored), tracing into any module whose output is at least 4 × smaller than its input. MobileNetV2 ->
    ``["features.1", "features.3", "features.6", "features.13", "features.18"]``; ResNet ->
    ``["relu", "layer1", "layer2", "layer3", "layer4"]`` (timm's ``feature_info`` modules).

    Args:
        model: a trunk whose forward takes one image batch ``[B, C, H, W]``.
        input_shape: ``(C, H, W)`` of the probe image. Default ``(3, 224, 224)``.

    Returns:
        list of module paths, shallow to deep (index ``i`` is stage ``i`` for :func:`split_trunk`).

    Raises:
        ValueError: the model cannot be traced, or no module outputs a spatial map.

    Example::

        >>> import torchvision
        >>> trunk_stages(torchvision.models.resnet18(), input_shape=(3, 64, 64))
        ['relu', 'layer1', 'layer2', 'layer3', 'layer4']
    """
    descend = set()
    for _ in range(64):  # each round traces one level deeper; real trunks need 2 or 3
        graph = _trace(model, descend)
        gm = fx.GraphModule(model, graph)
        with torch.no_grad(), eval_mode(model):
            try:
                ShapeProp(gm).propagate(torch.zeros(1, *input_shape, **_float_like(model)))
            except Exception as e:
                raise ValueError(
                    f"input_shape {tuple(input_shape)}: a probe image did not run through {type(model).__name__} "
                    f"({_first_line(e)})"
                ) from None
        more = set()
        for n in graph.nodes:
            if n.op != "call_module" or n.target in descend:
                continue
            out, inp = _spatial(n), (_spatial(n.args[0]) if n.args and isinstance(n.args[0], fx.Node) else None)
            sub = model.get_submodule(n.target)
            if out and inp and inp[0] >= 4 * out[0] and any(True for _ in sub.children()):
                more.add(n.target)
        if not more:
            break
        try:
            _trace(model, descend | more)
            descend |= more
        except ValueError:  # an untraceable multi-stage module stays one call
            break
    nodes = list(graph.nodes)
    clean = set(_clean_cuts(nodes))
    runs = []  # [(spatial size, last clean call_module path)]
    for n in nodes:
        size = _spatial(n) if n.op == "call_module" else None
        if size is None or size == (1, 1) or n.target not in clean:
            continue
        if runs and runs[-1][0] == size:
            runs[-1] = (size, n.target)
        else:
            runs.append((size, n.target))
    if not runs:
        raise ValueError(f"{type(model).__name__} has no module that outputs a [B, C, H, W] map for {input_shape}")
    return [path for _, path in runs]


def _resolve(model: torch.nn.Module, boundary, input_shape) -> str:
    if not (is_int(boundary) or isinstance(boundary, str)):
        raise TypeError(f"boundary must be a module path (str) or a stage index (int), got {boundary!r}")
    if isinstance(boundary, int):
        stages = trunk_stages(model, input_shape)
        if not -len(stages) <= boundary < len(stages):
            raise ValueError(
                f"boundary stage index {boundary} is out of range: {type(model).__name__} has {len(stages)} stages "
                f"ending at {stages}"
            )
        return stages[boundary]
    names = [name for name, _ in model.named_modules() if name]
    if boundary not in names:
        near = difflib.get_close_matches(boundary, names, n=3, cutoff=0.0)
        raise ValueError(f"boundary {boundary!r} is not a module of {type(model).__name__}; nearest: {near}")
    return boundary


def split_trunk(
    model: torch.nn.Module, boundary: Union[str, int], input_shape: Sequence[int] = DEFAULT_INPUT_SHAPE
) -> Tuple[fx.GraphModule, fx.GraphModule]:
    """Split ``model`` after the module ``boundary`` into ``(prefix, rest)``: ``rest(prefix(x))`` computes
    ``model(x)`` with the same modules (shared, not copied: training ``rest`` trains ``model``'s parameters, and
    ``state_dict`` keys keep their paths).

    The split is done on the ``torch.fx`` graph of the forward, traced only through the modules that contain the
    boundary. The cut must be clean: the boundary module's output is the only value computed before it that is used
    after it (not inside a residual block, not a module called twice).

    Args:
        model: a module whose forward takes one tensor (an image batch ``[B, C, H, W]``).
        boundary: module path where the prefix ends, as in ``model.named_modules()`` (``"features.17"``), or a
            stage index into :func:`trunk_stages` (negative counts from the last stage).
        input_shape: ``(C, H, W)`` of the probe image, used only for a stage index.

    Returns:
        ``(prefix, rest)``, two ``torch.fx.GraphModule``: ``prefix(x) -> boundary's output`` (e.g. ``[B, 320, H/32,
        W/32]`` for MobileNetV2 at ``"features.17"``), ``rest(features) -> model(x)``; ``training`` is ``model``'s.

    Raises:
        TypeError: ``boundary`` is neither a str nor an int.
        ValueError: (one line each) the path is not a module (nearest names listed); a stage index out of range;
            the boundary module is not called exactly once; the cut is not clean (a value computed before it is used
            after it); the forward takes more than one input or cannot be traced.

    Example::

        >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten())
        >>> prefix, rest = split_trunk(model, "1")
        >>> x = torch.randn(2, 3, 5, 5)
        >>> prefix(x).shape, torch.equal(rest(prefix(x)), model(x))
        (torch.Size([2, 8, 3, 3]), True)
    """
    path = _resolve(model, boundary, input_shape)
    parts = path.split(".")
    graph = _trace(model, {".".join(parts[:k]) for k in range(1, len(parts))})
    nodes = list(graph.nodes)
    name = type(model).__name__
    inputs = [n for n in nodes if n.op == "placeholder"]
    if len(inputs) != 1:
        raise ValueError(f"{name}.forward takes {len(inputs)} inputs; only a one-input trunk can be split")
    hits = [n for n in nodes if n.op == "call_module" and n.target == path]
    if len(hits) != 1:
        how = "never called in" if not hits else f"called {len(hits)} times in"
        raise ValueError(f"boundary {path!r} is {how} {name}.forward: the prefix must end at a module called once")
    cut = hits[0]
    bad = _crossing(nodes, cut)
    if bad is not None:
        clean = _clean_cuts(nodes)
        raise ValueError(
            f"boundary {path!r} does not split {name}.forward cleanly: {_describe(bad)}, computed before it, is "
            f"also used after it (a skip connection or a second branch); clean boundaries here: "
            f"{difflib.get_close_matches(path, clean, n=3, cutoff=0.0)}"
        )
    end = nodes.index(cut)
    needed, stack = set(), [cut]
    while stack:
        n = stack.pop()
        if n not in needed:
            needed.add(n)
            stack.extend(n.all_input_nodes)
    prefix_graph, env = fx.Graph(), {}
    for n in nodes[: end + 1]:
        if n in needed:
            env[n] = prefix_graph.node_copy(n, env.__getitem__)
    prefix_graph.output(env[cut])
    rest_graph = fx.Graph()
    env = {cut: rest_graph.placeholder("features")}
    for n in nodes[:end]:
        if n.op == "get_attr" and any(nodes.index(u) > end for u in n.users):
            env[n] = rest_graph.node_copy(n, env.__getitem__)
    for n in nodes[end + 1 :]:
        env[n] = rest_graph.node_copy(n, env.__getitem__)
    halves = []
    for graph_, suffix in ((prefix_graph, "Prefix"), (rest_graph, "Rest")):
        graph_.lint()
        gm = fx.GraphModule(model, graph_, class_name=f"{name}{suffix}")
        gm.training = model.training
        halves.append(gm)
    return halves[0], halves[1]
