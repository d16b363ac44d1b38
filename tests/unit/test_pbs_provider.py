"""PBSProBackfillProvider and its PBS commands, on recorded real PBS Pro output.

PBS Pro cannot run on this machine, so every PBS command is answered from output recorded on
real PBS Pro servers (ALCF Polaris and Aurora, MetaCentrum; tests/data/pbs/README.md says
where each sample comes from). The ``Replay`` runner below stands in for ``commands.run``:
that fake is legitimate ONLY because PBS cannot run here, and it replays recorded text, never
answers made up to fit the code. Two files are marked CONSTRUCTED (README.md): finished,
suspended and requeued pilots, of which no real record was found, and a backfill plan on a free
node; they are built from the recorded field layout and openpbs's documented constants.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from parsl.jobs.states import JobState
from parsl.providers.errors import SubmitException

from parsl_bf.providers.pbs import PBSProBackfillProvider, pilot_from_job
from parsl_bf.providers.pbs import commands as pbs
from parsl_bf.providers.pbs.commands import PBSCommandError
from parsl_bf.providers.sizing import size_pilot

DATA = Path(__file__).resolve().parents[1] / "data" / "pbs"
POLARIS = "polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"
CONSTRUCTED = "constructed.invalid"


def rec(name: str) -> str:
    return (DATA / name).read_text()


def local(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").timestamp()


class Replay:
    """Answers PBS commands with recorded output, and keeps the commands it was given."""

    def __init__(
        self,
        qsub_answer: str = rec("qsub_polaris.out"),
        qsub_error: str | None = None,
        jobs: str = "qstat_polaris.json",
        plan: str = "qstat_polaris.json",
        queues: str = "qstat_Q_polaris.json",
    ) -> None:
        self.qsub_answer, self.qsub_error = qsub_answer, qsub_error
        self.jobs, self.plan, self.queues = jobs, plan, queues
        self.calls: list[list[str]] = []

    def __call__(self, args) -> str:
        args = list(args)
        self.calls.append(args)
        match args:
            case ["qstat", "-Q", "-f", "-F", "json", _]:
                return rec(self.queues)
            case ["pbsnodes", "-a", "-F", "json"]:
                return rec("pbsnodes_polaris.json")
            case ["qstat", "-f", "-F", "json"]:
                return rec(self.plan)
            case ["qstat", "-f", "-F", "json", "-x", _]:
                return rec(self.jobs)
            case ["qsub", script]:
                if self.qsub_error is not None:  # as commands.run reports a failed command
                    raise PBSCommandError(f"qsub {script}: exit 1: {self.qsub_error.strip()}")
                return self.qsub_answer
            case ["qdel", *_]:
                return ""
        raise AssertionError(f"unexpected command {args}")


# --- parsing of every recorded sample ------------------------------------------------------


def test_pbsnodes_recorded() -> None:
    nodes = pbs.parse_pbsnodes(rec("pbsnodes_polaris.json"))
    assert {n: a["state"] for n, a in nodes.items()} == {
        "x3006c0s13b1n0": "free",
        "x3008c0s37b1n0": "job-exclusive",
        "x3009c0s19b0n0": "down",
    }
    assert nodes["x3008c0s37b1n0"]["jobs"] == [f"1147579.{POLARIS}"]
    assert nodes["x3006c0s13b1n0"]["resources_available"]["ncpus"] == 64


def test_queues_recorded_and_check_queue() -> None:
    polaris = pbs.parse_queues(rec("qstat_Q_polaris.json"))
    assert set(polaris) == {"run_next", "debug", "prod", "small"}
    assert pbs.check_queue("debug", Replay())["default_chunk"]["system"] == "polaris"
    with pytest.raises(PBSCommandError, match="not enabled"):
        pbs.check_queue("run_next", Replay())
    with pytest.raises(PBSCommandError, match="Route queue"):
        pbs.check_queue("prod", Replay())
    aurora = Replay(queues="qstat_Q_aurora.json")
    assert pbs.check_queue("backfill-tiny", aurora)["resources_default"]["enable_backfill"] == 1
    with pytest.raises(PBSCommandError, match="not enabled"):
        pbs.check_queue("lustre_scaling", aurora)

    def unknown(args):  # qstat's own words for a queue that does not exist
        raise PBSCommandError(f"{' '.join(args)}: exit 1: {rec('qstat_unknown_queue.err')}")

    with pytest.raises(PBSCommandError, match="Unknown queue destination blabli"):
        pbs.check_queue("blabli", unknown)


def test_jobs_recorded() -> None:
    polaris = pbs.parse_jobs(rec("qstat_polaris.json"))
    assert {j: a["job_state"] for j, a in polaris.items()} == {
        f"359322.{POLARIS}": "Q",
        f"412020.{POLARIS}": "H",
        f"1147579.{POLARIS}": "R",
    }
    aurora = pbs.parse_jobs(rec("qstat_x_aurora.json"))
    assert sorted(a["job_state"] for a in aurora.values()) == ["F", "H", "H", "Q"]
    meta = pbs.parse_jobs(rec("qstat_xf_metacentrum.json"))
    assert list(meta) == ["12860476.meta-pbs.metacentrum.cz"]
    assert pbs.parse_jobs('{"timestamp":1,"pbs_version":"x","pbs_server":"s"}') == {}
    with pytest.raises(PBSCommandError, match="not valid JSON"):
        pbs.parse_jobs("qstat: cannot connect to server")


def test_times_and_exec_vnodes() -> None:
    assert pbs.pbs_time("Thu Nov  9 13:05:50 2023") == local("2023-11-09 13:05:50")
    assert pbs.pbs_time("Tue Oct  4 21:23:33 2022") == local("2022-10-04 21:23:33")
    assert pbs.pbs_time("") is None and pbs.pbs_time(None) is None
    meta = pbs.parse_jobs(rec("qstat_xf_metacentrum.json"))["12860476.meta-pbs.metacentrum.cz"]
    assert pbs.exec_vnodes(meta["exec_vnode"]) == ["charon24", "charon21"]
    big = pbs.parse_jobs(rec("qstat_polaris.json"))[f"1147579.{POLARIS}"]
    assert len(pbs.exec_vnodes(big["exec_vnode"])) == 160 == big["Resource_List"]["nodect"]
    assert "x3008c0s37b1n0" in pbs.exec_vnodes(big["exec_vnode"])  # job-exclusive in pbsnodes
    # A chunk spanning vnodes, and vnode names with brackets (multi-vnode hosts).
    assert pbs.exec_vnodes("(a:ncpus=2+b[1]:ncpus=1)+(c:mem=1kb)") == ["a", "b[1]", "c"]


def test_queue_nodes_follow_default_chunk() -> None:
    nodes = pbs.parse_pbsnodes(rec("pbsnodes_polaris.json"))
    queues = pbs.parse_queues(rec("qstat_Q_polaris.json"))
    # debug: ss11=False drops x3009c0s19b0n0; build=False matches the nodes without "build".
    assert pbs.queue_nodes(nodes, "debug", queues["debug"]) == ["x3006c0s13b1n0", "x3008c0s37b1n0"]
    # small: debug=False drops the debug node x3006c0s13b1n0.
    assert pbs.queue_nodes(nodes, "small", queues["small"]) == ["x3008c0s37b1n0"]
    aurora = pbs.parse_queues(rec("qstat_Q_aurora.json"))["backfill-tiny"]
    assert pbs.queue_nodes(nodes, "backfill-tiny", aurora) == []  # system=aurora
    tied = {**nodes, "x3006c0s13b1n0": {**nodes["x3006c0s13b1n0"], "queue": "backfill"}}
    assert pbs.queue_nodes(tied, "backfill", {}) == ["x3006c0s13b1n0"]


def test_backfill_plan_counts_queued_jobs_only() -> None:
    # Recorded: the running job keeps its estimate, the held jobs' estimates are stale.
    assert pbs.parse_estimates(pbs.parse_jobs(rec("qstat_polaris.json"))) == {}
    assert pbs.parse_estimates(pbs.parse_jobs(rec("qstat_x_aurora.json"))) == {}
    planned = pbs.parse_estimates(pbs.parse_jobs(rec("constructed_estimate_polaris.json")))
    assert planned == {"x3006c0s13b1n0": (local("2023-11-10 12:31:19"), f"359322.{POLARIS}")}


# --- holes and sizing --------------------------------------------------------------------


def test_holes_and_size_pilot_recorded() -> None:
    found = pbs.holes("debug", local("2023-11-10 11:40:15"), Replay())
    # x3008c0s37b1n0 is job-exclusive (job 1147579), x3009c0s19b0n0 down, not in the queue.
    assert [(h.node, h.state, h.window_s, h.blocking_job) for h in found] == [
        ("x3006c0s13b1n0", "free", None, None)
    ]
    request = size_pilot(found, 1, 4, 120.0, 3600.0)
    assert request is not None
    assert (request.nodes, request.walltime_s, request.hosts) == (1, 3600.0, ("x3006c0s13b1n0",))
    assert pbs.holes("small", 0.0, Replay()) == []


def test_hole_window_from_the_backfill_plan() -> None:
    start = local("2023-11-10 12:31:19")
    found = pbs.holes("debug", start - 1800.5, Replay(plan="constructed_estimate_polaris.json"))
    assert [(h.node, h.window_s, h.blocking_job) for h in found] == [
        ("x3006c0s13b1n0", 1800.5, f"359322.{POLARIS}")
    ]
    request = size_pilot(
        found, 1, 4, 120.0, 3600.0, 0.0, PBSProBackfillProvider.walltime_granularity_s
    )
    assert request is not None and (request.nodes, request.walltime_s) == (1, 1800.0)
    assert size_pilot(found, 1, 4, 1900.0, 3600.0) is None  # shorter than min_walltime
    late = pbs.holes("debug", start + 60, Replay(plan="constructed_estimate_polaris.json"))
    assert late[0].window_s == 0.0


# --- qsub, qstat -x, qdel ----------------------------------------------------------------


def test_qsub_recorded_answers() -> None:
    assert pbs.qsub("job.sh", Replay()) == f"2048766.{POLARIS}"
    with pytest.raises(PBSCommandError, match="qsub: Unknown queue"):
        pbs.qsub("job.sh", Replay(qsub_error=rec("qsub_unknown_queue.err")))
    with pytest.raises(PBSCommandError, match="unexpected answer"):
        pbs.qsub("job.sh", Replay(qsub_answer="qsub: waiting for job to start\n"))


def test_show_job() -> None:
    meta = Replay(jobs="qstat_xf_metacentrum.json")
    job = pbs.show_job("12860476.meta-pbs.metacentrum.cz", meta)
    assert job is not None and job["job_state"] == "R"
    assert meta.calls[-1] == ["qstat", "-f", "-F", "json", "-x", "12860476.meta-pbs.metacentrum.cz"]
    assert pbs.show_job("12860476.meta-pbs", meta) == job  # the server named differently
    assert pbs.show_job("1.meta-pbs.metacentrum.cz", meta) is None

    def forgotten(args):  # PBS's "Unknown Job Id" text (as qdel prints it, recorded)
        raise PBSCommandError(f"{' '.join(args)}: exit 1: qstat: Unknown Job Id {args[-1]}")

    assert pbs.show_job("120.pbs", forgotten) is None


def test_qdel_tolerates_jobs_already_gone() -> None:
    def answering(stderr: str):
        def runner(args):
            raise PBSCommandError(f"{' '.join(args)}: exit 1: {stderr.strip()}")

        return runner

    pbs.qdel(["120"], answering(rec("qdel_unknown_job.err")))
    pbs.qdel(["8"], answering(rec("qdel_job_finished.err")))
    with pytest.raises(PBSCommandError, match="Unauthorized Request"):
        pbs.qdel(["8"], answering(rec("qdel_unauthorized.err")))
    calls = Replay()
    pbs.qdel([], calls)
    assert calls.calls == []


# --- pilot_from_job ----------------------------------------------------------------------


def test_pilot_from_recorded_jobs() -> None:
    polaris = pbs.parse_jobs(rec("qstat_polaris.json"))
    queued = pilot_from_job(polaris[f"359322.{POLARIS}"], 10)
    assert queued.state is JobState.PENDING and queued.nodes == [] and queued.started_at is None
    assert queued.reason.startswith("Not Running")
    held = pilot_from_job(polaris[f"412020.{POLARIS}"], 10)
    assert (
        held.state is JobState.HELD and held.reason == "job held, too many failed attempts to run"
    )
    running = pilot_from_job(polaris[f"1147579.{POLARIS}"], 10, f"1147579.{POLARIS}")
    assert running.state is JobState.RUNNING and len(running.nodes) == 160
    assert running.started_at == local("2023-11-09 13:05:50")
    assert running.ends_at == running.started_at + 24 * 3600
    assert running.scheduler_id == f"1147579.{POLARIS}"
    meta = pbs.parse_jobs(rec("qstat_xf_metacentrum.json"))["12860476.meta-pbs.metacentrum.cz"]
    assert pilot_from_job(meta, 10).nodes == ["charon24", "charon21"]
    aurora = pbs.parse_jobs(rec("qstat_x_aurora.json"))
    states = {j.split(".")[0]: pilot_from_job(a, 10).state for j, a in aurora.items()}
    assert states == {
        "4345644": JobState.HELD,
        "4683812": JobState.PENDING,
        "4846771": JobState.CANCELLED,  # finished, substate 91, never ran: "... and terminated"
        "4905429": JobState.HELD,
    }


@pytest.mark.parametrize(
    ("seq", "state", "reason"),
    [
        ("9000001", JobState.TIMEOUT, "walltime"),  # Exit_status -29
        ("9000002", JobState.TIMEOUT, "walltime"),  # exit 0 at the walltime (the trap)
        ("9000003", JobState.COMPLETED, "exit status 0"),
        ("9000004", JobState.CANCELLED, "deleted"),  # substate 91, exit 271
        ("9000005", JobState.FAILED, "exit status 1"),
        ("9000006", JobState.TIMEOUT, "preempted"),  # suspended
        ("9000007", JobState.PENDING, "requeued"),  # ran, queued again
        ("9000008", JobState.TIMEOUT, "preempted"),  # JOB_EXEC_CHKP
        ("9000009", JobState.CANCELLED, "deleted"),  # substate 91, the trap's exit 0
    ],
)
def test_pilot_from_constructed_jobs(seq: str, state: JobState, reason: str) -> None:
    job = pbs.parse_jobs(rec("constructed_pilot_jobs.json"))[f"{seq}.{CONSTRUCTED}"]
    pilot = pilot_from_job(job, 10)
    assert pilot.state is state and pilot.reason.startswith(reason)
    assert pilot.state is not JobState.FAILED or seq == "9000005"


def test_walltime_lead_decides_an_exit_0() -> None:
    job = pbs.parse_jobs(rec("constructed_pilot_jobs.json"))[f"9000002.{CONSTRUCTED}"]
    assert pilot_from_job(job, 10).reason == "walltime"  # ran 595 s of 600, lead 10
    assert pilot_from_job({**job, "Resource_List": {"walltime": "01:00:00"}}, 10).state is (
        JobState.COMPLETED
    )


# --- the provider, end to end through submit, status and cancel ---------------------------


def provider(tmp_path: Path, monkeypatch, runner: Replay, **kw) -> PBSProBackfillProvider:
    p = PBSProBackfillProvider(queue=kw.pop("queue", "debug"), **kw)
    p.script_dir = str(tmp_path)
    monkeypatch.setattr(p, "_run", runner)
    return p


def test_submit_writes_the_pbs_script(tmp_path: Path, monkeypatch) -> None:
    runner = Replay()
    p = provider(
        tmp_path,
        monkeypatch,
        runner,
        account="transformer_eval",
        cpus_per_node=64,
        select_options=":ngpus=4",
    )
    job_id = p.submit("process_worker_pool.py --block 0", 1, "parsl.bf")
    assert job_id == "pbspro-backfill.1"
    assert p.pilots[job_id].scheduler_id == f"2048766.{POLARIS}"
    assert p.resources[job_id]["job_id"] == f"2048766.{POLARIS}"
    script = tmp_path / "parsl.bf.1.submit"
    directives = [ln for ln in script.read_text().splitlines() if ln.startswith("#PBS")]
    assert directives == [
        "#PBS -N parsl.bf",
        "#PBS -q debug",
        "#PBS -A transformer_eval",
        "#PBS -l select=1:ncpus=64:ngpus=4",
        "#PBS -l walltime=01:00:00",  # no queued job planned on the free node: max_walltime
        "#PBS -l place=scatter:excl",
        f"#PBS -o {tmp_path / 'parsl.bf.1.stdout'}",
        f"#PBS -e {tmp_path / 'parsl.bf.1.stderr'}",
        "#PBS -r n",
        "#PBS -v JOBNAME=parsl.bf.1",
    ]
    assert pbs.NODE_LIST_SHELL in script.read_text()
    assert "mpirun -np $WORKERCOUNT" in script.read_text()  # MpiRunLauncher, one per node
    assert runner.calls[-1] == ["qsub", str(script)]
    # The node asked for is claimed until the pilot starts: no second pilot fits now.
    assert p.submit("cmd", 1, "parsl.bf") == "pbspro-backfill.2"
    assert p.pilots["pbspro-backfill.2"].scheduler_id is None
    assert [c[0] for c in runner.calls].count("qsub") == 1


def test_status_of_a_running_pilot(tmp_path: Path, monkeypatch) -> None:
    # qsub answers with the id of the recorded running job (format as in qsub_polaris.out).
    runner = Replay(qsub_answer=f"1147579.{POLARIS}\n")
    p = provider(tmp_path, monkeypatch, runner)
    job_id = p.submit("cmd", 1)
    [status] = p.status([job_id])
    assert status.state is JobState.RUNNING
    assert runner.calls[-1] == ["qstat", "-f", "-F", "json", "-x", f"1147579.{POLARIS}"]
    pilot = p.pilots[job_id]
    assert len(pilot.nodes) == 160 and pilot.ends_at == local("2023-11-10 13:05:50")
    assert p.cancel([job_id]) == [True]
    assert runner.calls[-1] == ["qdel", f"1147579.{POLARIS}"]
    assert p.status([job_id])[0].state is JobState.CANCELLED


@pytest.mark.parametrize("seq", ["9000006", "9000007"])  # suspended, requeued
def test_a_preempted_pilot_is_deleted_and_reported_timeout(
    tmp_path: Path, monkeypatch, seq: str
) -> None:
    runner = Replay(qsub_answer=f"{seq}.{CONSTRUCTED}\n", jobs="constructed_pilot_jobs.json")
    p = provider(tmp_path, monkeypatch, runner)
    job_id = p.submit("cmd", 1)
    [status] = p.status([job_id])
    assert (status.state, status.message) == (JobState.TIMEOUT, "preempted")
    assert runner.calls[-1] == ["qdel", f"{seq}.{CONSTRUCTED}"]
    asked = len(runner.calls)
    assert p.status([job_id])[0].state is JobState.TIMEOUT  # terminal: not asked again
    assert len(runner.calls) == asked


def test_a_walltime_ended_pilot_is_timeout_not_failed(tmp_path: Path, monkeypatch) -> None:
    runner = Replay(qsub_answer=f"9000001.{CONSTRUCTED}\n", jobs="constructed_pilot_jobs.json")
    p = provider(tmp_path, monkeypatch, runner)
    [status] = p.status([p.submit("cmd", 1)])
    assert (status.state, status.message) == (JobState.TIMEOUT, "walltime")
    assert not any(c[0] == "qdel" for c in runner.calls)


def test_qsub_failure_raises_with_pbs_message_and_leaves_nothing(
    tmp_path: Path, monkeypatch
) -> None:
    p = provider(tmp_path, monkeypatch, Replay(qsub_error=rec("qsub_unknown_queue.err")))
    with pytest.raises(SubmitException) as info:
        p.submit("cmd", 1, "parsl.bf")
    assert "qsub: Unknown queue" in str(info.value)
    assert p.pilots == {} and p.resources == {}
    assert list(tmp_path.iterdir()) == []


def test_an_unusable_queue_refuses_the_submit(tmp_path: Path, monkeypatch) -> None:
    runner = Replay()
    p = provider(tmp_path, monkeypatch, runner, queue="run_next")
    with pytest.raises(SubmitException, match="not enabled"):
        p.submit("cmd", 1)
    assert p.pilots == {} and not any(c[0] == "qsub" for c in runner.calls)


def test_constructor_checks() -> None:
    with pytest.raises(ValueError, match="cpus_per_node"):
        PBSProBackfillProvider(cpus_per_node=0)
    assert PBSProBackfillProvider().label == "pbspro-backfill"
