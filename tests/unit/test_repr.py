"""Parsl's own test suite runs with ``RepresentationMixin._validate_repr`` on: then a
constructor argument that is not kept as an attribute of the same name makes ``repr`` raise,
and every test that builds a config errors. These tests hold our classes to that contract."""

from __future__ import annotations

import pytest
from parsl.utils import RepresentationMixin

from parsl_bf.executor import BackfillExecutor
from parsl_bf.providers import (
    LocalBackfillProvider,
    PBSProBackfillProvider,
    SlurmBackfillProvider,
)


@pytest.fixture
def validate_repr():
    before = RepresentationMixin._validate_repr
    RepresentationMixin._validate_repr = True
    yield
    RepresentationMixin._validate_repr = before


@pytest.mark.parametrize(
    "make",
    [
        lambda: LocalBackfillProvider(nodes=4, max_nodes=2),
        lambda: SlurmBackfillProvider(max_nodes=4),
        lambda: PBSProBackfillProvider(max_nodes=4),
        lambda: BackfillExecutor(label="bf"),
        lambda: BackfillExecutor(label="bf", provider=LocalBackfillProvider(nodes=4)),
    ],
    ids=["local", "slurm", "pbs", "executor", "executor+provider"],
)
def test_every_constructor_argument_is_kept(validate_repr, make):
    text = repr(make())  # raises AttributeError naming the argument that is not kept
    assert text.split("(")[0] in {
        "LocalBackfillProvider",
        "SlurmBackfillProvider",
        "PBSProBackfillProvider",
        "BackfillExecutor",
    }
