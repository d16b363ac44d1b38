"""The elastic data-parallel trainer: one rank per process, any world size, exact progress.

Batch and learning-rate policy: the **global batch is fixed** (``TrainingTask.global_batch``)
and split into contiguous rank shares; each rank sums its per-sample losses and divides by the
global batch, and the gradients are summed across ranks, so every step computes the gradient
of the same global mean loss at every world size. The learning rate therefore needs no scaling
when the fragment shrinks or grows, and a run that is rescaled 2 → 1 → 3 → 2 follows the same
trajectory as an uninterrupted one (up to floating-point summation order).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

from .checkpoint import CheckpointError, latest, save_checkpoint
from .data import epoch_order, step_batch, step_indices
from .exchange import FlatGradients, fingerprint
from .reports import ReportSink

__all__ = ["TrainingTask", "TrainOutcome", "ElasticTrainer", "TrainingInputError"]


class TrainingInputError(ValueError):
    """A training task that cannot run as given."""


@dataclass
class TrainingTask:
    """What to train. Factories are called on every rank, so they must be deterministic.

    ``loss`` returns per-sample losses (``reduction="none"``); ``evaluate`` (optional) gets the
    trained model on rank 0 and returns metrics for the result.
    """

    model: Callable[[], torch.nn.Module]
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    dataset: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    global_batch: int = 64
    seed: int = 0
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None


@dataclass
class TrainOutcome:
    status: str  # "done" (all the work) or "stopped" (checkpointed on request)
    samples: int
    steps: int
    world: int
    loss: float | None
    checkpoint: str | None
    metrics: dict[str, float] = field(default_factory=dict)


class ElasticTrainer:
    """Runs ``task`` on ``comm`` until ``work`` samples are done or a stop is requested.

    ``should_stop`` is polled every step on every rank (e.g. a flag set by a SIGTERM or SIGUSR1
    handler); the ranks agree on it with one small Allreduce, checkpoint, and return.
    ``before_load`` is called once the model and optimizer exist and before the checkpoint is
    read: a new run started while its predecessor is still stopping waits there.
    """

    def __init__(
        self,
        task: TrainingTask,
        comm: MPI.Comm,
        checkpoint_dir: str | Path,
        work: int,
        checkpoint_every: int = 20,
        reports: ReportSink | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        report_every: int = 5,
        started_at: float | None = None,
        before_load: Callable[[], None] = lambda: None,
    ) -> None:
        self.task, self.comm, self.work = task, comm, int(work)
        self.checkpoint_dir = Path(checkpoint_dir)
        self.checkpoint_every = checkpoint_every
        self.reports = reports or ReportSink(None)
        self.should_stop = should_stop
        self.report_every = report_every
        self.began = time.time()
        self.started_at = started_at  # when the process started (imports take a while)
        self.before_load = before_load

    def _seed(self) -> None:
        torch.manual_seed(self.task.seed)
        np.random.seed(self.task.seed)
        random.seed(self.task.seed)

    def _check_same_model(self, params: list[torch.nn.Parameter]) -> None:
        mine = fingerprint(params)
        ref = self.comm.bcast(mine, root=0)
        same = bool(np.array_equal(mine, ref))
        if not self.comm.allreduce(same, op=MPI.LAND):
            raise TrainingInputError(
                "model parameters differ across ranks: the model factory must be deterministic "
                "(seeded) or the ranks must load the same checkpoint"
            )

    def run(self) -> TrainOutcome:
        comm, rank, world = self.comm, self.comm.rank, self.comm.size
        inputs, targets = self.task.dataset()
        n = len(inputs)
        if world > min(self.task.global_batch, n):
            raise TrainingInputError(
                f"world size {world} exceeds the samples per step "
                f"({min(self.task.global_batch, n)}): some ranks would get no sample"
            )
        self._seed()
        model = self.task.model()
        params = [p for p in model.parameters() if p.requires_grad]
        grads = FlatGradients(params)
        optimizer = self.task.optimizer(params)
        # A warm start: everything above (imports, model, optimizer) ran while the fragment's
        # previous run was still stopping; wait for its checkpoint only now.
        self.before_load()
        # Every rank picks and reads the newest readable checkpoint itself, in parallel (a
        # broadcast of ~100 MB of pickled state from rank 0 was slower); they check they agree.
        found = latest(self.checkpoint_dir)
        state = None if found is None else found[1]
        picked = "" if found is None else found[0].name
        if comm.allgather(picked).count(picked) != world:
            raise CheckpointError(f"ranks read different checkpoints in {self.checkpoint_dir}")
        samples = steps = 0
        stopped_at = None
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            grads.rebind()
            samples, steps = int(state["samples"]), int(state["steps"])
            torch.set_rng_state(state["rng"]["torch"])
            np.random.set_state(state["rng"]["numpy"])
            random.setstate(state["rng"]["python"])
            stopped_at = state.get("stopped_at")
        loaded_at = time.time()
        self._check_same_model(params)

        order_epoch, order = -1, np.empty(0, dtype=np.int64)
        loss_value: float | None = None
        last_t, last_samples = None, samples
        first_step_at = None
        status = "done"
        while samples < self.work:
            epoch, offset = divmod(samples, n)
            if epoch != order_epoch:
                order_epoch, order = epoch, epoch_order(self.task.seed, epoch, n)
            batch = step_batch(self.task.global_batch, n, offset, self.work - samples)
            idx = step_indices(order, offset, batch, world, rank)
            grads.zero()
            local = torch.zeros(())
            if len(idx):
                index = torch.from_numpy(idx)
                out = model(inputs[index])
                local = self.task.loss(out, targets[index]).sum()
                (local / batch).backward()
            grads.allreduce(comm)
            optimizer.step()
            samples += batch
            steps += 1
            # One small Allreduce for the step's loss and for "has any rank been asked to stop".
            shared = np.array([float(local.detach()), float(self.should_stop())])
            comm.Allreduce(MPI.IN_PLACE, shared, op=MPI.SUM)
            total_loss = loss_value = float(shared[0]) / batch
            stop = shared[1] > 0
            now = time.time()
            if first_step_at is None:
                first_step_at = now
                if rank == 0:
                    self.reports.emit(
                        "start",
                        world=world,
                        samples=samples,
                        resume_s=now - self.began,
                        process_started_at=self.started_at,
                        trainer_at=self.began,
                        loaded_at=loaded_at,
                        first_step_at=now,
                        stopped_at=stopped_at,
                    )
                last_t, last_samples = now, samples
            elif rank == 0 and steps % self.report_every == 0:
                rate = (samples - last_samples) / max(1e-9, now - last_t)
                self.reports.emit("step", world=world, samples=samples, rate=rate, loss=total_loss)
                last_t, last_samples = now, samples
            if stop and samples < self.work:
                status = "stopped"
                break
            if steps % self.checkpoint_every == 0:
                self._save(model, optimizer, samples, steps, n, None)
        stopped = time.time() if status == "stopped" else None
        path = self._save(model, optimizer, samples, steps, n, stopped)
        metrics: dict[str, float] = {}
        if rank == 0:
            if status == "done" and self.task.evaluate is not None:
                model.eval()
                with torch.no_grad():
                    metrics = self.task.evaluate(model)
            self.reports.emit(status, world=world, samples=samples, loss=loss_value)
        comm.Barrier()
        return TrainOutcome(status, samples, steps, world, loss_value, path, metrics)

    def _save(self, model, optimizer, samples: int, steps: int, n: int, stopped_at: float | None):
        if self.comm.rank != 0:
            return None
        state: dict[str, Any] = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "samples": samples,
            "steps": steps,
            "epoch": samples // n,
            "rng": {
                "torch": torch.get_rng_state(),
                "numpy": np.random.get_state(),
                "python": random.getstate(),
            },
            "stopped_at": stopped_at,
            "pid": os.getpid(),
        }
        return str(save_checkpoint(self.checkpoint_dir, state, samples))
