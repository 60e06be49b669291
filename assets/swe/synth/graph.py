"""Unweighted graphs as adjacency lists."""

from collections import deque


def build(edges, directed=False):
    """Adjacency dict from (a, b) pairs."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
        if not directed:
            graph[b].append(a)
    return graph


def shortest_path(graph, start, goal):
    """Fewest-edge path from start to goal as a list of nodes, or None."""
    if start == goal:
        return [start]
    previous = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in graph.get(node, []):
            if nxt in previous:
                continue
            previous[nxt] = node
            if nxt == goal:
                path = [goal]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                return path[::-1]
            queue.append(nxt)
    return None


def degree(graph, node):
    """Number of neighbours of node."""
    return len(graph.get(node, []))


def components(graph):
    """Connected components as sorted lists, in order of their smallest node."""
    seen = set()
    result = []
    for node in sorted(graph):
        if node in seen:
            continue
        stack = [node]
        part = []
        seen.add(node)
        while stack:
            cur = stack.pop()
            part.append(cur)
            for nxt in graph[cur]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        result.append(sorted(part))
    return result
