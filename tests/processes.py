"""Finding a run's processes after it ended: the launcher tests' "nothing left behind" check."""

import time

import psutil


def words(cmdline: list[str] | None) -> list[str]:
    """A command line as words. A process forked from a launch zygote (lab_utils/launch/launch_zygote.py) sets
    its title to the command it stands for: /proc shows that as one string, which psutil returns as one item."""
    return " ".join(cmdline or []).split()


def leftovers(run_dir):
    """Processes whose command line mentions this run: torchrun and its workers carry out_dir=run_dir."""
    mine = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(run_dir) in part for part in (p.info["cmdline"] or [])):
                mine.append(p)
        except psutil.Error:
            continue
    return mine


def nothing_left_within(run_dir, seconds: float) -> list[str]:
    """Wait up to `seconds` for every process of the run to go; kill and name any that stayed."""
    deadline = time.time() + seconds
    while (left := leftovers(run_dir)) and time.time() < deadline:
        time.sleep(0.2)
    names = []
    for p in left:  # a failed test must not leave a training job behind for the next one
        try:
            names.append(f"{p.pid}: {' '.join(p.cmdline())[:120]}")
            p.kill()
        except psutil.Error:
            pass
    return names


def stray_children() -> list[psutil.Process]:
    """This process's children that are neither its launch zygote (kept for the next launch) nor multiprocessing's
    resource tracker (started once by a spawn context, on a box with a GPU, and kept until this process ends)."""
    keep = ("launch_zygote", "resource_tracker")
    return [c for c in psutil.Process().children(recursive=True)
            if not any(k in " ".join(words(c.cmdline())) for k in keep)]
