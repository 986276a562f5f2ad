"""Fixtures more than one test module uses."""

import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def local_root():
    """A directory in RAM (/dev/shm) when there is one, else in the temp directory: where a
    local checkpoint tier lives."""
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    path = Path(tempfile.mkdtemp(prefix="ckptsim-local-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)
