"""A workflow drawn as inline SVG: layers from left to right, one box per step, a link each.

A step's layer is one more than the highest layer of its parents (roots are layer 1),
so every edge points to the right. Within a layer, steps are ordered by where their
parents sit (the mean of their rows), which keeps a diamond a diamond and most
edges short. At most EDGE_LIMIT edges are drawn: first each step's edge from the
parent that sets its layer, then the others as given; the drawing says how many it
left out (the page's table lists every step's parents). Like the dashboard's charts:
presentation attributes only (no style attribute, no script), every text escaped by
format_html.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from django_jobs.dashboard import svg_start

# Fill and text colours per state: readable on white, told apart without the label too.
COLORS: dict[str, tuple[str, str]] = {
    "blocked": ("#e0e0e0", "#333333"),
    "scheduled": ("#d1c4e9", "#311b92"),
    "waiting": ("#ffe082", "#4e3400"),
    "running": ("#1565c0", "#ffffff"),
    "done": ("#2e7d32", "#ffffff"),
    "dead": ("#ba2121", "#ffffff"),
    "gone": ("#ffffff", "#666666"),
}

NODE_W, NODE_H = 176, 42
GAP_X, GAP_Y = 56, 14
PAD = 8
LABEL_CHARS = 24  # of the handler's name, at 12 px in a 176 px box
# Edges drawn at most (about 200 bytes of SVG each): 300 steps that each wait for all
# the earlier ones have 44,850 edges, once 9.3 MB of SVG that no one could read.
EDGE_LIMIT = 1000
NOTE_H = 22  # the line saying how many edges are not drawn


@dataclass
class Node:
    key: Hashable
    name: str  # the handler's dotted path
    state: str
    state_label: str
    url: str | None  # the admin page of the job, its marker or its letter
    title: str  # the tooltip: full name, state, id


def layers(keys: Iterable[Hashable], edges: Iterable[tuple[Hashable, Hashable]]) -> dict[Any, int]:
    """Return each key's layer: 1 for a root, else 1 + the highest layer of its parents.

    Edges to or from keys not listed are ignored. Keys on a cycle (only hand-made rows
    can make one) go one layer after the rest, so that the drawing still ends.
    """
    # Keys become list positions first: a UUID hashes in Python, an int in C, and a
    # 50,000-step workflow would hash each key a dozen times.
    known = list(dict.fromkeys(keys))
    index = {key: i for i, key in enumerate(known)}
    children: list[list[int]] = [[] for _ in known]
    indegree = [0] * len(known)
    pairs = set()
    for parent, child in edges:
        p, c = index.get(parent), index.get(child)
        if p is not None and c is not None and p != c:
            pairs.add((p, c))
    for p, c in pairs:
        children[p].append(c)
        indegree[c] += 1
    layer = [1] * len(known)
    ready = deque(i for i, n in enumerate(indegree) if n == 0)
    placed = 0
    while ready:
        i = ready.popleft()
        placed += 1
        for c in children[i]:
            if layer[i] + 1 > layer[c]:
                layer[c] = layer[i] + 1
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    if placed < len(known):
        last = max((layer[i] for i, n in enumerate(indegree) if n == 0), default=0) + 1
        for i, n in enumerate(indegree):
            if n > 0:
                layer[i] = last
    return dict(zip(known, layer, strict=True))


def draw(
    nodes: Sequence[Node],
    edges: Iterable[tuple[Hashable, Hashable]],
    title: str,
    layer: dict[Any, int] | None = None,
) -> SafeString:
    """Return the SVG of the graph: one linked box per node, an arrow per drawn edge.

    `layer`: the nodes' layers when the caller has them (layers() of these edges).
    """
    # Edges between list positions first, as layers() does: 44,850 edges of UUIDs would
    # hash each UUID a few times over.
    keys = [n.key for n in nodes]
    numbered = {key: i for i, key in enumerate(keys)}
    pairs = []
    for parent, child in edges:
        p, c = numbered.get(parent), numbered.get(child)
        if p is not None and c is not None:
            pairs.append((p, c))
    pairs = list(dict.fromkeys(pairs))
    if layer is None:
        layer = layers(keys, [(keys[p], keys[c]) for p, c in pairs])
    left_out = max(0, len(pairs) - EDGE_LIMIT)
    if left_out:
        pairs = bounded_edges(pairs, [layer[key] for key in keys])
    drawn = [(keys[p], keys[c]) for p, c in pairs]
    parents: dict[Any, list[Any]] = defaultdict(list)
    for parent, child in drawn:  # a row near the parents drawn: the others are not seen
        parents[child].append(parent)
    columns: dict[int, list[Node]] = defaultdict(list)
    for node in nodes:
        columns[layer[node.key]].append(node)
    row: dict[Any, float] = {}
    for number in sorted(columns):
        column = columns[number]
        if number > 1:  # nearest its parents; a stable sort keeps the given order on ties
            column.sort(
                key=lambda n: sum(row[p] for p in parents[n.key]) / max(len(parents[n.key]), 1)
            )
        for index, node in enumerate(column):
            row[node.key] = index
    tallest = max((len(c) for c in columns.values()), default=0)
    width = PAD * 2 + len(columns) * NODE_W + max(len(columns) - 1, 0) * GAP_X
    height = PAD * 2 + tallest * NODE_H + max(tallest - 1, 0) * GAP_Y
    if left_out:
        height += NOTE_H
    position: dict[Any, tuple[float, float]] = {}
    for number, column in columns.items():
        # Each column centred on the tallest one.
        top = PAD + (tallest - len(column)) * (NODE_H + GAP_Y) / 2
        for index, node in enumerate(column):
            position[node.key] = (
                PAD + (number - 1) * (NODE_W + GAP_X),
                top + index * (NODE_H + GAP_Y),
            )

    parts = [
        *svg_start("django-jobs-graph", width, height, title),
        # The arrowhead of every edge.
        mark_safe(
            '<defs><marker id="django-jobs-arrow" viewBox="0 0 10 10" refX="10" refY="5" '
            'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
            '<path d="M0,0 L10,5 L0,10 z" fill="#888888"/></marker></defs>'
        ),
    ]
    for parent, child in drawn:
        (px, py), (cx, cy) = position[parent], position[child]
        x1, y1 = px + NODE_W, py + NODE_H / 2
        x2, y2 = cx, cy + NODE_H / 2
        bend = max((x2 - x1) / 2, GAP_X / 2)
        parts.append(
            format_html(
                '<path class="django-jobs-edge" d="M{},{} C{},{} {},{} {},{}" fill="none" '
                'stroke="#888888" stroke-width="1.5" marker-end="url(#django-jobs-arrow)"/>',
                _n(x1),
                _n(y1),
                _n(x1 + bend),
                _n(y1),
                _n(x2 - bend),
                _n(y2),
                _n(x2),
                _n(y2),
            )
        )
    for node in nodes:
        x, y = position[node.key]
        fill, ink = COLORS.get(node.state, COLORS["gone"])
        box = format_html(
            '<title>{}</title><rect x="{}" y="{}" width="{}" height="{}" rx="5" fill="{}" '
            'stroke="#555555" stroke-width="1"/>'
            '<text x="{}" y="{}" font-size="12" fill="{}">{}</text>'
            '<text x="{}" y="{}" font-size="11" fill="{}">{}</text>',
            node.title,
            _n(x),
            _n(y),
            NODE_W,
            NODE_H,
            fill,
            _n(x + 8),
            _n(y + 17),
            ink,
            short_name(node.name),
            _n(x + 8),
            _n(y + 33),
            ink,
            node.state_label,
        )
        if node.url:
            parts.append(
                format_html(
                    '<a class="django-jobs-node" href="{}" data-state="{}">{}</a>',
                    node.url,
                    node.state,
                    box,
                )
            )
        else:
            parts.append(
                format_html('<g class="django-jobs-node" data-state="{}">{}</g>', node.state, box)
            )
    if left_out:
        note = _(
            "%(n)s more edges not drawn: each step's edge from its latest parent is; "
            "the table lists every parent."
        ) % {"n": f"{left_out:,}"}
        parts.append(
            format_html(
                '<text class="django-jobs-graph-note" x="{}" y="{}" font-size="12" '
                'fill="#555555">{}</text>',
                PAD,
                _n(height - PAD),
                note,
            )
        )
    parts.append(mark_safe("</svg>"))  # noqa: S308 - a constant
    return mark_safe("".join(str(p) for p in parts))  # noqa: S308 - every part is escaped above


def bounded_edges(
    edges: Sequence[tuple[int, int]], layer: Sequence[int], limit: int = EDGE_LIMIT
) -> list[tuple[int, int]]:
    """At most limit of the edges between node numbers, in their order: first each child's
    edge from its parent in the highest layer (the one that sets the child's layer), then
    the others as given. `layer` holds each node number's layer."""
    first: dict[int, int] = {}  # child -> index of its edge from its latest parent
    for index, (parent, child) in enumerate(edges):
        best = first.get(child)
        if best is None or layer[parent] > layer[edges[best][0]]:
            first[child] = index
    chosen = set(sorted(first.values())[:limit])
    for index in range(len(edges)):
        if len(chosen) >= limit:
            break
        chosen.add(index)
    return [edges[index] for index in sorted(chosen)]


def short_name(name: str) -> str:
    """The end of a dotted path that fits a box: "shop.jobs.charge_card" -> "charge_card"."""
    text = name.rsplit(".", 1)[-1] or name
    text = text.replace("\n", " ")
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def _n(value: float) -> str:
    return f"{value:.1f}"
