"""What the batch-scheduler backfill providers (Slurm, PBS Pro) share: size, submit, track.

A pilot is sized to the best current hole when ``submit()`` is called. When no hole is big
enough, the pilot waits *in the provider*, not in the scheduler's queue (there a fixed size and
walltime would miss the holes that open later), and is submitted, sized to the hole, at the
first status poll that finds one. A subclass supplies the scheduler: its holes, the directives
of a batch script, submission, the state of its jobs, and cancellation.

The settings every batch provider shares (:data:`SHARED_PARAMETERS`: node and walltime bounds,
the pilot's exit, Parsl's block settings) are checked here, once. Each subclass still lists
them in its own constructor, typed and with its defaults (the YAML loader and the reference
read the signature), passes them on with :func:`shared_settings`, and documents only its own;
the shared descriptions are appended to its docstring's ``Parameters`` when the class is
defined.
"""

from __future__ import annotations

import inspect
import logging
import re
import shlex
import time
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from parsl.jobs.states import TERMINAL_STATES, JobState
from parsl.launchers.base import Launcher
from parsl.providers.errors import SubmitException

from .. import environment
from ..checks import SettingError, check_count, check_number
from ..decisions import PilotEnd, cancel_reason
from .base import Pilot, SchedulerError, check_blocks, check_walltimes, python_bin
from .pilots import PilotProvider
from .sizing import Hole, PilotRequest, Sizing, sizing_request

__all__ = ["SHARED_PARAMETERS", "BatchBackfillProvider", "shared_settings"]

log = logging.getLogger(__name__)

#: The numpy-style ``Parameters`` entries of the settings every batch provider shares:
#: ``(names, type, description)``; ``{parsl_provider}`` and ``{directive}`` are the
#: subclass's. A subclass that documents one of these names itself keeps its own text.
SHARED_PARAMETERS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        ("min_nodes", "max_nodes"),
        "int",
        "Nodes per pilot; no pilot is submitted until a hole of ``min_nodes`` exists.",
    ),
    (
        ("min_walltime", "max_walltime"),
        "str",
        'Bounds of a pilot\'s walltime ("HH:MM:SS"); a hole shorter than the minimum is not used.',
    ),
    (
        ("hole_margin_s",),
        "float",
        "Seconds taken off a hole's length, for schedulers whose planned starts move earlier.",
    ),
    (
        ("signal_lead_s",),
        "int",
        "Seconds before the walltime ends at which the pilot is told to leave; a finished "
        "pilot whose run reached its walltime minus this lead ended at the walltime.",
    ),
    (
        ("exit_wait_s",),
        "float",
        "At preemption or walltime end the pilot's processes get TERM and up to this long to "
        "leave (a BackfillExecutor's fragments checkpoint) before the pilot exits.",
    ),
    (
        ("pending_timeout_s",),
        "float",
        "A submitted pilot the scheduler has not started this long after submission missed its "
        "hole: it is cancelled and sized again to the holes of that moment.",
    ),
    (
        (
            "launcher",
            "worker_init",
            "scheduler_options",
            "init_blocks",
            "min_blocks",
            "max_blocks",
            "parallelism",
            "cmd_timeout",
            "status_polling_interval",
        ),
        "",
        "As for Parsl's ``{parsl_provider}`` (``scheduler_options`` are extra ``{directive}`` "
        "lines).",
    ),
)


@dataclass
class _Job:
    pilot: Pilot
    command: str
    tasks_per_node: int
    job_name: str
    request: PilotRequest | None = None
    script: Path | None = None
    submitted_at: float | None = None


class BatchBackfillProvider(PilotProvider):
    """Base of the batch-scheduler backfill providers; see the subclasses for the options.

    A subclass names ``parsl_provider`` and ``directive``, which its shared settings'
    descriptions use; its constructor must take every shared setting (a ``TypeError`` at its
    definition says which it lacks), and the descriptions of those its docstring does not
    describe are appended to that docstring's ``Parameters``.
    """

    #: Who sizes the pilots (:data:`~parsl_bf.providers.sizing.Sizing`); a scheduler that can
    #: size them itself lets its constructor choose.
    sizing: Sizing = "provider"
    #: The scheduler's walltime unit, in seconds (Slurm counts whole minutes).
    walltime_granularity_s: float = 1.0  # PBS: seconds
    #: Parsl's own provider for this scheduler, e.g. ``"SlurmProvider"``.
    parsl_provider: ClassVar[str]
    #: The prefix of the batch script's scheduler directives, e.g. ``"#SBATCH"``.
    directive: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        names = {n: getattr(cls, n, None) for n in ("parsl_provider", "directive")}
        if None in names.values():
            raise TypeError(f"{cls.__name__} must name its parsl_provider and directive")
        own = inspect.signature(cls.__init__).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in own.values()):
            missing = [name for name in _SHARED if name not in own]
            if missing:
                raise TypeError(f"{cls.__name__}.__init__ lacks the shared {', '.join(missing)}")
        if cls.__doc__:
            cls.__doc__ = _with_shared_parameters(cls.__doc__, **names)

    def __init__(
        self,
        *,
        label: str,
        min_nodes: int,
        max_nodes: int,
        min_walltime: str,
        max_walltime: str,
        hole_margin_s: float,
        signal_lead_s: int,
        exit_wait_s: float,
        pending_timeout_s: float,
        launcher: Launcher,
        worker_init: str,
        scheduler_options: str,
        init_blocks: int,
        min_blocks: int,
        max_blocks: int,
        parallelism: float,
        cmd_timeout: float,
        status_polling_interval: int,
    ) -> None:
        # Each check raises SettingError naming the argument, so that a YAML config's error
        # points at that key's line.
        check_count("min_nodes", min_nodes)
        if check_count("max_nodes", max_nodes) < min_nodes:
            raise SettingError("min_nodes", f"{min_nodes} is more than max_nodes ({max_nodes})")
        walltimes = check_walltimes(min_walltime, max_walltime)
        check_number("hole_margin_s", hole_margin_s, at_least=0)
        check_count("signal_lead_s", signal_lead_s, 0)
        check_number("exit_wait_s", exit_wait_s, at_least=0)
        check_number("pending_timeout_s", pending_timeout_s, above=0)
        check_blocks(init_blocks, min_blocks, max_blocks)
        check_number("parallelism", parallelism, at_least=0, at_most=1)
        check_number("cmd_timeout", cmd_timeout, above=0)
        check_count("status_polling_interval", status_polling_interval)
        super().__init__(label, status_polling_interval)
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.min_walltime, self.max_walltime = min_walltime, max_walltime
        self.min_walltime_s, self.max_walltime_s = walltimes
        self.hole_margin_s, self.signal_lead_s = hole_margin_s, signal_lead_s
        self.exit_wait_s, self.pending_timeout_s = exit_wait_s, pending_timeout_s
        self.launcher, self.worker_init = launcher, worker_init
        self.scheduler_options = scheduler_options
        self.init_blocks, self.min_blocks, self.max_blocks = init_blocks, min_blocks, max_blocks
        self.parallelism, self.cmd_timeout = parallelism, cmd_timeout
        self._jobs: dict[str, _Job] = {}
        self._checked = False

    # --- what a scheduler supplies ----------------------------------------------------------

    @abstractmethod
    def _check(self) -> None:
        """Raise :class:`SchedulerError` if the queue/partition the pilots go to is unusable."""

    @abstractmethod
    def _holes(self, now: float) -> list[Hole]:
        """Idle nodes where pilots may run now, and how long each stays free."""

    @abstractmethod
    def _directives(self, job: _Job, request: PilotRequest, out: Path, err: Path) -> str:
        """The batch script's scheduler directives (``#SBATCH``, ``#PBS``) for ``request``."""

    @abstractmethod
    def _node_list(self) -> str:
        """A shell expression, run inside the pilot, that prints its nodes comma-separated."""

    def _watch_preemption(self) -> str:
        """Shell lines, run in the pilot, that send it USR1 when it is being preempted and the
        scheduler's own signal may not come (empty: the scheduler always signals)."""
        return ""

    def _preempted_test(self) -> str:
        """A shell test, run in the pilot on its signal, true if the pilot is being preempted
        (false: the signal is only a notice that the walltime ends soon)."""
        return "true"

    @abstractmethod
    def _submit_script(self, script: Path) -> str:
        """Submit the batch script; the scheduler's job id."""

    @abstractmethod
    def _query(self, scheduler_id: str) -> Pilot | None:
        """The job's state, nodes, start, end and why it ended; None if the scheduler forgot it."""

    @abstractmethod
    def _cancel(self, scheduler_ids: list[str]) -> None:
        """Cancel these jobs."""

    # --- sizing and submission --------------------------------------------------------------

    def _claimed(self) -> set[str]:
        """Hosts of our submitted pilots that the scheduler has not started yet."""
        return {
            host
            for job in self._jobs.values()
            if job.request is not None and job.pilot.state is JobState.PENDING
            for host in job.request.hosts
        }

    def _size(self, now: float) -> PilotRequest | None:
        holes: list[Hole] = []
        if self.sizing != "scheduler":  # the scheduler's own sizing needs no look at the holes
            claimed = self._claimed()
            holes = [h for h in self._holes(now) if h.node not in claimed]
        return sizing_request(
            self.sizing,
            holes,
            self.min_nodes,
            self.max_nodes,
            self.min_walltime_s,
            self.max_walltime_s,
            self.hole_margin_s,
            self.walltime_granularity_s,
        )

    def _launch_lines(self, job: _Job, request: PilotRequest, out: Path) -> str:
        """The launcher's command for the pilot's real size: one per size the scheduler may
        start it at, chosen by the count of ``PILOT_NODES`` (a launcher such as srun is
        told its task count)."""
        sizes = range(request.fewest_nodes, request.nodes + 1)

        def launch(nodes: int) -> str:
            return self.launcher(job.command, job.tasks_per_node, nodes, str(out.parent))

        if len(sizes) == 1:
            return launch(request.nodes)
        arms = "\n".join(f"{k})\n{launch(k)}\n;;" for k in sizes)
        count = f'$(( $(echo "${environment.PILOT_NODES}" | tr , "\\n" | wc -l) ))'
        return f"case {count} in\n{arms}\nesac"

    def _end_shell(self, walltime_s: int) -> str:
        """A shell expression, run inside the pilot at its start, that prints the epoch second
        its walltime ends (the scheduler may have shortened the walltime asked for)."""
        return f"$(( $(date +%s) + {walltime_s} ))"

    def _script(self, job: _Job, request: PilotRequest, out: Path, err: Path) -> str:
        launch = self._launch_lines(job, request, out)
        wall = int(request.walltime_s)
        return f"""#!/bin/bash
{self._directives(job, request, out, err)}
{self.scheduler_options}
# parsl-bf pilot {job.pilot.job_id}: {_described(request)}.
export PATH={shlex.quote(python_bin())}:$PATH
{self.worker_init}
export {environment.PILOT_JOB_ID}={shlex.quote(job.pilot.job_id)}
export {environment.PILOT_NODES}=$({self._node_list()})
export {environment.PILOT_END}={self._end_shell(wall)}
# At preemption the scheduler's signal ends the pilot at once: the main job waiting for these
# nodes starts as soon as we are gone. The pilot's processes (their own process group) get
# TERM first and up to {self.exit_wait_s:g} s to leave (a BackfillExecutor's fragments
# checkpoint). A signal that is only the walltime notice (it may come a minute early) is not a
# reason to leave; the scheduler's TERM at the limit is.
leave() {{
  echo "parsl-bf: pilot {job.pilot.job_id} $1, exiting" >&2
  kill -TERM -- -$child 2>/dev/null
  for _ in $(seq {int(self.exit_wait_s * 10)}); do
    kill -0 -- -$child 2>/dev/null || break
    sleep 0.1
  done
  exit 0
}}
trap 'if {self._preempted_test()}; then leave preempted; fi' USR1
trap 'leave signalled' TERM
set -m  # the launched command gets a process group of its own, signalled as one
(
{launch}
) &
child=$!
set +m
{self._watch_preemption()}
# Leave at the walltime ourselves: a scheduler may enforce limits only every ~30 s, and a main
# job planned at the hole's end would wait for us.
(sleep $(( ${environment.PILOT_END} - $(date +%s) )); kill -TERM $$) 2>/dev/null &
while :; do
  wait $child
  status=$?
  kill -0 $child 2>/dev/null || exit $status
done
"""

    def _launch(self, job: _Job, request: PilotRequest) -> None:
        """Write and submit the pilot's script; on failure nothing is left behind."""
        directory = Path(self.script_dir or ".").resolve()
        directory.mkdir(parents=True, exist_ok=True)
        stem = directory / f"{job.job_name}.{job.pilot.job_id.rsplit('.', 1)[-1]}"
        script, out, err = (Path(f"{stem}{ext}") for ext in (".submit", ".stdout", ".stderr"))
        script.write_text(self._script(job, request, out, err))
        try:
            scheduler_id = self._submit_script(script)
        except SchedulerError as exc:
            script.unlink(missing_ok=True)
            raise SubmitException(job.job_name, str(exc)) from None
        job.request, job.script, job.submitted_at = request, script, time.time()
        job.pilot.scheduler_id = scheduler_id
        self.resources[job.pilot.job_id] = {
            "job_id": scheduler_id,
            "job_stdout_path": str(out),
            "job_stderr_path": str(err),
        }
        log.info(
            "pilot %s: submitted as %s, %s", job.pilot.job_id, scheduler_id, _described(request)
        )

    def _place_waiting(self, now: float) -> None:
        """Submit the pilots still waiting in the provider, while holes are left for them."""
        for job in self._jobs.values():
            if job.request is not None or job.pilot.state is not JobState.PENDING:
                continue
            try:
                request = self._size(now)
                if request is None:
                    return
                self._launch(job, request)
            except SubmitException as exc:  # a scheduler that refuses now will refuse again
                job.pilot.state, job.pilot.reason = JobState.FAILED, exc.message
                log.error("pilot %s: %s", job.pilot.job_id, exc.message)
            except SchedulerError as exc:  # hole discovery failed: try at the next poll
                log.warning("pilot %s: %s", job.pilot.job_id, exc)
                return

    # --- Parsl's provider interface ----------------------------------------------------------

    def submit(self, command: str, tasks_per_node: int, job_name: str = "parsl.bf") -> str:
        """Submit a pilot sized to the best current hole, or keep it waiting for one.

        Raises :class:`~parsl.providers.errors.SubmitException` with the scheduler's message
        when the scheduler refuses (unknown partition or queue, bad walltime, controller down).
        """
        with self._lock:
            try:
                if not self._checked:
                    self._check()
                    self._checked = True
                now = time.time()
                request = self._size(now)
            except SchedulerError as exc:
                raise SubmitException(job_name, str(exc)) from None
            job_id = f"{self._label}.{self._count + 1}"
            job = _Job(Pilot(job_id), command, tasks_per_node, job_name)
            if request is not None:
                self._launch(job, request)  # raises before anything is recorded
            else:
                log.info("pilot %s: no hole of %d node(s) yet; waiting", job_id, self.min_nodes)
            self._count += 1
            self._jobs[job_id] = job
            self.pilots[job_id] = job.pilot
            self.resources.setdefault(job_id, {"job_id": None})
            return job_id

    def _refresh(self, job: _Job) -> None:
        pilot = job.pilot
        assert pilot.scheduler_id is not None
        seen = self._query(pilot.scheduler_id)
        if seen is None:
            if pilot.state not in TERMINAL_STATES:
                # Forgotten by the controller before we saw its end: it is not running.
                pilot.state, pilot.reason = JobState.COMPLETED, "no longer known to the scheduler"
            return
        pilot.state, pilot.reason = seen.state, seen.reason
        pilot.nodes = seen.nodes or pilot.nodes
        pilot.started_at = seen.started_at or pilot.started_at
        pilot.ends_at = seen.ends_at or pilot.ends_at
        pilot.signalled_at = seen.signalled_at or pilot.signalled_at

    def _withdraw_stale(self, now: float) -> None:
        """A pilot the scheduler has not started within ``pending_timeout_s`` missed its hole
        (a main job took it first): cancel it, and size it again to the holes of now."""
        for job in self._jobs.values():
            if (
                job.request is None
                or not job.request.sized_to_hole  # the scheduler starts it whenever it fits
                or job.pilot.state is not JobState.PENDING
                or job.submitted_at is None
                or now - job.submitted_at < self.pending_timeout_s
            ):
                continue
            assert job.pilot.scheduler_id is not None
            try:
                self._cancel([job.pilot.scheduler_id])
            except SchedulerError as exc:
                log.warning("pilot %s: could not withdraw: %s", job.pilot.job_id, exc)
                continue
            log.info(
                "pilot %s: not started in %.0f s, withdrawn (%s) to be sized again",
                job.pilot.job_id,
                now - job.submitted_at,
                job.pilot.scheduler_id,
            )
            job.request = job.submitted_at = job.pilot.scheduler_id = None
            self.resources[job.pilot.job_id] = {"job_id": None}

    def _update(self, job_ids: list[str]) -> None:
        """Ask the scheduler about these pilots, withdraw those that missed their hole, and
        submit waiting pilots to holes that opened since the last poll."""
        now = time.time()
        for job_id in job_ids:
            job = self._jobs[job_id]
            if job.request is None or job.pilot.state in TERMINAL_STATES:
                continue
            try:
                self._refresh(job)
            except SchedulerError as exc:  # controller unreachable: keep the last state
                log.warning("pilot %s: status unknown: %s", job_id, exc)
        self._withdraw_stale(now)
        self._place_waiting(now)

    def _end(self, job_ids: list[str]) -> None:
        """Waiting pilots are dropped, submitted ones cancelled by the scheduler.

        A submitted pilot is asked about first: one that the scheduler has ended or is
        preempting since the last poll (a scale-in or shutdown right after a preemption) keeps
        that end, so that a preemption is never recorded as our own cancel."""
        submitted = []
        for job_id in job_ids:
            job = self._jobs[job_id]
            pilot = job.pilot
            if job.request is not None:
                assert pilot.scheduler_id is not None
                try:
                    self._refresh(job)
                except SchedulerError as exc:  # cancel anyway; the reason is ours then
                    log.warning("pilot %s: status unknown before cancel: %s", job_id, exc)
                if pilot.state in TERMINAL_STATES:
                    continue
                submitted.append(pilot.scheduler_id)
            signalled = job.request is not None and pilot.signalled_at is not None
            pilot.reason = cancel_reason(signalled)
            if pilot.reason == PilotEnd.PREEMPTED:  # in its grace time: the cancel only hastens it
                pilot.state = JobState.TIMEOUT
                continue
            pilot.state = JobState.CANCELLED
        if not submitted:
            return
        try:
            self._cancel(submitted)
        except SchedulerError as exc:
            log.warning("cancel: %s", exc)


def _described(request: PilotRequest) -> str:
    """A request in words, for the pilot script's header and the log."""
    nodes = f"{request.nodes}"
    if request.fewest_nodes < request.nodes:
        nodes = f"{request.fewest_nodes}-{request.nodes}"
    wall = f"{request.walltime_s:.0f} s"
    if request.shortest_s < request.walltime_s:
        wall = f"{request.shortest_s:.0f}-{request.walltime_s:.0f} s"
    how = "sized to a hole" if request.sized_to_hole else "sized by the scheduler"
    return f"{nodes} node(s) for {wall}, {how}"


#: The settings of :class:`BatchBackfillProvider`'s constructor, which each subclass takes.
_SHARED = tuple(inspect.signature(BatchBackfillProvider.__init__).parameters)[2:]  # no self, label


def shared_settings(arguments: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """The base class's keyword arguments out of a subclass constructor's ``locals()``, with
    ``overrides`` (e.g. the subclass's default launcher) taking precedence."""
    return {name: arguments[name] for name in _SHARED} | overrides


def _with_shared_parameters(doc: str, **names: str) -> str:
    """``doc`` with the entries of :data:`SHARED_PARAMETERS` it lacks appended to its
    ``Parameters`` section (its last section), indented as its own entries are; ``doc`` as
    it is when it has no such section."""
    lines = doc.rstrip().splitlines()
    at = next((i for i, line in enumerate(lines) if line.strip() == "Parameters"), None)
    if at is None:  # nothing to append to
        return doc
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    documented = set()
    for line in lines[at + 2 :]:
        header = re.fullmatch(rf"{indent}(\w+(?:,\s*\w+)*),?\s*(?::.*)?", line)
        if header:
            documented.update(n.strip() for n in header.group(1).split(","))
    added = []
    for names_, kind, text in SHARED_PARAMETERS:
        left = [n for n in names_ if n not in documented]
        if left:
            added.append(indent + ", ".join(left) + (f" : {kind}" if kind else ""))
            added.append(f"{indent}    {text.format(**names)}")
    return "\n".join([*lines, *added]) + "\n"
