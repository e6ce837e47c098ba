"""Launch a float twin of a run (`ddp-lab run --twin`, `chapter.run(..., twin=True)`): the run the parity report
needs to tell amplified float noise from a bug (`ddp-lab compare A B --noise auto`; lab_utils/analysis/noise.py).

Launch side: resolves the keys, asks float_twin.twin_of which twin fits them, and launches it beside the run as
NAME-twin-SUFFIX, where `--noise auto` finds it.
"""

from __future__ import annotations

import dataclasses

from lab_utils.core import config, float_twin
from lab_utils.launch import launcher


def twin_keys(overrides, nproc: int) -> tuple[str, dict]:
    """(suffix, keys) of the twin of a run with these key=value overrides on `nproc` processes."""
    given = config.parse_overrides(overrides)
    return float_twin.twin_of(given, config.resolve(given, world_size=nproc))


def launch_twin(request: launcher.LaunchRequest) -> launcher.RunResult:
    """Launch the float twin of the run `request` asks for (same nproc and options, the twin's keys) as
    NAME-twin-SUFFIX."""
    suffix, keys = twin_keys(request.overrides, request.nproc)
    return launcher.launch(dataclasses.replace(request, name=f"{request.name}{float_twin.SEPARATOR}{suffix}",
                                               overrides=keys))
