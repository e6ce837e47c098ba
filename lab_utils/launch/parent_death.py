"""Die with the parent: PR_SET_PDEATHSIG, the one helper every launch process uses (Linux).

Who dies with whom is drawn in docs/design.md ("Life of a run"): the driver with the launcher or its launch
zygote (SIGTERM, so torch's agent stops the ranks with their grace), the rank zygote and the worker clients with
the driver (SIGKILL), the ranks with the rank zygote (SIGKILL), one plain process with its launch zygote (SIGKILL).
Imports nothing heavy: the worker clients call it before the script's own imports.
"""

from __future__ import annotations

import ctypes
import os
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int, parent_pid: int) -> bool:
    """Ask Linux to send `sig` to this process when its parent dies (PR_SET_PDEATHSIG). False off Linux.

    The signal comes when the parent's *thread* that started us ends; the launcher waits for us in that
    thread, so for us that is the parent's death. If the parent died before this call, nobody will send it:
    the parent pid has already changed, so we send it ourselves. A failing prctl raises OSError.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)
    return True
