"""Every process a launch started, remembered as seen, so that all of them can be stopped, even those in
sessions of their own (torch's agent starts each worker with setsid). Used by the poll loop
(lab_utils/launch/supervise.py) and the stack dumps (launch_diagnose.dump_stacks); `launcher.ProcessTree`.
"""

from __future__ import annotations

import psutil

from lab_utils.launch import elastic_driver


class ProcessTree:
    """Every process started under `root`, remembered as seen, so they can all be stopped later."""

    def __init__(self, root):  # a subprocess.Popen, or a launch_zygote.Forked
        try:
            self.root = psutil.Process(root.pid)
        except psutil.NoSuchProcess:  # a forked process is reaped by its zygote: it may be gone already
            self.root = None
        self.seen: dict[int, psutil.Process] = {root.pid: self.root} if self.root else {}

    def snapshot(self) -> None:
        if self.root is None:
            return
        try:
            for child in self.root.children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def alive(self) -> list[psutil.Process]:
        # psutil.Process remembers the creation time, so a recycled pid is never mistaken for ours.
        return [p for p in self.seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    def stop(self, grace: float = elastic_driver.SHUTDOWN_GRACE) -> None:
        self.snapshot()
        procs = self.alive()
        for p in procs:
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        _, still = psutil.wait_procs(procs, timeout=grace)
        for p in still:  # e.g. a rank that ignores SIGTERM
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(still, timeout=grace)
