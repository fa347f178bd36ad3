"""How record_function ranges, Python frames and CPU ops nest on a thread (ingest/kineto_nesting.py), against a
brute-force reading of the same rule."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from itertrace.ingest.kineto_nesting import ANNOTATION, FRAME, OP, nest

Element = tuple[int, int, int, int]  # (kind, thread, start, end)


def encloses(outer: Element, outer_at: int, inner: Element, inner_at: int) -> bool:
    """`outer`, earlier in stack order, is still open when `inner` starts and ends no earlier: at one instant
    ranges that have a length close first, then ranges open, then zero-length ranges close, then ops start."""
    opens = 4 * inner[2] + (3 if inner[0] == OP else 1)
    closes = 4 * outer[3] + (0 if outer[3] > outer[2] else 2)
    return outer_at < inner_at and outer[1] == inner[1] and closes > opens and outer[3] >= inner[3]


def reference(elements: list[Element]) -> tuple[list[int], list[int]]:
    """(parent, depth) by the rule in plain Python: of the innermost frame and the innermost annotation
    enclosing an element, the inner where one holds the other, else the one of its own family."""
    def innermost(i: int, family: int) -> int:
        found = [j for j in range(i) if elements[j][0] == family and encloses(elements[j], j, elements[i], i)]
        return found[-1] if found else -1

    parents = []
    for i, element in enumerate(elements):
        frame, annotation = innermost(i, FRAME), innermost(i, ANNOTATION)
        own, other = (annotation, frame) if element[0] == ANNOTATION else (frame, annotation)
        inside = other >= 0 and (own < 0 or (elements[own][2] <= elements[other][2]
                                             and elements[own][3] >= elements[other][3] and own < other))
        parents.append(other if inside else own)
    depths = []
    for parent in parents:
        depth = 0
        while parent >= 0:
            depth, parent = depth + 1, parents[parent]
        depths.append(depth)
    return parents, depths


def stack_order(elements: list[Element]) -> list[Element]:
    """By thread, start, ranges before ops, longest first, then as given (the order of range_id)."""
    return [elements[i] for i in sorted(range(len(elements)), key=lambda i: (
        elements[i][1], elements[i][2], elements[i][0] == OP, -elements[i][3], i))]


def nested(elements: list[Element]) -> tuple[list[int], list[int]]:
    kind, thread, start, end = (np.array(column, dtype=np.int64) for column in zip(*elements))
    parent, depth = nest(kind, thread, start, end)
    return parent.tolist(), depth.tolist()


@st.composite
def calls(draw, kind: int, thread: int, lo: int, hi: int, budget: int) -> list[Element]:
    """Ranges of one family that nest, as a call stack does, within [lo, hi]."""
    out: list[Element] = []
    if budget <= 0 or hi < lo:
        return out
    points = sorted(draw(st.lists(st.integers(lo, hi), min_size=0, max_size=4)))
    for a, b in zip(points[::2], points[1::2]):
        out.append((kind, thread, a, b))
        out += draw(calls(kind, thread, a, b, budget - 1))
    return out


@st.composite
def threads(draw) -> list[Element]:
    elements: list[Element] = []
    for thread in range(draw(st.integers(1, 2))):
        elements += draw(calls(FRAME, thread, 0, 40, 4)) + draw(calls(ANNOTATION, thread, 0, 40, 3))
        for start in draw(st.lists(st.integers(0, 40), max_size=4)):
            elements.append((OP, thread, start, start + draw(st.integers(0, 6))))
    return stack_order(elements)


@given(threads())
def test_matches_the_rule_read_by_brute_force(elements):
    if elements:
        assert nested(elements) == reference(elements)


def test_a_range_opened_inside_enter_frames_holds_what_runs_after_them():
    """`with record_function(...)`: the range starts inside `__enter__` and ends inside `__exit__`."""
    elements = stack_order([
        (FRAME, 0, 0, 100),  # forward
        (FRAME, 0, 10, 20),  # __enter__
        (FRAME, 0, 12, 18),  # record_function.__enter__, inside which the range starts
        (ANNOTATION, 0, 15, 85),  # step
        (FRAME, 0, 19, 19),  # a call __enter__ makes once the range has begun: __enter__'s child
        (FRAME, 0, 30, 40),  # the body: the range's child
        (OP, 0, 32, 33),  # an op the body runs
        (FRAME, 0, 80, 90),  # __exit__, which the range ends inside
        (OP, 0, 95, 96),  # after the block
    ])
    assert nested(elements) == ([-1, 0, 1, 0, 1, 3, 5, 0, 0], [0, 1, 2, 1, 2, 2, 3, 1, 1])
    assert nested(elements) == reference(elements)


def test_ties_zero_length_and_touching():
    elements = stack_order([
        (FRAME, 0, 0, 10), (FRAME, 0, 0, 10),  # the same span twice: the first given is the parent
        (ANNOTATION, 0, 0, 10),  # and the same span again, of the other family: inside both
        (FRAME, 0, 10, 20),  # touches them: a sibling
        (FRAME, 0, 20, 20),  # zero-length at the instant the last one ends: a sibling too
        (ANNOTATION, 0, 20, 20), (FRAME, 0, 20, 20),  # zero-length at one instant: each inside the one before
        (OP, 0, 20, 20),  # zero-length ranges close before an op at their instant starts
    ])
    assert nested(elements) == reference(elements)
    parent, depth = nested(elements)
    assert elements == [(0, 0, 0, 10), (0, 0, 0, 10), (1, 0, 0, 10), (0, 0, 10, 20), (0, 0, 20, 20), (1, 0, 20, 20),
                        (0, 0, 20, 20), (2, 0, 20, 20)]
    assert parent == [-1, 0, 1, -1, -1, 4, 5, -1] and depth == [0, 1, 2, 0, 0, 1, 2, 0]
