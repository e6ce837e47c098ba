"""Launch a float twin of a run (`ddp-lab run --twin`, `chapter.run(..., twin=True)`): the run the parity report
needs to tell amplified float noise from a bug (`ddp-lab compare A B --noise auto`; lab_utils/analysis/noise.py).

Launch side: resolves the keys, asks float_twin.twin_of which twin fits them, and launches it beside the run as
NAME-twin-SUFFIX, where `--noise auto` finds it.
"""

from __future__ import annotations

from lab_utils.core import config, float_twin
from lab_utils.launch import launcher


def twin_keys(overrides, nproc: int) -> tuple[str, dict]:
    """(suffix, keys) of the twin of a run with these key=value overrides on `nproc` processes."""
    given = config.parse_overrides(overrides)
    return float_twin.twin_of(given, config.resolve(given, world_size=nproc))


def launch_twin(name: str, nproc: int, overrides, **launch_kwargs) -> launcher.RunResult:
    """Launch the float twin of run `name` (same nproc, same keys but the twin's) as NAME-twin-SUFFIX."""
    suffix, keys = twin_keys(overrides, nproc)
    return launcher.launch(f"{name}{float_twin.SEPARATOR}{suffix}", nproc, keys, **launch_kwargs)
