"""A rank's share of each global step, from in-memory tensors or a map-style ``Dataset``.

The trainer's :func:`~parsl_bf.training.data.step_plan` says which sample indices a rank
trains on at each step. In-memory ``(inputs, targets)`` tensors are indexed directly (the
fastest path on a CPU node). A map-style ``torch.utils.data.Dataset`` is read through one
``DataLoader`` for the whole run whose batch sampler walks the same plan, so ``loader_workers``
processes read ahead (files, memmaps) and every sample is still used exactly once per epoch
across any sequence of rescales. An ``IterableDataset`` has no index, so a resumed run could
not skip exactly the samples already trained: it is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

__all__ = ["Samples", "open_samples", "to_device"]


class Samples:
    """The training samples of a task: their number and each step's local batches."""

    def __init__(self, data: Dataset | tuple[torch.Tensor, torch.Tensor]) -> None:
        self.tensors = data if isinstance(data, tuple) else None
        self.dataset = None if isinstance(data, tuple) else data
        self.n = len(data[0]) if isinstance(data, tuple) else len(data)  # type: ignore[arg-type]
        self._template: Any = None

    def batches(
        self, plan: Iterator[tuple[int, np.ndarray]], workers: int, pin_memory: bool
    ) -> Iterator[Any]:
        """This rank's batch at each step of ``plan``: ``(inputs, targets)`` as collated by
        the ``DataLoader`` (any structure for a Dataset), with zero rows for an empty share."""
        if self.tensors is not None:
            inputs, targets = self.tensors
            for _, idx in plan:
                index = torch.from_numpy(idx)
                yield inputs[index], targets[index]
            return
        loader = DataLoader(
            self.dataset,
            batch_sampler=_Indices(plan),
            num_workers=workers,
            pin_memory=pin_memory,
            collate_fn=self._collate,
        )
        yield from loader

    def _collate(self, items: list) -> Any:
        if items:
            return default_collate(items)
        return _empty(self.template())

    def template(self) -> Any:
        """One collated sample, for the shape of an empty share."""
        if self._template is None:
            assert self.dataset is not None
            self._template = default_collate([self.dataset[0]])
        return self._template


class _Indices:
    """A batch sampler that yields each step's indices of a plan (a plan is one pass)."""

    def __init__(self, plan: Iterator[tuple[int, np.ndarray]]) -> None:
        self.plan = plan

    def __iter__(self) -> Iterator[list[int]]:
        for _, idx in self.plan:
            yield idx.tolist()


def _empty(batch: Any) -> Any:
    """``batch`` with zero rows (same structure, dtypes and trailing shapes)."""
    if isinstance(batch, torch.Tensor):
        return batch[:0]
    if isinstance(batch, dict):
        return {k: _empty(v) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_empty(v) for v in batch)
    return batch


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (tensors, or dicts, lists and tuples of them) on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def open_samples(data: Any) -> Samples:
    """The samples that a task's ``dataset()`` returned, checked; a TrainingInputError-style
    ``ValueError`` names what is wrong."""
    if isinstance(data, IterableDataset):
        raise ValueError(
            "dataset: returned an IterableDataset; elastic training needs a map-style Dataset "
            "(__len__ and __getitem__) so that a run resumed at another size can skip exactly "
            "the samples already trained"
        )
    if (
        isinstance(data, tuple | list)
        and len(data) == 2
        and all(isinstance(t, torch.Tensor) for t in data)
    ):
        inputs, targets = data
        if len(inputs) != len(targets):
            raise ValueError(
                f"dataset: inputs and targets differ in length ({len(inputs)} != {len(targets)})"
            )
        if len(inputs) == 0:
            raise ValueError("dataset: returned no samples")
        return Samples((inputs, targets))
    if isinstance(data, Dataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        if len(data) == 0:
            raise ValueError("dataset: returned no samples")
        return Samples(data)
    raise ValueError(
        f"dataset: returned {type(data).__name__}; expected (inputs, targets) tensors or a "
        "map-style torch.utils.data.Dataset whose items are (input, target)"
    )
