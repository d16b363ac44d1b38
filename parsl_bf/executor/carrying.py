"""Carrying out the controller's commands, the executor's role that does its I/O
(:class:`CarryingOut`): launch and signal messages to the pilots' agents, futures set, the
task directory's files, the event log and ``status.json``.

Each command is carried out on its own: one that raises (a full disk) is logged and the
others are still carried out; a launch that failed here is reported back as
:class:`~parsl_bf.executor.lifecycle.LaunchFailed` (its groups already sent are KILLed), and
a task's future is set whatever else failed with its ``Resolve`` or ``Fail``."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import environment
from ..pilot import outcome as runner
from ..pilot.wire import RANKS_KEY, Op
from ..training.command import mpiexec_argv, worker_argv
from ..training.reports import ReportTail, write_result
from ..training.resize import GrowRequest, ShrinkRequest
from .channel import PilotServer
from .controller import Controller
from .events import EventLog
from .lifecycle import (
    Command,
    Fail,
    FragmentOver,
    GrowFragment,
    LaunchFailed,
    LogEvent,
    MarkLost,
    Note,
    Outlook,
    RankGroup,
    Resolve,
    RunPlain,
    ShrinkFragment,
    Signal,
    StartFragment,
    TaskDir,
    WriteStatus,
    fragment_key,
    parse_key,
    plain_key,
)

__all__ = ["CarryingOut", "ShellState", "FragmentFailed", "Submission", "WARNED_NOTES"]

log = logging.getLogger(__name__)

#: Event-log notes also logged as warnings: a launch given up, a fragment that failed.
WARNED_NOTES = (LogEvent.FRAGMENT_START_TIMEOUT, LogEvent.FRAGMENT_FAILED, LogEvent.TASK_FAILED)


class FragmentFailed(RuntimeError):
    """A training task's ranks failed by themselves (not by a preemption or a rescale)."""


@dataclass
class Submission:
    """What the executor keeps of one submitted task until its future is set."""

    future: Future
    directory: TaskDir
    key: str | None = None  # an elastic task's checkpoint key, while it is live
    # An elastic task's worker: its TrainingTask factory, work (samples) and options.
    trainer: tuple[str, int, dict[str, Any]] | None = None


class ShellState:
    """What the executor's I/O shell keeps, declared once for its roles (:class:`CarryingOut`,
    :class:`~parsl_bf.executor.loop.DecisionLoop`) and set by
    :class:`~parsl_bf.executor.executor.BackfillExecutor`'s constructor. None of it is a
    decision: those are the controller's, which the shell reads only as commands."""

    # Settings and collaborators.
    label: str
    provider: Any
    block_error_handler: Any
    controller: Controller  # only ever called: handle(events, now) -> commands
    warm_ranks: bool
    mpi_hosts: bool
    mpiexec: str
    checkpoint_every: int
    _emulated: bool  # emulated nodes share this machine's cores: one thread a rank
    event_log: EventLog
    server: PilotServer | None
    # Per task and fragment.
    _lock: threading.Lock  # the controller, called from the decision thread and shutdown
    _inbox: queue.Queue[tuple[float, object]]  # (when, what arrived) for the decision thread
    _stop: threading.Event
    _submissions: dict[str, Submission]
    _keys: set[str]  # checkpoint keys of this run's live elastic tasks
    _reports: dict[str, ReportTail]  # task → its progress.jsonl, read so far
    _ready: dict[tuple[str, int], Path]  # warm successors' ready files to watch
    _live: set[tuple[str, int]]  # fragments started and not yet over
    # (task, generation) → the grow request to write once its joiners are set up, and where
    _grows: dict[tuple[str, int], tuple[GrowRequest, Path]]
    _resize_asked: dict[str, float]  # task → when its latest in-place resize was asked
    _outlook: Outlook  # the controller's latest
    _training: bool  # an elastic task was submitted: standby ranks are worth their cost
    _warmed: set[str]  # pilots asked for standby ranks
    # (pilot, key) of each launch sent while carrying out the current command: one that
    # fails half-way KILLs these
    _sent: list[tuple[str, str]]
    _launch_errors: dict[tuple[str, int | None], str]  # (task, generation) → why, here

    if TYPE_CHECKING:  # each role calls the other's entry points

        def _arrived(self, item: object) -> None: ...
        def _carry_out(self, command: Command) -> None: ...
        def _not_carried_out(self, command: Command, exc: Exception) -> None: ...


class CarryingOut(ShellState):
    """The commands, carried out. A role of
    :class:`~parsl_bf.executor.executor.BackfillExecutor`, on its state (:class:`ShellState`)."""

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
                command.pilot, {"op": Op.SIGNAL, "key": command.key, "signal": command.signal}
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
            self.event_log.emit(LogEvent.COMMAND_FAILED, command=_command_label(command), error=why)
        keys = _launch_keys(command)
        sent = set(self._sent)
        if keys and not set(keys) <= sent:  # all sent: launched, whatever failed after
            self._launch_errors[parse_key(keys[0][1])[:2]] = why
            for pilot, key in keys:
                if (pilot, key) in sent:  # waits for peers that will never come
                    with contextlib.suppress(Exception):
                        self._send(pilot, {"op": Op.SIGNAL, "key": key, "signal": "KILL"})
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

    def _settled(self, sub: Submission) -> None:
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
            LogEvent.FRAGMENT_START,
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
            "op": Op.LAUNCH, "key": key, "argv": [str(a) for a in argv], "env": env,
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


def _pythonpath() -> str:
    """Ranks and apps import this package, and the workflow's modules, as the executor does."""
    here = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(p for p in (here, os.getcwd(), os.environ.get("PYTHONPATH")) if p)


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text().strip().splitlines()[-lines:])
    except OSError:
        return _NO_STDERR


_NO_STDERR = "(no stderr)"
