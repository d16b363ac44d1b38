"""``SlurmBackfillProvider``: preemptible Slurm pilots sized to the holes the scheduler leaves.

Each pilot goes to a preemptible partition (and/or QOS) with as many nodes, for as long, as the
best current hole allows (:mod:`~parsl_bf.providers.slurm.commands`: idle nodes and the planned
starts of pending jobs). It is submitted with ``--signal=B:USR1@lead``, which reaches its batch
shell at the start of the preemption grace time when the site sets
``SlurmctldParameters=preempt_send_user_signal`` (and ``lead`` seconds before its walltime
ends; Slurm may send it up to a minute early); at preemption the pilot exits at once, so
the main job that wants the nodes starts without waiting out the grace time, and it stays on
a walltime notice until the limit's TERM. Pilots are submitted with ``--no-requeue``: a
preempted pilot ends, and the next one is sized to the holes of that moment. Preempted and
walltime-ended pilots are reported as ``JobState.TIMEOUT``, detected from ``scontrol show
job`` (``PreemptTime``, ``JobState``, run time against the time limit), which works without
an accounting database.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from parsl.jobs.states import JobState
from parsl.launchers import SrunLauncher
from parsl.launchers.base import Launcher

from ...checks import SettingError
from ...decisions import PilotEnd, walltime_reached
from ..base import Pilot, parse_walltime
from ..batch import BatchBackfillProvider, _Job, shared_settings
from ..sizing import SIZINGS, Hole, PilotRequest, Sizing
from . import commands
from .commands import epoch

__all__ = ["SlurmBackfillProvider", "pilot_from_job"]

_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
_RUNNING = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"}
_HELD = {"SUSPENDED", "STOPPED"}
_FAILED = {"FAILED", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY"}


def _nodes(request: PilotRequest) -> str:
    """``--nodes``: a count, or ``fewest-most`` when Slurm may start the pilot smaller."""
    if request.fewest_nodes < request.nodes:
        return f"{request.fewest_nodes}-{request.nodes}"
    return str(request.nodes)


def pilot_from_job(
    fields: dict[str, str], expand: Callable[[str], list[str]], signal_lead_s: float
) -> Pilot:
    """A pilot's state from ``scontrol show job -o`` fields.

    Preempted (``PreemptTime`` set) or ended at its time limit → TIMEOUT; cancelled by a user →
    CANCELLED; its own non-zero exit or a node failure → FAILED. A pilot that left on the
    walltime-end signal exits 0, so a COMPLETED job whose run reached the time limit minus the
    signal's lead is a walltime end too.
    """
    state = fields.get("JobState", "UNKNOWN")
    preempted_at = epoch(fields.get("PreemptTime", "None"))
    pending = state in _PENDING
    started = None if pending else epoch(fields.get("StartTime", ""))
    ended = epoch(fields.get("EndTime", ""))
    nodelist = fields.get("NodeList", "(null)")
    nodes = [] if pending or nodelist in ("", "(null)") else expand(nodelist)
    pilot = Pilot(
        fields.get("JobId", ""),
        nodes=nodes,
        started_at=started,
        ends_at=None if pending else ended,
        signalled_at=preempted_at,
        scheduler_id=fields.get("JobId"),
    )
    limit = fields.get("TimeLimit", "UNLIMITED")
    ran_s = (ended - started) if ended and started else 0.0
    walltime_s = None if limit in ("UNLIMITED", "Partition_Limit") else parse_walltime(limit)
    at_limit = walltime_reached(ran_s, walltime_s, signal_lead_s)
    if pending:
        pilot.state = JobState.PENDING
    elif state in _RUNNING:
        pilot.state = JobState.RUNNING
    elif state in _HELD:
        pilot.state = JobState.HELD
    elif preempted_at is not None or state == "PREEMPTED":
        pilot.state, pilot.reason = JobState.TIMEOUT, PilotEnd.PREEMPTED
    elif state in ("TIMEOUT", "DEADLINE") or (state == "COMPLETED" and at_limit):
        pilot.state, pilot.reason = JobState.TIMEOUT, PilotEnd.WALLTIME
    elif state == "COMPLETED":
        pilot.state, pilot.reason = JobState.COMPLETED, "exit code 0"
    elif state == "CANCELLED":
        pilot.state, pilot.reason = JobState.CANCELLED, PilotEnd.CANCELLED
    elif state in _FAILED:
        pilot.state = JobState.FAILED
        pilot.reason = f"{state.lower()}, exit code {fields.get('ExitCode', '?')}"
    else:
        pilot.state, pilot.reason = JobState.UNKNOWN, state
    return pilot


class SlurmBackfillProvider(BatchBackfillProvider):
    """Preemptible Slurm pilots sized to the holes the scheduler leaves.

    The settings every batch provider shares (``min_nodes``, ``hole_margin_s``,
    ``exit_wait_s``, ``pending_timeout_s``, Parsl's ``launcher``, ``worker_init``, block
    settings, ...) are described once, in :data:`~parsl_bf.providers.batch.SHARED_PARAMETERS`,
    and appended to the ``Parameters`` below; those whose meaning is Slurm's own are here.

    Parameters
    ----------
    partition : str
        Partition of preemptible work (its nodes are where holes are looked for).
    qos, account : str or None
        ``--qos`` (e.g. a preemptible QOS) and ``--account`` of the pilots.
    min_walltime, max_walltime : str
        Bounds of a pilot's ``--time`` ("HH:MM:SS"); a hole shorter than the minimum is not
        used. Slurm counts whole minutes: the walltime is the hole's length rounded down.
    signal_lead_s : int
        ``--signal=B:USR1@lead``: seconds before the walltime ends at which the pilot is told to
        leave (at preemption the signal comes at the start of the grace time).
    exclusive : bool
        ``--exclusive`` nodes.
    sizing : str
        Who sizes the pilots. ``hybrid`` (the default): we size each pilot to a hole from
        ``sinfo`` and ``squeue --start`` (its walltime, and its node count as the upper bound
        of ``--nodes=min_nodes-count``) and Slurm starts it at any size in that range.
        ``provider``: ours alone, a fixed ``--nodes`` and ``--time``. ``scheduler``: Slurm's
        alone: each pilot is submitted at once with ``--nodes=min_nodes-max_nodes``,
        ``--time-min=min_walltime`` and ``--time=max_walltime``, waits in Slurm's queue (it is
        not withdrawn) and starts when any size fits. Either way the pilot learns its real
        nodes and end from its allocation (``SLURM_JOB_NODELIST``, ``EndTime``).
        docs/providers.md, "Who sizes the pilots", has the measurements behind the default.
    """

    parsl_provider = "SlurmProvider"
    directive = "#SBATCH"
    walltime_granularity_s = 60.0

    def __init__(
        self,
        partition: str = "backfill",
        qos: str | None = None,
        account: str | None = None,
        min_nodes: int = 1,
        max_nodes: int = 4,
        min_walltime: str = "00:02:00",
        max_walltime: str = "01:00:00",
        hole_margin_s: float = 0.0,
        signal_lead_s: int = 10,
        exit_wait_s: float = 8.0,
        pending_timeout_s: float = 30.0,
        exclusive: bool = True,
        sizing: Sizing = "hybrid",
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
        settings = shared_settings(locals(), launcher=launcher or SrunLauncher())
        super().__init__(label="slurm-backfill", **settings)
        if sizing not in SIZINGS:
            raise SettingError("sizing", f"{sizing!r} is not one of {', '.join(SIZINGS)}")
        self.partition, self.qos, self.account, self.exclusive = partition, qos, account, exclusive
        self.sizing = sizing

    def _run(self, args) -> str:
        return commands.run(args, timeout=self.cmd_timeout)

    def _check(self) -> None:
        commands.check_partition(self.partition, self._run)

    def _holes(self, now: float) -> list[Hole]:
        return commands.holes(self.partition, now, self._run)

    def _directives(self, job: _Job, request: PilotRequest, out: Path, err: Path) -> str:
        lines = [
            f"--job-name={job.job_name}",
            f"--partition={self.partition}",
            f"--nodes={_nodes(request)}",
            f"--time={int(request.walltime_s // 60)}",
            f"--signal=B:USR1@{self.signal_lead_s}",
            "--no-requeue",
            f"--output={out}",
            f"--error={err}",
        ]
        if request.shortest_s < request.walltime_s:
            lines.append(f"--time-min={int(request.shortest_s // 60)}")
        if self.qos:
            lines.append(f"--qos={self.qos}")
        if self.account:
            lines.append(f"--account={self.account}")
        if self.exclusive:
            lines.append("--exclusive")
        return "\n".join(f"#SBATCH {line}" for line in lines)

    def _node_list(self) -> str:
        return commands.NODE_LIST_SHELL

    def _end_shell(self, walltime_s: int) -> str:
        # Slurm's EndTime: the walltime it granted (--time-min may have shortened it).
        return commands.end_time_shell(walltime_s)

    def _preempted_test(self) -> str:
        return commands.PREEMPTED_SHELL

    def _watch_preemption(self) -> str:
        # Slurm sends the --signal only once: when its walltime notice went out early (a
        # short pilot), a preemption signals job steps only, and a pilot without steps would
        # hold its nodes through the grace time. Ask the controller every few seconds.
        return (
            f"(while sleep 3; do if {commands.PREEMPTED_SHELL}; then kill -USR1 $$; break; fi;"
            " done) 2>/dev/null &"
        )

    def _submit_script(self, script: Path) -> str:
        return commands.sbatch(str(script), self._run)

    def _query(self, scheduler_id: str) -> Pilot | None:
        fields = commands.show_job(scheduler_id, self._run)
        if fields is None:
            return None
        pilot = pilot_from_job(
            fields, lambda hl: commands.hostnames(hl, self._run), self.signal_lead_s
        )
        if pilot.state is JobState.PENDING and pilot.signalled_at is not None:
            # Requeued by a site that ignores --no-requeue: it would come back at another
            # size in ~2 minutes. End it; the executor asks for a pilot sized to the holes.
            commands.scancel([scheduler_id], self._run)
            pilot.state, pilot.reason = JobState.TIMEOUT, PilotEnd.PREEMPTED
        return pilot

    def _cancel(self, scheduler_ids: list[str]) -> None:
        commands.scancel(scheduler_ids, self._run)
