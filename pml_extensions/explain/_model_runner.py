"""Internal: run a PML trunk + embedder in eval mode with temporary hooks on the explained feature map."""

import contextlib
import warnings
from typing import Dict, List, NamedTuple, Optional, Tuple, Union

import torch
from torch import nn

from ..utils.eval_mode import eval_mode

POOLING_TYPES = (
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d,
    nn.AvgPool2d,
    nn.MaxPool2d,
    nn.LPPool2d,
    nn.FractionalMaxPool2d,
)


def require_autograd(who: str) -> None:
    # enable_grad() cannot undo inference_mode: PyTorch would fail far from the call ("does not require grad")
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            f"{who} differentiates the model, but it was called under torch.inference_mode(), which "
            "torch.enable_grad() cannot switch back on: call it outside inference_mode (torch.no_grad() around the "
            "call is fine)"
        )


def _leaves(model: nn.Module) -> List[nn.Module]:
    return [m for m in model.modules() if next(m.children(), None) is None]


def token_grid(n_tokens: int):
    """``(g, extra)`` for ``n_tokens`` = ``g × g`` + ``extra`` (0 or 1 class token) with g >= 2, else ``None``."""
    for extra in (0, 1):
        g = int(round((n_tokens - extra) ** 0.5))
        if g >= 2 and g * g == n_tokens - extra:
            return g, extra
    return None


def _channels_last(module: nn.Module, out: torch.Tensor) -> bool:
    # [N, H, W, C] (torchvision Swin): a Swin block/stage, or a module ending in a LayerNorm over the last dim
    if out.shape[1] == out.shape[-1]:
        return False
    if "swin" in type(module).__name__.lower():
        return True
    norms = [m for m in module.modules() if isinstance(m, nn.LayerNorm)]
    return bool(norms) and tuple(norms[-1].normalized_shape) == (out.shape[-1],)


class MapLayout:
    """A layer's output <-> ``[N, C, h, w]``: ``"NCHW"``, ``"NHWC"`` (Swin), ``"tokens"`` (class token in ``extra``)."""

    def __init__(self, kind: str, extra: Optional[torch.Tensor] = None):
        self.kind, self.extra = kind, extra

    @classmethod
    def of(cls, module: nn.Module, out, name: str) -> "MapLayout":
        if torch.is_tensor(out) and out.ndim == 4:
            return cls("NHWC" if _channels_last(module, out) else "NCHW")
        if torch.is_tensor(out) and out.ndim == 3:
            grid = token_grid(out.shape[1])
            if grid is None:
                raise ValueError(
                    f"layer {name} outputs {out.shape[1]} tokens [N, T, C] = {tuple(out.shape)}: not a square "
                    "grid g*g (or g*g + 1 with a class token); pass layer=... with a square token grid"
                )
            return cls("tokens")
        raise ValueError(
            f"layer {name} must output a [N, C, h, w] map or [N, T, C] tokens, got "
            f"{tuple(out.shape) if torch.is_tensor(out) else type(out).__name__}"
        )

    def to_map(self, out: torch.Tensor) -> torch.Tensor:
        if self.kind == "NCHW":
            return out
        if self.kind == "NHWC":
            return out.permute(0, 3, 1, 2)
        g, extra = token_grid(out.shape[1])
        self.extra = out[:, :extra]
        return out[:, extra:].transpose(1, 2).reshape(out.shape[0], out.shape[2], g, g)

    def from_map(self, A: torch.Tensor) -> torch.Tensor:
        if self.kind == "NCHW":
            return A.clone()
        if self.kind == "NHWC":
            return A.permute(0, 2, 3, 1).clone()
        extra = self.extra
        if extra.shape[0] != A.shape[0]:
            extra = extra.repeat(A.shape[0] // extra.shape[0], 1, 1)
        return torch.cat([extra.to(A.dtype), A.flatten(2).transpose(1, 2)], dim=1)


def _is_candidate(m: nn.Module, out) -> bool:
    if not torch.is_tensor(out) or isinstance(m, POOLING_TYPES):
        return False
    return out.ndim == 4 or (out.ndim == 3 and token_grid(out.shape[1]) is not None)


class HeadRecord(NamedTuple):
    """One module call after the explained layer: the module, its qualified name, first input and output."""

    module: Optional[nn.Module]
    name: str
    input: Optional[torch.Tensor]
    output: Optional[torch.Tensor]


class RunResult(NamedTuple):
    """What one hooked forward pass produced."""

    feature_map: torch.Tensor  # [N, C, h, w]
    output: torch.Tensor  # model output [N, L]
    head: List[HeadRecord]  # module calls after the layer, in execution order
    image_size: Tuple[int, int]  # (H, W)
    layout: MapLayout  # how the layer's output became feature_map


class ModelRunner:
    """Finds the explained ``layer`` (module, name or ``None``) and runs hooked passes of ``embedder(trunk(x))``."""

    def __init__(self, trunk: nn.Module, embedder: Optional[nn.Module] = None, layer=None):
        if not isinstance(trunk, nn.Module):
            raise TypeError(f"trunk must be a torch.nn.Module, got {type(trunk).__name__}")
        if embedder is None:
            embedder = nn.Identity()
        if not isinstance(embedder, nn.Module):
            raise TypeError(f"embedder must be a torch.nn.Module or None, got {type(embedder).__name__}")
        self.trunk = trunk
        self.embedder = embedder
        self.names: Dict[int, str] = {}
        for prefix, model in (("trunk", trunk), ("embedder", embedder)):
            for name, m in model.named_modules():
                self.names.setdefault(id(m), f"{prefix}.{name}" if name else prefix)
        self.layer: Optional[nn.Module] = None
        self.layer_call = -1  # which call of the layer module (shared modules are called several times)
        if isinstance(layer, str):
            modules = dict(trunk.named_modules())
            if layer not in modules:
                raise ValueError(f"layer {layer!r} is not a submodule name of the trunk")
            layer = modules[layer]
        if layer is not None:
            if not isinstance(layer, nn.Module):
                raise TypeError(f"layer must be None, a module name or a torch.nn.Module, got {type(layer).__name__}")
            if not any(layer is m for m in trunk.modules()):
                raise ValueError("layer must be a submodule of the trunk")
            self.layer = layer

    def name_of(self, module: nn.Module) -> str:
        return self.names.get(id(module), type(module).__name__)

    @staticmethod
    def check_images(images, arg: str = "images") -> torch.Tensor:
        if not torch.is_tensor(images):
            raise TypeError(f"{arg} must be a torch.Tensor [N, C, H, W], got {type(images).__name__}")
        if images.ndim != 4 or images.shape[0] == 0:
            raise ValueError(f"{arg} must have shape [N, C, H, W] with N >= 1, got {tuple(images.shape)}")
        if not images.is_floating_point():
            raise TypeError(f"{arg} must be a floating-point tensor, got {images.dtype}")
        bad = ~torch.isfinite(images.detach()).flatten(1).all(dim=1)
        if bool(bad.any()):
            raise ValueError(
                f"{arg} contains NaN or inf values (image(s) {bad.nonzero().flatten().tolist()} of the batch)"
            )
        return images

    def _find_layer(self, images: torch.Tensor):
        # the last 4-D map or square token grid (no pooling); token models: the last whose grid tokens reach the output
        found: List[Tuple[nn.Module, int, torch.Tensor]] = []
        calls: Dict[int, int] = {}
        attention_at: List[int] = []  # len(found) when each attention module was called

        def hook(m, inp, out):
            calls[id(m)] = calls.get(id(m), -1) + 1
            if _is_candidate(m, out):
                found.append((m, calls[id(m)], out))

        def attention_hook(m, inp):
            attention_at.append(len(found))

        x = images[:1].detach().clone().requires_grad_(True)
        with contextlib.ExitStack() as hooks, eval_mode(self.trunk, self.embedder), torch.enable_grad():
            for m in _leaves(self.trunk):
                hooks.enter_context(m.register_forward_hook(hook))
            for m in self.trunk.modules():
                if "attention" in type(m).__name__.lower():
                    hooks.enter_context(m.register_forward_pre_hook(attention_hook))
            output = self.embedder(self.trunk(x))
        if not found:
            raise ValueError(
                "the trunk has no module with a 4-D [N, C, h, w] output (or [N, T, C] square token grid) to "
                "explain; pass layer=... (a module of the trunk, or its name)"
            )
        pick = found[-1]
        if pick[2].ndim == 3:
            # without autograd every token model would look like a class-token read-out: refuse instead of guessing
            require_autograd(f"layer=None on a token model ({self.name_of(pick[0])})")
            out = pick[2]
            reach = False
            if torch.is_tensor(output) and output.requires_grad and out.requires_grad:
                (g,) = torch.autograd.grad(output.float().sum(), [out], allow_unused=True)
                reach = g is not None and bool((g[:, token_grid(out.shape[1])[1] :] != 0).any())
            if not reach:  # a class-token read-out: explain the input of the last attention instead
                before = found[: attention_at[-1]] if attention_at else []
                if not before:
                    raise ValueError(
                        f"layer=None: the grid tokens of {self.name_of(pick[0])} do not reach the embedding "
                        "(a class-token head) and no attention module precedes it; pass layer=..."
                    )
                pick = before[-1]
            warnings.warn(
                f"layer=None: explaining {self.name_of(pick[0])} (output {tuple(pick[2].shape)})"
                + (" (the input of the last attention: the head reads the class token)" if not reach else "")
                + "; pass layer=... to choose another",
                stacklevel=4,
            )
        self.layer, self.layer_call = pick[0], pick[1]

    def run(
        self, images: torch.Tensor, mode: str = "capture", replacement: Optional[torch.Tensor] = None, repeat: int = 1
    ) -> RunResult:
        """Hooked eval pass: ``mode`` ``"capture"`` (map cloned, no grad), ``"leaf"`` (map a grad leaf, ``repeat``-ed
        along the batch) or ``"replace"`` (map replaced by ``replacement``, for ``torch.func``)."""
        self.check_images(images)
        if self.layer is None:
            self._find_layer(images)
        layer = self.layer
        state: Dict[str, object] = {"calls": 0}
        head: List[HeadRecord] = []

        def layer_hook(m, inp, out):
            call = state["calls"]
            state["calls"] = call + 1
            if self.layer_call >= 0 and call != self.layer_call:
                return None
            layout = MapLayout.of(m, out, self.name_of(m))
            A = layout.to_map(out)
            state["layout"] = layout
            head.clear()
            if mode != "replace" and layout.extra is not None:
                layout.extra = layout.extra.detach().clone()
            if mode == "capture":
                state["A"] = A.detach().clone()
                return None
            if mode == "leaf":
                state["A"] = (A.detach() if repeat == 1 else A.detach().repeat(repeat, 1, 1, 1)).requires_grad_(True)
                return layout.from_map(state["A"])
            state["A"] = replacement
            return layout.from_map(replacement)

        def leaf_hook(m, inp, out):
            if "A" in state and m is not layer:
                head.append(HeadRecord(m, self.name_of(m), inp[0] if len(inp) else None, out))

        grad_ctx = torch.no_grad() if mode == "capture" else contextlib.nullcontext()
        with contextlib.ExitStack() as hooks, eval_mode(self.trunk, self.embedder), grad_ctx:
            hooks.enter_context(layer.register_forward_hook(layer_hook))
            for m in _leaves(self.trunk) + _leaves(self.embedder):
                hooks.enter_context(m.register_forward_hook(leaf_hook))
            output = self.embedder(self.trunk(images))
        if "A" not in state:
            raise ValueError(f"layer {self.name_of(layer)} was not called in the forward pass")
        if not torch.is_tensor(output) or output.ndim != 2:
            raise ValueError(
                "embedder(trunk(images)) must return [N, L] embeddings, got "
                f"{tuple(output.shape) if torch.is_tensor(output) else type(output).__name__}"
            )
        return RunResult(state["A"], output, head, (images.shape[-2], images.shape[-1]), state["layout"])


def is_l2_normaliser(record: HeadRecord) -> bool:
    """Does this module call map its input to ``input / ||input||`` along dim 1 (checked on the values)?"""
    inp, out = record.input, record.output
    if not (torch.is_tensor(inp) and torch.is_tensor(out)) or inp.shape != out.shape or inp.ndim != 2:
        return False
    ref = torch.nn.functional.normalize(inp.detach(), dim=1)
    tol = 1e-5 if out.dtype == torch.float64 else 1e-4
    return bool(torch.allclose(out.detach(), ref, rtol=tol, atol=tol))


def refuse_normalised_output(output: torch.Tensor, who: str) -> None:
    # unit rows: a normalisation inside forward() hides the pre-normalisation embedding
    norms = output.detach().float().norm(dim=1)
    if torch.allclose(norms, torch.ones_like(norms), rtol=1e-4, atol=1e-4):
        raise ValueError(f"{who} the pre-normalisation embedding: put the normalisation in its own module")


def split_normaliser(head: List[HeadRecord]) -> Tuple[List[HeadRecord], Union[HeadRecord, None]]:
    """Separate a trailing L2-normalisation module call (detected numerically) from the rest of the head."""
    last = head[-1] if head else None
    if last and last.output is not last.input and is_l2_normaliser(last):
        return (head, None) if isinstance(last.module, (nn.Identity, nn.Dropout)) else (head[:-1], last)
    return head, None
