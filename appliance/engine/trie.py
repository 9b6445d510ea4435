"""Token-id sequences in a radix tree: the index both prefix-cache tiers query for the
longest stored prefix of a prompt, or the most tokens any stored sequence shares with it."""

from __future__ import annotations


class _Node:
    __slots__ = ("edge", "children", "end")

    def __init__(self, edge: tuple[int, ...], children: dict | None = None, end: bool = False):
        self.edge, self.children, self.end = edge, children or {}, end


def _common(edge: tuple[int, ...], tokens: tuple[int, ...], at: int) -> int:
    """How many leading tokens of `edge` equal tokens[at:] (slice compares run in C)."""
    n = min(len(edge), len(tokens) - at)
    if tokens[at:at + n] == edge[:n]:
        return n
    lo, hi = 0, n  # edge[:lo] matches, edge[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tokens[at:at + mid] == edge[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class TokenTrie:
    """Token-id sequences, for longest-stored-prefix queries. Both tiers index with it.

    A radix tree: an edge holds a run of tokens, so there is a node per stored sequence and
    per branch point, not per token. An 8k-token prompt is one tuple: lookups compare slices
    in C, and the garbage collector has a handful of objects to walk, not 8k dicts.
    """

    def __init__(self):
        self._root = _Node(())

    def add(self, tokens) -> None:
        tokens, node, i = tuple(tokens), self._root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                node.children[tokens[i]] = _Node(tokens[i:], end=True)
                return
            m = _common(child.edge, tokens, i)
            if m < len(child.edge):  # split the edge where the sequences part
                node.children[tokens[i]] = mid = _Node(child.edge[:m], {child.edge[m]: child})
                child.edge = child.edge[m:]
                child = mid
            node, i = child, i + m
        node.end = True

    def remove(self, tokens) -> None:
        tokens, path, node, i = tuple(tokens), [], self._root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None or tokens[i:i + len(child.edge)] != child.edge:
                return
            path.append(node)
            node, i = child, i + len(child.edge)
        if node is self._root:
            return
        node.end = False
        parent = path[-1]
        if not node.children:  # prune, then merge a parent left with a single child
            del parent.children[node.edge[0]]
            node = parent
            parent = path[-2] if len(path) > 1 else None
        if parent is not None and node is not self._root and not node.end \
                and len(node.children) == 1:
            (only,) = node.children.values()
            only.edge = node.edge + only.edge
            parent.children[node.edge[0]] = only

    def longest(self, tokens) -> int:
        """Length of the longest stored sequence that prefixes `tokens` (0: none)."""
        tokens, node, i, best = tuple(tokens), self._root, 0, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None or tokens[i:i + len(child.edge)] != child.edge:
                break  # sequences end at nodes, never inside an edge
            node, i = child, i + len(child.edge)
            if node.end:
                best = i
        return best

    def shared(self, tokens) -> tuple[int, tuple[int, ...] | None]:
        """The most leading tokens of `tokens` that a stored sequence shares (it may end
        or part inside an edge), and one such sequence (None: none shares any)."""
        tokens, node, i, path = tuple(tokens), self._root, 0, []
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            m = _common(child.edge, tokens, i)
            node, i = child, i + m
            path.append(child.edge)
            if m < len(child.edge):
                break
        if node is self._root:
            return 0, None
        while not node.end:  # a sequence that goes on from here: the first branch down
            node = next(iter(node.children.values()))
            path.append(node.edge)
        return i, sum(path, ())

    def __len__(self) -> int:
        count, stack = 0, [self._root]
        while stack:
            node = stack.pop()
            count += node.end
            stack.extend(node.children.values())
        return count

    def empty(self) -> bool:
        return not self._root.children
