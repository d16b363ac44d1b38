"""Training tasks for the tests (imported by fragment ranks, so they live in a module)."""

from __future__ import annotations

import torch
from mpi4py import MPI

from parsl_bf.training.examples import DigitsCNN, digits_cnn


def rank_dependent_model(**options):
    """A broken factory: each rank initialises its model differently."""
    task = digits_cnn(**options)

    def model():
        torch.manual_seed(1000 + MPI.COMM_WORLD.rank)
        return DigitsCNN()

    task.model = model
    return task


# --- a user's own task: waveforms in .npy memmaps, BatchNorm, AdamW with warm-up and cosine
# decay, clipping, bf16 autocast, periodic evaluation, extra state, a saved model ---


def write_waveforms(directory, n: int = 600, length: int = 64, seed: int = 0) -> None:
    """Synthetic two-class waveforms as ``.npy`` files (read back as memmaps)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    t = np.linspace(0, 1, length, dtype=np.float32)
    freq = np.where(labels == 1, 7.0, 3.0)[:, None]
    waves = np.sin(2 * np.pi * freq * t) + 0.5 * rng.standard_normal((n, length))
    np.save(f"{directory}/x.npy", waves.astype(np.float32)[:, None, :])
    np.save(f"{directory}/y.npy", labels.astype(np.int64))


class Waveforms(torch.utils.data.Dataset):
    """Reads samples lazily from memmaps (opened in each DataLoader worker on first use)."""

    def __init__(self, directory: str, start: int = 0, stop: int | None = None) -> None:
        import numpy as np

        self.directory, self.start = directory, start
        self.stop = stop if stop is not None else len(np.load(f"{directory}/y.npy", mmap_mode="r"))
        self._x = self._y = None

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i: int):
        import numpy as np

        if self._x is None:
            self._x = np.load(f"{self.directory}/x.npy", mmap_mode="r")
            self._y = np.load(f"{self.directory}/y.npy", mmap_mode="r")
        j = self.start + i
        return torch.from_numpy(np.array(self._x[j])), int(self._y[j])


class StepCounter:
    """Extra user state: global steps seen (each rank counts every step)."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])


def waveform_cnn(
    data: str,
    save_model: str | None = None,
    lr: float = 3e-3,
    global_batch: int = 32,
    precision: str = "bf16",
    loader_workers: int = 1,
    evaluate_every: int = 256,
    seed: int = 0,
    adam: bool = True,
):
    import math

    import torch.nn.functional as F
    from torch import nn

    from parsl_bf.training import TrainingTask

    counter = StepCounter()
    train = Waveforms(data, 0, 480)
    held_out = Waveforms(data, 480)

    def model():
        return nn.Sequential(
            nn.Conv1d(1, 8, 5, padding=2, bias=False),  # BatchNorm follows
            nn.BatchNorm1d(8),
            nn.ReLU(),
            nn.Conv1d(8, 8, 5, padding=2, bias=False),
            nn.BatchNorm1d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool1d(1),
            nn.Flatten(),
            nn.Linear(8, 2),
        )

    def schedule(optimizer, total_steps: int):
        warmup = max(1, total_steps // 10)

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = (step - warmup) / max(1, total_steps - warmup)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def step(net, batch, ctx):
        x, y = batch
        counter.steps += 1
        out = net(x)
        # Two terms: the data term per sample, and an L2 penalty counted once per global step
        # (its share on each rank is weighted by the rank's part of the batch).
        penalty = sum((p.float() ** 2).sum() for p in net.parameters()) * 1e-4
        return F.cross_entropy(out.float(), y, reduction="sum") + penalty * len(y)

    def evaluate(net):
        xs = torch.stack([held_out[i][0] for i in range(len(held_out))])
        ys = torch.tensor([held_out[i][1] for i in range(len(held_out))])
        device = next(net.parameters()).device
        out = net(xs.to(device)).cpu()
        return {
            "val_loss": float(F.cross_entropy(out, ys)),
            "val_accuracy": float((out.argmax(1) == ys).float().mean()),
        }

    return TrainingTask(
        model=model,
        optimizer=lambda params: (
            torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
            if adam
            else torch.optim.SGD(params, lr=10 * lr, momentum=0.9)
        ),
        dataset=lambda: train,
        step=step,
        global_batch=global_batch,
        seed=seed,
        evaluate=evaluate,
        scheduler=schedule,
        clip_grad_norm=1.0,
        precision=precision,
        evaluate_every=evaluate_every,
        state={"counter": counter},
        save_model=save_model,
        loader_workers=loader_workers,
    )


def iterable_dataset(**options):
    """A broken task: its dataset has no index."""
    task = digits_cnn(**options)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from ()

    task.dataset = Stream
    return task


def paced_digits(per_sample_s: float = 1e-3, per_step_s: float = 0.0, **options):
    """The digits CNN with each rank's step also waiting ``per_sample_s`` per sample of its
    share: a model whose step time is dominated by its share, as a large model's is, so that
    two ranks train faster than one however busy the machine's cores are (a sleep needs no
    core). For tests of growing and shrinking that must not depend on the machine's load.
    ``per_step_s``: a wait per step whatever the share, as a model that does not scale."""
    import time

    task = digits_cnn(**options)

    def step(model, batch, ctx):
        inputs, targets = batch
        time.sleep(per_step_s + per_sample_s * len(inputs))
        return torch.nn.functional.cross_entropy(model(inputs), targets, reduction="sum")

    task.step = step
    return task


def rank_recorder(record: str, **options):
    """``digits_cnn``; each rank that builds it writes ``record/<pid>.json``: its index among
    its node's ranks, its node's ranks (as its launcher told it) and its device."""
    import json
    import os

    from parsl_bf import environment
    from parsl_bf.training.trainer import local_rank, rank_device

    place = {
        "local_rank": local_rank(MPI.COMM_WORLD),
        "local_ranks": os.environ.get(environment.LOCAL_RANKS),
        "device": str(rank_device(MPI.COMM_WORLD)),
    }
    with open(f"{record}/{os.getpid()}.json", "w") as f:
        json.dump(place, f)
    return digits_cnn(**options)


def digits_on(device: str, **options):
    """``digits_cnn`` on ``device`` (``"cpu"``, ``"cuda"``, ``"auto"``)."""
    import dataclasses

    return dataclasses.replace(digits_cnn(**options), device=device)


def evaluated_digits(evaluate_every: int = 500, **options):
    """``digits_cnn`` evaluated (by rank 0) every ``evaluate_every`` samples."""
    task = digits_cnn(**options)
    task.evaluate_every = evaluate_every
    return task
