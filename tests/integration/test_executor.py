"""BackfillExecutor end to end on the local backfill emulation: real pilots (agents), real
fragment ranks (mpiexec), real preemptions (SIGTERM, then SIGKILL after the grace time)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parsl_bf.executor import BackfillExecutor
from parsl_bf.executor.lifecycle import TaskDir
from parsl_bf.providers import LocalBackfillProvider
from parsl_bf.training.reports import read_reports

from ..waiting import until
from .htex import ROOT
from .slurm import run

pytestmark = pytest.mark.slow
CHECKPOINT_EVERY, BATCH = 5, 64
GRACE_S = 10  # the loopback cluster's GraceTime (conftest)


def _events(executor: BackfillExecutor) -> list[dict]:
    """The executor's events so far (a line being written is left for the next read)."""
    return read_reports(Path(executor.directory) / "events.jsonl")


def _results(futures: list, executor: BackfillExecutor, timeout: float = 600) -> list:
    """The futures' results, each waited for up to ``timeout`` s (a bound on a hang, not a
    speed). A hang fails with where each task stands, first in the message, so that the one
    line a CI summary keeps says why."""
    out = []
    for future in futures:
        try:
            out.append(future.result(timeout=timeout))
        except TimeoutError:
            c = executor.controller
            tasks = [
                f"{t.id} {t.state} {t.samples}/{t.work}{'' if t.resolved else ' unresolved'}"
                for t in c.elastic.values()
            ] + [f"{t.id} {t.state}" for t in c.plain.values()]
            last = [e["event"] for e in _events(executor)[-8:]]
            raise AssertionError(
                f"not settled in {timeout:g} s: {'; '.join(tasks)}; pilots {sorted(c.pilots)}; "
                f"last events {last}"
            ) from None
    return out


def _lost_per_restart(reports: list[dict]) -> list[int]:
    """Samples done before a fragment ended but not in the checkpoint its successor loaded."""
    lost, best = [], 0
    for r in reports:
        if r["event"] == "start" and best:
            lost.append(max(0, best - (r["samples"] - BATCH)))
        if "samples" in r:
            best = max(best, r["samples"])
    return lost


def test_elastic_and_plain_tasks_all_finish_through_preemptions(tmp_path: Path, monkeypatch):
    import parsl
    from parsl.app.app import python_app
    from parsl.config import Config

    from parsl_bf.executor import elastic_app

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    # 4 emulated nodes, each idle 40 s then busy 8 s (phase-shifted): pilots ask for the most
    # walltime and are preempted when a main job (the synthetic trace) takes a node back.
    provider = LocalBackfillProvider(
        nodes=4,
        time_scale=1,
        idle_s=40,
        busy_s=8,
        known_holes=False,
        max_nodes=2,
        min_walltime="00:00:05",
        max_walltime="00:30:00",
        grace_s=5,
        max_blocks=4,
    )
    executor = BackfillExecutor(
        label="bf",
        provider=provider,
        allocator={"tfwd": 30},
        checkpoint_every=CHECKPOINT_EVERY,
        rescale_s=5,
        heartbeat_timeout_s=10,
    )
    config = Config(executors=[executor], strategy_period=1, run_dir=str(tmp_path / "runinfo"))
    train = elastic_app(
        "parsl_bf.training.examples:digits_cnn", work=4000, min_nodes=1, max_nodes=2
    )

    @python_app(executors=["bf"])
    def cube(x: int) -> int:
        return x**3

    @python_app(executors=["bf"])
    def gate(path: str) -> str:
        import os
        import time

        while not os.path.exists(path):
            time.sleep(0.2)
        return "open"

    def preempted() -> list:
        return [p for p in provider.pilots.values() if p.reason == "preempted"]

    opened = tmp_path / "open"
    with parsl.load(config):
        # The gate holds a node (and so pilots) until 3 pilots have been preempted, however
        # fast the trials train: the preemptions do not depend on the machine's speed.
        held = gate(str(opened))
        trials = [train(lr=0.05, width=8, global_batch=BATCH, seed=i) for i in range(6)]
        plain = [cube(i) for i in range(20)]
        until(lambda: len(preempted()) >= 3, 600, "fewer than 3 pilots preempted")
        opened.touch()
        assert _results([held], executor, 900) == ["open"]
        assert _results(plain, executor, 900) == [i**3 for i in range(20)]
        outcomes = _results(trials, executor, 900)
    assert all(o["status"] == "done" and o["samples"] == 4000 for o in outcomes)
    assert all(o["metrics"]["accuracy"] > 0.5 for o in outcomes)
    assert len(preempted()) >= 3 and executor.preemptions >= 3
    for task in executor.controller.elastic:
        reports = read_reports(TaskDir.of(executor.directory, task).progress)
        assert all(x <= CHECKPOINT_EVERY * BATCH for x in _lost_per_restart(reports))
    events = _events(executor)
    assert any(e["event"] == "decision" and "pilot preempted" in e["causes"] for e in events)
    # Pilots submitted once there was training started their standbys before registering.
    agents = (Path(executor.directory) / "submit_scripts").glob("*.stderr")
    logs = [log.read_text() for log in agents]
    assert any(0 <= t.find("standby ranks:") < t.find("registering with") for t in logs)


def test_a_task_that_stopped_before_gets_a_walltime_notice_of_its_own(tmp_path, monkeypatch):
    """Known holes (a pilot's walltime is its hole): the first walltime stop of a task comes
    ``walltime_notice_s`` before the end; once it has stopped cleanly, its later holes are cut
    short only by twice its stop time and a little (``Controller.notices``)."""
    import parsl
    from parsl.config import Config

    from parsl_bf.executor import elastic_app

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    provider = LocalBackfillProvider(
        nodes=1,
        time_scale=1,
        idle_s=25,
        busy_s=3,
        known_holes=True,
        min_walltime="00:00:05",
        max_walltime="00:30:00",
        grace_s=5,
        max_blocks=1,
    )
    notice = 10.0  # far above a digits fragment's stop (a checkpoint of a few kB), even loaded
    executor = BackfillExecutor(
        label="bf", provider=provider, walltime_notice_s=notice, min_node_life_s=0
    )
    config = Config(executors=[executor], strategy_period=1, run_dir=str(tmp_path / "runinfo"))
    train = elastic_app("parsl_bf.training.examples:digits_cnn", work=10**10, max_nodes=1)

    def stops_at_walltime() -> list[dict]:
        return [
            e
            for e in _events(executor)
            if e["event"] == "fragment_stop" and e["reason"] == "walltime"
        ]

    with parsl.load(config):
        train(lr=0.05, width=8, global_batch=BATCH)
        until(lambda: len(stops_at_walltime()) >= 2, 300, "fewer than two walltime stops")
    seen = _events(executor)
    ends_at = {e["pilot"]: e["ends_at"] for e in seen if e["event"] == "pilot_up"}
    ending = [e for e in seen if e["event"] == "pilot_ending"]
    stopped = [e["t"] for e in seen if e["event"] == "fragment_stopped"]
    first, second = ending[:2]
    # The first: no stop of the task seen yet, the configured notice (never sooner).
    assert first["t"] >= ends_at[first["pilot"]] - notice
    assert stopped and stopped[0] < second["t"]  # the task stopped cleanly in between
    # The second: cut short by less than the configured notice, by its own stop time's.
    assert ends_at[second["pilot"]] - second["t"] < notice


@pytest.mark.parametrize(
    ("known_holes", "reason"),
    [(True, "walltime"), (False, "preempted")],
    ids=["walltime", "preempted"],
)
def test_a_leaving_pilot_gives_its_ranks_back_in_place(tmp_path, monkeypatch, known_holes, reason):
    """Two nodes, half a cycle apart: node1's first hole ends at 47.5 s, node0's at 100 s.
    With known holes each pilot's walltime is its hole; without, pilots ask for the most
    walltime and a main job preempts them at the hole's end. A task that scales (its step
    waits for its share) spans both pilots; when node1's pilot leaves, its rank there leaves
    and the rank on node0 trains on in the same fragment, with no stop and no restart."""
    import parsl
    from parsl.config import Config

    from parsl_bf.executor import elastic_app

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    provider = LocalBackfillProvider(
        nodes=2,
        time_scale=1,
        idle_s=100,
        busy_s=5,
        known_holes=known_holes,
        max_nodes=1,
        min_walltime="00:00:05",
        max_walltime="00:30:00",
        grace_s=5,
        max_blocks=2,
    )
    executor = BackfillExecutor(
        label="bf", provider=provider, allocator={"tfwd": 600}, min_node_life_s=0
    )
    config = Config(executors=[executor], strategy_period=1, run_dir=str(tmp_path / "runinfo"))
    train = elastic_app("tests.training_tasks:paced_digits", work=10**9, max_nodes=2)

    def seen(kind: str) -> list[dict]:
        return [e for e in _events(executor) if e["event"] == kind]

    with parsl.load(config):
        train(lr=0.05, width=8, global_batch=BATCH)
        until(lambda: seen("fragment_shrunk"), 300, "no fragment gave a leaving pilot back")
        (task,) = executor.controller.elastic
        progress = TaskDir.of(executor.directory, task).progress
        until(lambda: any(r["event"] == "shrunk" for r in read_reports(progress)), 60,
              "the kept rank never stepped at the new size")  # fmt: skip
        preempted = [p for p in provider.pilots.values() if p.reason == "preempted"]
    (shrink,) = [e for e in seen("fragment_shrink") if e.get("reason") == reason]
    (shrunk,) = seen("fragment_shrunk")
    assert (shrunk["generation"], shrunk["nodes"]) == (shrink["generation"], 1)
    stops = [e for e in seen("fragment_stop") if e["generation"] == shrink["generation"]]
    assert all(e["t"] > shrunk["t"] for e in stops)  # only the end of the test stopped it
    starts = [r for r in read_reports(progress) if r["event"] == "start"]
    assert len(starts) == 1  # the same processes throughout: no restart
    if reason == "preempted":
        assert len(preempted) == 1 and executor.preemptions == 1


def _two_pilots(
    tmp_path: Path, idle_s: float, busy_s: float, tfwd: float, grow_in_place: bool = True,
    **options,
):  # fmt: skip
    """A BackfillExecutor (with ``options``) over two emulated nodes, one-node pilots, and its
    config. Only one pilot at first (``max_blocks=1``): a test raises it to 2 once its task
    trains on the first, so the second pilot comes in a decision of its own."""
    from parsl.config import Config

    provider = LocalBackfillProvider(
        nodes=2,
        time_scale=1,
        idle_s=idle_s,
        busy_s=busy_s,
        known_holes=False,
        max_nodes=1,
        min_walltime="00:00:05",
        max_walltime="00:30:00",
        grace_s=5,
        max_blocks=1,
    )
    executor = BackfillExecutor(
        label="bf",
        provider=provider,
        allocator={"tfwd": tfwd, "grow_in_place": grow_in_place},
        checkpoint_every=CHECKPOINT_EVERY,
        rescale_s=2,
        heartbeat_timeout_s=10,
        **options,
    )
    config = Config(executors=[executor], strategy_period=1, run_dir=str(tmp_path / "runinfo"))
    return provider, executor, config


def test_a_warm_rescale_hands_over_without_losing_a_sample(tmp_path: Path, monkeypatch):
    import parsl

    from parsl_bf.executor import elastic_app

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    # Two 1-node pilots: the task starts on the first and grows onto the second while it
    # trains (a warm hand-over); the nodes are idle 60 s of every 70 s, half a period apart
    # (the second one's first hole ends 25 s in, a successor's start fits in it however busy
    # the machine is), so later preemptions shrink it and returning nodes grow it again. The
    # task's step is paced by its share of the batch: two ranks are faster than one whatever
    # the load, so growing always pays.
    # tfwd 600: growing is always worth it. A grow in place would keep the fragment: off.
    provider, executor, config = _two_pilots(
        tmp_path, idle_s=60, busy_s=10, tfwd=600, grow_in_place=False
    )
    train = elastic_app("tests.training_tasks:paced_digits", work=100_000, min_nodes=1, max_nodes=2)
    with parsl.load(config):
        future = train(lr=0.05, width=8, global_batch=BATCH)
        # Parsl's scaling reads max_blocks at each period: a second pilot now arrives while
        # the task trains on one node (not in the same decision as the first, which would
        # start it on both at once).
        until(lambda: executor.controller.fragments, 120, "the task never started")
        provider.max_blocks = 2
        (outcome,) = _results([future], executor)
    assert outcome["status"] == "done" and outcome["samples"] == 100_000
    events = _events(executor)
    warm = [e for e in events if e["event"] == "fragment_start" and e.get("after") is not None]
    assert warm, "no warm rescale happened"
    (task,) = executor.controller.elastic
    reports = read_reports(TaskDir.of(executor.directory, task).progress)
    assert all(x <= CHECKPOINT_EVERY * BATCH for x in _lost_per_restart(reports))
    # A warm successor's process started before its predecessor stopped, and its first step
    # continues from the predecessor's last (less a step's report granularity at an epoch end).
    handed = [
        (i, r)
        for i, r in enumerate(reports)
        if r["event"] == "start"
        and r.get("stopped_at")
        and (r.get("process_started_at") or float("inf")) < r["stopped_at"]
    ]
    assert handed
    for i, r in handed:
        best = max(x["samples"] for x in reports[:i] if "samples" in x)
        assert best - (r["samples"] - BATCH) < BATCH


def test_a_task_grows_onto_a_pilot_and_gives_it_back_in_place(tmp_path: Path, monkeypatch):
    """Task a trains on one pilot, then grows in place onto a second (a joiner rank there gets
    the state from the running one), where it measures that it does not scale (each step
    waits a fixed time, whatever the world size). So when task b (the same training code: it
    borrows a's rates) comes, a gives the second node back in place: its rank there leaves,
    the rank on its first pilot trains on in the same process, b starts on the node given
    back, and both train every sample. a's first fragment does all of its work."""
    import parsl

    from parsl_bf.executor import elastic_app

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    # A short look-ahead: over 600 s either task would finish on one node, and the allocator
    # caps a task's gain at its remaining work.
    provider, executor, config = _two_pilots(tmp_path, idle_s=3600, busy_s=1, tfwd=10)
    # At most 64 samples / 0.05 s = 1,280 samples/s at any size, however fast the machine:
    # a's 80,000 samples (a minute at least) outlast its grow and the shrink, and b's 20,000
    # are worth more than a's second node.
    options = {"lr": 0.05, "width": 8, "global_batch": BATCH, "per_sample_s": 0.0}
    code = "tests.training_tasks:paced_digits"
    train_a = elastic_app(code, work=80_000, max_nodes=2)
    train_b = elastic_app(code, work=20_000, max_nodes=2)
    with parsl.load(config):
        first = train_a(per_step_s=0.05, **options)
        until(lambda: executor.controller.elastic, 60, "a was never submitted")
        a = next(iter(executor.controller.elastic.values()))
        until(lambda: 1 in a.measured, 300, "a never trained on one node")
        provider.max_blocks = 2
        until(lambda: len(a.nodes) == 2 and a.previous is None and 2 in a.measured,
              300, "a never trained on two nodes")  # fmt: skip
        second = train_b(per_step_s=0.05, **options)
        outcomes = _results([first, second], executor)
    assert [o["samples"] for o in outcomes] == [80_000, 20_000]
    assert all(o["status"] == "done" and o["restarts"] == 0 for o in outcomes)
    events = _events(executor)
    kinds = [(e["event"], e.get("task")) for e in events]
    shrink = kinds.index(("fragment_shrink", a.id))
    shrunk = kinds.index(("fragment_shrunk", a.id))
    b_start = next(i for i, e in enumerate(events) if e["event"] == "fragment_start"
                   and e["task"] != a.id)  # fmt: skip
    assert shrink < shrunk < b_start  # b took the node once a's rank there had left
    grow, grown = kinds.index(("fragment_grow", a.id)), kinds.index(("fragment_grown", a.id))
    assert grow < grown < shrink
    # One fragment of a throughout: it grew and shrank in the same processes.
    assert kinds.count(("fragment_start", a.id)) == 1
    reports = read_reports(TaskDir.of(executor.directory, a.id).progress)
    resized = [(r["event"], r["previous_world"], r["world"]) for r in reports
               if r["event"] in ("grown", "shrunk")]  # fmt: skip
    assert resized == [("grown", 1, 2), ("shrunk", 2, 1)]
    assert [r["event"] for r in reports].count("start") == 1


@pytest.mark.parametrize("warm_ranks", [True, False])
def test_a_node_with_two_gpus_runs_two_ranks(tmp_path: Path, monkeypatch, warm_ranks: bool):
    import parsl
    from parsl.config import Config

    from parsl_bf.executor import elastic_app

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    # What Slurm's --gpus=2 gives a job: the agent counts the node's GPUs from it. Without
    # CUDA here each rank trains on the CPU, but where the launcher put it is the same.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    provider = LocalBackfillProvider(
        nodes=1, time_scale=1, idle_s=86400, busy_s=60, min_walltime="00:00:10", max_blocks=1
    )
    executor = BackfillExecutor(label="bf", provider=provider, warm_ranks=warm_ranks)
    config = Config(executors=[executor], strategy_period=1, run_dir=str(tmp_path / "runinfo"))
    record = tmp_path / "ranks"
    record.mkdir()
    train = elastic_app("tests.training_tasks:rank_recorder", work=2000, max_nodes=1)
    with parsl.load(config):
        outcome = train(record=str(record), lr=0.05, width=8, global_batch=BATCH).result(600)
    assert outcome["status"] == "done" and outcome["samples"] == 2000
    (task,) = executor.controller.elastic
    reports = read_reports(TaskDir.of(executor.directory, task).progress)
    assert {r["world"] for r in reports if r["event"] == "start"} == {2}  # one node, two ranks
    places = [json.loads(p.read_text()) for p in record.glob("*.json")]
    assert sorted(p["local_rank"] for p in places) == [0, 1]
    assert all(p["local_ranks"] == "2" and p["device"] in ("cpu", f"cuda:{p['local_rank']}")
               for p in places)  # fmt: skip


def test_backfill_executor_on_slurm_pilots_through_a_main_job(slurm, tmp_path: Path, monkeypatch):
    import parsl
    from parsl.app.app import python_app
    from parsl.config import Config
    from parsl.launchers import SimpleLauncher

    from parsl_bf.executor import elastic_app
    from parsl_bf.providers import SlurmBackfillProvider

    from .slurm import job, sbatch, start_delay

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    busy = sbatch(slurm, "main", 2, "sleep 600", "--time=5")
    until(lambda: job(slurm, busy)["JobState"] == "RUNNING", 30)
    # One agent per pilot (SimpleLauncher); it starts the fragment ranks on its nodes.
    provider = SlurmBackfillProvider(
        partition="backfill",
        max_nodes=2,
        min_walltime="00:01:00",
        max_walltime="00:10:00",
        launcher=SimpleLauncher(),
        max_blocks=1,
        status_polling_interval=1,
    )
    executor = BackfillExecutor(
        label="bf",
        provider=provider,
        allocator={"tfwd": 30},
        checkpoint_every=CHECKPOINT_EVERY,
        rescale_s=5,
    )
    config = Config(executors=[executor], strategy_period=1, run_dir=str(tmp_path / "runinfo"))
    train = elastic_app("parsl_bf.training.examples:digits_cnn", work=3000, max_nodes=2)

    @python_app(executors=["bf"])
    def cube(x: int) -> int:
        return x**3

    with parsl.load(config):
        trials = [train(lr=0.05, width=8, global_batch=BATCH, seed=i) for i in range(2)]
        plain = [cube(i) for i in range(5)]
        until(lambda: executor.controller.solves > 0 and executor.server.pilots, 120)
        until(lambda: any(p.samples > 0 for p in executor.controller.elastic.values()), 120)
        main = sbatch(slurm, "main", 2, "sleep 10", "--time=1")  # needs the pilot's nodes
        until(lambda: job(slurm, main)["JobState"] in ("RUNNING", "COMPLETED"), 60)
        assert start_delay(slurm, main) <= GRACE_S + 6  # the fragments checkpoint within it
        assert _results(plain, executor) == [i**3 for i in range(5)]
        outcomes = _results(trials, executor)
    assert all(o["status"] == "done" and o["samples"] == 3000 for o in outcomes)
    assert executor.preemptions >= 1
    ends = {p.job_id: (p.state.name, p.reason) for p in provider.pilots.values()}
    assert any(reason == "preempted" for _state, reason in ends.values()), ends
    run(slurm, "scancel", busy)


def test_parsl_monitoring_records_the_executors_tasks_and_blocks(tmp_path: Path, monkeypatch):
    import sqlite3

    import parsl
    from parsl.app.app import python_app
    from parsl.config import Config
    from parsl.monitoring import MonitoringHub

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.chdir(tmp_path)
    provider = LocalBackfillProvider(
        nodes=2, time_scale=1, idle_s=86400, busy_s=60, min_walltime="00:00:10", max_blocks=1
    )
    db = tmp_path / "monitoring.db"
    config = Config(
        executors=[BackfillExecutor(label="bf", provider=provider)],
        monitoring=MonitoringHub(logging_endpoint=f"sqlite:///{db}"),
        run_dir=str(tmp_path / "runinfo"),
    )

    @python_app(executors=["bf"])
    def inc(x: int) -> int:
        return x + 1

    with parsl.load(config):
        assert [inc(i).result(timeout=120) for i in range(3)] == [1, 2, 3]
    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from task").fetchone() == (3,)
        assert conn.execute("select count(*) from block where executor_label='bf'").fetchone()[0]
        done = conn.execute("select count(*) from status where task_status_name='exec_done'")
        assert done.fetchone() == (3,)
