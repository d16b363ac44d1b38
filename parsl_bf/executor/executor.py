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

**Faults of the shell's own I/O** (a full disk): each command is carried out on its own
(:mod:`.carrying`); a launch that failed here is a
:class:`~parsl_bf.executor.lifecycle.LaunchFailed` event: a fragment restarts from its
checkpoint at most ``max_restarts`` times, then fails; a plain app fails with the error, as
does one whose runner could not write its outcome
(:func:`~parsl_bf.pilot.outcome.no_outcome_error`), rather than running again forever.

Tasks are ordinary Parsl apps. An app whose ``parsl_resource_specification`` has ``work`` is an
elastic training task: ``task`` names a ``module:function`` returning a
:class:`~parsl_bf.training.TrainingTask` (called with ``options``), or, without ``task``, the
app's own function (with its arguments) is that factory. Its future resolves with the final
:class:`~parsl_bf.training.trainer.TrainOutcome` as a dict. Other apps run as one process on
one node. Preemption never fails a task: fragments resume from their checkpoint, plain apps
run again.
"""

from __future__ import annotations

import logging
import os
import queue
import shlex
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
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

from ..allocation import AllocatorSettings
from ..checks import SettingError, check_count
from ..pilot.wire import AGENT_MODULE, Op, write_secret
from ..training.command import MPIEXEC
from ..training.reports import ReportTail
from ..training.resize import GrowRequest
from .carrying import CarryingOut, FragmentFailed, Submission
from .channel import PilotServer
from .controller import Controller, ElasticTask, PlainTask
from .events import EventLog
from .lifecycle import LogEvent, Outlook, TaskDir, TaskSubmitted, Tick, WriteStatus
from .loop import DecisionLoop, _read_json
from .submitting import code_name, count_of, factory_file, task_key

__all__ = ["BackfillExecutor", "FragmentFailed", "ELASTIC_KEYS"]

log = logging.getLogger(__name__)

#: Keys of ``parsl_resource_specification`` an elastic training task may use.
ELASTIC_KEYS = frozenset(
    {"work", "min_nodes", "max_nodes", "scaling", "rescale_s", "task", "options", "name"}
)


class BackfillExecutor(DecisionLoop, CarryingOut, BlockProviderExecutor, RepresentationMixin):
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
        self._submissions: dict[str, Submission] = {}
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
        self.event_log.emit(
            LogEvent.START, url=self.server.url, provider=type(self.provider).__name__
        )
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
                    self.event_log.emit(LogEvent.PILOTS_HELD, until=round(until, 3), wanted=n)
            return []
        blocks = super().scale_out_facade(n)
        if blocks and self.event_log is not None:
            self.event_log.emit(LogEvent.BLOCKS_SUBMITTED, blocks=blocks)
        return blocks

    def set_bad_state_and_fail_all(self, exception: Exception) -> None:
        """Parsl's bad state (pilots cannot start): fail every task not done yet, too. Our
        futures live outside Parsl's ``self._tasks``, which the base class fails."""
        super().set_bad_state_and_fail_all(exception)
        for task_id, sub in list(self._submissions.items()):
            if not sub.future.done():
                sub.future.set_exception(BadStateException(self, exception))
                if self.event_log is not None:
                    self.event_log.emit(LogEvent.TASK_FAILED, task=task_id, error=str(exception))

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
                factory = factory_file(directory, func, args, kwargs)
        except OSError:  # a full disk: Parsl fails the app, and its retry keeps this key
            with self._lock:
                self._keys.discard(key)
            raise
        future: Future = Future()
        sub = self._submissions[task_id] = Submission(future, directory, key)
        task: ElasticTask | PlainTask
        if spec:
            finished = _read_json(directory.outcome)
            if (
                finished is not None
                and finished.get("status") == "done"
                and count_of(finished.get("samples")) >= int(spec["work"])
            ):
                # Done by an earlier run of this workflow: its outcome, without training again.
                # With less work than asked (a trial sent on to a larger budget under its
                # name), it trains on from its checkpoint instead.
                self.event_log.emit(
                    LogEvent.TASK_DONE,
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
                family=spec.get("task") or code_name(func),
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
                self.server.send(pilot, {"op": Op.SHUTDOWN})
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
            self.event_log.emit(LogEvent.SHUTDOWN)
        if getattr(self, "_log_handler", None) is not None:
            logging.getLogger("parsl_bf").removeHandler(self._log_handler)
            self._log_handler.close()


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


def _cores() -> int:
    """The cores this process may run on (what emulated nodes share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1
