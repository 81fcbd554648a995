"""Class-disjoint half-batch split of the cross-batch (XML) loss."""

from typing import Optional, Tuple

import torch


def class_disjoint_split(
    labels: torch.Tensor, generator: Optional[torch.Generator] = None
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """Split a batch into two halves whose label sets are disjoint (XML, Gurbuz & Alatan, ICIP 2023, Sec. 2.3).

    The unique labels are shuffled with ``generator`` (classes with ≥ 2 samples and singletons separately) and dealt
    alternately to the two sides; the result does not depend on the batch order.

    Args:
        labels: ``[N]`` integer tensor.
        generator: a CPU ``torch.Generator``; ``None`` uses the global RNG.

    Returns:
        ``(indices_1, indices_2)``: sorted 1-D long tensors on ``labels.device``, or ``None`` when fewer than two
        classes have ≥ 2 samples (no two halves with a positive pair each).

    Raises:
        ValueError: if ``labels`` is not a 1-D integer tensor.
    """
    if not torch.is_tensor(labels) or labels.ndim != 1 or labels.is_floating_point():
        raise ValueError(f"labels must be a 1-D integer tensor, got {getattr(labels, 'shape', type(labels))}")
    classes, counts = torch.unique(labels.detach().cpu(), return_counts=True)
    paired, single = classes[counts >= 2], classes[counts < 2]
    if len(paired) < 2:
        return None
    device = "cpu" if generator is None else generator.device  # None: the global RNG, as the docstring says
    order = torch.cat([c[torch.randperm(len(c), generator=generator, device=device)] for c in (paired, single)])
    side = torch.arange(len(order), device=order.device) % 2
    side_of_label = dict(zip(order.tolist(), side.tolist()))
    sides = torch.tensor([side_of_label[v] for v in labels.tolist()], device=labels.device)
    return torch.nonzero(sides == 0).flatten(), torch.nonzero(sides == 1).flatten()
