"""``BackfillExecutor``: a Parsl executor that packs elastic training fragments onto pilots.

It owns pilots from a backfill provider (Parsl's block scaling asks for them while tasks want
nodes and releases them when idle). Each pilot runs :mod:`parsl_bf.pilot.agent`, which
registers over an authenticated ZeroMQ channel (:mod:`parsl_bf.executor.channel`).

The executor is the I/O shell around the decision core
(:class:`~parsl_bf.executor.controller.Controller`). One decision thread drains what arrived
(channel messages, submissions), turns it into :mod:`~parsl_bf.executor.lifecycle` events
(reading the files a process left: a fragment's result, a plain app's outcome, progress
reports, ready files), hands the whole batch to the controller, and carries out the commands
it returns: fragment ranks started on pilots (``mpiexec … python -m
parsl_bf.training.worker``, one launcher per pilot joined by the rendezvous), signals, plain
apps run by :mod:`parsl_bf.pilot.runner`, futures set, the event log and ``status.json``.

**Faults of the shell's own I/O** (a full disk). Each command is carried out on its own: one
that raises is logged and the others are still carried out. A task's future is set even when
its ``outcome.json`` cannot be written (only a rerun's shortcut is lost), and the event log
and ``status.json`` drop what they cannot write. A launch that failed here is reported to the
controller as its processes' exits with
:data:`~parsl_bf.executor.lifecycle.LAUNCH_FAILED` (its groups already sent are KILLed): a
fragment restarts from its checkpoint at most ``max_restarts`` times, then fails; a plain app
fails with the error. So does a plain app whose runner could not write its outcome
(:func:`~parsl_bf.pilot.outcome.no_outcome_error`: ``[Errno 28] No space left on device``)
or which could not be launched on its pilot, rather than running again forever.

Tasks are ordinary Parsl apps. An app whose ``parsl_resource_specification`` has ``work`` is an
elastic training task: ``task`` names a ``module:function`` returning a
:class:`~parsl_bf.training.TrainingTask` (called with ``options``), or, without ``task``, the
app's own function (with its arguments) is that factory. Its future resolves with the final
:class:`~parsl_bf.training.trainer.TrainOutcome` as a dict. Other apps run as one process on
one node. Preemption never fails a task: fragments resume from their checkpoint, plain apps
run again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import re
import shlex
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parsl.executors.errors import BadStateException
from parsl.executors.status_handling import BlockProviderExecutor
from parsl.monitoring.radios.base import RadioConfig
from parsl.monitoring.radios.filesystem import FilesystemRadio
from parsl.providers.base import ExecutionProvider
from parsl.serialize import pack_apply_message
from parsl.utils import RepresentationMixin
from pydantic import ValidationError

from .. import environment
from ..allocation import AllocatorSettings
from ..checks import SettingError, check_count
from ..decisions import leaving_reason
from ..pilot import outcome as runner
from ..pilot.outcome import RunnerError, no_outcome_error, read_outcome
from ..pilot.wire import AGENT_MODULE, RANKS_KEY, Refused, standbys_for, write_secret
from ..training.command import MPIEXEC, mpiexec_argv, worker_argv
from ..training.reports import ReportTail, write_result
from ..training.resize import GrowRequest, ShrinkRequest
from . import channel
from .channel import PilotServer
from .controller import Controller, ElasticTask, PlainTask
from .events import EventLog
from .lifecycle import (
    DECISIONS,
    Command,
    Evaluated,
    Event,
    Fail,
    FragmentOver,
    FragmentReady,
    FragmentStarted,
    GrowFragment,
    LaunchFailed,
    MarkLost,
    Note,
    Outlook,
    PilotGone,
    PilotLeaving,
    PilotUp,
    ProcessExited,
    Progress,
    RankGroup,
    Rescaled,
    Resolve,
    RunPlain,
    ShrinkFragment,
    Signal,
    Solved,
    StartFragment,
    TaskDir,
    TaskSubmitted,
    Tick,
    WriteStatus,
    fragment_key,
    launch_failed,
    parse_key,
    plain_key,
)

__all__ = ["BackfillExecutor", "FragmentFailed", "ELASTIC_KEYS"]

log = logging.getLogger(__name__)

#: Keys of ``parsl_resource_specification`` an elastic training task may use.
ELASTIC_KEYS = frozenset(
    {"work", "min_nodes", "max_nodes", "scaling", "rescale_s", "task", "options", "name"}
)

# Deadlines, progress reports and ready files are looked at this often.
TICK_S = 1.0
#: Event-log notes also logged as warnings: a launch given up, a fragment that failed.
WARNED_NOTES = ("fragment_start_timeout", "fragment_failed", "task_failed")
#: How often a warm successor's ready file is looked for between ticks (a ready standby rank
#: is set up in a fraction of a second, and its predecessor trains on until it is seen).
READY_POLL_S = 0.02


class FragmentFailed(RuntimeError):
    """A training task's ranks failed by themselves (not by a preemption or a rescale)."""


@dataclass
class _Submission:
    future: Future
    directory: TaskDir
    key: str | None = None  # an elastic task's checkpoint key, while it is live
    # An elastic task's worker: its TrainingTask factory, work (samples) and options.
    trainer: tuple[str, int, dict[str, Any]] | None = None


class BackfillExecutor(BlockProviderExecutor, RepresentationMixin):
    """Runs Parsl apps on backfill pilots, elastic training tasks resized by the allocator.

    Parameters
    ----------
    label : str
        The executor's label.
    provider : ExecutionProvider
        A backfill provider (``LocalBackfillProvider``, ``SlurmBackfillProvider``, …).
    allocator : AllocatorSettings or dict
        The settings (:class:`~parsl_bf.allocation.AllocatorSettings`, whose defaults are
        the replay's too): the allocation policy, ``policy`` (``milp``), ``objective``
        (``speedup_balanced``), ``tfwd`` (120 s; or ``auto``: the median walltime of the
        pilots so far, i.e. of the holes) and the solver's ``time_limit``; and whether
        fragments resize in place, ``shrink_in_place`` and ``grow_in_place`` (True; only
        with ``warm_ranks``). In YAML, an ``allocator:`` mapping under the executor. The
        replay takes the same settings.
    max_tasks : int
        The most elastic tasks running at once (first come first served).
    checkpoint_every : int or None
        Training steps between checkpoints: what a preemption without notice can lose. None
        (the default): every 20 steps, but never more than 2 % of the time spent writing
        checkpoints (:class:`parsl_bf.training.checkpoint.Cadence`), so that fast steps do not
        checkpoint many times a second and slow-to-save models do not spend their holes
        saving; a preemption then loses at most the longer of 20 steps and 50 × one
        checkpoint's duration.
    checkpoint_dir : str or None
        Where elastic tasks keep their checkpoints, one directory per task key, so that a rerun
        of the workflow after a crash of the driver continues each unfinished task from its
        checkpoint and resolves each finished one from its ``outcome.json`` without training.
        A task's key is its ``name`` (resource specification, ``elastic_app(name=...)``), else
        a digest of its training code, options, work and arguments, as Parsl's memoization
        computes them. None: ``checkpoints/<label>`` beside the run directories (``runinfo/``).
        A task submitted again under its name with more ``work`` than its outcome says it did
        trains on from its checkpoint (a search that sends a trial on to a larger budget).
    max_restarts : int
        Restarts of a task's fragments from its checkpoint after failures that are not the
        task's own (a crashed rank, a lost node, out of memory) before its future fails; no
        Parsl retry is spent on them. An exception in the task's own code fails it at once.
    min_node_life_s : float or None
        Nodes whose pilot ends sooner are not offered to elastic tasks; None: twice the
        rescale cost guess. 0 is the paper's model (every node is worth taking).
    walltime_notice_s : float
        A pilot this close to its end is treated as leaving: its fragments checkpoint and stop.
        The most: once the tasks running on a pilot (or their families) have stopped before,
        the notice is twice their longest recent stop plus 0.25 s (a digits fragment: under
        0.5 s), so that a hole is not cut short by more than a stop needs
        (:data:`parsl_bf.executor.controller.NOTICE_MARGIN`).
    rescale_s : float
        Guess of a rescale's cost until one is measured.
    warm_ranks : bool
        Once there is training to do, each pilot's agent keeps one standby rank per node
        (:mod:`parsl_bf.pilot.standby`: torch imported, MPI up, first optimizer step done)
        and fragments start on them instead of starting processes: a start, a restart and a
        rescale skip the seconds of a rank's start-up. Every rank of a fragment is then an MPI
        job of its own, joined to the others by the rendezvous. False: one ``mpiexec`` per
        pilot, started at the decision.
    warm_rescale : bool
        Start a rescaled fragment's successor while the fragment still trains, and stop the
        fragment once the successor has imported and built its model (when the nodes the
        successor adds are free). False: stop first, then start the new size.
    heartbeat_timeout_s : float
        A pilot silent this long is considered gone.
    start_timeout_s : float
        A fragment whose ranks have not all started training this long after its launch (or
        four times the task's longest measured start, when longer) is stopped, logged and
        restarted as after a crashed rank (a restart, out of ``max_restarts``); then the
        task's future fails with an error that names the pilots, the hosts and the ranks'
        last lines. A launch that cannot start (job steps that never get their CPUs, ranks
        that cannot reach each other) never hangs.
    mpiexec : str
        The MPI launcher for fragment ranks (default: the one next to this Python).
    mpi_hosts : bool
        Pass the pilot's hosts to ``mpiexec -hosts`` (real multi-node pilots; the local
        emulation and the loopback cluster run every rank on this machine).
    address : str
        Where pilots reach the executor.
    block_error_handler : bool or callable
        As for Parsl's executors; True (the default) is a
        :class:`~parsl_bf.providers.BackfillErrorHandler`: preempted and walltime-ended pilots
        are not failures, three failed pilot starts in a row fail every outstanding task.
    remote_monitoring_radio
        As for Parsl's executors; monitoring messages of apps travel through the shared file
        system by default (``FilesystemRadio``).
    """

    #: The executor writes its own ``status.json`` (with the error handler's blocks in it).
    writes_status = True

    def __init__(
        self,
        label: str = "backfill",
        provider: ExecutionProvider | None = None,
        *,
        allocator: AllocatorSettings | dict[str, Any] | None = None,
        max_tasks: int = 10,
        checkpoint_every: int | None = None,
        checkpoint_dir: str | None = None,
        max_restarts: int = 3,
        min_node_life_s: float | None = None,
        walltime_notice_s: float = 5.0,
        rescale_s: float = 10.0,
        warm_rescale: bool = True,
        warm_ranks: bool = True,
        heartbeat_timeout_s: float = 15.0,
        start_timeout_s: float = 120.0,
        mpiexec: str | None = None,
        mpi_hosts: bool = False,
        address: str = "127.0.0.1",
        block_error_handler: bool | Callable = True,
        remote_monitoring_radio: RadioConfig | None = None,
    ) -> None:
        from ..providers import BackfillErrorHandler, LocalBackfillProvider

        if provider is None:
            provider = LocalBackfillProvider()
        if block_error_handler is True:
            block_error_handler = BackfillErrorHandler()
        super().__init__(provider=provider, block_error_handler=block_error_handler)
        self.label = label
        # Apps run in processes on the pilots, which share the run directory's file system.
        self.remote_monitoring_radio = remote_monitoring_radio or FilesystemRadio()
        self.allocator = allocator_settings(allocator)
        if checkpoint_every is not None:
            checkpoint_every = check_count("checkpoint_every", checkpoint_every)
        self.max_tasks, self.checkpoint_every = max_tasks, checkpoint_every
        self.checkpoint_dir, self.max_restarts = checkpoint_dir, max_restarts
        self.min_node_life_s = min_node_life_s
        self.walltime_notice_s, self.rescale_s = walltime_notice_s, rescale_s
        self.warm_rescale, self.warm_ranks = warm_rescale, warm_ranks
        # (task, generation) → its live launchers' (first rank, ranks), by placement group,
        # numbered as the fragment's ranks are now (an in-place resize renumbers them)
        self._rank_ranges: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}
        # task → when its in-place resize began (a shrink's request, a grow's decision)
        self._resize_asked: dict[str, float] = {}
        # (task, generation) → the grow request to write once all its joiners are set up,
        # and where
        self._grows: dict[tuple[str, int], tuple[GrowRequest, Path]] = {}
        self._warmed: set[str] = set()  # pilots asked for standby ranks
        self._training = False  # an elastic task was submitted: standbys are worth their cost
        self._held_until: float | None = None  # the error handler's hold last logged
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.start_timeout_s = start_timeout_s
        self.mpiexec = mpiexec or MPIEXEC
        self.mpi_hosts, self.address = mpi_hosts, address
        # In place only where each rank is its own MPI job (warm ranks): one that leaves exits
        # at once (in one mpiexec world, MPICH keeps a rank that left until all have).
        settings = self.allocator
        if not warm_ranks:
            off = {"shrink_in_place": False, "grow_in_place": False}
            settings = settings.model_copy(update=off)
        # The hand-over deadline is the controller's default.
        self.controller = Controller(
            allocator=settings,
            max_tasks=max_tasks,
            min_node_life_s=2 * rescale_s if min_node_life_s is None else min_node_life_s,
            warm_rescale=warm_rescale,
            walltime_notice_s=walltime_notice_s,
            # Ranks blocked on a peer that died with its pilot: killed after this.
            stop_grace_s=max(30.0, 3 * heartbeat_timeout_s),
            start_timeout_s=start_timeout_s,
            max_restarts=max_restarts,
            # Emulated nodes share this machine's cores: count what a node can do there.
            shared_cores=_cores() if getattr(provider, "emulated", False) else None,
        )
        # What arrived for the decision thread: (when, channel event or lifecycle event).
        self._inbox: queue.Queue[tuple[float, object]] = queue.Queue()
        self._lock = threading.Lock()  # the controller's state, read by outstanding()
        self._submissions: dict[str, _Submission] = {}
        self._keys: set[str] = set()  # checkpoint keys of this run's elastic tasks
        self._reports: dict[str, ReportTail] = {}  # task → its progress.jsonl, read so far
        self._ready: dict[tuple[str, int], Path] = {}  # warm successors' ready files to watch
        self._live: set[tuple[str, int]] = set()  # fragments started and not yet over
        # The controller's latest Outlook: what this shell acts on between its batches.
        self._outlook = Outlook(0, None, 0)
        self._count = 0
        # (pilot, process key) of each launch sent while carrying out the current command: a
        # launch command that fails half-way KILLs these (:meth:`_not_carried_out`)
        self._sent: list[tuple[str, str]] = []
        # (task, generation) → why its launch failed here, for the error that fails the task
        self._launch_errors: dict[tuple[str, int | None], str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.server: PilotServer | None = None
        # Every emulated node is this machine: each rank gets one thread, not the node's cores.
        self._emulated = bool(getattr(provider, "emulated", False))
        self.event_log: EventLog | None = None

    @property
    def preemptions(self) -> int:
        """Pilots preempted so far (not those Parsl's scaling cancelled)."""
        return self._outlook.preemptions

    # --- Parsl's executor interface ---------------------------------------------------------

    def start(self) -> None:
        self.directory = Path(self.run_dir) / self.label
        self.directory.mkdir(parents=True, exist_ok=True)
        self.checkpoint_root = Path(
            self.checkpoint_dir or Path(self.run_dir).parent / "checkpoints" / self.label
        ).absolute()
        self.provider.script_dir = str(self.directory / "submit_scripts")
        Path(self.provider.script_dir).mkdir(exist_ok=True)
        # Our log lines go next to Parsl's, not to the terminal.
        self._log_handler = logging.FileHandler(self.directory / "executor.log")
        self._log_handler.setFormatter(
            logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s")
        )
        package_log = logging.getLogger("parsl_bf")
        package_log.addHandler(self._log_handler)
        package_log.setLevel(min(package_log.getEffectiveLevel(), logging.INFO))
        self.secret_file = self.directory / "pilot.secret"
        secret = write_secret(self.secret_file)
        self.event_log = EventLog(self.directory / "events.jsonl", self.directory / "status.json")
        self.server = PilotServer(secret, self._arrived, self.address, self.heartbeat_timeout_s)
        self.server.start()
        self._thread = threading.Thread(target=self._loop, name=f"{self.label}-decide", daemon=True)
        self._thread.start()
        self.event_log.emit("start", url=self.server.url, provider=type(self.provider).__name__)
        super().start()

    def _get_launch_command(self, block_id: str) -> str:
        """The agent's command line; once there is training to do, its standby ranks start
        with it rather than when it has registered (the first start on a fresh pilot is the
        one a hole pays in full)."""
        assert self.server is not None
        command = (
            f"{sys.executable} -m {AGENT_MODULE} --url {self.server.url} "
            f"--secret-file {shlex.quote(str(self.secret_file))}"
        )
        if self.warm_ranks and self._training:
            command += f" --warm-ranks {shlex.quote(self.mpiexec)}"
        return command

    @property
    def workers_per_node(self) -> int:
        return 1

    def outstanding(self) -> int:
        """Nodes the tasks could use: Parsl's scaling asks for pilots while this is positive."""
        return self._outlook.demand

    def scale_out_facade(self, n: int) -> list[str]:
        """Submit ``n`` pilots (Parsl's strategy calls this), unless the error handler holds
        new pilots after failed starts (``BackfillErrorHandler.holding``): then none, and the
        strategy asks again on a later poll."""
        handler = self.block_error_handler
        holding = getattr(handler, "holding", None)
        now = time.time()
        left = holding(now) if n > 0 and callable(holding) else 0.0
        if left > 0:
            until = getattr(handler, "hold_until", now + left)
            if self._held_until != until:  # the strategy asks every poll: log each hold once
                self._held_until = until
                log.info("%s: pilots failed to start; next pilot in %.1f s", self.label, left)
                if self.event_log is not None:
                    self.event_log.emit("pilots_held", until=round(until, 3), wanted=n)
            return []
        blocks = super().scale_out_facade(n)
        if blocks and self.event_log is not None:
            self.event_log.emit("blocks_submitted", blocks=blocks)
        return blocks

    def set_bad_state_and_fail_all(self, exception: Exception) -> None:
        """Parsl's bad state (pilots cannot start): fail every task not done yet, too. Our
        futures live outside Parsl's ``self._tasks``, which the base class fails."""
        super().set_bad_state_and_fail_all(exception)
        for task_id, sub in list(self._submissions.items()):
            if not sub.future.done():
                sub.future.set_exception(BadStateException(self, exception))
                if self.event_log is not None:
                    self.event_log.emit("task_failed", task=task_id, error=str(exception))

    def submit(self, func, resource_specification: dict[str, Any], *args, **kwargs) -> Future:
        if self.bad_state_is_set:
            raise self.executor_exception
        spec = dict(resource_specification or {})
        unknown = set(spec) - ELASTIC_KEYS
        if unknown:
            raise ValueError(
                f"{self.label}: unknown resource specification keys {sorted(unknown)}; "
                f"an elastic training task takes {sorted(ELASTIC_KEYS)}"
            )
        if spec and "work" not in spec:
            raise ValueError(f"{self.label}: an elastic training task needs 'work' (samples)")
        with self._lock:
            self._count += 1
            task_id = f"t{self._count}"
        key = self._key_of(spec, func, args, kwargs) if spec else None
        checkpoints = None if key is None else self.checkpoint_root / key
        directory = TaskDir.of(self.directory, task_id, checkpoints)
        factory = None  # the app's own function is an elastic task's TrainingTask factory
        try:
            directory.path.mkdir(parents=True)
            if not spec:
                directory.app_in.write_bytes(pack_apply_message(func, args, kwargs))
            elif not spec.get("task"):
                factory = _factory_file(directory, func, args, kwargs)
        except OSError:  # a full disk: Parsl fails the app, and its retry keeps this key
            with self._lock:
                self._keys.discard(key)
            raise
        future: Future = Future()
        sub = self._submissions[task_id] = _Submission(future, directory, key)
        task: ElasticTask | PlainTask
        if spec:
            finished = _read_json(directory.outcome)
            if (
                finished is not None
                and finished.get("status") == "done"
                and _int(finished.get("samples")) >= int(spec["work"])
            ):
                # Done by an earlier run of this workflow: its outcome, without training again.
                # With less work than asked (a trial sent on to a larger budget under its
                # name), it trains on from its checkpoint instead.
                self.event_log.emit(
                    "task_done",
                    task=task_id,
                    samples=finished.get("samples"),
                    outcome=str(directory.outcome),
                )
                future.set_result(finished | {"resumed_samples": finished.get("samples")})
                return future
            task = ElasticTask(
                task_id,
                work=int(spec["work"]),
                min_nodes=int(spec.get("min_nodes", 1)),
                max_nodes=int(spec.get("max_nodes", spec.get("min_nodes", 1))),
                task=spec.get("task") or factory,
                family=spec.get("task") or _code_name(func),
                options=dict(spec.get("options", {})),
                scaling={int(k): float(v) for k, v in (spec.get("scaling") or {}).items()},
                rescale_s=float(spec.get("rescale_s", self.rescale_s)),
            )
            sub.trainer = (task.task, task.work, task.options)
        else:
            task = PlainTask(task_id)
        self._arrived(TaskSubmitted(task))
        return future

    def _key_of(self, spec: dict[str, Any], func, args, kwargs) -> str:
        """The task's stable key (its checkpoint directory under ``checkpoint_root``). A
        second live task with the same key (the same trial twice) gets ``<key>.2``; a key is
        free again once its task has settled (a Parsl retry continues where it failed)."""
        key = task_key(spec, func, args, kwargs)
        with self._lock:
            n, unique = 1, key
            while unique in self._keys:
                n += 1
                unique = f"{key}.{n}"
            self._keys.add(unique)
        return unique

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.server is not None:
            for pilot in list(self.server.pilots):
                self.server.send(pilot, {"op": "shutdown"})
            time.sleep(0.5)
            self.server.stop()
        if self.event_log is not None:
            # The final state, for parsl-bf status and the report: a last tick, of which only
            # the status is carried out (the pilots have been told to shut down).
            with self._lock:
                final = self.controller.handle([Tick()], time.time())
            for command in final:
                if isinstance(command, WriteStatus):
                    self._write_status(command.snapshot)
            self.event_log.emit("shutdown")
        if getattr(self, "_log_handler", None) is not None:
            logging.getLogger("parsl_bf").removeHandler(self._log_handler)
            self._log_handler.close()

    # --- the decision thread: I/O → events → controller → commands → I/O --------------------

    def _arrived(self, item: object) -> None:
        """From the channel's thread or a submitting one: queue it for the next batch."""
        self._inbox.put((time.time(), item))

    def _loop(self) -> None:
        next_tick = 0.0
        ticked_for = None  # the walltime notice a Tick was added for (once each)
        while not self._stop.is_set():
            deadline = self._outlook.wake_at  # a pilot's walltime notice
            if deadline == ticked_for:
                deadline = None
            wake = next_tick if deadline is None else min(next_tick, deadline)
            timeout = min(0.5, max(0.0, wake - time.time()))
            if self._ready or self._grows:  # ready files end a hand-over, start a grow
                timeout = min(timeout, READY_POLL_S)
            self._request_grows()
            batch = self._drain(timeout=timeout)
            now = time.time()
            if now >= next_tick or (deadline is not None and now >= deadline):
                if now >= next_tick:
                    next_tick = now + TICK_S
                else:
                    ticked_for = deadline
                batch.append((now, Tick()))
            elif self._ready:
                batch += [(time.time(), ready) for ready in self._readiness()]
            if not batch:
                continue
            try:
                self._decide(batch)
            except Exception:  # one bad batch must not stop every later decision
                log.exception("%s: batch %r failed", self.label, batch)

    def _drain(self, timeout: float) -> list[tuple[float, object]]:
        """Everything queued now, waiting up to ``timeout`` for the first item."""
        try:
            batch = [self._inbox.get(timeout=timeout)] if timeout > 0 else []
        except queue.Empty:
            batch = []
        while True:
            try:
                batch.append(self._inbox.get_nowait())
            except queue.Empty:
                return batch

    def _decide(self, batch: list[tuple[float, object]]) -> None:
        """One batch: its events, one controller decision, its commands carried out."""
        events: list[Event] = []
        causes: list[str] = []
        for _, item in batch:
            found = self._events_of(item)
            events += found
            causes += [c for c in map(_cause, found) if c and c not in causes]
        self._warm(events)
        now = time.time()
        with self._lock:
            commands = self.controller.handle(events, now)
        for command in commands:
            self._sent = []
            try:
                self._carry_out(command)
            except Exception as exc:  # a full disk: the batch's other commands still count
                self._not_carried_out(command, exc)
        solved = [c.solve_s for c in commands if isinstance(c, Solved)]
        decided = [c for c in commands if isinstance(c, DECISIONS)]
        if decided or solved or any(c.startswith("pilot") for c in causes):
            # From the batch's first arrival to its commands sent to the pilots.
            self.event_log.decision(
                causes[0] if causes else "tick",
                time.time() - min(t for t, _ in batch),
                [_command_name(c) for c in decided],
                solved[-1] if solved else None,
                causes=causes,
                events=len(events),
            )

    def _warm(self, events: list[Event]) -> None:
        """Ask pilots for standby ranks (one per node), from the first elastic task on."""
        if not self.warm_ranks or self.server is None:
            return
        first = not self._training and any(
            isinstance(e, TaskSubmitted) and isinstance(e.task, ElasticTask) for e in events
        )
        self._training = self._training or first
        if not self._training or not (first or any(isinstance(e, PilotUp) for e in events)):
            return
        self._warmed.intersection_update(self.server.pilots)  # forget pilots that are gone
        for pilot, up in self.server.pilots.items():
            if pilot not in self._warmed:
                self._warmed.add(pilot)
                size = standbys_for(up.nodes, up.host, up.gpus)
                self._send(pilot, {"op": "warm_ranks", "size": size, "mpiexec": self.mpiexec})

    def _events_of(self, item: object) -> list[Event]:
        """The lifecycle events of one arrival, with the files it left read now."""
        log_ = self.event_log
        if isinstance(item, Tick):
            return self._progress_of_live() + self._readiness() + [item]
        if isinstance(item, FragmentReady | LaunchFailed):  # seen between ticks; a failed launch
            return [item]
        if isinstance(item, TaskSubmitted):
            log_.emit(
                "task_submitted", task=item.task.id, elastic=isinstance(item.task, ElasticTask)
            )
            return [item]
        if isinstance(item, channel.PilotUp):
            log_.emit("pilot_up", pilot=item.pilot, nodes=list(item.nodes), ends_at=item.ends_at)
            return [PilotUp(item.pilot, tuple(item.nodes), item.ends_at, item.gpus)]
        if isinstance(item, channel.PilotPreempted):
            # Parsl scaling in (or shutting down) cancels pilots too: not a preemption.
            known = getattr(self.provider, "pilots", {}).get(item.pilot)
            reason = leaving_reason(known.reason if known is not None else None)
            log_.emit(f"pilot_{reason}", pilot=item.pilot, signal=item.signal)
            return [PilotLeaving(item.pilot, reason)]
        if isinstance(item, channel.PilotGone):
            log_.emit("pilot_gone", pilot=item.pilot, reason=item.reason)
            return [PilotGone(item.pilot, item.reason)]
        if isinstance(item, channel.ProcessExited):
            return self._exit_of(item)
        if isinstance(item, Refused):
            log_.emit("refused", peer=item.peer, reason=item.reason, count=item.count)
        return []

    def _exit_of(self, item: channel.ProcessExited) -> list[Event]:
        try:
            task_id, generation, _group = parse_key(item.key)
        except ValueError:
            log.warning("%s: exit of an unknown process %r", self.label, item.key)
            return []
        sub = self._submissions.get(task_id)
        if sub is None:
            return []
        if generation is None:  # a plain app: its outcome, if it left one
            try:
                outcome: Any = read_outcome(sub.directory.app_out)
            except OSError:  # None, and it runs again, unless its runner or launch said why
                error = _no_outcome(item, sub.directory)
                outcome = None if error is None else (False, error)
            except RunnerError as exc:
                outcome = (False, exc)
            return [ProcessExited(item.pilot, item.key, item.code, outcome)]
        # Its last reports first: the controller knows its samples when it classifies the exit.
        result = _read_json(sub.directory.result(generation))
        return self._progress_of(task_id) + [ProcessExited(item.pilot, item.key, item.code, result)]

    def _progress_of_live(self) -> list[Event]:
        return [e for t in {t for t, _ in self._live} for e in self._progress_of(t)]

    def _progress_of(self, task_id: str) -> list[Event]:
        """New records of a task's progress report, as events."""
        tail = self._reports.get(task_id)
        if tail is None:
            tail = self._reports[task_id] = ReportTail(
                self._submissions[task_id].directory.progress
            )
        out: list[Event] = []
        for r in tail.read():
            if r["event"] == "step":
                share = r.get("cpu_share")
                out.append(
                    Progress(
                        task_id, int(r["world"]), float(r["rate"] or 0), int(r["samples"]),
                        float(share) if isinstance(share, int | float) else None,
                    )
                )  # fmt: skip
            elif r["event"] == "eval":  # the task's own metrics, for parsl-bf status
                out.append(Evaluated(task_id, int(r["samples"]), dict(r.get("metrics") or {})))
            elif r["event"] in ("shrunk", "grown"):
                asked = self._resize_asked.pop(task_id, None)
                seconds = r["first_step_at"] - asked if asked and r.get("first_step_at") else -1
                kind = "shrink" if r["event"] == "shrunk" else "grow"
                out.append(Rescaled(task_id, seconds, in_place=kind))
            elif r["event"] == "start":
                out.append(FragmentStarted(task_id, int(r.get("samples") or 0)))
                if r.get("stopped_at") and r.get("first_step_at"):
                    # From the later of the old fragment's stop and the new one's process
                    # start: time the task waited for nodes is not part of a rescale's cost.
                    began = max(r["stopped_at"], r.get("process_started_at") or 0.0)
                    out.append(Rescaled(task_id, r["first_step_at"] - began))
        return out

    def _request_grows(self) -> None:
        """Write the grow request of each in-place grow whose joiners are all set up: the
        fragment takes them in at its next step, with no wait for one that is starting."""
        for key, (request, path) in list(self._grows.items()):
            if request.joiners_ready():
                del self._grows[key]
                request.write(path)

    def _readiness(self) -> list[Event]:
        """Warm successors whose ready file appeared."""
        out: list[Event] = []
        for (task_id, generation), path in list(self._ready.items()):
            if path.exists():
                del self._ready[(task_id, generation)]
                out.append(FragmentReady(task_id, generation))
        return out

    # --- carrying out commands --------------------------------------------------------------

    def _carry_out(self, command: Command) -> None:
        if isinstance(command, StartFragment):
            self._start_fragment(command)
        elif isinstance(command, ShrinkFragment):
            self._shrink_fragment(command)
        elif isinstance(command, GrowFragment):
            self._grow_fragment(command)
        elif isinstance(command, RunPlain):
            self._run_plain(command)
        elif isinstance(command, Signal):
            task_id, generation, _ = parse_key(command.key)
            if command.signal == "TERM" and generation is not None:
                self._grows.pop((task_id, generation), None)  # it ends before it grows
            self._send(
                command.pilot, {"op": "signal", "key": command.key, "signal": command.signal}
            )
        elif isinstance(command, FragmentOver):
            key = (command.task, command.generation)
            self._live.discard(key)
            self._ready.pop(key, None)
            self._grows.pop(key, None)
        elif isinstance(command, Outlook):
            self._outlook = command
        elif isinstance(command, WriteStatus):
            self._write_status(command.snapshot)
        elif isinstance(command, Resolve):
            sub = self._submissions[command.task]
            if sub.key is not None and command.value.get("status") == "done":
                self._save_outcome(command.task, sub.directory.outcome, command.value)
            self._settled(sub)
            if not sub.future.done():
                sub.future.set_result(command.value)
        elif isinstance(command, Fail):
            self._settled(self._submissions[command.task])
            future = self._submissions[command.task].future
            error = command.error
            if command.generation is not None:
                stderr = _tail(
                    self._submissions[command.task].directory.stream(
                        command.generation, 0, "stderr"
                    )
                )
                why = self._launch_errors.get((command.task, command.generation))
                launch = f" (its launch failed: {why})" if why else ""
                error = FragmentFailed(f"task {command.task}: {error}: {stderr}{launch}")
            if not future.done():
                future.set_exception(error)
        elif isinstance(command, MarkLost):
            directory = self._submissions[command.task].directory
            write_result(directory.result(command.generation), {"status": "lost", "samples": 0})
        elif isinstance(command, Note):
            if command.event in WARNED_NOTES:  # what a user must see without the event log
                log.warning("%s: %s: %s", self.label, command.event, command.fields)
            self.event_log.emit(command.event, **command.fields)

    def _not_carried_out(self, command: Command, exc: Exception) -> None:
        """A command that raised (a full disk): one log line, and what the controller must
        know. A launch is reported back as :class:`LaunchFailed` for each of its processes not
        sent (those sent are KILLed), which the controller classifies as any failed start; a
        task's future is set whatever else failed with its ``Resolve`` or ``Fail``."""
        why = f"{type(exc).__name__}: {exc}"
        log.error("%s: %s not carried out: %s", self.label, _command_label(command), why)
        with contextlib.suppress(Exception):
            self.event_log.emit("command_failed", command=_command_label(command), error=why)
        keys = _launch_keys(command)
        sent = set(self._sent)
        if keys and not set(keys) <= sent:  # all sent: launched, whatever failed after
            self._launch_errors[parse_key(keys[0][1])[:2]] = why
            for pilot, key in keys:
                if (pilot, key) in sent:  # waits for peers that will never come
                    with contextlib.suppress(Exception):
                        self._send(pilot, {"op": "signal", "key": key, "signal": "KILL"})
                else:  # a plain app fails with the error; a fragment's start is a failure
                    self._arrived(LaunchFailed(pilot, key, exc))
        sub = self._submissions.get(getattr(command, "task", ""))
        if isinstance(command, Resolve | Fail) and sub is not None and not sub.future.done():
            self._settled(sub)
            if isinstance(command, Resolve):
                sub.future.set_result(command.value)
            else:
                error = command.error
                sub.future.set_exception(
                    error if isinstance(error, BaseException) else FragmentFailed(str(error))
                )

    def _save_outcome(self, task: str, path: Path, value: dict[str, Any]) -> None:
        """Write a done task's ``outcome.json``, from which a rerun resolves it without
        training. Best effort: its future gets its result all the same, and without the file a
        rerun ends at once from the final checkpoint instead."""
        try:
            write_result(path, value)
        except (OSError, TypeError, ValueError) as exc:
            log.warning("%s: task %s: outcome not saved to %s: %s", self.label, task, path, exc)

    def _settled(self, sub: _Submission) -> None:
        with self._lock:
            self._keys.discard(sub.key)

    def _send(self, pilot: str, msg: dict) -> None:
        assert self.server is not None
        self.server.send(pilot, msg)

    def _start_fragment(self, start: StartFragment) -> None:
        d = self._submissions[start.task].directory
        d.fragment(start.generation).mkdir(parents=True, exist_ok=True)
        self._live.add((start.task, start.generation))
        ranks, groups = start.world, len(start.groups)
        for g, group in enumerate(start.groups):
            flags = self._fragment_flags(d, start.generation, start.leave_min)
            if self.warm_ranks and ranks > 1:  # every rank its own group
                flags["rendezvous"] = d.rendezvous(start.generation)
            elif groups > 1:
                flags |= {
                    "rendezvous": d.rendezvous(start.generation),
                    "group": g,
                    "groups": groups,
                }
            if start.after is not None:  # a warm successor: take over from that fragment
                flags |= {"after": d.result(start.after), "ready": d.ready(start.generation)}
            argv = self._worker_argv(start.task, flags)
            rank_spec = None
            env = {}
            if self.warm_ranks:  # the agent starts each rank, on a standby if it has one
                rank_spec = self._rank_spec(group.first, group.count, ranks, group)
            else:  # a rank's place on its node is Hydra's MPI_LOCALRANKID
                hosts = group.hosts if self.mpi_hosts else None
                argv = mpiexec_argv(group.count, hosts, self.mpiexec, group.per_node) + argv
                env[environment.LOCAL_RANKS] = str(group.per_node)
                env |= environment.RANK_STEP_ENV
            self._launch_group(start.task, start.generation, g, group.pilot, argv, env, rank_spec)
        if start.after is not None:
            self._ready[(start.task, start.generation)] = d.ready(start.generation)
        self.event_log.emit(
            "fragment_start",
            task=start.task,
            generation=start.generation,
            nodes=start.nodes,
            pilots=[p for p, _ in start.placement],
            after=start.after,  # a warm successor of that generation
        )

    def _shrink_fragment(self, shrink: ShrinkFragment) -> None:
        """Write the request that the fragment's ranks take at their next step."""
        request = ShrinkRequest(shrink.ranks, shrink.of)
        request.write(self._submissions[shrink.task].directory.resize(shrink.generation))
        self._resize_asked[shrink.task] = time.time()

    def _grow_fragment(self, grow: GrowFragment) -> None:
        """Start the joiners, each rank a rendezvous group after the fragment's (group 0), and
        ask for the grow once they are set up (:meth:`_request_grows`)."""
        d = self._submissions[grow.task].directory
        joiners = sum(g.count for g in grow.groups)
        rendezvous = d.grow(grow.generation, grow.first)
        flags = self._fragment_flags(d, grow.generation, grow.leave_min) | {"join": rendezvous}
        argv = self._worker_argv(grow.task, flags)
        self._resize_asked[grow.task] = time.time()
        for i, group in enumerate(grow.groups):
            # Ranks of the joiners' own world: the fragment is its rank 0 (group 0).
            spec = self._rank_spec(1 + group.first - grow.world, group.count, 1 + joiners, group)
            self._launch_group(
                grow.task, grow.generation, grow.first + i, group.pilot, argv, {}, spec
            )
        request = GrowRequest(str(rendezvous), 1 + joiners, of=grow.world, to=grow.world + joiners)
        self._grows[(grow.task, grow.generation)] = (request, d.resize(grow.generation))

    def _worker_argv(self, task: str, flags: dict[str, Any]) -> list[str]:
        sub = self._submissions[task]
        assert sub.trainer is not None, f"{task} is not an elastic task"
        factory, work, options = sub.trainer
        return worker_argv(factory, work, sub.directory.checkpoints, options, **flags)

    def _fragment_flags(self, d: TaskDir, generation: int, leave_min: int | None) -> dict[str, Any]:
        """The worker flags every rank of a fragment takes, whatever its way in; ``leave_min``
        as the controller decided it (:class:`~parsl_bf.executor.lifecycle.StartFragment`)."""
        flags: dict[str, Any] = {
            "checkpoint_every": self.checkpoint_every,
            "report": d.progress,
            "result": d.result(generation),
            "resize": d.resize(generation),
        }
        if leave_min is not None:
            flags["leave_min"] = leave_min
        return flags

    def _rank_spec(self, first: int, count: int, of: int, group: RankGroup) -> dict[str, Any]:
        """The agent's spec of a group of warm ranks (:mod:`parsl_bf.pilot.ranks`): ``count``
        ranks from ``first`` of a world of ``of``, ``group.per_node`` on each of its hosts."""
        per_node = group.per_node
        spec: dict[str, Any] = {"first": first, "count": count, "of": of, "per_node": per_node}
        spec["mpiexec"] = self.mpiexec
        if self.mpi_hosts:
            spec["hosts"] = [h for h in group.hosts for _ in range(per_node)]
        return spec

    def _launch_group(
        self, task: str, generation: int, group: int, pilot: str, argv: list[str],
        env: dict[str, str], ranks: dict[str, Any] | None,
    ) -> None:  # fmt: skip
        """Launch one placement group of a fragment on ``pilot``, its streams in the task's
        directory."""
        d = self._submissions[task].directory
        env = {"PYTHONPATH": _pythonpath()} | env
        if self._emulated:  # emulated nodes share the cores: a thread each
            env[environment.THREADS_PER_RANK] = "1"
        self._launch(
            pilot, fragment_key(task, generation, group), argv, env, d.fragment(generation),
            d.stream(generation, group, "stdout"), d.stream(generation, group, "stderr"),
            ranks=ranks,
        )  # fmt: skip

    def _run_plain(self, run: RunPlain) -> None:
        d = self._submissions[run.task].directory
        d.app_out.unlink(missing_ok=True)
        # cwd: relative paths in apps mean what they mean where the workflow runs. warm: the
        # agent forks it from its warm host (no interpreter to start), or runs the command.
        self._launch(
            run.pilot, plain_key(run.task), runner.command(d.app_in, d.app_out),
            {"PYTHONPATH": _pythonpath()}, Path.cwd(), d.app_stream("stdout"),
            d.app_stream("stderr"), warm=True,
        )  # fmt: skip

    def _launch(
        self, pilot: str, key: str, argv: list[str], env: dict[str, str], cwd: Path, stdout: Path,
        stderr: Path, warm: bool = False, ranks: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        """The channel's ``launch`` message (``ranks``: a fragment's, :data:`RANKS_KEY`)."""
        msg = {
            "op": "launch", "key": key, "argv": [str(a) for a in argv], "env": env,
            "cwd": str(cwd), "stdout": str(stdout), "stderr": str(stderr),
        }  # fmt: skip
        if warm:
            msg["warm"] = True
        if ranks is not None:
            msg[RANKS_KEY] = ranks
        self._send(pilot, msg)
        self._sent.append((pilot, key))

    def _write_status(self, snapshot: dict[str, Any]) -> None:
        self.event_log.write_status({"label": self.label} | snapshot | self._block_summary())

    def _block_summary(self) -> dict[str, Any]:
        """The error handler's view of the blocks (failed starts and why), when it keeps one."""
        summary = getattr(self.block_error_handler, "summary", None)
        if summary is None:
            return {}
        found = summary(getattr(self.provider, "pilots", None) or {})
        keys = ("blocks", "failed_blocks", "backoff_s_left")  # the pilots are ours
        return {k: found[k] for k in keys if k in found}


def allocator_settings(value: AllocatorSettings | dict[str, Any] | None) -> AllocatorSettings:
    """``BackfillExecutor(allocator=...)`` as settings; SettingError names the bad key."""
    if isinstance(value, AllocatorSettings):
        return value
    try:
        return AllocatorSettings.model_validate(value or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in ("allocator", *err["loc"]))
        raise SettingError(where, err["msg"].removeprefix("Value error, ")) from None


def task_key(spec: dict[str, Any], func, args, kwargs) -> str:
    """An elastic task's identity across runs: its ``name``, else a digest of what it trains
    (code, options, work, the app's arguments, as Parsl's memoization serialises them); a
    ``run-<uuid>`` when its arguments cannot be (it then starts afresh in every run)."""
    if spec.get("name"):
        name = str(spec["name"])
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}", name):
            raise ValueError(f"task name {name!r}: use letters, digits and _ . = - (≤ 128)")
        return name
    from parsl.dataflow.memoization import id_for_memo

    what = [_code_name(func), spec.get("task"), spec.get("options"), spec["work"], args, kwargs]
    try:
        digest = hashlib.sha256(id_for_memo(what)).hexdigest()[:20]
    except ValueError:  # an argument Parsl cannot memoize
        return f"run-{uuid.uuid4().hex[:20]}"
    trains = spec.get("task") or _code_name(func)
    return f"{trains.rpartition(':')[2][:40]}-{digest}"


def _cause(event: Event) -> str | None:
    """What an event is called in the decision log (None: not a cause worth naming)."""
    if isinstance(event, PilotLeaving):
        return "pilot ending" if event.reason == "walltime" else f"pilot {event.reason}"
    return {
        PilotUp: "pilot up",
        PilotGone: "pilot gone",
        TaskSubmitted: "task submitted",
        ProcessExited: "process exited",
    }.get(type(event))


def _command_name(command: Command) -> str:
    return f"{type(command).__name__}:{getattr(command, 'task', None) or command.key}"


def _command_label(command: Command) -> str:
    """A command as a log line names it: its kind, its task, and its fragment or process."""
    generation = getattr(command, "generation", None)
    where = f" fragment {generation}" if generation is not None else ""
    if isinstance(command, Signal):
        return f"Signal {command.signal} to {command.key} on {command.pilot}"
    if isinstance(command, Note):
        return f"Note {command.event}"
    return f"{type(command).__name__} of task {command.task}{where}"


def _launch_keys(command: Command) -> list[tuple[str, str]]:
    """(pilot, process key) of every process a launch command starts; [] for the others."""
    if isinstance(command, StartFragment):
        return [
            (pilot, fragment_key(command.task, command.generation, g))
            for g, (pilot, _) in enumerate(command.placement)
        ]
    if isinstance(command, GrowFragment):
        return [
            (pilot, fragment_key(command.task, command.generation, command.first + i))
            for i, (pilot, _) in enumerate(command.placement)
        ]
    if isinstance(command, RunPlain):
        return [(command.pilot, plain_key(command.task))]
    return []


def _no_outcome(item: channel.ProcessExited, directory: TaskDir) -> Exception | None:
    """Why a plain app left no outcome, if its runner or its launch said (None: it was killed,
    and runs again)."""
    said = _tail(directory.app_stream("stderr"), 1)
    said = "" if said == _NO_STDERR else said
    if launch_failed(item.code):
        return RunnerError(f"not launched on {item.pilot} (exit {item.code}): {said}")
    return no_outcome_error(item.code, directory.app_out, said)


def _factory_file(directory: TaskDir, func, args, kwargs) -> str:
    """The app's own function is the TrainingTask factory: the ranks call it."""
    directory.factory.write_bytes(pack_apply_message(func, args, kwargs))
    return f"@{directory.factory}"


def _cores() -> int:
    """The cores this process may run on (what emulated nodes share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1


def _pythonpath() -> str:
    """Ranks and apps import this package, and the workflow's modules, as the executor does."""
    here = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(p for p in (here, os.getcwd(), os.environ.get("PYTHONPATH")) if p)


def _code_name(func) -> str:
    """``module:qualname`` of an app's function (any callable)."""
    name = getattr(func, "__qualname__", None) or type(func).__qualname__
    return f"{getattr(func, '__module__', None) or type(func).__module__}:{name}"


def _int(value: object) -> int:
    """An outcome's count, 0 when missing or not a number (a file from elsewhere)."""
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return 0


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text().strip().splitlines()[-lines:])
    except OSError:
        return _NO_STDERR


_NO_STDERR = "(no stderr)"
