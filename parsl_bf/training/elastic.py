"""Your own training loop as an elastic task, in the spirit of Horovod Elastic's ``State`` and
``commit`` and of torchrun's contract.

A typical PyTorch script changes in a few lines (docs/training.md shows pytorch/examples'
``mnist/main.py`` side by side; ``parsl_bf/training/examples_loop.py`` is that script):

    from parsl_bf.training import elastic

    device = elastic.device()                                   # cuda:<local rank> or cpu
    train_loader = elastic.loader(train_set, batch_size=64)     # this rank's share, resumable
    optimizer = elastic.optimizer(optim.Adadelta(model.parameters(), lr=1.0))
    state = elastic.State(model=model, optimizer=optimizer, scheduler=scheduler, epoch=1)
    for epoch in range(state.epoch, epochs + 1):
        train(model, device, train_loader, optimizer, epoch)    # unchanged
        scheduler.step()
        state.epoch = epoch + 1
        state.commit()

The loop runs as an ``elastic_app`` (or ``python -m parsl_bf.training.worker --task
module:main``) on every rank of a fragment. ``elastic.loader`` yields each rank's share of a
fixed global batch, in the order of :func:`~parsl_bf.training.data.step_plan`, so every
sample is used once per epoch whatever the rescales; ``elastic.optimizer`` sums the ranks'
gradients, each weighted by its share, before every step, so a step is the step one process
would take on the whole batch when the loss is the (default) mean over the batch. Between
any two batches a stop (preemption, rescale) makes every rank checkpoint the ``State`` and the
loader's position and leave; the loop started again at any world size goes on from there.
The script still runs by itself (``python script.py``): outside a fragment everything is a
single process with nothing to checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

from .batches import open_samples
from .checkpoint import (
    Cadence,
    agreed_latest,
    mismatch,
    rng_state,
    save_atomically,
    save_checkpoint,
    set_rng_state,
)
from .data import step_plan
from .exchange import quiet_barrier
from .reports import ReportEvent, ReportSink
from .trainer import rank_device

__all__ = [
    "Session",
    "State",
    "Stopped",
    "device",
    "is_main",
    "loader",
    "optimizer",
    "rank",
    "report",
    "save",
    "session",
    "world",
]


class Stopped(BaseException):
    """Raised out of the loop at a stop, once the state is checkpointed. A BaseException, so
    that a loop's ``except Exception`` does not swallow it; the worker expects it."""


@dataclass
class Session:
    """One run of a loop on a fragment's ranks (the worker opens it; see :func:`session`)."""

    comm: MPI.Comm
    checkpoint_dir: Path | None
    work: int | None = None
    checkpoint_every: int | None = None  # steps; None: auto (checkpoint.Cadence)
    reports: ReportSink = field(default_factory=lambda: ReportSink(None))
    should_stop: Callable[[], bool] = lambda: False
    before_load: Callable[[], Any] = lambda: None  # returns a handover.Receiver or None
    stop_at: int | None = None
    started_at: float | None = None
    # What the loop has done (read by the worker for the outcome).
    samples: int = 0
    steps: int = 0
    used: bool = False
    status: str = "done"
    checkpoint: str | None = None
    metrics_history: list[dict[str, float]] = field(default_factory=list)
    model_path: str | None = None
    state: State | None = None
    weight: float = 1.0  # this rank's share of the current global step
    resume_in_pass_end: bool = False  # the checkpoint was taken at a pass's last step
    loss: float | None = None
    _began: float = field(default_factory=time.time)
    _first_step: bool = True
    _last: tuple[float, int, float] = (0.0, 0, 0.0)  # (t, samples, CPU s) of the last report
    _cadence: Cadence | None = None

    def save_checkpoint(self, stopped: bool = False, at_pass_end: bool = False) -> None:
        """Rank 0 writes the state, the loader's position and the RNGs; all ranks wait."""
        if self.checkpoint_dir is None:
            return
        if self.state is None:
            raise RuntimeError("create elastic.State(...) before iterating an elastic.loader")
        if self.comm.rank == 0:
            payload = {
                "loop": self.state.state_dict(),
                "samples": self.samples,
                "steps": self.steps,
                "metrics_history": list(self.metrics_history),
                # Taken at the last step of a loader pass, before the loop's code after it
                # (evaluation, commit): a resumed run first finishes that pass, empty.
                "at_pass_end": at_pass_end,
                "rng": rng_state(),
                "stopped_at": time.time() if stopped else None,
                "pid": os.getpid(),
            }
            self.checkpoint = str(
                save_checkpoint(self.checkpoint_dir, payload, self.samples, handover=stopped)
            )
        quiet_barrier(self.comm)

    def after_step(self, batch: int, pass_end: int) -> bool:
        """Account a global step (of a loader pass that ends at ``pass_end`` samples); True if
        the loop must stop now (checkpointed)."""
        if self._cadence is None:
            self._cadence = Cadence(self.checkpoint_every, self.steps)
        self.samples += batch
        self.steps += 1
        # Rank 0 times the checkpoints: its "due" rides on the step's stop flag to every rank.
        due = self.comm.rank == 0 and self._cadence.due(self.steps, time.time())
        shared = np.array([float(self.should_stop()), float(due)])
        self.comm.Allreduce(MPI.IN_PLACE, shared, op=MPI.SUM)
        now = time.time()
        if self.comm.rank == 0:
            if self._first_step:
                self.reports.emit(
                    ReportEvent.START,
                    world=self.comm.size,
                    samples=self.samples,
                    resume_s=now - self._began,
                    process_started_at=self.started_at,
                    first_step_at=now,
                    stopped_at=self.state.stopped_at if self.state else None,
                )
                self._last = (now, self.samples, time.process_time())
            elif self.steps % 5 == 0:
                t, s, last_cpu = self._last
                rate = (self.samples - s) / max(1e-9, now - t)
                cpu = time.process_time()
                share = (cpu - last_cpu) / max(1e-9, now - t)  # as the worker's
                self.reports.emit(
                    ReportEvent.STEP, world=self.comm.size, samples=self.samples, rate=rate,
                    loss=self.loss, cpu_share=round(share, 4),
                )  # fmt: skip
                self._last = (now, self.samples, cpu)
        self._first_step = False
        planned = self.stop_at is not None and self.samples >= self.stop_at
        if (shared[0] > 0 or planned) and (self.work is None or self.samples < self.work):
            self.status = "stopped"
            self.save_checkpoint(stopped=True, at_pass_end=self.samples >= pass_end)
            return True
        if shared[1] > 0:
            began = time.time()
            self.save_checkpoint(at_pass_end=self.samples >= pass_end)
            self._cadence.saved(self.steps, began, time.time())
        return False


_current: Session | None = None


@contextlib.contextmanager
def session(**kwargs: Any) -> Iterator[Session]:
    """Run a loop in a fragment (the worker's job): ``Session`` fields as keywords."""
    global _current
    previous, _current = _current, Session(**kwargs)
    try:
        yield _current
    finally:
        _current = previous


def _session() -> Session:
    global _current
    if _current is None:  # a script run by itself: one process, nothing to checkpoint
        _current = Session(MPI.COMM_SELF, None)
    _current.used = True
    return _current


def rank() -> int:
    return _session().comm.rank


def world() -> int:
    return _session().comm.size


def is_main() -> bool:
    """Rank 0 (print, save, evaluate there)."""
    return rank() == 0


def device() -> torch.device:
    """``cuda:<local rank>`` of the GPUs this rank sees, else the CPU."""
    return rank_device(_session().comm)


class State:
    """What the loop checkpoints: objects with ``state_dict()``/``load_state_dict()`` (model,
    optimizer, scheduler, …) and plain values (``epoch=1``), as attributes.

    Creating it restores the newest checkpoint, if there is one (every rank reads it), and
    gives every rank rank 0's model parameters. :meth:`commit` checkpoints now (e.g. at the
    end of an epoch); stops and ``checkpoint_every`` steps checkpoint by themselves.
    """

    def __init__(self, **items: Any) -> None:
        s = _session()
        self._objects = {k: v for k, v in items.items() if hasattr(v, "state_dict")}
        self._values = {k: v for k, v in items.items() if k not in self._objects}
        self.stopped_at: float | None = None
        for key, value in items.items():
            object.__setattr__(self, key, value)
        s.state = self
        # A warm start waits here for the previous fragment's state (sent, or its checkpoint).
        received = s.before_load()
        found = None
        if s.checkpoint_dir is not None:  # another loop's checkpoint is skipped like a damaged one
            found = agreed_latest(s.checkpoint_dir, s.comm, check=self._fits, received=received)
        elif received is not None:
            received.close()
        if found is not None:
            saved = found[1]
            self.load_state_dict(saved["loop"])
            s.samples, s.steps = int(saved["samples"]), int(saved["steps"])
            s.metrics_history = list(saved.get("metrics_history") or [])
            set_rng_state(saved["rng"])
            self.stopped_at = saved.get("stopped_at")
            s.resume_in_pass_end = bool(saved.get("at_pass_end"))
        for obj in self._objects.values():  # the same start on every rank
            if isinstance(obj, torch.nn.Module) and s.comm.size > 1:
                obj.load_state_dict(s.comm.bcast(obj.state_dict(), root=0))

    def _fits(self, saved: dict[str, Any]) -> str | None:
        """Why a checkpoint is not this loop's (another model, another layout), or None."""
        why = mismatch(saved, None, ("loop", "samples", "steps", "rng"))
        return why or mismatch(saved["loop"].get("objects"), self._objects)

    def __setattr__(self, key: str, value: Any) -> None:
        if not key.startswith("_") and key != "stopped_at" and hasattr(self, "_values"):
            if key in self._objects:
                self._objects[key] = value
            else:
                self._values[key] = value
        object.__setattr__(self, key, value)

    def state_dict(self) -> dict[str, Any]:
        return {
            "objects": {k: v.state_dict() for k, v in self._objects.items()},
            "values": dict(self._values),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, obj in self._objects.items():
            if key in state["objects"]:
                obj.load_state_dict(state["objects"][key])
        for key, value in state["values"].items():
            setattr(self, key, value)

    def commit(self) -> None:
        """Checkpoint now (all ranks call it; rank 0 writes)."""
        _session().save_checkpoint()


class _Loader:
    """Each rank's share of the global batches of an epoch, from where the run stands."""

    def __init__(self, dataset: Any, batch_size: int, seed: int, workers: int) -> None:
        self.samples_of = open_samples(dataset)
        self.batch_size, self.seed, self.workers = batch_size, seed, workers

    def __len__(self) -> int:
        return -(-self.samples_of.n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        s = _session()
        if s.resume_in_pass_end:  # the pass that was stopped at its end: finish it, empty
            s.resume_in_pass_end = False
            return
        n = self.samples_of.n
        epoch_end = (s.samples // n + 1) * n
        end = epoch_end if s.work is None else min(epoch_end, s.work)
        if s.samples >= end:
            return
        comm = s.comm

        def plan():
            return step_plan(self.seed, n, self.batch_size, s.samples, end, comm.size, comm.rank)

        batches = self.samples_of.batches(plan(), self.workers, torch.cuda.is_available())
        for (batch, idx), local in zip(plan(), batches, strict=True):
            s.weight = len(idx) / batch
            yield local
            if s.after_step(batch, end):
                raise Stopped


def loader(
    dataset: Any,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    **kwargs: Any,
) -> _Loader:
    """A ``DataLoader`` stand-in: each iteration is one epoch (from where a resumed run
    stopped) of global batches of ``batch_size``, this rank's share of each; ``dataset`` is a
    map-style Dataset or ``(inputs, targets)`` tensors. The order is a permutation of
    (``seed``, epoch); ``shuffle=False`` is not supported (exact resume needs the plan)."""
    if not shuffle:
        raise ValueError("elastic.loader: shuffle=False is not supported")
    if kwargs:
        raise ValueError(f"elastic.loader: unsupported DataLoader arguments {sorted(kwargs)}")
    return _Loader(dataset, batch_size, seed, num_workers)


def optimizer(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``opt``, whose ``step()`` first sums every rank's gradients weighted by its share of
    the global batch: with a loss that is the mean over the rank's batch, the step is that of
    the mean over the global batch."""

    def before_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        s = _session()
        if s.comm.size > 1:
            _allreduce_grads(opt, s.comm, s.weight)

    # A step pre-hook, not a replaced step(): LR schedulers wrap the bound method.
    opt.register_step_pre_hook(before_step)
    return opt


def _allreduce_grads(opt: torch.optim.Optimizer, comm: MPI.Comm, weight: float) -> None:
    params = [p for group in opt.param_groups for p in group["params"] if p.requires_grad]
    for p in params:
        if p.grad is None:  # a rank whose share did not reach this parameter
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.detach().reshape(-1).float() for p in params]) * weight
    host = flat.cpu().numpy() if flat.is_cuda else flat.numpy()
    comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
    summed = torch.from_numpy(host).to(flat.device)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(summed[offset : offset + n].view_as(p.grad))
        offset += n


def report(**metrics: float) -> None:
    """Metrics of the loop (e.g. a test accuracy each epoch): a progress report, and an entry
    of the outcome's ``metrics_history`` (rank 0's)."""
    s = _session()
    values = {k: float(v) for k, v in metrics.items()}
    if "loss" in values:
        s.loss = values["loss"]
    if s.comm.rank == 0:
        s.metrics_history.append({"samples": s.samples, **values})
        s.reports.emit(ReportEvent.EVAL, samples=s.samples, metrics=values)


def save(obj: Any, path: str | os.PathLike) -> str | None:
    """``torch.save(obj, path)`` on rank 0, atomically (the outcome's ``model_path``)."""
    s = _session()
    if s.comm.rank != 0:
        return None
    target = save_atomically(obj, Path(path).expanduser().resolve())
    s.model_path = str(target)
    return s.model_path
