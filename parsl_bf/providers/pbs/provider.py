"""``PBSProBackfillProvider``: preemptible PBS Pro pilots sized to the holes the scheduler leaves.

Each pilot goes to a preemptible queue with as many nodes, for as long, as the best current
hole allows (:mod:`~parsl_bf.providers.pbs.commands`: free vnodes of the queue and the
scheduler's backfill plan, ``estimated.start_time``/``estimated.exec_vnode`` of queued jobs).
Pilots are submitted not rerunnable (``-r n``): PBS cannot preempt them by requeueing, so a
preempted pilot is suspended or deleted (``preempt_order``) and the next one is sized to the
holes of that moment. PBS has no early-warning signal: at the walltime, and when a pilot is
deleted, the batch shell gets SIGTERM (the pilot leaves at once, exit 0) and SIGKILL after the
queue's ``kill_delay``. Preempted and walltime-ended pilots are reported as
``JobState.TIMEOUT``, from ``qstat -f -F json -x`` (``job_state``, ``substate``,
``Exit_status``, run time against the walltime).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from parsl.jobs.states import JobState
from parsl.launchers import MpiRunLauncher
from parsl.launchers.base import Launcher

from ...checks import check_count
from ...decisions import PilotEnd, walltime_reached
from ..base import Pilot, parse_walltime
from ..batch import BatchBackfillProvider, _Job, shared_settings
from ..sizing import Hole, PilotRequest
from . import commands
from .commands import exec_vnodes, pbs_time

__all__ = ["PBSProBackfillProvider", "pilot_from_job"]

_PENDING = {"Q", "W", "T"}  # queued, waiting for its start time, in transit
_RUNNING = {"R", "E", "B"}  # running, exiting, array begun
_SUSPENDED = {"S", "U"}  # suspended (preemption by suspension), suspended by the workstation
_FINISHED = {"F", "X"}  # finished, expired subjob

#: ``Exit_status`` PBS records when a job ran over its walltime (openpbs src/include/job.h).
JOB_EXEC_KILL_WALLTIME = -29
#: ``Exit_status`` values of a job requeued or checkpointed away, i.e. preempted (job.h).
_PREEMPTED_EXITS = {-11: "JOB_EXEC_RERUN", -12: "JOB_EXEC_CHKP", -15: "JOB_EXEC_QUERST"}
#: ``substate`` of a finished job that was deleted, not run to its end (job.h).
SUBSTATE_TERMINATED = 91
#: A pilot ended by SIGTERM/SIGKILL: 256+n as PBS reports a signalled job, 128+n as bash does.
_SIGNALLED = {256 + 15, 256 + 9, 128 + 15, 128 + 9}


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def pilot_from_job(job: dict[str, Any], signal_lead_s: float, job_id: str = "") -> Pilot:
    """A pilot's state from its ``qstat -f -F json -x`` attributes.

    Q/W/T → PENDING (reason "requeued" when it already ran: preemption by requeueing), H →
    HELD, R/E/B → RUNNING, S/U (suspended by preemption) → TIMEOUT "preempted". A finished job:
    ``Exit_status`` -29 (walltime), or a run that reached the walltime minus the lead and ended
    by exit 0 or SIGTERM/SIGKILL (the pilot's trap exits 0 on the walltime's SIGTERM) →
    TIMEOUT "walltime"; requeue/checkpoint codes → TIMEOUT "preempted"; deleted while running
    (``substate`` 91, or killed by SIGTERM/SIGKILL) or before it ran → CANCELLED (PBS records a
    qdel and a preemption by deletion alike); exit 0 → COMPLETED; anything else → FAILED.
    """
    state = str(job.get("job_state", "?"))
    comment = str(job.get("comment", ""))
    started = pbs_time(job.get("stime"))
    limit = (job.get("Resource_List") or {}).get("walltime")
    try:
        wall = parse_walltime(limit) if limit else None
    except ValueError:
        wall = None
    ended = None
    if state in _FINISHED:
        ended = pbs_time(job.get("obittime")) or pbs_time(job.get("mtime"))
    elif state in _RUNNING and started is not None and wall is not None:
        ended = started + wall  # when PBS ends it at the latest
    waiting = state in _PENDING or state == "H"
    preempted_at = _int(job.get("ptime"))  # set at preemption; PBS shows it to managers only
    pilot = Pilot(
        job_id,
        nodes=[] if waiting else exec_vnodes(job.get("exec_vnode")),
        started_at=None if waiting else started,
        ends_at=None if waiting or started is None else ended,
        signalled_at=None if preempted_at is None else float(preempted_at),
        scheduler_id=job_id or None,
    )
    exit_status = _int(job.get("Exit_status"))
    ran_s = (ended - started) if ended is not None and started is not None else 0.0
    at_limit = started is not None and walltime_reached(ran_s, wall, signal_lead_s)
    if state in _PENDING:
        pilot.state, pilot.reason = JobState.PENDING, comment
        if (_int(job.get("run_count")) or 0) > 0:  # it ran and is queued again: requeued
            pilot.reason = "requeued"
            pilot.signalled_at = pilot.signalled_at or pbs_time(job.get("mtime"))
    elif state == "H":
        pilot.state, pilot.reason = JobState.HELD, comment
    elif state in _RUNNING:
        pilot.state = JobState.RUNNING
    elif state in _SUSPENDED:
        pilot.state, pilot.reason = JobState.TIMEOUT, PilotEnd.PREEMPTED
        pilot.signalled_at = pilot.signalled_at or pbs_time(job.get("mtime"))
    elif state in _FINISHED:
        if started is None and (exit_status is None or exit_status >= 0):
            pilot.state, pilot.reason = JobState.CANCELLED, f"deleted before it ran: {comment}"
        elif exit_status == JOB_EXEC_KILL_WALLTIME:
            pilot.state, pilot.reason = JobState.TIMEOUT, PilotEnd.WALLTIME
        elif exit_status in _PREEMPTED_EXITS or preempted_at is not None:
            pilot.state, pilot.reason = JobState.TIMEOUT, PilotEnd.PREEMPTED
        elif at_limit and (exit_status in (None, 0) or exit_status in _SIGNALLED):
            pilot.state, pilot.reason = JobState.TIMEOUT, PilotEnd.WALLTIME
        elif _int(job.get("substate")) == SUBSTATE_TERMINATED or exit_status in (256 + 15, 256 + 9):
            pilot.state = JobState.CANCELLED
            pilot.reason = f"deleted (qdel or preemption by deletion), exit status {exit_status}"
        elif exit_status in (None, 0):
            pilot.state, pilot.reason = JobState.COMPLETED, "exit status 0"
        else:
            pilot.state, pilot.reason = JobState.FAILED, f"exit status {exit_status}"
    elif state == "M":
        pilot.state, pilot.reason = JobState.UNKNOWN, "moved to another server"
    else:
        pilot.state, pilot.reason = JobState.UNKNOWN, state
    return pilot


def _pbs_name(name: str) -> str:
    """A valid PBS job name: printable, no white space, alphabetic first, at most 236 chars."""
    name = re.sub(r"[^\w.+-]", "_", name) or "pilot"
    return (name if name[0].isalpha() else f"p{name}")[:236]


class PBSProBackfillProvider(BatchBackfillProvider):
    """Preemptible PBS Pro pilots sized to the holes the scheduler leaves.

    The settings every batch provider shares (``min_nodes``, ``hole_margin_s``,
    ``exit_wait_s``, ``pending_timeout_s``, Parsl's ``worker_init``, block settings, ...) are
    described once, in :data:`~parsl_bf.providers.batch.SHARED_PARAMETERS`, and appended to
    the ``Parameters`` below; those whose meaning is PBS's own are here.

    Parameters
    ----------
    queue : str
        Execution queue of preemptible work (its free vnodes are where holes are looked for).
    account : str or None
        ``-A`` of the pilots.
    min_walltime, max_walltime : str
        Bounds of a pilot's ``walltime`` ("HH:MM:SS"); a hole shorter than the minimum is not
        used.
    signal_lead_s : int
        A finished pilot whose run reached its walltime minus this lead ended at the walltime
        (PBS sends no signal before the walltime: the pilot leaves on the walltime's SIGTERM).
    cpus_per_node : int
        ``ncpus`` of each chunk (``-l select=N:ncpus=C``); with ``place=scatter:excl`` the
        pilot gets the whole node either way.
    select_options : str
        Appended to each chunk, e.g. ``":ngpus=4:system=polaris"``.
    launcher : Launcher or None
        Default :class:`~parsl.launchers.MpiRunLauncher`: a pilot spans several nodes and each
        needs its own worker pool (``mpirun`` starts one per ``$PBS_NODEFILE`` entry, one per
        chunk); ``SimpleLauncher`` would start the workers on the first node only.
    """

    parsl_provider = "PBSProProvider"
    directive = "#PBS"
    walltime_granularity_s = 1.0  # PBS counts whole seconds

    def __init__(
        self,
        queue: str = "backfill",
        account: str | None = None,
        min_nodes: int = 1,
        max_nodes: int = 4,
        min_walltime: str = "00:02:00",
        max_walltime: str = "01:00:00",
        hole_margin_s: float = 0.0,
        signal_lead_s: int = 10,
        exit_wait_s: float = 8.0,
        pending_timeout_s: float = 30.0,
        cpus_per_node: int = 1,
        select_options: str = "",
        launcher: Launcher | None = None,
        worker_init: str = "",
        scheduler_options: str = "",
        init_blocks: int = 1,
        min_blocks: int = 0,
        max_blocks: int = 4,
        parallelism: float = 1.0,
        cmd_timeout: float = 30.0,
        status_polling_interval: int = 5,
    ) -> None:
        check_count("cpus_per_node", cpus_per_node)
        settings = shared_settings(locals(), launcher=launcher or MpiRunLauncher())
        super().__init__(label="pbspro-backfill", **settings)
        self.queue, self.account = queue, account
        self.cpus_per_node, self.select_options = cpus_per_node, select_options
        self._queue_info: dict[str, Any] | None = None

    def _run(self, args) -> str:
        return commands.run(args, timeout=self.cmd_timeout)

    def _check(self) -> None:
        self._queue_info = commands.check_queue(self.queue, self._run)

    def _holes(self, now: float) -> list[Hole]:
        return commands.holes(self.queue, now, self._run, self._queue_info)

    def _directives(self, job: _Job, request: PilotRequest, out: Path, err: Path) -> str:
        wall = int(request.walltime_s)
        chunk = self.select_options
        if chunk and not chunk.startswith(":"):
            chunk = f":{chunk}"
        name = _pbs_name(job.job_name)
        lines = [
            f"-N {name}",
            f"-q {self.queue}",
            f"-l select={request.nodes}:ncpus={self.cpus_per_node}{chunk}",
            f"-l walltime={wall // 3600:02d}:{wall % 3600 // 60:02d}:{wall % 60:02d}",
            "-l place=scatter:excl",
            f"-o {out}",
            f"-e {err}",
            "-r n",
            # MpiRunLauncher writes cmd_$JOBNAME.sh in the job's directory: one per pilot.
            f"-v JOBNAME={name}.{job.pilot.job_id.rsplit('.', 1)[-1]}",
        ]
        if self.account:
            lines.insert(2, f"-A {self.account}")
        return "\n".join(f"#PBS {line}" for line in lines)

    def _node_list(self) -> str:
        return commands.NODE_LIST_SHELL

    def _submit_script(self, script: Path) -> str:
        return commands.qsub(str(script), self._run)

    def _query(self, scheduler_id: str) -> Pilot | None:
        job = commands.show_job(scheduler_id, self._run)
        if job is None:
            return None
        pilot = pilot_from_job(job, self.signal_lead_s, scheduler_id)
        suspended = job.get("job_state") in _SUSPENDED
        requeued = pilot.state is JobState.PENDING and pilot.reason == "requeued"
        if suspended or requeued:
            # Suspended (it would hold its memory and resume at another moment) or requeued by
            # a site that ignores -r n (it would come back at another size): end it. The
            # executor asks for a pilot sized to the holes of now.
            commands.qdel([scheduler_id], self._run)
            pilot.state, pilot.reason = JobState.TIMEOUT, PilotEnd.PREEMPTED
        return pilot

    def _cancel(self, scheduler_ids: list[str]) -> None:
        commands.qdel(scheduler_ids, self._run)
