"""The elastic data-parallel trainer: one rank per process, any world size, exact progress.

Batch and learning-rate policy: the **global batch is fixed** (``TrainingTask.global_batch``)
and split into contiguous rank shares; each rank sums its per-sample losses and divides by the
global batch, and the gradients are summed across ranks, so every step computes the gradient
of the same global mean loss at every world size. The learning rate therefore needs no scaling
when the fragment shrinks or grows, and a run that is rescaled 2 → 1 → 3 → 2 follows the same
trajectory as an uninterrupted one (up to floating-point summation order). Batch norm layers
are replaced by :class:`~parsl_bf.training.syncbn.MPIBatchNorm`, which normalises with the
global batch's statistics, so this holds for models with batch norm too.
"""

from __future__ import annotations

import contextlib
import math
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

from .. import environment
from ..decisions import trains_on_in_place
from .batches import open_samples, to_device
from .checkpoint import (
    Cadence,
    agreed_latest,
    mismatch,
    rng_state,
    save_atomically,
    save_checkpoint,
    set_rng_state,
    state_from_parts,
    state_parts,
)
from .data import step_plan, total_steps
from .exchange import FlatGradients, fingerprint, quiet_barrier
from .handover import Receiver
from .rendezvous import join, refuse
from .reports import ReportEvent, ReportSink
from .resize import GrowRequest, ShrinkRequest
from .syncbn import convert_batchnorm, has_batchnorm, set_comm

__all__ = [
    "ElasticTrainer",
    "PRECISIONS",
    "StepContext",
    "TrainOutcome",
    "TrainingInputError",
    "TrainingTask",
]

#: ``TrainingTask.precision`` values: the autocast dtype of the forward pass and the loss.
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
DEVICES = ("auto", "cpu", "cuda")


class TrainingInputError(ValueError):
    """A training task that cannot run as given."""


@dataclass
class StepContext:
    """What a custom ``TrainingTask.step`` is told about the step it computes."""

    device: torch.device  #: where the model and the batch are
    rank: int  #: this rank, of ``world``
    world: int
    batch: int  #: samples in the global step (the loss is divided by this, not by the share)
    steps: int  #: global steps done before this one
    samples: int  #: samples done before this step


@dataclass
class TrainingTask:
    """What to train. Factories are called on every rank, so they must be deterministic
    (seeded). Only ``model``, ``optimizer``, ``dataset`` and ``loss`` (or ``step``) are needed;
    docs/training.md describes every field with a complete example.

    model
        ``() -> nn.Module``.
    optimizer
        ``(parameters) -> torch.optim.Optimizer``.
    dataset
        ``() -> (inputs, targets)`` tensors, or a map-style ``torch.utils.data.Dataset`` whose
        items are ``(input, target)`` (or anything the default collate and ``step`` agree on),
        read lazily through a ``DataLoader`` with ``loader_workers`` worker processes.
    loss
        ``(outputs, targets) -> per-sample losses`` (``reduction="none"``).
    global_batch, seed
        Samples per global step, whatever the world size; the seed of the model's
        initialisation and of each epoch's sample order.
    evaluate
        ``(model) -> {metric: value}``, on rank 0, in eval mode, without gradients: at the
        end, and every ``evaluate_every`` samples if that is set.
    scheduler
        ``(optimizer, total_steps) -> LR scheduler``, stepped once per global step;
        ``total_steps`` is the number of global steps of the task's work.
    step
        ``(model, batch, ctx: StepContext) -> loss`` replaces ``model(x)`` and ``loss``: a
        custom step (several loss terms, dict inputs). It returns the per-sample losses or
        their sum over this rank's share; the trainer divides by the global batch.
    clip_grad_norm
        Clip the global gradient to this norm before each optimizer step.
    precision
        ``"fp32"``, ``"bf16"`` or ``"fp16"``: autocast of the forward pass and loss (fp16 with
        a GradScaler on CUDA, kept in checkpoints).
    evaluate_every
        Samples between evaluations; each one is a progress report (``"eval"``) and an entry
        of the outcome's ``metrics_history``.
    state
        Extra objects with ``state_dict()``/``load_state_dict()`` (by name), kept in
        checkpoints and restored on every rank.
    save_model
        A path: rank 0 writes the final model's ``state_dict`` there (atomically); the
        outcome's ``model_path``.
    device
        ``"auto"`` (a GPU if there is one, else the CPU), ``"cpu"`` or ``"cuda"``: a rank uses
        ``cuda:<local rank>`` of the GPUs it sees (``CUDA_VISIBLE_DEVICES``).
    loader_workers
        ``DataLoader`` worker processes per rank for a Dataset (0: read in the rank).
    sync_batchnorm
        Replace batch norm by its global-batch version (see the module's docstring).
    """

    model: Callable[[], torch.nn.Module]
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    dataset: Callable[[], Any]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    global_batch: int = 64
    seed: int = 0
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None
    scheduler: Callable[[torch.optim.Optimizer, int], Any] | None = None
    step: Callable[[torch.nn.Module, Any, StepContext], torch.Tensor] | None = None
    clip_grad_norm: float | None = None
    precision: str = "fp32"
    evaluate_every: int | None = None
    state: dict[str, Any] = field(default_factory=dict)
    save_model: str | os.PathLike | None = None
    device: str = "auto"
    loader_workers: int = 0
    sync_batchnorm: bool = True

    def check(self) -> None:
        """Raise :class:`TrainingInputError` naming the first field that cannot work."""
        for name in ("model", "optimizer", "dataset"):
            if not callable(getattr(self, name)):
                raise TrainingInputError(f"{name}: expected a callable, got {_kind(self, name)}")
        if self.loss is None and self.step is None:
            raise TrainingInputError("loss: needed unless the task has a custom step")
        for name in ("loss", "step", "evaluate", "scheduler"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TrainingInputError(f"{name}: expected a callable, got {_kind(self, name)}")
        for name, least in (("global_batch", 1), ("loader_workers", 0)):
            value = getattr(self, name)
            if not _whole(value, least):
                raise TrainingInputError(f"{name}: expected an integer >= {least}, got {value!r}")
        every = self.evaluate_every
        if every is not None and not _whole(every, 1):
            raise TrainingInputError(f"evaluate_every: expected samples >= 1, got {every!r}")
        clip = self.clip_grad_norm
        if clip is not None and not _positive(clip):
            raise TrainingInputError(f"clip_grad_norm: expected a positive number, got {clip!r}")
        if self.precision not in PRECISIONS:
            raise TrainingInputError(
                f"precision: expected one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        if self.device not in DEVICES:
            raise TrainingInputError(
                f"device: expected one of {', '.join(DEVICES)}, got {self.device!r}"
            )
        if not isinstance(self.state, dict):
            kind = _kind(self, "state")
            raise TrainingInputError(f"state: expected a dict of objects, got {kind}")
        for key, obj in self.state.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TrainingInputError(
                    f"state[{key!r}]: {type(obj).__name__} has no state_dict()/load_state_dict()"
                )


def _kind(task: TrainingTask, name: str) -> str:
    return type(getattr(task, name)).__name__


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _positive(value: Any) -> bool:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return ok and math.isfinite(value) and value > 0


@dataclass
class TrainOutcome:
    #: "done" (all the work), "stopped" (checkpointed on request) or "left" (this rank left
    #: at an in-place shrink, and the others trained on; or, a joiner, it was not taken in)
    status: str
    samples: int
    steps: int
    world: int
    loss: float | None
    checkpoint: str | None
    metrics: dict[str, float] = field(default_factory=dict)
    #: Every evaluation so far (``evaluate_every``, and the final one): metrics and ``samples``.
    metrics_history: list[dict[str, float]] = field(default_factory=list)
    #: Where ``save_model`` wrote the final model (rank 0, when done).
    model_path: str | None = None
    #: The samples of the checkpoint this fragment started from (0: none).
    loaded_samples: int = 0


#: Where launchers put a rank's index on its node: the agent's (each rank its own
#: ``mpiexec -n 1``, so MPI's own is 0), then MPICH's Hydra and Open MPI's.
_LOCAL_RANK_VARS = (environment.LOCAL_RANK, "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK")


def local_rank(comm: MPI.Comm) -> int:
    """This rank's index among the ranks of its node, as its launcher set it, else as MPI's
    shared-memory split finds it."""
    for name in _LOCAL_RANK_VARS:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return node_position(comm)[0]


def node_position(comm: MPI.Comm) -> tuple[int, int]:
    """(this rank's index, the number of ranks) among the ranks of ``comm`` that share its node,
    as MPI's shared-memory split finds them."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.rank, local.size
    finally:
        local.Free()


def share_cores(comm: MPI.Comm, resized: bool = False) -> int:
    """Split this node's cores among the ranks of ``comm`` on it (one intra-op thread pool per
    rank would oversubscribe the node); returns this rank's threads.

    ``PARSL_BF_THREADS_PER_RANK`` wins (an emulated node per core). At a fragment's start the
    agent's count of this node's ranks (``PARSL_BF_LOCAL_RANKS``) is a floor, since ranks
    started one by one may not see each other as one node in MPI. After an in-place resize
    (``resized``) that count describes the launch, not the fragment: the new communicator's
    count is the one (a rank left alone on its node by a shrink takes all its cores, and
    joiners share theirs with the ranks already there)."""
    override = os.environ.get(environment.THREADS_PER_RANK)
    if override:
        threads = int(override)
    else:
        launched = "" if resized else os.environ.get(environment.LOCAL_RANKS, "")
        local = max(int(launched) if launched.isdigit() else 1, node_position(comm)[1])
        threads = max(1, (os.cpu_count() or 1) // local)
    torch.set_num_threads(threads)
    return threads


def rank_device(comm: MPI.Comm, want: str = "auto") -> torch.device:
    """This rank's device: ``cuda:<local rank>`` of the GPUs it sees (``"auto"``: if there
    are any), or the CPU."""
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise TrainingInputError("device: 'cuda' asked for, but this node has no usable GPU")
    return torch.device("cuda", local_rank(comm) % torch.cuda.device_count())


class ElasticTrainer:
    """Runs ``task`` on ``comm`` until ``work`` samples are done or a stop is requested.

    ``should_stop`` is polled every step on every rank (e.g. a flag set by a SIGTERM or SIGUSR1
    handler); the ranks agree on it with one small Allreduce, checkpoint, and return.
    ``before_load`` is called once the model and optimizer exist and before the checkpoint is
    read: a new run started while its predecessor is still stopping waits there, and returns
    the listener that got the predecessor's state, if any (:mod:`.handover`).

    ``should_resize`` is polled like ``should_stop`` (e.g. "a request file is there"): once any
    rank has seen it, every rank calls ``take_resize(read)`` (which clears what it saw) and
    the request rank 0 reads (``read`` True there) decides (:mod:`.resize`):

    - a :class:`~parsl_bf.training.resize.ShrinkRequest`: the ranks it keeps split off a
      communicator of their own and train on with the model, optimizer and data position in
      memory, from the next step at the new size (the lowest of them is rank 0 from then on);
      the others return ``status`` ``"left"``;
    - a :class:`~parsl_bf.training.resize.GrowRequest`: the fragment takes in the joiners
      waiting at its rendezvous, sends them its state, and every rank takes the next step at
      the new size.

    A request that cannot be done in place is a stop; one made for another world size (late,
    or repeated) is dropped. A joiner is a trainer with ``join``: ``join(comm)`` returns the
    grown communicator (:func:`~parsl_bf.training.rendezvous.join`), and its state comes from
    the fragment's rank 0 instead of a checkpoint.

    With ``leave_min``, a stop asked of some ranks but not of all is those ranks leaving, as a
    preemption that signals only its own pilot's ranks asks: when at least ``leave_min`` ranks
    were not asked, they train on in memory as after a shrink request that keeps them, and the
    asked ones return ``"left"`` (no checkpoint round trip, no restart). Otherwise, and
    without ``leave_min``, any rank's stop stops every rank.
    """

    def __init__(
        self,
        task: TrainingTask,
        comm: MPI.Comm,
        checkpoint_dir: str | Path,
        work: int,
        checkpoint_every: int | None = None,
        reports: ReportSink | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        report_every: int = 5,
        started_at: float | None = None,
        before_load: Callable[[], Receiver | None] = lambda: None,
        stop_at: int | None = None,
        should_resize: Callable[[], bool] = lambda: False,
        take_resize: Callable[[bool], ShrinkRequest | GrowRequest | None] = lambda read: None,
        resize_at: int | None = None,
        join: Callable[[MPI.Intracomm], MPI.Intracomm] | None = None,
        leave_min: int | None = None,
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
        self.stop_at = stop_at
        self.should_resize = should_resize
        self.take_resize = take_resize
        self.resize_at = resize_at  # a resize asked at an exact step (tests, benchmarks)
        self.join = join
        self.leave_min = leave_min  # None: a stop asked of any rank stops every rank

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
        task = self.task
        task.check()
        try:
            samples_of = open_samples(task.dataset())
        except ValueError as exc:
            raise TrainingInputError(str(exc)) from None
        n = samples_of.n
        if world > min(task.global_batch, n):
            raise TrainingInputError(
                f"world size {world} exceeds the samples per step "
                f"({min(task.global_batch, n)}): some ranks would get no sample"
            )
        device = rank_device(comm, task.device)
        self._seed()
        model = task.model()
        if not isinstance(model, torch.nn.Module):
            raise TrainingInputError(f"model: returned {type(model).__name__}, not an nn.Module")
        synced = task.sync_batchnorm and has_batchnorm(model)
        if synced:
            model = convert_batchnorm(model, comm)
        model.to(device)
        params = [p for p in model.parameters() if p.requires_grad]
        # One rank has nothing to exchange: its gradients are autograd's own, dropped before
        # each step (zeroing and accumulating into a flat buffer cost ~8 % of a small step).
        grads = FlatGradients(params, device=device) if world > 1 else None
        optimizer = task.optimizer(params)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TrainingInputError(
                f"optimizer: returned {type(optimizer).__name__}, not a torch.optim.Optimizer"
            )
        scheduler = None
        if task.scheduler is not None:
            scheduler = task.scheduler(optimizer, total_steps(self.work, n, task.global_batch))
            if not (hasattr(scheduler, "step") and hasattr(scheduler, "state_dict")):
                raise TrainingInputError(
                    f"scheduler: returned {type(scheduler).__name__}, not an LR scheduler"
                )
        scaler = torch.amp.GradScaler(
            device.type, enabled=task.precision == "fp16" and device.type == "cuda"
        )
        # A warm start: everything above (imports, model, optimizer) ran while the fragment's
        # previous run was still stopping; wait for its checkpoint only now.
        received = self.before_load()
        if self.join is not None:
            # A joiner: the running fragment takes this rank in and sends its state.
            comm = self.comm = self.join(comm)
            rank, world = comm.rank, comm.size
            # The fragment's ranks on this node share its cores from now on (collective: where
            # the running ranks call it), before the state comes and the model is checked:
            # with a rank's threads still set for the world before, this node's cores were
            # oversubscribed, and the check alone took 0.1-0.2 s.
            share_cores(comm, resized=True)
            found = None, self._grow_state(comm, None, joiner=True)
            if world > 1:
                grads = FlatGradients(params, device=device)
            if synced:
                set_comm(model, comm)
        else:
            # Another model's checkpoint (other keys, other shapes) is skipped like a damaged
            # one.
            live = {"model": model, "optimizer": optimizer}
            found = agreed_latest(
                self.checkpoint_dir,
                comm,
                check=lambda saved: mismatch(saved, live, ("samples", "steps", "rng")),
                received=received,
            )
        from_peer = received is not None and received.received_at is not None
        state = None if found is None else found[1]
        samples = steps = 0
        stopped_at = None
        history: list[dict[str, float]] = []
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            if grads is not None:
                grads.rebind()
            if scheduler is not None and state.get("scheduler") is not None:
                scheduler.load_state_dict(state["scheduler"])
            if state.get("scaler"):
                scaler.load_state_dict(state["scaler"])
            for key, obj in task.state.items():
                if key in (state.get("user_state") or {}):
                    obj.load_state_dict(state["user_state"][key])
            history = list(state.get("metrics_history") or [])
            samples, steps = int(state["samples"]), int(state["steps"])
            set_rng_state(state["rng"])
            stopped_at = state.get("stopped_at")
        loaded_samples = samples
        loaded_at = time.time()
        self._check_same_model(params)

        def plan():
            return step_plan(task.seed, n, task.global_batch, samples, self.work, world, rank)

        batches = samples_of.batches(plan(), task.loader_workers, device.type == "cuda")
        dtype = PRECISIONS[task.precision]
        autocast = (
            (lambda: torch.autocast(device.type, dtype=dtype))
            if dtype is not None
            else contextlib.nullcontext
        )
        saved = {
            "model": model,
            "optimizer": optimizer,
            "scheduler": scheduler,
            "scaler": scaler,
            "n": n,
            "history": history,
        }
        loss_value: float | None = None
        last_t, last_samples = None, samples
        last_cpu = time.process_time()  # this rank's CPU seconds at last_t
        first_step_at = None
        cadence = Cadence(self.checkpoint_every, steps)
        status = "done"
        # An in-place resize's report (its event; the world before; when it was agreed on, and
        # when the communicator of the new size was set up), until the first step after it
        resized: tuple[str, dict[str, Any]] | None = None
        model.train()
        while True:
            keep: list[int] | None = None
            grow: GrowRequest | None = None
            for (batch, idx), local_batch in zip(plan(), batches, strict=True):
                if grads is not None:
                    grads.zero()
                else:
                    for p in params:
                        p.grad = None
                local = torch.zeros((), device=device)
                # With global batch norm every rank joins each step's collectives, with an empty
                # share if need be; without it an empty share skips the model.
                if len(idx) or synced:
                    local_batch = to_device(local_batch, device)
                    with autocast():
                        if task.step is not None:
                            ctx = StepContext(device, rank, world, batch, steps, samples)
                            local = task.step(model, local_batch, ctx)
                        else:
                            inputs, targets = local_batch
                            local = task.loss(model(inputs), targets)
                        local = local.float().sum()
                    scaler.scale(local / batch).backward()
                if grads is not None:
                    grads.allreduce(comm)
                if scaler.is_enabled():
                    scaler.unscale_(optimizer)
                if task.clip_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(params, task.clip_grad_norm)
                scaler.step(optimizer)
                scaler.update()
                if scheduler is not None:
                    scheduler.step()
                samples += batch
                steps += 1
                # One small Allreduce for the step's loss and for "has any rank been asked to
                # stop" and "... to resize".
                planned_resize = self.resize_at is not None and samples >= self.resize_at
                asked = [float(self.should_stop()), float(self.should_resize() or planned_resize)]
                shared = np.array([float(local.detach()), *asked])
                mine_stop = asked[0] > 0
                comm.Allreduce(MPI.IN_PLACE, shared, op=MPI.SUM)
                total_loss = loss_value = float(shared[0]) / batch
                stop, resize = shared[1] > 0, shared[2] > 0
                now = time.time()
                if first_step_at is None:
                    first_step_at = now
                    if rank == 0:
                        self.reports.emit(
                            ReportEvent.START,
                            world=world,
                            samples=samples,
                            resume_s=now - self.began,
                            process_started_at=self.started_at,
                            trainer_at=self.began,
                            loaded_at=loaded_at,
                            first_step_at=now,
                            stopped_at=stopped_at,
                            from_peer=from_peer and found is not None,
                        )
                    last_t, last_samples, last_cpu = now, samples, time.process_time()
                elif resized is not None:
                    if rank == 0:  # the first step at the new size, in the same processes
                        self.reports.emit(resized[0], world=world, samples=samples,
                                          first_step_at=now, **resized[1])  # fmt: skip
                    resized, last_t, last_samples = None, now, samples
                    last_cpu = time.process_time()
                elif rank == 0 and steps % self.report_every == 0:
                    rate = (samples - last_samples) / max(1e-9, now - last_t)
                    cpu = time.process_time()
                    # The cores this rank got (CPU ÷ wall seconds): where emulated nodes share
                    # cores, what a node could do in this span (Controller.efficiency).
                    share = (cpu - last_cpu) / max(1e-9, now - last_t)
                    self.reports.emit(
                        ReportEvent.STEP, world=world, samples=samples, rate=rate,
                        loss=total_loss, cpu_share=round(share, 4),
                    )  # fmt: skip
                    last_t, last_samples, last_cpu = now, samples, cpu
                every = task.evaluate_every
                if every and (samples - batch) // every != samples // every and samples < self.work:
                    self._evaluate(model, samples, history)
                    model.train()
                planned = self.stop_at is not None and samples >= self.stop_at
                if stop and not planned and samples < self.work:
                    keep = self._stays(world, int(round(shared[1])), mine_stop)
                    if keep is not None:
                        break  # the asked ranks leave in place; the others train on
                if (stop or planned) and samples < self.work:
                    status = "stopped"
                    break
                if cadence.due(steps, now):
                    self._save(saved, samples, steps, None)
                    cadence.saved(steps, now, time.time())
                if resize and samples < self.work:
                    self.resize_at = None
                    action = self._agree_resize(world, min(task.global_batch, n))
                    if action is None:
                        continue  # a stale request: dropped
                    if action == "stop":
                        status = "stopped"  # not possible in place: the executor restarts it
                    elif isinstance(action, GrowRequest):
                        grow = action
                    else:
                        keep = action
                    break
            if status != "done" or not (keep or grow):
                break
            batches.close()  # its loader's workers, if any, end with it
            times = {"previous_world": world, "agreed_at": time.time()}
            if grow is not None:
                # Grow in place: the joiners connect, and rank 0 sends them the state.
                comm = self.comm = join(grow.rendezvous, 0, grow.groups, base=comm)
                times["connected_at"] = time.time()
                share_cores(comm, resized=True)  # as the joiners do, right after they join
                state = self._state(saved, samples, steps, None) if rank == 0 else None
                self._grow_state(comm, state, joiner=False)
                self._check_same_model(params)  # on the grown communicator, with the joiners
            else:
                # Shrink in place: the kept ranks go on with everything in memory. Only rank 0
                # evaluates: its history goes to the rank that is rank 0 next.
                history[:] = comm.bcast(history if rank == 0 else None, root=0)
                comm = comm.Split(0 if rank in keep else MPI.UNDEFINED, key=rank)
                if comm == MPI.COMM_NULL:
                    status = "left"
                    break
                share_cores(comm, resized=True)
            times["resized_at"] = time.time()  # the new communicator, and the state shared
            resized = ("grown" if grow else "shrunk", times)
            self.comm, rank, world = comm, comm.rank, comm.size
            # One rank uses autograd's own gradients, as a fragment started at one rank.
            if world == 1:
                grads = None
            elif grads is None:
                grads = FlatGradients(params, device=device)
            if synced:
                set_comm(model, comm)
            batches = samples_of.batches(plan(), task.loader_workers, device.type == "cuda")
        if status == "left":
            return TrainOutcome(status, samples, steps, world, loss_value, None, {}, [], None)
        stopped = time.time() if status == "stopped" else None
        metrics: dict[str, float] = {}
        model_path = None
        if status == "done":
            metrics = self._evaluate(model, samples, history)
            if rank == 0 and task.save_model is not None:
                model_path = _save_model(model, Path(task.save_model))
        path = self._save(saved, samples, steps, stopped)
        if rank == 0:
            self.reports.emit(status, world=world, samples=samples, loss=loss_value)
        quiet_barrier(comm)
        return TrainOutcome(
            status,
            samples,
            steps,
            world,
            loss_value,
            path,
            metrics,
            list(history),
            model_path,
            loaded_samples,
        )

    def _stays(self, world: int, asked: int, mine: bool) -> list[int] | None:
        """After a step in which ``asked`` of the ``world`` ranks were asked to stop (``mine``:
        this one): the ranks that train on while the asked ones leave in place, when some were
        not asked and at least ``leave_min`` stay; None: every rank stops. A stop asked of
        some ranks only is their nodes going (a preemption signals only its own pilot's
        ranks): the others keep their state in memory instead of a checkpoint round trip.
        Collective on every rank (each knows ``asked`` from the step's Allreduce); rank 0's
        ``leave_min`` decides, so that every rank decides alike: the controller's rule
        (:func:`parsl_bf.decisions.trains_on_in_place`), in ranks."""
        if not trains_on_in_place(world - asked, asked, 1):  # alike on every rank: no collective
            return None
        gathered = self.comm.allgather((mine, self.leave_min))
        leave_min = gathered[0][1]
        keep = [r for r, (leaving, _) in enumerate(gathered) if not leaving]
        stays = trains_on_in_place(
            len(keep), world - len(keep), leave_min or 0, enabled=leave_min is not None
        )
        return keep if stays else None

    def _agree_resize(self, world: int, most: int) -> list[int] | GrowRequest | str | None:
        """Every rank takes (and clears) its resize request; rank 0's decides. The ranks to
        keep, or the grow to do; ``"stop"`` when it cannot be done in place; None for a
        request made for another world size (dropped). Joiners of a grow not done are told."""
        mine = self.take_resize(self.comm.rank == 0)
        request = self.comm.bcast(mine, root=0)
        if isinstance(request, GrowRequest):
            action = request.action(world, most)
            if action == "grow":
                return request
            if self.comm.rank == 0:
                refuse(request.rendezvous)
            return None if action == "drop" else "stop"
        kept = None if request is None else request.kept(world)
        return "stop" if kept == [] else kept

    def _grow_state(
        self, comm: MPI.Intracomm, state: dict[str, Any] | None, joiner: bool
    ) -> dict | None:
        """Over a grown communicator: rank 0 (a running rank, with its ``state``) sends it to
        the ranks that join now (``joiner``), which return it; collective on every rank. (A
        rank that joined at an earlier grow is a running rank at this one.) Broadcast among
        rank 0 and the joiners only (the running ranks hold the state already): first its
        form (``weights_only`` to read), then each tensor's bytes straight into the tensor
        the joiner allocated for it (:func:`~parsl_bf.training.checkpoint.state_parts`)."""
        sub = comm.Split(0 if comm.rank == 0 or joiner else MPI.UNDEFINED, key=comm.rank)
        if sub == MPI.COMM_NULL:
            return None
        try:
            form, data = state_parts(state) if sub.rank == 0 and state is not None else (b"", [])
            size = sub.bcast(len(form), root=0)
            if sub.rank != 0:
                form = bytearray(size)
            sub.Bcast([form, MPI.BYTE], root=0)
            if joiner:
                state, data = state_from_parts(form)
            for part in data:  # the same tensors in the same order on every rank
                if part.size:
                    sub.Bcast([part, MPI.BYTE], root=0)
            return state if joiner else None
        finally:
            sub.Free()

    def _evaluate(
        self, model: torch.nn.Module, samples: int, history: list[dict[str, float]]
    ) -> dict[str, float]:
        """Rank 0 evaluates (if the task can); the metrics join the history and the reports."""
        if self.comm.rank != 0 or self.task.evaluate is None:
            return {}
        model.eval()
        with torch.no_grad():
            metrics = self.task.evaluate(model)
        if not isinstance(metrics, dict):
            raise TrainingInputError(
                f"evaluate: returned {type(metrics).__name__}, not a dict of metrics"
            )
        metrics = {k: float(v) for k, v in metrics.items()}
        if not history or history[-1].get("samples") != samples:
            history.append({"samples": samples, **metrics})
            self.reports.emit(ReportEvent.EVAL, samples=samples, metrics=metrics)
        return metrics

    def _save(self, saved: dict[str, Any], samples: int, steps: int, stopped_at: float | None):
        if self.comm.rank != 0:
            return None
        state = self._state(saved, samples, steps, stopped_at)
        # A stop's checkpoint goes to a warm successor first, if one listens (.handover).
        handover = stopped_at is not None
        return str(save_checkpoint(self.checkpoint_dir, state, samples, handover=handover))

    def _state(
        self, saved: dict[str, Any], samples: int, steps: int, stopped_at: float | None
    ) -> dict[str, Any]:
        """Everything a fragment's ranks hold: what a checkpoint stores, and a joiner gets."""
        scheduler, scaler = saved["scheduler"], saved["scaler"]
        state: dict[str, Any] = {
            "model": saved["model"].state_dict(),
            "optimizer": saved["optimizer"].state_dict(),
            "scheduler": None if scheduler is None else scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler.is_enabled() else None,
            "user_state": {k: obj.state_dict() for k, obj in self.task.state.items()},
            "metrics_history": list(saved["history"]),
            "samples": samples,
            "steps": steps,
            "epoch": samples // saved["n"],
            "rng": rng_state(),
            "stopped_at": stopped_at,
            "pid": os.getpid(),
        }
        return state


def _save_model(model: torch.nn.Module, path: Path) -> str:
    """The model's state dict (on the CPU) at ``path``, written atomically; its absolute path."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return str(save_atomically(state, path.expanduser().resolve()))
