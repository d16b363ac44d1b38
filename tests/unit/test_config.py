"""YAML configs: the shipped ones load; every mistake is one located line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from parsl.config import Config

import parsl_bf
from parsl_bf.config import ConfigError, validate_config
from parsl_bf.executor import BackfillExecutor
from parsl_bf.providers import LocalBackfillProvider

ROOT = Path(__file__).resolve().parents[2]
LOCAL = (ROOT / "configs" / "local.yaml").read_text()


def test_shipped_local_config_builds_parsl_objects() -> None:
    config = parsl_bf.load_config(ROOT / "configs" / "local.yaml")
    assert isinstance(config, Config)
    (executor,) = config.executors
    assert isinstance(executor, BackfillExecutor) and executor.label == "bf"
    assert isinstance(executor.provider, LocalBackfillProvider)
    assert executor.provider.nodes == 64 and executor.provider.max_walltime_s == 1800
    assert config.retries == 2 and config.parsl_bf_allocator.tfwd == "auto"
    # The allocator section configures the executor.
    assert executor.checkpoint_every == 10 and executor.controller.tfwd is None


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_every_shipped_config_builds(name: str, monkeypatch) -> None:
    monkeypatch.setenv("PARSL_BF_WORKER_INIT", "true")
    config = parsl_bf.load_config(ROOT / "configs" / name)
    assert config.executors and all(e.provider is not None for e in config.executors)


def test_shipped_slurm_config_is_the_issue_usage() -> None:
    from parsl.launchers import SrunLauncher

    from parsl_bf.providers import SlurmBackfillProvider

    (executor,) = parsl_bf.load_config(ROOT / "configs" / "htex-slurm-backfill.yaml").executors
    provider = executor.provider
    assert isinstance(provider, SlurmBackfillProvider) and provider.partition == "backfill"
    assert (provider.min_nodes, provider.max_nodes) == (1, 4)
    assert (provider.min_walltime_s, provider.max_walltime_s) == (120, 3600)
    assert isinstance(provider.launcher, SrunLauncher)


def test_environment_variables_are_substituted_and_typed(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NODES", "3")
    monkeypatch.setenv("INIT", "true")  # a shell command, not a boolean
    text = LOCAL.replace("nodes: 64", "nodes: ${NODES}").replace(
        "grace_s: 5", "grace_s: 5\n      worker_init: ${INIT}"
    )
    (tmp_path / "c.yaml").write_text(text)
    config, _ = validate_config(tmp_path / "c.yaml")
    assert config.executors[0].provider.nodes == 3
    assert config.executors[0].provider.worker_init == "true"


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("old", "new", "needle", "where", "message"),
    [
        ("nodes: 64", "nodez: 64", "nodez", "executors[0].provider.nodez", "unknown key"),
        ("nodes: 64", "nodes: four", "nodes: four", "executors[0].provider.nodes", "expected int"),
        (
            "type: LocalBackfillProvider",
            "type: Nope",
            "type: Nope",
            "executors[0].provider.type",
            "unknown class 'Nope'",
        ),
        (
            "objective: throughput",
            "objective: fastest",
            "objective: fastest",
            "allocator.objective",
            "Input should be",
        ),
        ("retries: 2", "retry: 2", "retry: 2", "retry", "unknown key"),
        (
            "nodes: 64",
            "nodes: ${UNSET_FOR_SURE}",
            "UNSET_FOR_SURE",
            "executors[0].provider.nodes",
            "UNSET_FOR_SURE is not set",
        ),
        ("grace_s: 5", "grace_s: [5", "grace_s: [5", "", "not valid YAML"),
    ],
)
def test_mistakes_name_file_line_and_path(tmp_path, old, new, needle, where, message) -> None:
    text = LOCAL.replace(old, new)
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        validate_config(path)
    text_error = str(info.value)
    assert "\n" not in text_error and message in text_error
    if where:
        assert text_error.startswith(f"{path}:{_line_of(text, needle)} {where}: ")
    else:
        assert text_error.startswith(f"{path}:")


def test_validate_command(tmp_path) -> None:
    parsl_bf_cmd = str(Path(sys.executable).with_name("parsl-bf"))
    ok = subprocess.run(
        [parsl_bf_cmd, "validate", "configs/local.yaml"], cwd=ROOT, capture_output=True, text=True
    )
    assert ok.returncode == 0 and "ok: executors bf" in ok.stdout
    (tmp_path / "c.yaml").write_text(LOCAL.replace("max_blocks: 3", "max_blocks: lots"))
    bad = subprocess.run(
        [parsl_bf_cmd, "validate", str(tmp_path / "c.yaml")], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert f"c.yaml:{_line_of(LOCAL, 'max_blocks')} executors[0].provider.max_blocks" in bad.stderr
