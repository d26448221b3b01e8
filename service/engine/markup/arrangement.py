"""The runs of a tag's children over its target words (`Arrangement`), for
service.engine.markup.project: each child gets one contiguous run, in a given order, chosen by
dynamic programming to keep as many words as possible under the child their alignment asks for;
past DP_BUDGET, greedily."""

from __future__ import annotations

# A unit's label: the child (0..k-1, in order) its words want, or these.
DIRECT, FREE = -1, -2  # the parent itself (no child); no alignment says (anything)
MISPLACED, FREE_INSIDE = 1.0, 0.25
# Units times states above which the children's runs are cut greedily (a paragraph of 200 words
# under 100 sibling tags is 40,200; the dynamic programme takes about 0.1 s for 100,000).
DP_BUDGET = 100_000


class Arrangement:
    """Disjoint runs of units [lo, hi) for k children in a given order (each may be empty): unit u
    wants child labels[u] (or DIRECT: no child; FREE: anything). States 0..2k alternate between
    the gaps (even) and the children (odd); the units' states never decrease. A unit outside the
    child it wants costs 1, a free unit inside a child 1/4, an empty child a little for its distance
    from its anchor. A first child opened before the block must start at lo, a last one left open
    must end at hi."""

    def __init__(self, labels: list[int], anchors: list[int], lo: int, hi: int, first_fixed: bool, last_fixed: bool):
        self.labels, self.anchors, self.lo, self.hi = labels, anchors, lo, hi
        self.first_fixed, self.last_fixed = first_fixed, last_fixed
        self.states = 2 * len(anchors) + 1
        self.step = 1e-3 / (hi - lo + 2)

    def label_costs(self, label: int) -> list[float]:
        """What a unit of `label` costs in each state (the same for every unit of that label)."""
        costs = []
        for s in range(self.states):
            if (s == 0 and self.first_fixed) or (s == self.states - 1 and self.last_fixed):
                costs.append(float("inf"))
            elif s % 2 == 0:
                costs.append(0.0 if label < 0 else MISPLACED)
            else:
                costs.append(0.0 if label == s // 2 else FREE_INSIDE if label == FREE else MISPLACED)
        return costs

    def skipped(self, p: int) -> list[float]:
        """prefix[s]: what leaving children empty at boundary p costs, summed over states < s."""
        prefix = [0.0]
        total, step = 0.0, self.step
        for anchor in self.anchors:
            prefix.append(total)
            total = total + step * abs(p - anchor)
            prefix.append(total)
        prefix.append(total)
        return prefix

    def path(self) -> list[int]:
        """Each unit's state on a cheapest path by the units' labels. Unit u in state s costs its
        label's cost there; from unit u-1's state r it stays (r == s) or moves up, leaving the
        children between empty (what `skipped` says), the best move kept as the states go up.
        That best may be s itself, less the skip cost of its child there: a unit that stays in
        a child's state is credited what leaving the child empty at that boundary would cost.
        The credits are thousandths (step is 1e-3 over the units), below any label's cost on
        blocks of up to a few hundred words; among paths of equal label cost they favour the one
        whose runs hold more units (a tag around "is looking" rather than around nothing), which
        is what the tag placement benchmark measured (docs/markup.md)."""
        states, lo, labels = self.states, self.lo, self.labels
        costs_of = {label: self.label_costs(label) for label in set(labels)}
        prefix = self.skipped(lo)
        first = costs_of[labels[0]]
        cost = [prefix[s] + first[s] for s in range(states)]
        back: list[list[int]] = []
        for u in range(1, self.hi - lo):
            prefix = self.skipped(lo + u)
            costs = costs_of[labels[u]]
            row, links = [], []
            best, best_from = float("inf"), 0
            for s in range(states):
                before = cost[s]
                left = before - prefix[s + 1]
                if left < best:
                    best, best_from = left, s
                jump = best + prefix[s]
                if before <= jump:
                    row.append(before + costs[s])
                    links.append(s)
                else:
                    row.append(jump + costs[s])
                    links.append(best_from)
            cost = row
            back.append(links)
        prefix = self.skipped(self.hi)
        state = min(range(states), key=lambda s: cost[s] + prefix[states] - prefix[s + 1])
        path = [state]
        for links in reversed(back):
            state = links[state]
            path.append(state)
        return path[::-1]

    def greedy(self) -> list[tuple[int, int]]:
        """For many words under many sibling tags, where the dynamic programme would be slow: each
        child gets the hull of the units that want it (an empty run at its anchor when none),
        cut so that the runs follow one another in order."""
        k = len(self.anchors)
        wanting: dict[int, list[int]] = {}
        for u, label in enumerate(self.labels):
            wanting.setdefault(label, []).append(self.lo + u)
        spans, done = [], self.lo
        for j in range(k):
            units = wanting.get(j)
            start, end = (units[0], units[-1] + 1) if units else (self.anchors[j], self.anchors[j])
            start = self.lo if j == 0 and self.first_fixed else min(max(start, done), self.hi)
            end = self.hi if j == k - 1 and self.last_fixed else min(max(end, start), self.hi)
            spans.append((start, end))
            done = end
        return spans

    def spans(self) -> list[tuple[int, int]]:
        k, lo, n = len(self.anchors), self.lo, self.hi - self.lo
        if n == 0:
            return [(lo, lo)] * k
        if n * self.states > DP_BUDGET:
            return self.greedy()
        path = self.path()
        spans = []
        for j in range(k):
            inside = [u for u, s in enumerate(path) if s == 2 * j + 1]
            if inside:
                spans.append((lo + inside[0], lo + inside[-1] + 1))
            else:
                at = next((u for u, s in enumerate(path) if s > 2 * j + 1), n)
                spans.append((lo + at, lo + at))
        return spans
