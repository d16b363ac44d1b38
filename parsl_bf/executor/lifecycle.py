"""The contracts between the BackfillExecutor's decision core and its I/O shell, defined once.

- **Events** (:data:`Event`): what the shell saw. Channel messages, submissions, progress
  reports and ready files become these plain values; the
  :class:`~parsl_bf.executor.controller.Controller` takes them in batches.
- **Commands** (:data:`Command`): what the controller decided. The shell turns them into
  launch and signal messages to pilot agents, futures set, files and log lines written.
- **Process keys**: the agent names each process it runs by the key given at launch:
  ``<task>#<generation>#<group>`` for a fragment's launcher (one per pilot it spans),
  ``plain#<task>`` for a plain app. A process whose launch failed in the agent is reported
  exited with a :func:`launch_failed` code; one the shell could not launch is a
  :class:`LaunchFailed` event.
- **The task directory** (:class:`TaskDir`): every file of a task, by name.

Nothing here does I/O; the shell and the controller import the same names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

__all__ = [
    "E_SLACK",
    "LogEvent",
    "PilotUp",
    "PilotLeaving",
    "PilotGone",
    "TaskSubmitted",
    "ProcessExited",
    "LaunchFailed",
    "Progress",
    "Evaluated",
    "FragmentStarted",
    "Rescaled",
    "FragmentReady",
    "Tick",
    "Event",
    "RankGroup",
    "StartFragment",
    "GrowFragment",
    "ShrinkFragment",
    "RunPlain",
    "Signal",
    "Resolve",
    "Fail",
    "MarkLost",
    "Note",
    "FragmentOver",
    "Outlook",
    "Solved",
    "WriteStatus",
    "Command",
    "DECISIONS",
    "BOOKKEEPING",
    "Placement",
    "fragment_key",
    "plain_key",
    "parse_key",
    "AppCrashed",
    "LAUNCH_FAILED",
    "launch_failed",
    "TaskDir",
]

#: An efficiency (or a utilisation) above 1 + this is noise, not a result: no node does more
#: than one node's work. The controller's summary marks its figures by it (``suspect``,
#: ``noise``), and so do the readers of finished runs (``benchmarks/executor.py``).
E_SLACK = 0.02

#: One launcher per pilot a fragment spans: (pilot, its hosts the fragment runs on).
Placement = tuple[tuple[str, tuple[str, ...]], ...]


class LogEvent(StrEnum):
    """The name of every line of the event log (``events.jsonl``): what the controller's
    :class:`Note` says and what the shell logs itself. The readers of a finished run
    (:mod:`parsl_bf.executor.analysis`, the benchmarks) read the same names."""

    START = "start"
    SHUTDOWN = "shutdown"
    DECISION = "decision"
    BLOCKS_SUBMITTED = "blocks_submitted"
    PILOTS_HELD = "pilots_held"
    COMMAND_FAILED = "command_failed"
    REFUSED = "refused"
    PILOT_UP = "pilot_up"
    PILOT_PREEMPTED = "pilot_preempted"
    PILOT_CANCELLED = "pilot_cancelled"
    PILOT_GONE = "pilot_gone"
    PILOT_ENDING = "pilot_ending"
    TASK_SUBMITTED = "task_submitted"
    TASK_DONE = "task_done"
    TASK_FAILED = "task_failed"
    TASK_REQUEUED = "task_requeued"
    TASK_RESIZES_BY_RESTART = "task_resizes_by_restart"
    FRAGMENT_START = "fragment_start"
    FRAGMENT_STOP = "fragment_stop"
    FRAGMENT_STOPPED = "fragment_stopped"
    FRAGMENT_KILL = "fragment_kill"
    FRAGMENT_LOST = "fragment_lost"
    FRAGMENT_FAILED = "fragment_failed"
    FRAGMENT_START_TIMEOUT = "fragment_start_timeout"
    FRAGMENT_SHRINK = "fragment_shrink"
    FRAGMENT_SHRUNK = "fragment_shrunk"
    FRAGMENT_GROW = "fragment_grow"
    FRAGMENT_GROWN = "fragment_grown"


# --- events -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PilotUp:
    """A pilot's agent registered: its hosts, and when the pilot ends (None: no end known)."""

    pilot: str
    hosts: tuple[str, ...]
    ends_at: float | None
    gpus: int = 0  # GPUs on each node: a fragment runs one rank per GPU, one on CPU nodes


@dataclass(frozen=True)
class PilotLeaving:
    """A pilot was told to go: ``"preempted"`` (a main job takes its nodes), ``"cancelled"``
    (Parsl scaled it in) or ``"walltime"`` (its end is near). Its fragments checkpoint now."""

    pilot: str
    reason: str


@dataclass(frozen=True)
class PilotGone:
    """A pilot's agent said bye or stopped answering: its processes are gone with it."""

    pilot: str
    reason: str


@dataclass(frozen=True)
class TaskSubmitted:
    """A Parsl app was submitted: an elastic training task or a plain task (controller types)."""

    task: Any  # controller.ElasticTask | controller.PlainTask


@dataclass(frozen=True)
class ProcessExited:
    """A process the agent ran has exited with ``code``. ``result`` is what it left: a
    fragment's ``result.json`` (a dict, or None if missing) as read when the exit was seen:
    ``status`` ``done``, ``stopped`` or ``error`` (the task's own code raised: ``error`` has
    the traceback); a plain app's ``(ok, value)`` outcome, or None when it left none (killed
    with its pilot), or ``(False, error)`` when it left none and its runner or its launch said
    why (its outcome could not be written, it could not be launched)."""

    pilot: str
    key: str
    code: int
    result: Any = None


@dataclass(frozen=True)
class LaunchFailed:
    """The shell could not launch ``key`` on ``pilot`` (its files could not be written: a full
    disk), or sent only some of a fragment's launchers (those sent are KILLed): ``error``
    says why. A fragment's launch counts as a failed start; a plain app fails with ``error``."""

    pilot: str
    key: str
    error: BaseException


@dataclass(frozen=True)
class Progress:
    """A fragment's step report: ``rate`` samples/s at ``world`` ranks, ``samples`` so far;
    ``cpu_share``: the cores its rank 0 got over the report's span (CPU ÷ wall seconds), if
    reported."""

    task: str
    world: int
    rate: float
    samples: int
    cpu_share: float | None = None


@dataclass(frozen=True)
class Evaluated:
    """A periodic evaluation of a task: its metrics at ``samples``."""

    task: str
    samples: int
    metrics: dict[str, Any]


@dataclass(frozen=True)
class FragmentStarted:
    """A fragment took its first step, resumed from a checkpoint at ``samples`` (0: none)."""

    task: str
    samples: int


@dataclass(frozen=True)
class Rescaled:
    """A fragment took ``seconds`` from its predecessor's stop to its first step; with
    ``in_place`` ``"shrink"`` or ``"grow"``, the task's running fragment resized in place,
    from the decision to its first step at the new size (``seconds`` < 0: not known)."""

    task: str
    seconds: float
    in_place: str = ""


@dataclass(frozen=True)
class FragmentReady:
    """A warm successor has built its model and waits to take over (its ready file exists)."""

    task: str
    generation: int


@dataclass(frozen=True)
class Tick:
    """Time passed: deadlines (hand-overs, stops, pilots' walltimes) are checked."""


Event = (
    PilotUp
    | PilotLeaving
    | PilotGone
    | TaskSubmitted
    | ProcessExited
    | LaunchFailed
    | Progress
    | Evaluated
    | FragmentStarted
    | Rescaled
    | FragmentReady
    | Tick
)


# --- commands ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankGroup:
    """One launcher's ranks: ``count`` ranks numbered from ``first`` in the fragment's world,
    ``per_node`` of them on each of ``hosts`` of ``pilot``."""

    pilot: str
    hosts: tuple[str, ...]
    first: int
    count: int
    per_node: int


def _placement_of(groups: tuple[RankGroup, ...]) -> Placement:
    return tuple((g.pilot, g.hosts) for g in groups)


@dataclass(frozen=True)
class StartFragment:
    """Start ``task``'s fragment number ``generation``, one launcher per group of ``groups``
    (process key :func:`fragment_key`, its index the group number); with ``after``, as a warm
    successor of that generation: it builds its model, writes its ready file, and takes over
    from that fragment's result. ``leave_min``: the ranks of ``min_nodes`` nodes, below which
    a preempted pilot's ranks do not leave in place (None: they never do)."""

    task: str
    generation: int
    groups: tuple[RankGroup, ...]
    after: int | None = None
    leave_min: int | None = None

    @property
    def placement(self) -> Placement:
        return _placement_of(self.groups)

    @property
    def nodes(self) -> int:
        return sum(len(g.hosts) for g in self.groups)

    @property
    def world(self) -> int:
        return sum(g.count for g in self.groups)


@dataclass(frozen=True)
class ShrinkFragment:
    """Shrink ``task``'s running fragment ``generation`` in place to its launchers ``keep``
    (group numbers): write its shrink request (:mod:`parsl_bf.training.resize`) naming their
    ``ranks`` of its world of ``of``. The ranks of the other groups leave and their launchers
    exit 0."""

    task: str
    generation: int
    keep: tuple[int, ...]
    ranks: tuple[int, ...] = ()
    of: int = 0


@dataclass(frozen=True)
class GrowFragment:
    """Grow ``task``'s running fragment ``generation`` (of ``world`` ranks) in place: start the
    joiner launchers ``groups`` (group numbers ``first``, ``first`` + 1, …; process keys
    :func:`fragment_key`; their ranks as numbered in the grown fragment) with ``--join``, and
    once every joiner is set up write the grow request (:mod:`parsl_bf.training.resize`). The
    joiners connect at the fragment's next step and get its state from rank 0; from then on
    they are ranks of the fragment. ``leave_min`` as :class:`StartFragment`'s."""

    task: str
    generation: int
    groups: tuple[RankGroup, ...]
    first: int
    world: int = 0
    leave_min: int | None = None

    @property
    def placement(self) -> Placement:
        return _placement_of(self.groups)

    @property
    def nodes(self) -> int:
        return sum(len(g.hosts) for g in self.groups)


@dataclass(frozen=True)
class RunPlain:
    """Run plain task ``task`` on ``host`` of ``pilot`` (process key :func:`plain_key`)."""

    task: str
    pilot: str
    host: str


@dataclass(frozen=True)
class Signal:
    """Signal the process group of ``key`` on ``pilot``: ``"TERM"`` (checkpoint and exit) or
    ``"KILL"``."""

    pilot: str
    key: str
    signal: str


@dataclass(frozen=True)
class Resolve:
    """Set the task's future's result: a fragment's outcome dict or a plain app's value."""

    task: str
    value: Any


@dataclass(frozen=True)
class Fail:
    """Fail the task's future. ``error`` is the plain app's exception, or for a fragment (with
    ``generation``) what went wrong, to which the shell adds the ranks' stderr."""

    task: str
    error: Any
    generation: int | None = None


class AppCrashed(RuntimeError):
    """A plain app that exited without an outcome on pilots that stayed, again and again
    (killed by the kernel, a crash of the interpreter): its future fails with this."""


@dataclass(frozen=True)
class MarkLost:
    """Write a ``lost`` result for a superseded fragment that died without one, so that its
    warm successor, waiting for that result, takes over from the last checkpoint."""

    task: str
    generation: int


@dataclass(frozen=True)
class Note:
    """A line for the event log: what was decided and why."""

    event: LogEvent
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FragmentOver:
    """Every launcher of ``task``'s fragment ``generation`` has exited: the shell stops
    watching its files (progress, ready file, joiners)."""

    task: str
    generation: int


@dataclass(frozen=True)
class Outlook:
    """What the shell acts on between batches, sent when it changes: ``demand``, the nodes
    the tasks could use (Parsl's scaling asks for pilots while it is positive); ``wake_at``,
    the next deadline a batch must come by (a pilot's walltime notice; None: none);
    ``preemptions`` seen so far."""

    demand: int
    wake_at: float | None
    preemptions: int


@dataclass(frozen=True)
class Solved:
    """The batch ran the allocation solver, for ``solve_s`` seconds."""

    solve_s: float


@dataclass(frozen=True)
class WriteStatus:
    """Write ``parsl-bf status``'s snapshot (each tick, and when a task settles): pilots,
    tasks, plain apps, solves and the accounting, as the controller sees them now."""

    snapshot: dict[str, Any]


Command = (
    StartFragment
    | ShrinkFragment
    | GrowFragment
    | RunPlain
    | Signal
    | Resolve
    | Fail
    | MarkLost
    | Note
    | FragmentOver
    | Outlook
    | Solved
    | WriteStatus
)

#: The commands that carry out a decision (the event log's decision lines name them); the
#: others are bookkeeping for the shell.
DECISIONS = (StartFragment, ShrinkFragment, GrowFragment, RunPlain, Signal, Resolve, Fail, MarkLost)
#: What the shell keeps up to date from, between decisions.
BOOKKEEPING = (FragmentOver, Outlook, Solved, WriteStatus)


# --- process keys -----------------------------------------------------------------------------


def fragment_key(task: str, generation: int, group: int) -> str:
    return f"{task}#{generation}#{group}"


def plain_key(task: str) -> str:
    return f"plain#{task}"


def parse_key(key: str) -> tuple[str, int | None, int | None]:
    """``(task, generation, group)`` of a fragment's key; ``(task, None, None)`` of a plain
    app's. ValueError for anything else."""
    parts = key.split("#")
    if len(parts) == 2 and parts[0] == "plain":
        return parts[1], None, None
    if len(parts) == 3:
        return parts[0], int(parts[1]), int(parts[2])
    raise ValueError(f"not a process key: {key!r}")


#: The exit code of a process that never ran because its launch failed: the agent's (as a shell
#: says of a command it cannot run; 127: not found) and the shell's, for a launch it could not
#: carry out (its files could not be written: a full disk). Never the code of a signal.
LAUNCH_FAILED = 126


def launch_failed(code: int) -> bool:
    """The process never ran: its launch failed (:data:`LAUNCH_FAILED`, or 127: not found)."""
    return code in (LAUNCH_FAILED, 127)


# --- the task directory -----------------------------------------------------------------------


@dataclass(frozen=True)
class TaskDir:
    """``<run_dir>/<label>/tasks/<task>/``: everything one task writes, by name.

    An elastic task keeps one ``progress.jsonl`` (every fragment appends) and one checkpoint
    directory (``checkpoints/`` here, or the executor's ``checkpoint_dir/<task key>``, with
    ``outcome.json`` once it is done); each fragment has ``fragment<N>/`` with its
    ``result.json``, its ``ready`` file (a warm successor), its ``resize.json`` (an in-place
    resize request, until rank 0 takes it), its ``rendezvous/`` (ranks of several pilots), a
    ``grow<g>/`` rendezvous per in-place grow and each launcher's ``group<g>.stdout``/
    ``.stderr``. A plain app has ``app.in`` (the packed call), ``app.out`` (its outcome) and its
    output streams; an elastic task whose factory is the app's own function has ``factory.in``.
    """

    path: Path
    #: The task's checkpoints: under ``path`` unless they live where a later run finds them
    #: (the BackfillExecutor's ``checkpoint_dir``).
    checkpoints_dir: Path | None = None

    @classmethod
    def of(cls, executor_dir: Path, task: str, checkpoints: Path | None = None) -> TaskDir:
        return cls(Path(executor_dir) / "tasks" / task, checkpoints)

    @property
    def progress(self) -> Path:
        return self.path / "progress.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.checkpoints_dir or self.path / "checkpoints"

    @property
    def outcome(self) -> Path:
        """The final outcome of a task that ended done, beside its checkpoints: a later run
        of the same workflow resolves the task from it instead of training again."""
        return self.checkpoints / "outcome.json"

    def fragment(self, generation: int) -> Path:
        return self.path / f"fragment{generation}"

    def result(self, generation: int) -> Path:
        return self.fragment(generation) / "result.json"

    def ready(self, generation: int) -> Path:
        return self.fragment(generation) / "ready"

    def rendezvous(self, generation: int) -> Path:
        return self.fragment(generation) / "rendezvous"

    def resize(self, generation: int) -> Path:
        """Where the fragment's ranks look for an in-place resize request."""
        return self.fragment(generation) / "resize.json"

    def grow(self, generation: int, first: int) -> Path:
        """The rendezvous of the fragment's in-place grow whose joiners start at placement
        group ``first`` (one directory per grow)."""
        return self.fragment(generation) / f"grow{first}"

    def stream(self, generation: int, group: int, name: str) -> Path:
        """A launcher's ``stdout`` or ``stderr``."""
        return self.fragment(generation) / f"group{group}.{name}"

    @property
    def factory(self) -> Path:
        return self.path / "factory.in"

    @property
    def app_in(self) -> Path:
        return self.path / "app.in"

    @property
    def app_out(self) -> Path:
        return self.path / "app.out"

    def app_stream(self, name: str) -> Path:
        """A plain app's ``stdout`` or ``stderr``."""
        return self.path / f"app.{name}"
