"""A small bucketed k-d tree whose arrays live in the region (test helper).

Built by the driver, queried on workers by address, and updated in place:
``erase`` marks a point dead, ``insert`` writes it into a free slot of the
leaf it falls in.  The same class runs on plain numpy arrays for the
single-process reference.
"""
import heapq

import numpy as np


class KDTree:
    def __init__(self, points, leaf_size=16, spare=4, alloc=np.array):
        pts = np.asarray(points, dtype=np.float64)
        self.dims = pts.shape[1]
        nodes, leaves = [], []

        def build(idx, depth):
            me = len(nodes)
            nodes.append(None)
            if len(idx) <= leaf_size:
                nodes[me] = (-1, 0.0, -1, -1, len(leaves))
                leaves.append(idx)
                return me
            d = depth % self.dims
            order = idx[np.argsort(pts[idx, d], kind="stable")]
            mid = len(order) // 2
            split = pts[order[mid], d]
            left = build(order[:mid], depth + 1)
            right = build(order[mid:], depth + 1)
            nodes[me] = (d, split, left, right, -1)
            return me

        build(np.arange(len(pts)), 0)
        cap = leaf_size + spare
        slots = np.zeros((len(leaves) * cap, self.dims))
        alive = np.zeros(len(leaves) * cap, dtype=np.int8)
        for i, idx in enumerate(leaves):
            slots[i * cap:i * cap + len(idx)] = pts[idx]
            alive[i * cap:i * cap + len(idx)] = 1
        self.cap = cap
        self.dim = alloc(np.array([n[0] for n in nodes], dtype=np.int64))
        self.split = alloc(np.array([n[1] for n in nodes], dtype=np.float64))
        self.left = alloc(np.array([n[2] for n in nodes], dtype=np.int64))
        self.right = alloc(np.array([n[3] for n in nodes], dtype=np.int64))
        self.leaf = alloc(np.array([n[4] for n in nodes], dtype=np.int64))
        self.slots = alloc(slots)
        self.alive = alloc(alive)

    def _leaf_of(self, p):
        n = 0
        while self.leaf[n] < 0:
            n = self.left[n] if p[self.dim[n]] < self.split[n] else self.right[n]
        return int(self.leaf[n])

    def query(self, q, k=3):
        """(distances, points) of the k nearest live points, nearest first."""
        q = np.asarray(q, dtype=np.float64)
        best = []  # max-heap of (-dist, tie, point)
        tie = 0
        stack = [(0.0, 0)]
        while stack:
            bound, n = stack.pop()
            if len(best) == k and bound > -best[0][0]:
                continue
            if self.leaf[n] >= 0:
                lo = int(self.leaf[n]) * self.cap
                for s in range(lo, lo + self.cap):
                    if self.alive[s]:
                        d = float(np.sqrt(((self.slots[s] - q) ** 2).sum()))
                        item = (-d, tie, tuple(self.slots[s]))
                        tie += 1
                        if len(best) < k:
                            heapq.heappush(best, item)
                        elif d < -best[0][0]:
                            heapq.heapreplace(best, item)
                continue
            d = int(self.dim[n])
            diff = q[d] - self.split[n]
            near, far = (self.left[n], self.right[n]) if diff < 0 else (self.right[n], self.left[n])
            stack.append((max(bound, abs(diff)), int(far)))
            stack.append((bound, int(near)))
        best.sort(key=lambda t: (-t[0], t[1]))
        return [-b[0] for b in best], [b[2] for b in best]

    def erase(self, p):
        lo = self._leaf_of(p) * self.cap
        for s in range(lo, lo + self.cap):
            if self.alive[s] and np.array_equal(self.slots[s], p):
                self.alive[s] = 0
                return True
        return False

    def insert(self, p):
        lo = self._leaf_of(p) * self.cap
        for s in range(lo, lo + self.cap):
            if not self.alive[s]:
                self.slots[s] = p
                self.alive[s] = 1
                return True
        raise MemoryError("leaf full")
