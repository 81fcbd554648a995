"""Insert a :class:`TemplateMatchingBlock` between the last two stages of a torchvision CNN (Gorgun, Gurbuz & Alatan,
BMVC 2022, Sec. 3.3) or after a named stage; why the block starts as the identity: docs/methods/template_matching.md."""

import copy
import functools
from typing import List, Optional

import torch
import torchvision

from .soft_maximizer_swap import BLOCKS
from .template_matching_block import INITS, TemplateMatchingBlock
from .trunk_split import _float_like

SUPPORTED = (
    "torchvision ResNet (resnet18, resnet34, resnet50, ... or any model with layer3/layer4 stages of "
    "torchvision BasicBlock/Bottleneck)",
    "torchvision MobileNetV2 (mobilenet_v2)",
    "torchvision DenseNet (densenet121, densenet161, densenet169, densenet201)",
)


def template_matching_blocks(model: torch.nn.Module) -> List[TemplateMatchingBlock]:
    """All :class:`TemplateMatchingBlock` submodules of ``model`` in registration order (possibly empty)."""
    return [m for m in model.modules() if isinstance(m, TemplateMatchingBlock)]


def _widen(module: torch.nn.Module, extra: int) -> torch.nn.Module:
    # the Conv2d / BatchNorm2d rebuilt (on its device, no deep copy: fake and meta tensors have no storage) with
    # `extra` more input channels that it ignores: zero conv weights, BatchNorm's defaults for the new channels
    if isinstance(module, torch.nn.Conv2d):
        if module.groups != 1:
            raise ValueError(f"cannot widen the input of a grouped convolution ({module})")
        w = module.weight
        new = torch.nn.Conv2d(
            module.in_channels + extra,
            module.out_channels,
            module.kernel_size,
            stride=module.stride,
            padding=module.padding,
            dilation=module.dilation,
            bias=module.bias is not None,
            padding_mode=module.padding_mode,
            device=w.device,
            dtype=w.dtype,
        )
        torch.nn.init.zeros_(new.weight)
    else:
        w = module.weight if module.weight is not None else module.running_mean
        new = torch.nn.BatchNorm2d(
            module.num_features + extra,
            eps=module.eps,
            momentum=module.momentum,
            affine=module.affine,
            track_running_stats=module.track_running_stats,
            device=w.device,
            dtype=w.dtype,
        ).train(module.training)
    with torch.no_grad():
        for name, t in module.state_dict(keep_vars=True).items():  # the old values into the leading block
            getattr(new, name)[tuple(slice(0, n) for n in t.shape)].copy_(t)
    return new


def _is_resnet_like(model) -> bool:
    l3, l4 = getattr(model, "layer3", None), getattr(model, "layer4", None)
    return (
        isinstance(l3, torch.nn.Sequential)
        and isinstance(l4, torch.nn.Sequential)
        and len(l4) > 0
        and all(isinstance(b, BLOCKS) for b in list(l3) + list(l4))
    )


def _insert_child(parent: torch.nn.Sequential, after: str, block: torch.nn.Module) -> None:
    # numbered children shift by one index, named ones keep their keys and the block is ``template_block``
    children = list(parent.named_children())
    at = [name for name, _ in children].index(after) + 1
    numbered = all(name == str(i) for i, (name, _) in enumerate(children))
    new = children[:at] + [(str(at) if numbered else "template_block", block)]
    new += [(str(i + 1) if numbered else name, m) for i, (name, m) in enumerate(children[at:], start=at)]
    for name, _ in children:
        delattr(parent, name)
    for name, m in new:
        parent.add_module(name, m)


# each ``_*_site(model, combine)``: (width of the map, (parent, name) of the layers that a concat block's wider output
# feeds, the function that puts the block into the model)


def _resnet_site(model, combine):
    first = model.layer4[0]
    if combine == "concat" and first.downsample is None:
        raise ValueError("combine='concat' needs a downsample shortcut in layer4[0] to absorb the wider input")
    return first.conv1.in_channels, [(first, "conv1"), (first.downsample, "0")], model.layer3.append


def _mobilenet_site(model, combine):
    stride2 = [
        i
        for i, m in enumerate(model.features)
        if isinstance(m, torchvision.models.mobilenetv2.InvertedResidual) and m.stride == 2
    ]
    if not stride2:
        raise ValueError("MobileNetV2.features has no stride-2 inverted residual to insert the block before")
    first = model.features[stride2[-1]].conv[0]  # the block's first Conv2dNormActivation; [0] is its conv
    return first[0].in_channels, [(first, "0")], functools.partial(_insert_child, model.features, str(stride2[-1] - 1))


def _densenet_site(model, combine):
    named = dict(model.features.named_children())
    if "denseblock3" not in named or "transition3" not in named:
        raise ValueError("DenseNet.features must contain denseblock3 and transition3")
    trans = named["transition3"]
    put = functools.partial(_insert_child, model.features, "denseblock3")
    return trans.norm.num_features, [(trans, "norm"), (trans, "conv")], put


def _stage_width(stage: torch.nn.Module) -> int:
    width = None
    for m in stage.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            width = m.num_features
        elif isinstance(m, torch.nn.Conv2d):
            width = m.out_channels
    if width is None:
        raise ValueError(f"after: the stage {type(stage).__name__} has no Conv2d or BatchNorm2d to read its width from")
    return width


def _after_site(model, combine, path):
    modules = dict(model.named_modules())
    stage = modules.get(path)
    parent_path, _, child = path.rpartition(".")
    parent = modules.get(parent_path) if stage is not None else None
    in_sequential = isinstance(parent, torch.nn.Sequential) and not isinstance(stage, torch.nn.Sequential)
    if not path or not (isinstance(stage, torch.nn.Sequential) or in_sequential):
        sequential = [n for n, m in modules.items() if n and isinstance(m, torch.nn.Sequential)]
        raise ValueError(
            f"after={path!r} must name an nn.Sequential stage of the model or a module inside one; its stages: "
            f"{', '.join(sequential[:12])}"
        )
    if combine != "add":
        raise ValueError(f"after={path!r} takes combine='add' (the width the next stage expects), got {combine!r}")
    return _stage_width(stage), [], functools.partial(_insert_child, parent, child) if in_sequential else stage.append


def insert_template_matching(
    model: torch.nn.Module,
    num_classes: int,
    inplace: bool = False,
    after: Optional[str] = None,
    init: str = "identity",
    **block_kwargs,
) -> torch.nn.Module:
    """Return ``model`` with a template-matching block between its last two stages (or after the stage ``after``);
    by default the returned model computes exactly what ``model`` computed (see ``init``).

    The paper's place, the last map before the final down-sampling stage: appended to ``layer3`` of a ResNet (stages
    ``layer3``/``layer4`` of ``BasicBlock``/``Bottleneck``; existing keys unchanged), before the last stride-2 inverted
    residual of MobileNetV2's ``features`` (index 14; later indices shift by one), after DenseNet's ``denseblock3``
    (as ``features.template_block``).

    Args:
        model: a torchvision ResNet / MobileNetV2 / DenseNet (or ResNet-style model), random or pretrained; its
            classifier head is left as it is (``torch.nn.Identity()`` makes it a PML trunk).
        num_classes: c ≥ 2, training classes of the block's patch classifier.
        inplace: modify ``model`` itself (default ``False``: a deep copy).
        after: module path (``model.named_modules()``) of an ``nn.Sequential`` stage of any model (e.g. ``"layer2"``:
            the block is appended to it) or of a module inside one (e.g. ``"0.13"``: inserted right after it, later
            children shifting by one index); the width is read from its last BatchNorm2d / Conv2d; ``combine="add"``
            only. ``None`` (default): the paper's place for the architectures above.
        init: ``"identity"`` (default; our deviation): the model's output is unchanged at insertion, in train and
            eval mode (``combine="add"``: :meth:`TemplateMatchingBlock.init_identity`, bit for bit on the CPU;
            ``combine="concat"``: the zero-widened next layer); ``"paper"``: PyTorch's random 1×1 convs. The block's
            random draws are the same for both.
        **block_kwargs: passed to :class:`TemplateMatchingBlock` (``mixing``, ``combine``, ``window``, ...;
            ``value_channels`` defaults to the map's width).

    Returns:
        The model, with the same output shape as before; :func:`template_matching_blocks` finds the block.

    Raises:
        TypeError: if ``model`` is not a ``torch.nn.Module``.
        ValueError: an unsupported architecture without ``after`` (one line listing the supported ones); bad block
            arguments; an unknown ``init``; ``combine="concat"`` on a ResNet whose ``layer4[0]`` has no downsample
            shortcut; an ``after`` that is not a stage of the model (its stages are listed) or comes with
            ``combine="concat"``.

    Example::

        >>> from pml_extensions.trunks import SmallResNet
        >>> resnet = SmallResNet(1, (8, 16, 32, 32)).eval()
        >>> net = insert_template_matching(resnet, num_classes=10, after="layer2").eval()
        >>> [type(m).__name__ for m in net.layer2], net(torch.zeros(2, 1, 28, 28)).shape
        (['BasicBlock', 'TemplateMatchingBlock'], torch.Size([2, 32]))
        >>> x = torch.randn(2, 1, 28, 28)
        >>> torch.equal(net(x), resnet(x))  # init="identity": the same function at insertion
        True
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if after is not None:
        site = functools.partial(_after_site, path=str(after))
    elif isinstance(model, torchvision.models.DenseNet):
        site = _densenet_site
    elif isinstance(model, torchvision.models.MobileNetV2):
        site = _mobilenet_site
    elif _is_resnet_like(model):
        site = _resnet_site
    else:
        raise ValueError(
            f"insert_template_matching does not know the architecture {type(model).__name__}; supported: "
            + "; ".join(SUPPORTED)
            + "; any other CNN with after='<path of its nn.Sequential stage>'"
        )
    if not inplace:
        model = copy.deepcopy(model)
    combine = block_kwargs.get("combine", "add")
    width, wider, put = site(model, combine)
    kwargs = {**_float_like(model), **block_kwargs}
    if combine == "add" and kwargs.get("value_channels") not in (None, width):
        raise ValueError(
            f"value_channels={kwargs['value_channels']} would change the width {width} that the next "
            "stage expects; leave it None for combine='add'"
        )
    block = TemplateMatchingBlock(width, num_classes, init="paper", **kwargs)
    for parent, name in wider if combine == "concat" else ():
        setattr(parent, name, _widen(getattr(parent, name), block.out_channels - block.in_channels))
    put(block)
    if init == "identity" and combine == "add":
        block.init_identity()  # concat: the zero-widened next layer already keeps the function
    return model


def template_matching_trunk(model: torch.nn.Module, num_classes: int, **block_kwargs) -> torch.nn.Sequential:
    """A PML trunk body from a torchvision CNN with a template-matching block between its last two stages
    (:func:`insert_template_matching` on a copy, then the model without pooling and head):
    ``trunk(images [B, 3, H, W]) -> [B, C, H/32, W/32]``.

    Args:
        model, num_classes, **block_kwargs: as :func:`insert_template_matching`.

    Raises:
        ValueError: an unsupported architecture (see :func:`insert_template_matching`).

    Example::

        >>> body = template_matching_trunk(torchvision.models.resnet18(weights=None), num_classes=4)
        >>> body(torch.zeros(2, 3, 64, 64)).shape, len(template_matching_blocks(body))
        (torch.Size([2, 512, 2, 2]), 1)
    """
    model = insert_template_matching(model, num_classes, inplace=False, **block_kwargs)
    if isinstance(model, torchvision.models.MobileNetV2):
        return torch.nn.Sequential(*model.features.children())
    if isinstance(model, torchvision.models.DenseNet):
        return torch.nn.Sequential(*model.features.children(), torch.nn.ReLU(inplace=False))
    return torch.nn.Sequential(
        model.conv1, model.bn1, model.relu, model.maxpool, model.layer1, model.layer2, model.layer3, model.layer4
    )
