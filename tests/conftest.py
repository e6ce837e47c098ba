import os
from pathlib import Path

import pytest


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    """Each test's runs go to its own folder (the launcher reads LAB_RUNS_DIR at call time via RUNS)."""
    from lab_utils import launcher

    d = tmp_path / "runs"
    monkeypatch.setattr(launcher, "RUNS", d)
    return d


def pytest_configure(config):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    Path("runs").mkdir(exist_ok=True)
