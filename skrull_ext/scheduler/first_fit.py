"""First-fit bin packing in O(log bins) an item.

Each item goes to the lowest-numbered bin with room for it. A scan of the
bins per item is quadratic in the batch: ChunkFlow's plan at DP 128 x CP 8
(sim/chunkflow.py) packs tens of thousands of pieces, and torchtitan's
'rows' batching (data/steps/row_layout.py) checks every step of a run at
start-up. A max tree over the bins' room finds the bin in one descent.
"""

from __future__ import annotations


class FirstFit:
    """`bins` bins of `capacity` each (all empty at first), filled first-fit.

    Bins are numbered in the order first-fit opens them: an empty bin's room is
    the full capacity, so the first empty one is found only when no earlier
    bin has room, and ``opened`` counts those used so far.
    """

    def __init__(self, bins: int, capacity: int):
        self.size = 1
        while self.size < max(1, bins):
            self.size *= 2
        # Leaves past `bins` hold -1: never chosen.
        self.tree = [-1] * (2 * self.size)
        for b in range(bins):
            self.tree[self.size + b] = capacity
        for i in range(self.size - 1, 0, -1):
            self.tree[i] = max(self.tree[2 * i], self.tree[2 * i + 1])
        self.opened = 0

    def room(self, b: int) -> int:
        return self.tree[self.size + b]

    def place(self, need: int) -> int | None:
        """The lowest bin with `need` room left, charged `need`; None where none has it."""
        tree, size = self.tree, self.size
        if tree[1] < need:
            return None
        i = 1
        while i < size:
            i *= 2
            if tree[i] < need:
                i += 1
        b = i - size
        tree[i] -= need
        i //= 2
        while i:  # rooms only fall: once a node keeps its value, so do the nodes above it
            left, right = tree[2 * i], tree[2 * i + 1]
            room = left if left > right else right
            if tree[i] == room:
                break
            tree[i] = room
            i //= 2
        if b >= self.opened:
            self.opened = b + 1
        return b
