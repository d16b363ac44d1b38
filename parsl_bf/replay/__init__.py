"""Replay of recorded idle-node traces on the allocation code (readers so far)."""

from .jobsets import Job, default_data_dir, load_job_set, missing_data

__all__ = ["Job", "default_data_dir", "load_job_set", "missing_data"]
