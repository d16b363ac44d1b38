"""A fragment's rank: ``python -m parsl_bf.training.worker`` under ``mpiexec``.

    mpiexec -n 2 python -m parsl_bf.training.worker --task parsl_bf.training.examples:digits_cnn \
        --work 20000 --checkpoint-dir ckpt/ --report progress.jsonl --result result.json

SIGTERM or SIGUSR1 (preemption, or a rescale decided by the executor) makes every rank finish
its step, checkpoint and exit 0 with ``"status": "stopped"`` in the result file; starting the
same command again, at any world size, continues from the checkpoint. With ``--leave-min K``, a
signal to some ranks only (a preemption of their pilot) makes them leave in place when at least
K ranks were not signalled: those train on in memory, as at a shrink. A request written to the
``--resize`` file (:mod:`.resize`) resizes the fragment in place. At a shrink the ranks it keeps
train on in memory at the new size and the others exit 0 at once (the lowest rank kept is rank
0 from then on, and writes the result file). At a grow, joiner ranks started with ``--join DIR
--group g --groups G`` (after they said ``--ready``) connect and receive the state from rank 0.
A task's own training loop takes a request as a stop, and its stopped result says
``"resizes_in_place": false`` so that the executor asks it for no more. A rescale
is fastest as a warm start: launch the new size with ``--after OLD_RESULT`` (at the decision,
or earlier as a standby that reports ``--ready``), then signal the old ranks; the new ranks
import torch and build the model before the old ones stop, and take over from their
checkpoint.
Ranks of several launchers form one fragment with ``--rendezvous DIR --group g --groups G``.
Exit codes: 0 done or stopped, 2 bad input (message on stderr). A rank ends without the
interpreter's teardown (:func:`exit_now`): its files are written by then, and tearing torch
down would hold the node's cores for most of a second while the successor starts there.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib
import io
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from . import elastic, handover
from .checkpoint import CheckpointError
from .rendezvous import RendezvousError, join, refuse
from .reports import ReportSink, write_result
from .resize import GrowRequest, ShrinkRequest, read_request, ready_file
from .trainer import (
    ElasticTrainer,
    TrainingInputError,
    TrainingTask,
    TrainOutcome,
    share_cores,
)

__all__ = ["exit_code", "exit_now", "infrastructure_failure", "main", "load_task", "run"]


def load_task(spec: str, options: dict) -> Any:
    """Call ``module:function`` with ``options`` (``@FILE``: a function call packed by Parsl,
    ``pack_apply_message``, e.g. an app's own function and arguments). It returns a
    :class:`TrainingTask` for the trainer to run, or it is a loop that trained by itself with
    :mod:`parsl_bf.training.elastic` (in the session the worker opened) and returns anything."""
    if spec.startswith("@"):
        from parsl.serialize import unpack_apply_message

        try:
            func, args, kwargs = unpack_apply_message(Path(spec[1:]).read_bytes())
        except (OSError, Exception) as exc:
            raise TrainingInputError(f"task {spec!r}: {exc}") from None
        kwargs.pop("parsl_resource_specification", None)
        return func(*args, **{**kwargs, **options})
    module, _, name = spec.partition(":")
    if not name:
        raise TrainingInputError(f"task {spec!r}: expected module:function")
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise TrainingInputError(f"task {spec!r}: {exc}") from None
    return factory(**options)


def _process_started_at() -> float | None:
    """Wall-clock start of this process (Linux), to report how long start-up took."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            int(x.split()[1])
            for x in Path("/proc/stat").read_text().splitlines()
            if x.startswith("btime")
        )
    except (OSError, ValueError, StopIteration, IndexError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


#: Seconds between two looks for a resize request.
RESIZE_POLL_S = 0.05


class ResizePoll:
    """Whether a resize request is in ``path`` (looked at every :data:`RESIZE_POLL_S` at most),
    and taking it: rank 0 reads and removes it, the others just stop asking."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.seen, self.next = path, False, 0.0

    def asked(self) -> bool:
        now = time.monotonic()
        if self.path is not None and now >= self.next:
            self.seen, self.next = self.path.exists(), now + RESIZE_POLL_S
        return self.seen

    def take(self, read: bool) -> ShrinkRequest | GrowRequest | None:
        self.seen, self.next = False, 0.0
        if not read or self.path is None or not self.path.exists():
            return None
        request = read_request(self.path)  # unreadable: keeps no rank, a stop
        with contextlib.suppress(OSError):
            self.path.unlink()  # taken: the one who asked sees it go
        return request


class StoppedInStandby(Exception):
    """Asked to stop while waiting for ``--after``: nothing was loaded or trained."""


class NotTakenIn(Exception):
    """A joiner that the running fragment did not take in (:mod:`.resize`): it leaves."""


def _standby(
    comm: MPI.Comm,
    ready: Path | None,
    after: Path | None,
    timeout: float,
    should_stop=lambda: False,
    receiver: handover.Receiver | None = None,
) -> handover.Receiver | None:
    """Tell (``ready``) that every rank is set up, then wait until ``after`` exists or every
    rank's ``receiver`` has the state the previous fragment sent (:mod:`.handover`).

    The ranks decide together (one tiny Allreduce per poll) whether to go on or to stop, so
    none is left in a collective that the others never reach. Returns ``receiver``, for the
    checkpoint's load to use (and close)."""
    if ready is not None:
        comm.Barrier()
        if comm.rank == 0:
            ready.parent.mkdir(parents=True, exist_ok=True)
            ready.touch()
    deadline = time.monotonic() + timeout
    while after is not None:
        waiting = receiver is None or not receiver.got
        mine = np.array([float(not after.exists()), float(should_stop()), float(waiting)])
        comm.Allreduce(MPI.IN_PLACE, mine, op=MPI.MAX)
        if mine[1]:
            raise StoppedInStandby
        if not mine[0] or not mine[2]:
            return receiver
        if time.monotonic() > deadline:
            raise TrainingInputError(f"--after {after}: not there after {timeout:.0f} s")
        time.sleep(0.01)
    return receiver


def _loop_outcome(loop: elastic.Session) -> TrainOutcome:
    """A loop's outcome: it trained to its end (done) or was stopped between two steps."""
    if loop.status == "done" and loop.checkpoint_dir is not None and loop.state is not None:
        loop.save_checkpoint()  # the final state, for a run started again by mistake
    if loop.comm.rank == 0:
        loop.reports.emit(loop.status, world=loop.comm.size, samples=loop.samples)
    history = loop.metrics_history
    metrics = {k: v for k, v in history[-1].items() if k != "samples"} if history else {}
    return TrainOutcome(
        loop.status,
        loop.samples,
        loop.steps,
        loop.comm.size,
        loop.loss,
        loop.checkpoint,
        metrics,
        list(history),
        loop.model_path,
    )


def _steps(text: str) -> int:
    """A positive step count (argparse's type for ``--checkpoint-every``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of steps")
    return value


def main(argv: list[str] | None = None, started_at: float | None = None) -> int:
    """Run one rank; ``started_at``: when this rank's start began, if not at the process's
    start (a warm standby that took the job then, :mod:`.standby`)."""
    ap = argparse.ArgumentParser(prog="parsl_bf.training.worker", description=__doc__)
    ap.add_argument(
        "--task", required=True, help="module:function returning a TrainingTask, or @FILE"
    )
    ap.add_argument("--options", default="{}", help="JSON keyword arguments for the task")
    ap.add_argument("--work", type=int, required=True, help="samples to train in total")
    ap.add_argument("--checkpoint-dir", type=Path, required=True)
    ap.add_argument(
        "--checkpoint-every",
        type=_steps,
        help="steps between checkpoints (default: every 20 steps, but at most 2 %% of the time "
        "spent writing them)",
    )
    ap.add_argument("--report", type=Path, help="progress report file (JSON lines)")
    ap.add_argument("--result", type=Path, help="result file written by rank 0 (JSON)")
    ap.add_argument("--rendezvous", type=Path, help="directory shared by the groups")
    ap.add_argument("--group", type=int, default=0)
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument(
        "--after",
        type=Path,
        help="warm start: get ready, then wait for this file (the previous run's "
        "result) before reading the checkpoint",
    )
    ap.add_argument("--after-timeout", type=float, default=600.0, help="seconds to wait for it")
    ap.add_argument(
        "--ready",
        type=Path,
        help="file to create once every rank has imported and built its model "
        "(a standby fragment is then ready to take over)",
    )
    ap.add_argument(
        "--handover",
        choices=handover.MODES,
        default="auto",
        help="with --after: take the previous run's state from its ranks over the network "
        "when they send it, else from its checkpoint file (peer); only from the file (file); "
        "peer where the checkpoint directory is on a network file system, else file (auto, "
        "the default)",
    )
    ap.add_argument(
        "--resize",
        type=Path,
        help="once a request appears in this file (parsl_bf.training.resize), resize in place "
        "with the state in memory: keep the ranks it names and let the others leave, or take "
        "in the joiners of its rendezvous; rank 0 removes it",
    )
    ap.add_argument(
        "--resize-at",
        type=int,
        help="look for the --resize request once this many samples are done (tests, "
        "benchmarks: a resize at an exact step)",
    )
    ap.add_argument(
        "--join",
        type=Path,
        help="a joiner: join the running fragment (group 0) as group --group of --groups "
        "through this rendezvous directory once it takes a grow request, and receive its "
        "state; says it is set up in ready.<group> there (unless --ready names a file)",
    )
    ap.add_argument(
        "--leave-min",
        type=int,
        help="a SIGTERM or SIGUSR1 to some ranks only (a preemption of their pilot) lets them "
        "leave in place when at least this many ranks were not signalled: those train on in "
        "memory; without it (and with fewer), every rank checkpoints and stops",
    )
    ap.add_argument(
        "--stop-at",
        type=int,
        help="checkpoint and stop (status stopped) once this many samples are done: a planned "
        "rescale at an exact step (tests, benchmarks)",
    )
    args = ap.parse_args(argv)
    started = started_at if started_at is not None else _process_started_at()

    stop = {"asked": False}

    def ask_stop(signum, frame) -> None:  # checked between steps
        stop["asked"] = True

    signal.signal(signal.SIGTERM, ask_stop)
    signal.signal(signal.SIGUSR1, ask_stop)
    # Not a signal: mpiexec dies of SIGUSR2, and a cold launch's ranks are reached only
    # through it. The file is on the checkpoints' (shared) file system; looked for at most
    # every RESIZE_POLL_S, since a stat per step would load a parallel file system.
    resize = ResizePoll(args.resize)
    resize_asked = (lambda: False) if args.resize_at is not None else resize.asked
    joining = args.join is not None
    if args.groups > 1 and not joining:
        comm = join(args.rendezvous, args.group, args.groups)
    else:
        comm = MPI.COMM_WORLD
    share_cores(comm)
    # Every rank may write reports: whichever is rank 0 does (after a shrink in place that
    # let the first rank go, another one is).
    reports = ReportSink(args.report)

    # A warm successor listens for the previous run's state before it says it is ready.
    peer = args.after is not None and handover.use_peer(args.handover, args.checkpoint_dir)
    receiver = handover.Receiver(args.checkpoint_dir, comm.rank) if peer else None

    ready = ready_file(args.join, args.group) if joining and not args.ready else args.ready

    def before_load() -> handover.Receiver | None:
        return _standby(
            comm, ready, args.after, args.after_timeout, lambda: stop["asked"], receiver
        )

    def join_grown(base: MPI.Intracomm) -> MPI.Intracomm:
        """A joiner's wait for its turn, and the grown fragment's communicator."""
        should_stop = lambda: stop["asked"]  # noqa: E731
        try:
            return join(args.join, args.group, args.groups, args.after_timeout, base, should_stop)
        except RendezvousError as exc:  # refused, stopped or timed out before its turn
            raise NotTakenIn(str(exc)) from None

    def loop_before_load() -> handover.Receiver | None:
        received = before_load()
        if joining:
            # A task's own loop cannot take joiners in: its fragment stops at the request and
            # refuses them. This rank waits for that, and leaves without training.
            join_grown(comm)
            raise NotTakenIn(f"{args.task}: a training loop does not grow in place")
        return received

    trainer = task = None
    own_loop = False  # the task trained with a loop of its own: it cannot resize in place
    try:
        with elastic.session(
            comm=comm,
            checkpoint_dir=args.checkpoint_dir,
            work=args.work,
            checkpoint_every=args.checkpoint_every,
            reports=reports,
            # A loop of the task's own cannot resize in place: a request is a stop for it.
            should_stop=lambda: stop["asked"] or resize_asked(),
            before_load=loop_before_load,
            stop_at=args.stop_at,
            started_at=started,
        ) as loop:
            try:
                task = load_task(args.task, json.loads(args.options))
            except elastic.Stopped:
                task = None
            except StoppedInStandby:
                task, loop.used, loop.status = None, True, "stopped"
        if loop.used and not isinstance(task, TrainingTask):  # a training loop, and it ran
            outcome = _loop_outcome(loop)
            own_loop = True
        elif not isinstance(task, TrainingTask):
            raise TrainingInputError(
                f"task {args.task!r}: returned {type(task).__name__}, not a TrainingTask "
                "(nor trained with parsl_bf.training.elastic)"
            )
        else:
            trainer = ElasticTrainer(
                task,
                comm,
                args.checkpoint_dir,
                args.work,
                checkpoint_every=args.checkpoint_every,
                reports=reports,
                should_stop=lambda: stop["asked"],
                started_at=started,
                before_load=before_load,
                stop_at=args.stop_at,
                should_resize=resize_asked,
                take_resize=resize.take,
                resize_at=args.resize_at,
                join=join_grown if joining else None,
                leave_min=args.leave_min,
            )
            try:
                outcome = trainer.run()
                comm = trainer.comm  # resized in place, or joined
            except StoppedInStandby:
                outcome = TrainOutcome("stopped", 0, 0, comm.size, None, None)
    except (TrainingInputError, CheckpointError, json.JSONDecodeError) as exc:
        # Raised on every rank alike (the checks are collective): a clean exit.
        if comm.rank == 0:
            print(f"parsl_bf.training.worker: error: {exc}", file=sys.stderr)
            _error_result(args.result, f"{type(exc).__name__}: {exc}")
        return 2
    except NotTakenIn:
        # A joiner that was not taken in (the grow was not done in place) has nothing to do.
        outcome = TrainOutcome("left", 0, 0, comm.size, None, None)
    except BaseException as exc:
        # Anything else may have hit one rank only; the others would wait in a collective
        # for ever. Abort the whole fragment. An exception of the task's own code is its
        # failure (the result says so, with the traceback); out of memory or an MPI error (a
        # peer that died) is the node's, and like a crash it resumes from the last checkpoint.
        traceback.print_exc()
        sys.stderr.flush()
        if isinstance(exc, Exception) and not infrastructure_failure(exc):
            _error_result(args.result, traceback.format_exc())
        MPI.COMM_WORLD.Abort(1)
        raise
    finally:
        if receiver is not None:
            receiver.close()  # idempotent: the load closed it, unless it never came to that
    if comm.rank == 0 and outcome.status != "left":
        # A grow asked too late for this fragment: its joiners are told, and leave.
        pending = resize.take(True)
        if isinstance(pending, GrowRequest):
            refuse(pending.rendezvous)
    if outcome.status == "left":
        # In one mpiexec world MPICH's MPI_Finalize waits for every rank: give back what this
        # rank held before it waits (each rank its own mpiexec, as the executor launches
        # them, exits at once).
        del trainer, task
        gc.collect()
        cuda = getattr(sys.modules.get("torch"), "cuda", None)
        if cuda is not None and cuda.is_available():
            cuda.empty_cache()
    elif comm.rank == 0 and args.result:
        result = asdict(outcome)
        if own_loop and outcome.status == "stopped":
            # Whatever stopped it, an in-place resize would have too: the controller then asks
            # for none again (parsl_bf.decisions.trains_on_in_place's task_resizes).
            result["resizes_in_place"] = False
        write_result(args.result, result)
    return 0


def _error_result(path: str | None, error: str) -> None:
    """The fragment's result when the task's own code failed: ``status`` ``error``."""
    if path:
        with contextlib.suppress(OSError):  # a full disk: the exit code still tells
            write_result(Path(path), {"status": "error", "samples": 0, "error": error})


def infrastructure_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the node's or the network's, not the task's code's: out of memory,
    or an MPI error (a peer rank died mid-collective, and MPICH told this rank before
    ``mpiexec`` killed it). Such a fragment resumes from its last checkpoint like a crash;
    anything else is the task's own failure."""
    cuda_oom = getattr(getattr(sys.modules.get("torch"), "cuda", None), "OutOfMemoryError", None)
    if isinstance(exc, MemoryError | MPI.Exception):
        return True
    return cuda_oom is not None and isinstance(exc, cuda_oom)


#: Buffered writers a rank may hold open (the user's own files): flushed by :func:`exit_now`.
_WRITERS = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)


def exit_now(code: int, release: Callable[[int], None] | None = None) -> NoReturn:
    """End this rank at once, without the interpreter's teardown; ``release(code)`` last, just
    before the exit (a rank forked from a warm host hands its code to its relay).

    With torch loaded, the teardown (freeing every module and object) takes about 0.7 s of CPU
    here, against under 0.1 s for this. At a rescale or a restart that is time on the very
    cores where the successor's first steps run. What the teardown would still have done that
    matters is done here: every open buffered file is flushed (a task's own log, say), the
    ``atexit`` handlers run (the user's, logging's flush, mpi4py's ``MPI_Finalize``), and
    standard output and error are flushed. The result, the checkpoint and the report lines are
    on disk before this."""
    for obj in gc.get_objects():
        if type(obj) in _WRITERS:  # not isinstance: ABC checks on 300k objects are slow
            with contextlib.suppress(Exception):
                if not obj.closed and obj.writable():
                    obj.flush()
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    with contextlib.suppress(Exception):
        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if release is not None:
        with contextlib.suppress(Exception):
            release(code)
    os._exit(code)


def exit_code(entry, *args, **kwargs) -> int:
    """``entry(...)``'s return value; a ``SystemExit`` (argparse's) gives its code as usual."""
    try:
        return entry(*args, **kwargs)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1


def run(entry, *args, **kwargs) -> NoReturn:
    """``exit_now(entry(...))``, the code as :func:`exit_code` gives it."""
    exit_now(exit_code(entry, *args, **kwargs))


if __name__ == "__main__":
    run(main)
