"""Elastic tasks on a Slurm cluster of separate hosts (``scripts/slurm-loopback.sh``
``HOSTS=netns``: each node its own network, UTS and mount namespace, so ranks on two nodes
talk over TCP). The BackfillExecutor as a site runs it: ``mpi_hosts=True``, ``address`` where
the hosts reach this machine, one agent per pilot; a fragment's ranks on the pilot's other
hosts are job steps of the pilot. Outcomes and order only, never durations."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
from pathlib import Path

import pytest
import torch

from parsl_bf.executor import BackfillExecutor, FragmentFailed
from parsl_bf.training import load_latest
from parsl_bf.training.command import MPIEXEC
from parsl_bf.training.reports import read_reports

from ..waiting import until
from .fragments import run as run_ranks
from .htex import ROOT
from .slurm import host_command, run, sbatch

pytestmark = pytest.mark.slow
BATCH = 64


def _config(
    env, tmp_path: Path, nodes: int = 2, blocks: int = 1, in_place: bool = True, **executor
):
    from parsl.config import Config
    from parsl.launchers import SimpleLauncher

    from parsl_bf.providers import SlurmBackfillProvider

    provider = SlurmBackfillProvider(
        partition="backfill",
        min_nodes=nodes,
        max_nodes=nodes,
        min_walltime="00:02:00",
        max_walltime="00:20:00",
        launcher=SimpleLauncher(),
        max_blocks=blocks,
        status_polling_interval=1,
    )
    bf = BackfillExecutor(
        label="bf",
        provider=provider,
        allocator={"tfwd": 30, "shrink_in_place": in_place, "grow_in_place": in_place},
        mpi_hosts=True,
        address=env["PARSL_BF_ADDRESS"],
        **executor,
    )
    return Config(executors=[bf], strategy_period=1, run_dir=str(tmp_path / "runinfo"))


def _launched_on(env, host: str) -> tuple[int, int]:
    """Batch scripts (a pilot's agent) and job steps (srun) the host's slurmd started."""
    text = (Path(env["SLURM_LOOPBACK_DIR"]) / "log" / f"slurmd-{host}.log").read_text()
    return len(re.findall("Launching batch job", text)), len(re.findall("launch task", text))


def test_a_fragment_trains_with_ranks_on_two_hosts(hosts, tmp_path: Path, monkeypatch) -> None:
    import parsl

    from parsl_bf.executor import elastic_app

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    before = {h: _launched_on(hosts, h) for h in ("n1", "n2", "n3", "n4")}
    train = elastic_app(
        "parsl_bf.training.examples:digits_cnn", work=2000, min_nodes=2, max_nodes=2
    )
    with parsl.load(_config(hosts, tmp_path)):
        result = train(lr=0.05, width=8, global_batch=BATCH).result(timeout=600)
    parsl.clear()
    assert result["status"] == "done" and result["samples"] == 2000
    assert result["world"] == 2 and result["restarts"] == 0
    # One rank on the agent's host (forked there), the other a job step on a second host.
    after = {h: _launched_on(hosts, h) for h in before}
    agent = [h for h in before if after[h][0] > before[h][0]]
    stepped = [h for h in before if after[h][1] > before[h][1]]
    assert len(agent) == 1 and len(stepped) == 1 and agent != stepped, (agent, stepped)
    reports = [r for f in tmp_path.rglob("progress.jsonl") for r in read_reports(f)]
    assert any(r["event"] == "step" and r["world"] == 2 for r in reports)
    # The same model as 2 ranks on one host (shared memory): TCP between hosts changes no sum.
    alone = tmp_path / "one-host"
    options = {"lr": 0.05, "width": 8, "global_batch": BATCH}
    done = run_ranks(2, alone, 2000, options=options)
    assert done.returncode == 0, done.stderr
    (spanned,) = {p.parent for p in tmp_path.rglob("ckpt-*.pt") if alone not in p.parents}
    a, b = load_latest(spanned)["model"], load_latest(alone / "ckpt")["model"]
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)


def test_local_emulation_starts_each_pilot_on_its_nodes_host(hosts, tmp_path: Path) -> None:
    """LocalBackfillProvider with ``hosts``: emulated node i's pilot runs on host i mod 4
    (there: its hostname, and the pilot's own variables kept through the host's command)."""
    from parsl_bf.providers import LocalBackfillProvider

    names = ["n1", "n2", "n3", "n4"]
    provider = LocalBackfillProvider(
        nodes=4, max_nodes=1, min_walltime="00:00:01", known_holes=False, hosts=names,
        host_command=host_command(hosts),
    )  # fmt: skip
    provider.script_dir = str(tmp_path)
    try:
        jobs = [
            provider.submit(f"echo $(hostname) $PARSL_BF_NODES > {tmp_path}/where-{i}", 1)
            for i in range(3)
        ]
        until(lambda: all(s.terminal for s in provider.status(jobs)), 120)
    finally:
        provider.close(timeout=60)
    for i, job in enumerate(jobs):
        (node,) = provider.pilots[job].nodes
        host, nodes = (tmp_path / f"where-{i}").read_text().split()
        assert nodes == node and host == names[int(node.removeprefix("node")) % 4], (host, node)


def test_a_launch_that_cannot_start_fails_the_future_naming_where(
    hosts, tmp_path: Path, monkeypatch
) -> None:
    """Ranks for another host whose launcher never starts them (a job step that can never
    get its CPUs): stopped at the start bound, restarted once, then the future fails with
    an error naming the pilot and its hosts."""
    import parsl

    from parsl_bf.executor import elastic_app

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    # Each rank sent to a named host waits for ever, as an srun step without CPUs would;
    # the agent's own standbys (no -hosts) start as usual.
    launcher = tmp_path / "mpiexec"
    launcher.write_text(
        f'#!/bin/sh\ncase " $* " in *" -hosts "*) exec sleep 100000 ;; esac\nexec {MPIEXEC} "$@"\n'
    )
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    train = elastic_app(
        "parsl_bf.training.examples:digits_cnn", work=2000, min_nodes=2, max_nodes=2
    )
    config = _config(hosts, tmp_path, mpiexec=str(launcher), start_timeout_s=10, max_restarts=1)
    with parsl.load(config):
        future = train(lr=0.05, width=8, global_batch=BATCH)
        with pytest.raises(FragmentFailed) as failed:
            future.result(timeout=600)
    parsl.clear()
    message = str(failed.value)
    assert "had not started training" in message and "after 1 restarts" in message
    assert re.search(r"pilot \S+ hosts n\d,n\d", message), message
    events = [line for f in tmp_path.rglob("events.jsonl") for line in f.read_text().splitlines()]
    timeouts = [e for e in events if '"fragment_start_timeout"' in e]
    assert len(timeouts) == 2  # the first launch and its restart


def _worlds(tmp_path: Path) -> list[int]:
    """The world sizes of the task's steps, in the order its ranks reported them."""
    return [
        r["world"]
        for f in sorted(tmp_path.rglob("progress.jsonl"))
        for r in read_reports(f)
        if r["event"] == "step"
    ]


def test_a_preempted_hosts_ranks_leave_and_the_fragment_trains_on_the_other(
    hosts, tmp_path: Path, monkeypatch
) -> None:
    """Two one-node pilots on two hosts, one fragment over both; a main job preempts one of
    them: its rank leaves, the other host's trains on (``min_nodes`` 1 stays), no restart.
    The task never runs out of work, so it outlives the preemption however fast it trains:
    the test ends once a step at one node follows the preemption."""
    import parsl

    from parsl_bf.executor import elastic_app

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    train = elastic_app(
        "parsl_bf.training.examples:digits_cnn", work=10**9, min_nodes=1, max_nodes=2
    )
    executor_config = _config(hosts, tmp_path, nodes=1, blocks=2)

    def trained_on_after_the_preemption() -> bool:
        worlds = _worlds(tmp_path)
        return executor.preemptions >= 1 and 1 in worlds[worlds.index(2) :]

    with parsl.load(executor_config):
        executor = executor_config.executors[0]
        future = train(lr=0.05, width=8, global_batch=BATCH)
        until(lambda: 2 in _worlds(tmp_path), 300)
        pilots = run(hosts, "squeue", "-h", "-p", "backfill", "-t", "R", "-o", "%N").split()
        assert len(set(pilots)) == 2, pilots  # one pilot on each of two hosts
        sbatch(hosts, "main", 1, "sleep 20", "-w", pilots[-1], "--time=1")
        until(trained_on_after_the_preemption, 300)
        assert not future.done()
    parsl.clear()
    events = [line for f in tmp_path.rglob("events.jsonl") for line in f.read_text().splitlines()]
    assert not [e for e in events if '"fragment_failed"' in e]  # the preemption cost no restart


def test_a_rank_killed_on_the_other_host_resumes_from_the_checkpoint(
    hosts, tmp_path: Path, monkeypatch
) -> None:
    """A fragment over two pilots on two hosts loses the rank on the second pilot's host
    (SIGKILL, as the OOM killer would): it restarts from its checkpoint and finishes."""
    import parsl

    from parsl_bf.executor import elastic_app

    from .test_no_work_lost import _ranks

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    train = elastic_app(
        "parsl_bf.training.examples:digits_cnn", work=30_000, min_nodes=2, max_nodes=2
    )
    config = _config(hosts, tmp_path, nodes=1, blocks=2, checkpoint_every=5, max_restarts=2)
    with parsl.load(config):
        future = train(lr=0.05, width=8, global_batch=BATCH)
        until(lambda: 2 in _worlds(tmp_path), 300)
        until(lambda: any(tmp_path.rglob("ckpt-*.pt")), 300, "no checkpoint")
        pilots = run(hosts, "squeue", "-h", "-p", "backfill", "-t", "R", "-o", "%N").split()
        namespaces = {_netns(pid): pid for pid in _ranks(str(tmp_path))}
        assert len(namespaces) == 2, namespaces  # a rank on each host
        # The rank on the second pilot's host (namespace "...n<i>" for host n<i>).
        (victim,) = [pid for ns, pid in namespaces.items() if ns.endswith(pilots[-1])]
        os.kill(victim, signal.SIGKILL)
        result = future.result(timeout=600)
    parsl.clear()
    assert result["status"] == "done" and result["samples"] == 30_000
    assert result["restarts"] == 1


def test_a_fragment_over_three_hosts_forks_its_ranks_from_each_hosts_rank_host(
    hosts, tmp_path: Path, monkeypatch
) -> None:
    """Three one-node pilots on three hosts, one fragment of 3 ranks over them (three
    ``mpiexec`` worlds joined over TCP): each host's rank is forked by that host's own warm
    rank host, not only the first's, and the fragment trains every sample."""
    import parsl

    from parsl_bf.executor import elastic_app

    from .test_no_work_lost import _forked_rank, _ranks

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    train = elastic_app(
        "parsl_bf.training.examples:digits_cnn", work=10**9, min_nodes=3, max_nodes=3
    )
    with parsl.load(_config(hosts, tmp_path, nodes=1, blocks=3)):
        train(lr=0.05, width=8, global_batch=BATCH)
        until(lambda: 3 in _worlds(tmp_path), 300, "no step on 3 ranks")
        ranks = _ranks(str(tmp_path))
        forked = {_netns(pid) for pid in ranks if _forked_rank(Path("/proc", str(pid)))}
        pilots = run(hosts, "squeue", "-h", "-p", "backfill", "-t", "R", "-o", "%N").split()
    parsl.clear()
    assert len(set(pilots)) == 3, pilots  # one pilot on each of three hosts
    assert len(ranks) == 3 and len(forked) == 3, (ranks, forked)  # one forked rank per host


def _netns(pid: int) -> str:
    """The network namespace a process runs in (its host on this cluster)."""
    return subprocess.run(
        ["ip", "netns", "identify", str(pid)], capture_output=True, text=True, check=True
    ).stdout.strip()


def _events(tmp_path: Path) -> list[tuple[str, int, int]]:
    """(event, world, samples) of the task's start, resize and end reports, in order; a
    start's and a resize's samples are those after the first step at the new size."""
    return [
        (r["event"], r["world"], r["samples"])
        for f in sorted(tmp_path.rglob("progress.jsonl"))
        for r in read_reports(f)
        if r["event"] in ("start", "grown", "shrunk", "stopped", "done")
    ]


def _executor_events(tmp_path: Path) -> list[str]:
    """The executor's event names so far, in order."""
    return [e["event"] for f in tmp_path.rglob("events.jsonl") for e in read_reports(f)]


def _after(events: list[tuple[str, int, int]], kinds: tuple[str, ...], world: int, i: int) -> int:
    """Index of the first event of ``kinds`` at ``world`` after index ``i``; -1 if none."""
    return next((j for j in range(i + 1, len(events)) if events[j][:2] in
                 [(k, world) for k in kinds]), -1)  # fmt: skip


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "hand-over"])
def test_a_fragment_grows_onto_a_second_host_and_shrinks_off_it(
    hosts, tmp_path: Path, monkeypatch, in_place: bool
) -> None:
    """One host free: the fragment starts there on 1 rank. A second host frees up, a second
    pilot starts there and the fragment grows onto it (a joiner over TCP in place, or a
    successor of 2 ranks from the checkpoint by hand-over); a main job then takes that host
    back and the fragment shrinks off it the same way. Every successor resumes where its
    predecessor stopped."""
    import parsl

    from parsl_bf.executor import elastic_app

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    hold = sbatch(hosts, "main", 3, "sleep 600", "--time=15")  # 3 of the 4 hosts
    until(lambda: run(hosts, "squeue", "-h", "-j", hold, "-o", "%T").strip() == "RUNNING", 60)
    train = elastic_app(
        "parsl_bf.training.examples:digits_cnn", work=10**9, min_nodes=1, max_nodes=2
    )
    config = _config(hosts, tmp_path, nodes=1, blocks=2, in_place=in_place)
    grow = ("grown",) if in_place else ("start",)
    shrink = ("shrunk",) if in_place else ("start",)
    with parsl.load(config):
        train(lr=0.05, width=8, global_batch=BATCH)
        until(lambda: 1 in _worlds(tmp_path), 300)
        first = run(hosts, "squeue", "-h", "-p", "backfill", "-t", "R", "-o", "%N").split()
        run(hosts, "scancel", hold)  # the second pilot can start, on another host
        until(lambda: _after(_events(tmp_path), grow, 2, 0) >= 0, 300, "no grow to 2 ranks")
        # The executor knows the grow is over (the joiner took part in a step, or the
        # predecessor has exited): a preemption during a grow restarts the fragment instead.
        done = "fragment_grown" if in_place else "fragment_stopped"
        until(lambda: done in _executor_events(tmp_path), 300, f"no {done}")
        jobs = run(hosts, "squeue", "-h", "-p", "backfill", "-t", "R", "-o", "%i %N").split("\n")
        pilots = dict(sorted(line.split() for line in jobs if line.strip()))
        second = [node for node in pilots.values() if node not in first]
        assert len(first) == 1 and len(second) == 1, pilots  # one pilot on each of two hosts
        sbatch(hosts, "main", 1, "sleep 20", "-w", second[0], "--time=1")
        until(
            lambda: (
                _after(_events(tmp_path), shrink, 1, _after(_events(tmp_path), grow, 2, 0)) >= 0
            ),
            300,
            "no shrink back to 1 rank",
        )
    parsl.clear()
    events = _events(tmp_path)
    grew = _after(events, grow, 2, 0)
    shrank = _after(events, shrink, 1, grew)
    assert events[0][:2] == ("start", 1) and 0 < grew < shrank, events
    if in_place:  # the same processes throughout: one start, no checkpoint round trip
        assert [e for e, _, _ in events[: shrank + 1]].count("start") == 1, events
    else:  # each successor resumes where its predecessor stopped: its first step is the next
        assert [e for e, _, _ in events[: shrank + 1]].count("start") == 3, events
        for j in (grew, shrank):  # (a step at an epoch's end is shorter than a batch)
            assert events[j - 1][0] == "stopped", events
            assert 0 < events[j][2] - events[j - 1][2] <= BATCH, events
