"""Does `with model.no_sync():` around the backward alone (the forward before it) skip the all-reduce?
Each rank feeds different data; after one micro-batch the ranks' .grad agree only if DDP all-reduced them."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
x = torch.full((8, 4), float(rank + 1))
for where in ("outside", "inside"):
    model.zero_grad()
    if where == "outside":
        loss = model(x).sum()
        with model.no_sync():
            loss.backward()
    else:
        with model.no_sync():
            loss = model(x).sum()
            loss.backward()
    g = model.module.weight.grad.clone()
    others = [torch.zeros_like(g) for _ in range(dist.get_world_size())]
    dist.all_gather(others, g)
    if rank == 0:
        print(f"forward {where} no_sync: rank grads equal (all-reduced) = {torch.equal(others[0], others[1])}; "
              f"rank0 {others[0].flatten().tolist()} rank1 {others[1].flatten().tolist()}")
dist.destroy_process_group()
