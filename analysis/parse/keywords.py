"""The keyword scan: the first line of a chunk holding one of the keywords that wake the
parser, found with ``bytes.find`` anchored on a rare byte of each keyword."""

from __future__ import annotations

from typing import Any

# Bytes that are rare in log text, rarest first: a keyword is found by its first byte in this
# list (one memchr-speed pass per byte), then checked at that position.  A keyword with none
# of them is searched for whole.
_RARE = "|#*KM)TE"


def build_anchors(
    keywords: tuple[str, ...],
) -> tuple[tuple[bytes, tuple[tuple[bytes, int], ...]], ...]:
    """(anchor, ((keyword, offset of the anchor in it), ...)) for every keyword: its rarest
    byte, else the keyword whole; keywords that share a part are found by one search of it
    ("exits" and "ssh exited" by "exit": each multi-byte pass over a chunk costs ~0.3-0.6
    ms/MB, less the longer the part)."""
    by_anchor: dict[bytes, list[tuple[bytes, int]]] = {}
    for kw in keywords:
        anchor = next((c for c in _RARE if c in kw), "exit" if "exit" in kw else kw)
        by_anchor.setdefault(anchor.encode(), []).append((kw.encode(), kw.index(anchor)))
    return tuple((a, tuple(checks)) for a, checks in by_anchor.items())


def _next_hit(
    block: bytes, anchor: bytes, checks: tuple[tuple[bytes, int], ...], pos: int, end: int
) -> int:
    """Position of the next keyword hit of one anchor in [pos, end), or -1."""
    find = block.find
    p = find(anchor, pos, end)
    if not checks or (len(checks) == 1 and checks[0][1] == 0 and checks[0][0] == anchor):
        return p
    startswith = block.startswith
    misses, since = 0, p
    while p >= 0:
        for kw, off in checks:
            if p >= off and startswith(kw, p - off):
                return p
        misses += 1
        if misses == _MISSES and len(checks) == 1 and p - since < _MISSES * _DENSE_GAP:
            return _whole_hit(block, len(anchor), checks[0], p + 1, end)
        p = find(anchor, p + 1, end)
    return -1


_MISSES, _DENSE_GAP = 8, 1024
"""When the anchor byte of an anchor's only keyword was found ``_MISSES`` times in a row
without the keyword, less than ``_DENSE_GAP`` bytes apart on average (``E`` and ``T`` of
NCCL's ``INFO`` and ``NET`` lines, in a log full of them), the keyword is searched for
whole: one ``bytes.find`` of the keyword costs less than stopping at every such byte."""


def _whole_hit(block: bytes, alen: int, check: tuple[bytes, int], pos: int, end: int) -> int:
    """``_next_hit`` of one keyword searched for whole: the first anchor position in
    [pos, end) (the anchor ends by ``end``; the keyword may go on past it) that starts the
    keyword at its offset."""
    kw, off = check
    q = block.find(kw, max(pos - off, 0), end - alen - off + len(kw))
    return q + off if q >= 0 else -1


class Keywords:
    """The keyword scan: the first line holding a keyword in a range of a chunk."""

    def __init__(self, keywords: tuple[str, ...], iteration_keyword: str = "iteration") -> None:
        self.keywords = keywords
        self.pipe_keywords = tuple(k for k in keywords if k != iteration_keyword)
        self.anchors = build_anchors(keywords)
        self.pipe_anchors = build_anchors(self.pipe_keywords)
        self._cache: list[Any] = [None, -1, None, [], 0]

    def forget(self) -> None:
        """Drop what ``first`` remembers (and the buffer it holds)."""
        self._cache = [None, -1, None, [], 0]

    def has(self, line: str, pipe_iterations: bool) -> bool:
        """Whether a line holds a keyword."""
        return any(k in line for k in (self.pipe_keywords if pipe_iterations else self.keywords))

    def first(
        self, block: bytes, pos: int, end: int, pipe_iterations: bool, once: bool = False
    ) -> int:
        """Position of the first keyword in ``block[pos:end]``, or -1.  The next hit of each
        anchor is remembered for the same buffer, so that successive calls over one chunk
        search each byte about once (``once``: a buffer searched only once, not remembered)."""
        anchors = self.pipe_anchors if pipe_iterations else self.anchors
        cache = self._cache
        if once or cache[0] is not block or cache[1] != end or cache[2] is not anchors:
            cache = [block, end, anchors, [-2] * len(anchors), pos]
            if not once:
                self._cache = cache
        elif pos < cache[4]:  # going back: forget
            cache[3] = [-2] * len(anchors)
        cache[4] = pos
        nxt = cache[3]
        best = -1
        for i, (anchor, checks) in enumerate(anchors):
            p = nxt[i]
            if p < pos and p != -1:
                # (a buffer searched once: each anchor only up to the first hit so far)
                stop = best if once and best >= 0 else end
                p = nxt[i] = _next_hit(block, anchor, checks, pos, stop)
            if p >= 0 and (best < 0 or p < best):
                best = p
        return best
