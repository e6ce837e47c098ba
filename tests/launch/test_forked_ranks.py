"""launch/forked_ranks: the lessons' in-process gloo ranks (chapters 06 and 08). A rank's own traceback reaches
the caller and the ranks waiting for it are stopped at once; a stuck rank is killed and named at the deadline; a
rank that returns instead of calling `finish` is refused (returning is what deadlocked in gloo's teardown on CI);
nothing outlives a call."""

import time

import pytest
from processes import stray_children

from lab_utils.launch import forked_ranks

pytestmark = pytest.mark.slow  # every test here starts processes (see tests/conftest.py)


def _allreduce_rank(rank, world_size, init, out, fail_rank):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
    if rank == fail_rank:
        raise ValueError(f"planted failure on rank {rank}")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)  # the others wait here for the failed rank
    forked_ranks.finish(out, rank, {"rank": rank, "sum": t.item()})


def _returning_rank(rank, world_size, init, out):
    return {"rank": rank}


def _sleeping_rank(rank, world_size, init, out):
    time.sleep(600)


def test_records_come_back_in_rank_order():
    assert forked_ranks.run(_allreduce_rank, 2, (-1,), deadline_s=120, what="sum") == [
        {"rank": 0, "sum": 3.0}, {"rank": 1, "sum": 3.0}]
    assert stray_children() == []


@pytest.mark.parametrize("fail_rank", [0, 1])
def test_the_failed_ranks_own_traceback_and_the_waiting_rank_stopped_long_before_the_deadline(fail_rank):
    # the waiting peer fails too ("Connection reset by peer"): the report must name the rank that failed first,
    # whichever it is (CI showed a lowest-rank-first report naming the peer)
    start = time.monotonic()
    want = rf"(?s)sum: rank {fail_rank} failed first.*:\n.*_allreduce_rank.*planted failure on rank {fail_rank}"
    with pytest.raises(RuntimeError, match=want):
        forked_ranks.run(_allreduce_rank, 2, (fail_rank,), deadline_s=300, what="sum")
    assert time.monotonic() - start < 60  # rank 0 waited in all_reduce: killed once rank 1 failed
    assert stray_children() == []


def test_a_returning_rank_is_refused():
    with pytest.raises(RuntimeError, match="returned without calling forked_ranks.finish"):
        forked_ranks.run(_returning_rank, 2, deadline_s=60, what="ret")
    assert stray_children() == []


def test_stuck_ranks_are_killed_and_named_at_the_deadline():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"stuck: rank\(s\) \[0, 1\] still running 2 s after the start; killed"):
        forked_ranks.run(_sleeping_rank, 2, deadline_s=2, what="stuck")
    assert time.monotonic() - start < 30
    assert stray_children() == []
