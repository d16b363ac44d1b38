"""Faults that are not preemptions lose at most one checkpoint interval: a rank killed under
the BackfillExecutor restarts from its task's checkpoint, and a rerun of a workflow whose
driver was killed continues every unfinished task from its checkpoint and skips finished
ones. Real pilots, real ranks, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from parsl_bf.executor.lifecycle import TaskDir
from parsl_bf.pilot import standby, warmhost
from parsl_bf.training.reports import read_reports

from ..waiting import until
from .htex import ROOT

pytestmark = pytest.mark.slow
CHECKPOINT_EVERY, BATCH = 5, 64
TASK = "parsl_bf.training.examples:digits_cnn"


def _rank_host(proc: Path) -> bool:
    return (proc / "cmdline").read_bytes().split(b"\0")[2:5:2] == [
        warmhost.MODULE.encode(),
        b"--ranks",
    ]


def _forked_rank(proc: Path) -> bool:
    """A rank forked by a rank host: a child of one, with its command line."""
    ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
    return _rank_host(proc) and _rank_host(Path("/proc", ppid))


def _ranks(marker: str) -> list[int]:
    """PIDs of training ranks of a run (``marker``: its directory): cold ones mention it on
    their command line; a standby that took a rank's job, or a rank forked from the rank host,
    writes its output there."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            text = b" ".join(argv).decode(errors="replace")
            if "mpiexec" in argv[0].decode(errors="replace"):
                continue
            cold = "parsl_bf.training.worker" in text and marker in text
            warm = standby.MODULE in text or _forked_rank(proc)
            warm = warm and marker in os.readlink(proc / "fd/1")
            if cold or warm:
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _one_idle_node(tmp_path: Path, **kw):
    """A BackfillExecutor on one emulated node that is always idle (no preemption),
    checkpoints in ``tmp_path / "ckpt"``."""
    from parsl_bf.executor import BackfillExecutor
    from parsl_bf.providers import LocalBackfillProvider

    provider = LocalBackfillProvider(
        nodes=1, time_scale=1, idle_s=10**6, busy_s=0, max_nodes=1, max_blocks=1,
        max_walltime="01:00:00",
    )  # fmt: skip
    return BackfillExecutor(
        label="bf", provider=provider, checkpoint_every=CHECKPOINT_EVERY,
        checkpoint_dir=str(tmp_path / "ckpt"), **kw,
    )  # fmt: skip


def _checkpointed(progress: Path) -> int:
    return max(
        (r["samples"] for r in read_reports(progress) if r["event"] == "checkpoint"), default=0
    )


def test_a_killed_rank_restarts_from_the_checkpoint_without_a_parsl_retry(
    tmp_path: Path, monkeypatch
):
    import parsl
    from parsl.config import Config

    from parsl_bf.executor import elastic_app

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    # Nodes always idle: no preemption, so the only fault is the killed rank.
    executor = _one_idle_node(tmp_path, max_restarts=2)
    config = Config(
        executors=[executor], strategy_period=1, retries=0, run_dir=str(tmp_path / "runinfo")
    )
    work = 400_000
    train = elastic_app(TASK, work=work, max_nodes=1)
    with parsl.load(config):
        future = train(lr=0.05, width=8, global_batch=BATCH)
        until(lambda: executor.controller.elastic, 60)
        (task,) = executor.controller.elastic
        progress = TaskDir.of(executor.directory, task).progress
        until(lambda: any((tmp_path / "ckpt").glob("*/ckpt-*.pt")), 300, "no checkpoint")
        (rank,) = _ranks(str(tmp_path))
        os.kill(rank, signal.SIGKILL)
        outcome = future.result(timeout=600)
    assert outcome["status"] == "done" and outcome["samples"] == work
    assert outcome["restarts"] == 1
    assert 0 <= outcome["redone_samples"] <= CHECKPOINT_EVERY * BATCH + BATCH
    events = [json.loads(x) for x in (Path(executor.directory) / "events.jsonl").open()]
    kinds = [e["event"] for e in events]
    assert "task_failed" not in kinds
    assert kinds.index("fragment_failed") < kinds.index("task_done")
    # The restart resumed from the checkpoint, not from zero.
    starts = [r for r in read_reports(progress) if r["event"] == "start"]
    assert len(starts) == 2 and starts[1]["samples"] > 0


def test_a_task_sent_on_under_its_name_continues_from_its_checkpoint(
    tmp_path: Path, monkeypatch
) -> None:
    """What a successive-halving search does with a promoted trial: the same name, more work."""
    import parsl
    from parsl.config import Config

    from parsl_bf.executor import elastic_app

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    executor = _one_idle_node(tmp_path)
    config = Config(executors=[executor], strategy_period=1, run_dir=str(tmp_path / "runinfo"))
    options = {"lr": 0.05, "width": 8, "global_batch": BATCH}

    def train(work: int) -> dict:
        return elastic_app(TASK, work=work, max_nodes=1, name="trial-0")(**options).result()

    with parsl.load(config):
        first, second, again = train(3000), train(9000), train(3000)
    assert first["status"] == "done" and first["samples"] == 3000
    assert second["status"] == "done" and second["samples"] == 9000
    # It started where the first left off (its first step's report counts one more batch).
    assert 3000 <= second["resumed_samples"] <= 3000 + BATCH
    # Less work than already done: resolved from the outcome, nothing trained.
    assert again["samples"] == 9000 and again["resumed_samples"] == 9000
    events = [json.loads(x) for x in (Path(executor.directory) / "events.jsonl").open()]
    assert sum(e["event"] == "fragment_start" for e in events) == 2


WORKFLOW = """\
import json
import sys
import parsl
from parsl.config import Config
from parsl_bf.executor import BackfillExecutor, elastic_app
from parsl_bf.providers import LocalBackfillProvider

root, work = sys.argv[1], int(sys.argv[2])
provider = LocalBackfillProvider(
    nodes=1, time_scale=1, idle_s=10**6, busy_s=0, max_nodes=1, max_blocks=1,
    max_walltime="01:00:00",
)
executor = BackfillExecutor(label="bf", provider=provider, checkpoint_every={every})
config = Config(executors=[executor], strategy_period=1, run_dir=root + "/runinfo")
train = elastic_app("{task}", work=work, max_nodes=1)
with parsl.load(config):
    outcome = train(lr=0.05, width=8, global_batch={batch}).result()
print("OUTCOME", json.dumps(outcome), flush=True)
"""


def test_a_rerun_after_the_driver_is_killed_continues_and_skips_finished_work(tmp_path: Path):
    script = tmp_path / "workflow.py"
    script.write_text(WORKFLOW.format(every=CHECKPOINT_EVERY, task=TASK, batch=BATCH))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    work = 1_000_000  # more than orphans could train before they stop

    def run(*, kill_after_checkpoint: bool) -> dict | None:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path), str(work)], cwd=tmp_path, env=env,
            stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        if not kill_after_checkpoint:
            out, _ = proc.communicate(timeout=900)
            assert proc.returncode == 0, out
            (line,) = [x for x in out.splitlines() if x.startswith("OUTCOME ")]
            return json.loads(line.removeprefix("OUTCOME "))
        checkpoints = tmp_path / "runinfo" / "checkpoints" / "bf"
        until(lambda: any(checkpoints.glob("*/ckpt-*.pt")), 300, "no checkpoint")
        os.kill(proc.pid, signal.SIGKILL)  # the driver only: its pilots and ranks are orphans
        proc.wait()
        # Orphans of the dead driver stop by themselves and never go on training.
        until(lambda: not _ranks(str(tmp_path)), 120, "ranks of the dead driver still train")
        return None

    run(kill_after_checkpoint=True)
    resumed = run(kill_after_checkpoint=False)
    assert resumed["status"] == "done" and resumed["samples"] == work
    assert 0 < resumed["resumed_samples"] < work
    again = run(kill_after_checkpoint=False)  # finished: resolved from its outcome
    assert again["samples"] == work and again["resumed_samples"] == work
    latest = sorted((tmp_path / "runinfo").glob("0*"))[-1]
    events = [json.loads(x) for x in (latest / "bf" / "events.jsonl").open()]
    assert not [e for e in events if e["event"] == "fragment_start"]
