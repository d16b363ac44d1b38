"""Which samples each rank trains on: exact sample accounting across world sizes.

The order of an epoch is a permutation that depends only on (seed, epoch). Training advances a
global sample offset; a step takes the next ``global_batch`` indices of the order and splits them
into contiguous rank shares. So whatever the sequence of world sizes, every sample of an epoch
is used exactly once, and with a fixed global batch the gradients are the same as at any size.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = [
    "epoch_order",
    "rank_share",
    "step_indices",
    "step_batch",
    "step_plan",
    "total_steps",
]


def epoch_order(seed: int, epoch: int, n_samples: int) -> np.ndarray:
    """The sample order of ``epoch``: a permutation of range(n_samples)."""
    return np.random.default_rng([seed, epoch]).permutation(n_samples)


def rank_share(batch: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of ``rank``'s contiguous share of a batch of ``batch`` samples."""
    base, extra = divmod(batch, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def step_indices(order: np.ndarray, offset: int, batch: int, world: int, rank: int) -> np.ndarray:
    """This rank's sample indices for a step of ``batch`` samples at ``offset`` in the epoch."""
    start, stop = rank_share(batch, world, rank)
    return order[offset + start : offset + stop]


def step_batch(global_batch: int, n_samples: int, offset: int, remaining: int) -> int:
    """Samples in the next step: a global batch, less at an epoch's end or the work's end."""
    return min(global_batch, n_samples - offset, remaining)


def step_plan(
    seed: int, n_samples: int, global_batch: int, start: int, work: int, world: int, rank: int
) -> Iterator[tuple[int, np.ndarray]]:
    """The steps from ``start`` samples to ``work``: (samples in the global step, this rank's
    indices). The same sequence feeds the trainer's accounting and its data loader."""
    samples, order_epoch, order = start, -1, np.empty(0, dtype=np.int64)
    while samples < work:
        epoch, offset = divmod(samples, n_samples)
        if epoch != order_epoch:
            order_epoch, order = epoch, epoch_order(seed, epoch, n_samples)
        batch = step_batch(global_batch, n_samples, offset, work - samples)
        yield batch, step_indices(order, offset, batch, world, rank)
        samples += batch


def total_steps(work: int, n_samples: int, global_batch: int) -> int:
    """Global steps to train ``work`` samples (each epoch ends with a short step), whatever the
    world sizes: what an LR schedule spans."""
    epochs, rest = divmod(work, n_samples)
    per_epoch = -(-n_samples // global_batch)
    return epochs * per_epoch + -(-rest // global_batch)
