"""YOLOv5's InfiniteDataLoader pattern (a DataLoader that makes its iterator once, in __init__) with a
DistributedSampler at rank 0 of 2: the order each epoch gets after set_epoch(epoch), next to the order set_epoch
asks for. Output: infinite_loader_set_epoch.txt."""

from torch.utils.data import DataLoader, DistributedSampler


class _RepeatSampler:
    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)


class InfiniteDataLoader(DataLoader):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "batch_sampler", _RepeatSampler(self.batch_sampler))
        self.iterator = super().__iter__()

    def __len__(self):
        return len(self.batch_sampler.sampler)

    def __iter__(self):
        for _ in range(len(self)):
            yield next(self.iterator)


if __name__ == "__main__":
    ds = list(range(16))
    for nw in (0, 2):
        s = DistributedSampler(ds, num_replicas=2, rank=0, shuffle=True, seed=0)
        dl = InfiniteDataLoader(ds, batch_size=2, sampler=s, num_workers=nw)
        orders = []
        for ep in range(3):
            s.set_epoch(ep)
            orders.append([int(x) for b in dl for x in b])
        ref = []
        for ep in range(3):
            s.set_epoch(ep)
            ref.append(list(iter(s)))
        print("workers", nw, "epochs", orders, "\n  set_epoch-respecting orders", ref)
