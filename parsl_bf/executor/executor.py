"""``BackfillExecutor``: a Parsl executor that packs elastic training fragments onto pilots.

It owns pilots from a backfill provider (Parsl's block scaling asks for them while tasks want
nodes and releases them when idle). Each pilot runs :mod:`parsl_bf.executor.agent`, which
registers over an authenticated ZeroMQ channel (:mod:`parsl_bf.executor.channel`). One
decision thread turns every event (pilot up, preempted, gone; task submitted; process exited;
progress) into the :class:`~parsl_bf.executor.controller.Controller`'s actions and carries
them out: fragment ranks started on pilots (``mpiexec … python -m parsl_bf.training.worker``,
one launcher per pilot joined by the rendezvous), asked to checkpoint and stop, plain apps run
by :mod:`parsl_bf.executor.runner`.

Tasks are ordinary Parsl apps. An app whose ``parsl_resource_specification`` has ``work`` is an
elastic training task: ``task`` names a ``module:function`` returning a
:class:`~parsl_bf.training.TrainingTask` (called with ``options``), or, without ``task``, the
app's own function (with its arguments) is that factory. Its future resolves with the final
:class:`~parsl_bf.training.trainer.TrainOutcome` as a dict. Other apps run as one process on
one node. Preemption never fails a task: fragments resume from their checkpoint, plain apps
run again.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parsl.executors.errors import BadStateException
from parsl.executors.status_handling import BlockProviderExecutor
from parsl.monitoring.radios.base import RadioConfig
from parsl.monitoring.radios.filesystem import FilesystemRadio
from parsl.providers.base import ExecutionProvider
from parsl.serialize import pack_apply_message
from parsl.utils import RepresentationMixin

from ..providers.base import check_tfwd
from ..training.command import MPIEXEC, mpiexec_argv, worker_argv
from ..training.reports import ReportTail, write_result
from .channel import (
    PilotGone,
    PilotPreempted,
    PilotServer,
    PilotUp,
    ProcessExited,
    Refused,
    write_secret,
)
from .controller import (
    Controller,
    ElasticTask,
    PlainTask,
    RunPlain,
    StartFragment,
    StopFragment,
)
from .events import EventLog
from .runner import read_outcome

__all__ = ["BackfillExecutor", "FragmentFailed", "ELASTIC_KEYS"]

log = logging.getLogger(__name__)

#: Keys of ``parsl_resource_specification`` an elastic training task may use.
ELASTIC_KEYS = frozenset(
    {"work", "min_nodes", "max_nodes", "scaling", "rescale_s", "task", "options"}
)

# A warm successor not set up by then: stop its predecessor anyway (the successor takes over
# from the checkpoint whenever it is ready).
HANDOVER_TIMEOUT_S = 120.0


class FragmentFailed(RuntimeError):
    """A training task's ranks failed by themselves (not by a preemption or a rescale)."""


@dataclass
class _Fragment:
    task: str
    generation: int
    running: dict[str, str]  # process key → pilot
    result: Path
    stop_requested: bool = False
    stop_at: float | None = None


@dataclass
class _Handover:
    """A fragment to stop once its warm successor is ready (or at ``deadline`` regardless)."""

    generation: int
    reason: str
    ready: Path
    deadline: float


@dataclass
class _Submission:
    future: Future
    elastic: bool
    directory: Path
    started: float = field(default_factory=time.time)


class BackfillExecutor(BlockProviderExecutor, RepresentationMixin):
    """Runs Parsl apps on backfill pilots, elastic training tasks resized by the allocator.

    Parameters
    ----------
    label : str
        The executor's label.
    provider : ExecutionProvider
        A backfill provider (``LocalBackfillProvider``, ``SlurmBackfillProvider``, …).
    objective, tfwd, time_limit, max_tasks
        The allocator's objective, look-ahead (s, or "auto": the median walltime of the pilots
        so far, i.e. of the holes), solver time limit (s), and the most elastic tasks running
        at once. A YAML config's ``allocator:`` section sets these.
    checkpoint_every : int
        Training steps between checkpoints (bounds the work a preemption can lose).
    min_node_life_s : float or None
        Nodes whose pilot ends sooner are not offered to elastic tasks; None: twice the
        rescale cost guess. 0 is the paper's model (every node is worth taking).
    walltime_notice_s : float
        A pilot this close to its end is treated as leaving: its fragments checkpoint and stop.
    rescale_s : float
        Guess of a rescale's cost until one is measured.
    warm_rescale : bool
        Start a rescaled fragment's successor while the fragment still trains, and stop the
        fragment once the successor has imported and built its model (when the nodes the
        successor adds are free). False: stop first, then start the new size.
    heartbeat_timeout_s : float
        A pilot silent this long is considered gone.
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
        objective: str = "throughput",
        tfwd: float | str = "auto",
        time_limit: float = 10.0,
        max_tasks: int = 10,
        checkpoint_every: int = 20,
        min_node_life_s: float | None = None,
        walltime_notice_s: float = 5.0,
        rescale_s: float = 10.0,
        warm_rescale: bool = True,
        heartbeat_timeout_s: float = 15.0,
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
        check_tfwd(tfwd)
        self.objective, self.tfwd, self.time_limit = objective, tfwd, time_limit
        self.max_tasks, self.checkpoint_every = max_tasks, checkpoint_every
        self.min_node_life_s = min_node_life_s
        self.walltime_notice_s, self.rescale_s = walltime_notice_s, rescale_s
        self.warm_rescale = warm_rescale
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.mpiexec = mpiexec or MPIEXEC
        self.mpi_hosts, self.address = mpi_hosts, address
        self.controller = Controller(
            objective,
            None if tfwd == "auto" else float(tfwd),
            time_limit,
            max_tasks,
            2 * rescale_s if min_node_life_s is None else min_node_life_s,
            warm_rescale,
        )
        self._events: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # the controller's state, read by outstanding()
        self._submissions: dict[str, _Submission] = {}
        self._fragments: dict[tuple[str, int], _Fragment] = {}
        # (task, successor generation) → the warm hand-over waiting for the successor's ranks
        self._handovers: dict[tuple[str, int], _Handover] = {}
        self._reports: dict[str, ReportTail] = {}  # task → its progress.jsonl, read so far
        self._metrics: dict[str, dict[str, float]] = {}  # task → its latest evaluation
        self._count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.server: PilotServer | None = None
        self._emulated = type(provider).__name__ == "LocalBackfillProvider"
        self.event_log: EventLog | None = None
        self.preemptions = 0

    # --- Parsl's executor interface ---------------------------------------------------------

    def apply_allocator_settings(self, settings) -> None:
        """Take the keys a YAML config's ``allocator:`` section sets (the others keep this
        executor's values)."""
        given = settings.model_fields_set
        if "objective" in given:
            self.objective = settings.objective.value
            self.controller.objective = settings.objective
        if "tfwd" in given:
            self.tfwd = settings.tfwd
            self.controller.tfwd = None if settings.tfwd == "auto" else float(settings.tfwd)
        if "time_limit" in given:
            self.time_limit = self.controller.time_limit = settings.time_limit
        if "max_tasks" in given:
            self.max_tasks = self.controller.max_tasks = settings.max_tasks
        if "checkpoint_every" in given:
            self.checkpoint_every = settings.checkpoint_every

    def start(self) -> None:
        self.directory = Path(self.run_dir) / self.label
        self.directory.mkdir(parents=True, exist_ok=True)
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
        self.server = PilotServer(secret, self._events.put, self.address, self.heartbeat_timeout_s)
        self.server.start()
        self._thread = threading.Thread(target=self._loop, name=f"{self.label}-decide", daemon=True)
        self._thread.start()
        self.event_log.emit("start", url=self.server.url, provider=type(self.provider).__name__)
        super().start()

    def _get_launch_command(self, block_id: str) -> str:
        assert self.server is not None
        return (
            f"{sys.executable} -m parsl_bf.executor.agent --url {self.server.url} "
            f"--secret-file {self.secret_file}"
        )

    @property
    def workers_per_node(self) -> int:
        return 1

    def outstanding(self) -> int:
        """Nodes the tasks could use: Parsl's scaling asks for pilots while this is positive."""
        with self._lock:
            return self.controller.outstanding_nodes()

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
        directory = self.directory / "tasks" / task_id
        directory.mkdir(parents=True)
        future: Future = Future()
        self._submissions[task_id] = _Submission(future, bool(spec), directory)
        if spec:
            task = ElasticTask(
                task_id,
                work=int(spec["work"]),
                min_nodes=int(spec.get("min_nodes", 1)),
                max_nodes=int(spec.get("max_nodes", spec.get("min_nodes", 1))),
                task=spec.get("task") or self._factory_file(directory, func, args, kwargs),
                family=spec.get("task") or _code_name(func),
                options=dict(spec.get("options", {})),
                scaling={int(k): float(v) for k, v in (spec.get("scaling") or {}).items()},
                rescale_s=float(spec.get("rescale_s", self.rescale_s)),
            )
            self._events.put(("submit_elastic", task))
        else:
            (directory / "app.in").write_bytes(pack_apply_message(func, args, kwargs))
            self._events.put(("submit_plain", PlainTask(task_id)))
        return future

    @staticmethod
    def _factory_file(directory: Path, func, args, kwargs) -> str:
        """The app's own function is the TrainingTask factory: the ranks call it."""
        path = directory / "factory.in"
        path.write_bytes(pack_apply_message(func, args, kwargs))
        return f"@{path}"

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
            self.event_log.emit("shutdown")
        if getattr(self, "_log_handler", None) is not None:
            logging.getLogger("parsl_bf").removeHandler(self._log_handler)
            self._log_handler.close()

    # --- the decision thread ----------------------------------------------------------------

    def _loop(self) -> None:
        last_tick = 0.0
        while not self._stop.is_set():
            try:
                item = self._events.get(timeout=0.5)
            except queue.Empty:
                item = None
            try:
                if item is not None:
                    self._handle(item)
                if time.time() - last_tick >= 1.0:
                    last_tick = time.time()
                    self._tick()
            except Exception:  # one bad event must not stop every later decision
                log.exception("%s: event %r failed", self.label, item)

    def _apply(self, actions, cause: str, t0: float) -> None:
        for action in actions:
            if isinstance(action, StartFragment):
                self._start_fragment(action)
            elif isinstance(action, StopFragment) and action.when_ready is not None:
                gen_dir = self._submissions[action.task].directory / f"fragment{action.when_ready}"
                self._handovers[(action.task, action.when_ready)] = _Handover(
                    action.generation,
                    action.reason,
                    gen_dir / "ready",
                    time.time() + HANDOVER_TIMEOUT_S,
                )
            elif isinstance(action, StopFragment):
                self._handovers.pop((action.task, action.generation + 1), None)
                self._stop_fragment(action.task, action.generation, action.reason)
            elif isinstance(action, RunPlain):
                self._run_plain(action)
        if actions or cause.startswith("pilot"):
            alloc = self.controller.last_allocation
            self.event_log.decision(
                cause,
                time.time() - t0,
                [type(a).__name__ + ":" + a.task for a in actions],
                None if alloc is None else alloc.solve_s,
            )
        self._write_status()

    def _handle(self, item) -> None:
        t0 = time.time()
        c = self.controller
        with self._lock:
            c.account(t0)
            if isinstance(item, PilotUp):
                self.event_log.emit("pilot_up", pilot=item.pilot, nodes=list(item.nodes))
                actions = c.pilot_up(item.pilot, item.nodes, item.ends_at, t0)
                cause = "pilot up"
            elif isinstance(item, PilotPreempted):
                # Parsl scaling in (or shutting down) cancels pilots too: not a preemption.
                known = getattr(self.provider, "pilots", {}).get(item.pilot)
                cancelled = known is not None and known.reason == "cancelled"
                self.preemptions += 0 if cancelled else 1
                event = "pilot_cancelled" if cancelled else "pilot_preempted"
                self.event_log.emit(event, pilot=item.pilot, signal=item.signal)
                actions = c.pilot_leaving(item.pilot, t0, event.removeprefix("pilot_"))
                cause = event.replace("_", " ")
            elif isinstance(item, PilotGone):
                self.event_log.emit("pilot_gone", pilot=item.pilot, reason=item.reason)
                actions = c.pilot_gone(item.pilot, t0)
                actions += self._fragments_lost_with(item.pilot)
                cause = "pilot gone"
            elif isinstance(item, ProcessExited):
                actions, cause = self._process_exited(item, t0), "process exited"
            elif isinstance(item, Refused):
                self.event_log.emit("refused", peer=item.peer, reason=item.reason)
                return
            elif item[0] == "submit_elastic":
                self.event_log.emit("task_submitted", task=item[1].id, elastic=True)
                actions, cause = c.submit_elastic(item[1], t0), "task submitted"
            elif item[0] == "submit_plain":
                self.event_log.emit("task_submitted", task=item[1].id, elastic=False)
                actions, cause = c.submit_plain(item[1], t0), "task submitted"
            else:
                return
            self._apply(actions, cause, t0)

    def _hand_over(self, now: float) -> None:
        """Stop each fragment whose warm successor is set up (or gone, or late)."""
        for (task_id, gen), h in list(self._handovers.items()):
            if h.ready.exists() or (task_id, gen) not in self._fragments or now > h.deadline:
                del self._handovers[(task_id, gen)]
                self._stop_fragment(task_id, h.generation, h.reason)

    def _tick(self) -> None:
        """Progress from the reports, pilots reaching their walltime, stuck stops."""
        t0 = time.time()
        with self._lock:
            self.controller.account(t0)
            self._hand_over(t0)
            for (task_id, _gen), fragment in list(self._fragments.items()):
                self._read_progress(task_id)
                if fragment.stop_at is not None and t0 > fragment.stop_at:
                    # Ranks blocked on a peer that died with its pilot: end them.
                    for key, pilot in fragment.running.items():
                        self._send(pilot, {"op": "signal", "key": key, "signal": "KILL"})
                    fragment.stop_at = None
            actions = []
            for view in list(self.controller.pilots.values()):
                if (
                    not view.leaving
                    and view.ends_at is not None
                    and view.ends_at - t0 <= self.walltime_notice_s
                ):
                    self.event_log.emit("pilot_ending", pilot=view.pilot)
                    actions += self.controller.pilot_leaving(view.pilot, t0, "walltime")
            if actions:
                self._apply(actions, "pilot ending", t0)
            else:
                self._write_status()

    def _read_progress(self, task_id: str) -> None:
        tail = self._reports.get(task_id)
        if tail is None:
            tail = self._reports[task_id] = ReportTail(
                self._submissions[task_id].directory / "progress.jsonl"
            )
        for r in tail.read():
            if r["event"] == "step":
                self.controller.progress(
                    task_id, int(r["world"]), float(r["rate"] or 0), int(r["samples"])
                )
            elif r["event"] == "eval":  # the task's own metrics, for parsl-bf status
                self._metrics[task_id] = {"samples": r["samples"], **(r.get("metrics") or {})}
            elif r["event"] == "start" and r.get("stopped_at") and r.get("first_step_at"):
                # From the later of the old fragment's stop and the new one's process start:
                # time the task waited for nodes is not part of a rescale's cost.
                began = max(r["stopped_at"], r.get("process_started_at") or 0.0)
                self.controller.rescaled(task_id, r["first_step_at"] - began)

    # --- carrying out actions ---------------------------------------------------------------

    def _send(self, pilot: str, msg: dict) -> None:
        assert self.server is not None
        self.server.send(pilot, msg)

    def _start_fragment(self, action: StartFragment) -> None:
        task = self.controller.elastic[action.task]
        d = self._submissions[action.task].directory
        gen_dir = d / f"fragment{action.generation}"
        gen_dir.mkdir(parents=True, exist_ok=True)
        result = gen_dir / "result.json"
        groups = len(action.placement)
        running = {}
        for g, (pilot, hosts) in enumerate(action.placement):
            key = f"{action.task}#{action.generation}#{g}"
            flags: dict[str, Any] = {
                "checkpoint_every": self.checkpoint_every,
                "report": d / "progress.jsonl",
                "result": result,
            }
            if groups > 1:
                flags |= {"rendezvous": gen_dir / "rendezvous", "group": g, "groups": groups}
            if action.after is not None:  # a warm successor: take over from that fragment
                flags |= {
                    "after": d / f"fragment{action.after}" / "result.json",
                    "ready": gen_dir / "ready",
                }
            argv = mpiexec_argv(len(hosts), hosts if self.mpi_hosts else None, self.mpiexec)
            argv += worker_argv(task.task, task.work, d / "checkpoints", task.options, **flags)
            env = {"PYTHONPATH": _pythonpath()}
            if self._emulated:  # every emulated node of this machine is about one core
                env["PARSL_BF_THREADS_PER_RANK"] = "1"
            self._send(
                pilot,
                {
                    "op": "launch",
                    "key": key,
                    "argv": argv,
                    "env": env,
                    "cwd": str(gen_dir),
                    "stdout": str(gen_dir / f"group{g}.stdout"),
                    "stderr": str(gen_dir / f"group{g}.stderr"),
                },
            )
            running[key] = pilot
        self._fragments[(action.task, action.generation)] = _Fragment(
            action.task, action.generation, running, result
        )
        self.event_log.emit(
            "fragment_start",
            task=action.task,
            generation=action.generation,
            nodes=sum(len(h) for _, h in action.placement),
            pilots=[p for p, _ in action.placement],
            after=action.after,  # a warm successor of that generation
        )

    def _stop_fragment(self, task_id: str, generation: int, reason: str) -> None:
        fragment = self._fragments.get((task_id, generation))
        if fragment is None or fragment.stop_requested:
            return
        fragment.stop_requested = True
        fragment.stop_at = time.time() + max(30.0, 3 * self.heartbeat_timeout_s)
        for key, pilot in fragment.running.items():
            self._send(pilot, {"op": "signal", "key": key, "signal": "TERM"})
        self.event_log.emit("fragment_stop", task=task_id, generation=generation, reason=reason)

    def _fragments_lost_with(self, pilot: str) -> list:
        """Processes of a vanished pilot will never report: count them as exited."""
        actions = []
        for fragment in list(self._fragments.values()):
            for key in [k for k, p in fragment.running.items() if p == pilot]:
                actions += self._process_exited(ProcessExited(pilot, key, -9), time.time())
        return actions

    def _run_plain(self, action: RunPlain) -> None:
        d = self._submissions[action.task].directory
        out = d / "app.out"
        out.unlink(missing_ok=True)
        self._send(
            action.pilot,
            {
                "op": "launch",
                "key": f"plain#{action.task}",
                "argv": [
                    sys.executable,
                    "-m",
                    "parsl_bf.executor.runner",
                    str(d / "app.in"),
                    str(out),
                ],
                "env": {"PYTHONPATH": _pythonpath()},
                "cwd": os.getcwd(),  # relative paths in apps mean what they mean here
                "stdout": str(d / "app.stdout"),
                "stderr": str(d / "app.stderr"),
            },
        )

    def _process_exited(self, item: ProcessExited, now: float) -> list:
        kind, _, rest = item.key.partition("#")
        if kind == "plain":
            return self._plain_exited(rest, item, now)
        task_id, generation, _group = item.key.split("#")
        fragment = self._fragments.get((task_id, int(generation)))
        if fragment is None or item.key not in fragment.running:
            return []
        del fragment.running[item.key]
        if fragment.running:
            if not fragment.stop_requested:  # a group ended alone: stop the others
                self._stop_fragment(task_id, int(generation), "a group ended")
            return []
        del self._fragments[(task_id, int(generation))]
        self._read_progress(task_id)
        outcome = _read_json(fragment.result)
        status = outcome.get("status") if outcome else None
        sub = self._submissions[task_id]
        if fragment.generation < self.controller.elastic[task_id].generation:
            return self._superseded_exited(fragment, outcome, item, now)
        if status == "done":
            self._resolve(task_id, outcome)
            return self.controller.fragment_ended(
                task_id, fragment.generation, "done", outcome["samples"], now
            )
        if status == "stopped" or fragment.stop_requested:
            samples = outcome["samples"] if outcome else 0
            self.event_log.emit("fragment_stopped", task=task_id, samples=samples)
            return self.controller.fragment_ended(
                task_id, fragment.generation, "stopped", samples, now
            )
        err = _tail(sub.directory / f"fragment{fragment.generation}" / "group0.stderr")
        self.event_log.emit("task_failed", task=task_id, code=item.code)
        sub.future.set_exception(FragmentFailed(f"task {task_id}: exit {item.code}: {err}"))
        return self.controller.fragment_ended(task_id, fragment.generation, "failed", 0, now)

    def _resolve(self, task_id: str, outcome: dict) -> None:
        """An elastic task's result (once: a predecessor and its successor may both end done)."""
        sub = self._submissions[task_id]
        if not sub.future.done():
            self.event_log.emit("task_done", task=task_id, samples=outcome["samples"])
            sub.future.set_result(outcome)

    def _superseded_exited(
        self, fragment: _Fragment, outcome: dict | None, item: ProcessExited, now: float
    ) -> list:
        """A fragment that a warm successor replaces has exited: the successor resolves the
        task. If it left no result (it died), write one, so that the successor, waiting for
        it, takes over from the last checkpoint as after a preemption."""
        if outcome is None:
            self.event_log.emit(
                "fragment_lost", task=fragment.task, generation=fragment.generation, code=item.code
            )
            outcome = {"status": "lost", "samples": 0}
            write_result(fragment.result, outcome)
        elif outcome.get("status") == "done":
            # It finished the work before its successor took over: that is the task's result
            # (the successor finds the final checkpoint and ends at once).
            self._resolve(fragment.task, outcome)
        else:
            self.event_log.emit("fragment_stopped", task=fragment.task, samples=outcome["samples"])
        return self.controller.fragment_ended(
            fragment.task, fragment.generation, "stopped", int(outcome["samples"]), now
        )

    def _plain_exited(self, task_id: str, item: ProcessExited, now: float) -> list:
        sub = self._submissions[task_id]
        out = sub.directory / "app.out"
        if not out.exists():  # killed with its pilot, not by its own error: run it again
            self.event_log.emit("task_requeued", task=task_id, code=item.code)
            return self.controller.plain_finished(task_id, now, lost=True)
        ok, value = read_outcome(out)
        if ok:
            sub.future.set_result(value)
        else:
            sub.future.set_exception(value)
        self.event_log.emit("task_done", task=task_id, ok=ok)
        return self.controller.plain_finished(task_id, now)

    def _write_status(self) -> None:
        c = self.controller
        alloc = c.last_allocation
        self.event_log.write_status(
            {
                "label": self.label,
                "pilots": [
                    {
                        "pilot": v.pilot,
                        "nodes": list(v.hosts),
                        "ends_in_s": None if v.ends_at is None else round(v.ends_at - time.time()),
                        "leaving": v.leaving,
                    }
                    for v in c.pilots.values()
                ],
                "tasks": [
                    {
                        "task": t.id,
                        "state": t.state,
                        "nodes": len(t.nodes),
                        "samples": t.samples,
                        "work": t.work,
                        "rate": _last_rate(t),
                        "metrics": self._metrics.get(t.id),
                    }
                    for t in c.elastic.values()
                ],
                "plain": {
                    s: sum(1 for t in c.plain.values() if t.state == s)
                    for s in ("queued", "running", "done")
                },
                "solves": c.solves,
                "last_solve_s": None if alloc is None else alloc.solve_s,
                "preemptions": self.preemptions,
                "accounting": c.efficiency(),
            }
            | self._block_summary()
        )

    def _block_summary(self) -> dict[str, Any]:
        """The error handler's view of the blocks (failed starts and why), when it keeps one."""
        summary = getattr(self.block_error_handler, "summary", None)
        if summary is None:
            return {}
        found = summary(getattr(self.provider, "pilots", None) or {})
        return {"blocks": found["blocks"], "failed_blocks": found["failed_blocks"]}


def _last_rate(task: ElasticTask) -> float | None:
    world = len(task.nodes)
    rates = task.measured.get(world)
    return rates[-1] if rates else None


def _pythonpath() -> str:
    """Ranks and apps import this package, and the workflow's modules, as the executor does."""
    here = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(p for p in (here, os.getcwd(), os.environ.get("PYTHONPATH")) if p)


def _code_name(func) -> str:
    """``module:qualname`` of an app's function (any callable)."""
    name = getattr(func, "__qualname__", None) or type(func).__qualname__
    return f"{getattr(func, '__module__', None) or type(func).__module__}:{name}"


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text().strip().splitlines()[-lines:])
    except OSError:
        return "(no stderr)"
