"""What the torch workers share: named checks that fail naming the rank and are counted for the
RESULT line the tests read, a bit-exact comparison, and seeded small-integer tensors."""

import json

import torch


class Checks:
    """`checks(name, cond)` asserts `cond`, naming the rank and the check; `result()` prints
    the line the test reads, with how many checks ran (so a worker that skipped some shows)."""

    def __init__(self, rank, size):
        self.rank, self.size, self.names = rank, size, []

    def __call__(self, name, cond):
        self.names.append(name)
        assert cond, f"rank {self.rank}: {name}"

    def refused(self, name, f, exc, words):
        """A check that calling `f` raises `exc` with `words` in its message."""
        try:
            f()
        except exc as e:
            self(name, words in str(e))
            return
        self(name, False)

    def result(self):
        print("RESULT " + json.dumps({"rank": self.rank, "size": self.size, "checks": len(self.names)}), flush=True)


def same(a, b):
    """The same shape, dtype and bits."""
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def val(r, shape, dt, salt=0, seed=7):
    """Rank r's tensor: random small integers (seeded by r, salt and the worker's seed), so a
    block from the wrong rank or offset shows, and sums and products of a few ranks stay exact
    in every dtype the workers use (bfloat16 and int8 included)."""
    gen = torch.Generator().manual_seed(1000 * r + salt + seed)
    return torch.randint(-20, 21, shape, generator=gen).to(dt)
