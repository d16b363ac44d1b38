"""Training tasks for the tests (imported by fragment ranks, so they live in a module)."""

from __future__ import annotations

import torch
from mpi4py import MPI

from parsl_bf.training.examples import DigitsCNN, digits_cnn


def rank_dependent_model(**options):
    """A broken factory: each rank initialises its model differently."""
    task = digits_cnn(**options)

    def model():
        torch.manual_seed(1000 + MPI.COMM_WORLD.rank)
        return DigitsCNN()

    task.model = model
    return task
