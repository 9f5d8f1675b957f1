"""How a durable session stores the last request view it sent: exchange items by reference.

A request view holds the exchange items it selected and a selection report listing item and
exchange ids. The items are already stored once, in the session's exchange-log blobs; storing them
again, or even one id per item, with every step's view would make storage grow with the whole
history at every model call. The stored form keeps every other field of ``RequestView.to_dict()``
and writes each list of selected items or ids as *segments*:

- ``[first, last]``: every item (or every id) of the closed exchanges ``first`` .. ``last``;
- ``"ex-000012/1"``: one item by id, when the exchange log holds exactly that text under it;
- an object: one item inline, when the log does not hold it (a compaction summary, say).

An uncompacted transcript is then one segment whatever its length. Reading needs the exchange log
at (or after) the step that sent the view: closed exchanges never change and items are only ever
appended to an open one, so every id keeps its text.
"""

from __future__ import annotations

import dataclasses
import json
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from qitos.core._exchange import ExchangeLog, ExchangeLogError, exchange_id_at
from qitos.core.request_view import RequestView

__all__ = ["view_from_record", "view_record"]

_ITEM_LISTS = ("selected_item_ids", "omitted_item_ids")
_EXCHANGE_LISTS = ("selected_exchange_ids", "omitted_exchange_ids", "protected_exchange_ids")


def view_record(view: RequestView, log: ExchangeLog | None) -> dict[str, Any]:
    """The stored form of ``view``, with what ``log`` holds referenced and folded into segments.

    Runs are matched against the log's projection of its closed prefix with list comparisons, so
    recording the view of a long transcript costs a few C-level compares, not work per item."""
    data = dataclasses.replace(view, selected_items_json=()).to_dict()  # no parse of every item
    ids = list(view.selection.selected_item_ids)
    texts = list(view.selected_items_json)
    if log is None or len(ids) != len(texts):
        data["selected_items"] = [json.loads(text) for text in texts]
        return data
    data["selected_items"] = _fold(ids, log, items=True, texts=texts)
    selection = data["selection"]
    for name in _ITEM_LISTS:
        selection[name] = _fold(selection[name], log, items=True)
    for name in _EXCHANGE_LISTS:
        selection[name] = _fold(selection[name], log, items=False)
    return data


def view_from_record(data: Mapping[str, Any], log: ExchangeLog) -> RequestView:
    """The request view stored as ``data``; ValueError names a reference ``log`` cannot resolve."""
    proj = log.projection()
    items: list[Any] = []
    for segment in data.get("selected_items") or ():
        if isinstance(segment, list):
            first, last = _segment_bounds(segment, log)
            offsets = proj.item_offsets
            items.extend(json.loads(text) for text in proj.item_json[offsets[first] : offsets[last + 1]])
        elif isinstance(segment, str):
            text = _logged_item(log, segment)
            if text is None:
                raise ValueError(f"the stored request view selects item {segment!r}, which the exchange log lacks")
            items.append(json.loads(text))
        else:
            items.append(segment)
    selection = dict(data["selection"])
    for name in _ITEM_LISTS:
        selection[name] = _unfold(selection.get(name) or (), log, items=True)
    for name in _EXCHANGE_LISTS:
        selection[name] = _unfold(selection.get(name) or (), log, items=False)
    return RequestView.from_dict({**data, "selected_items": items, "selection": selection})


# --------------------------------------------------------------------------- segments


def _flat(log: ExchangeLog, *, items: bool) -> tuple[Sequence[str], Sequence[int]]:
    """The closed prefix as a flat id list (item ids, or exchange ids) and, per exchange, the
    offset where its ids start (one more offset marks the end)."""
    proj = log.projection()
    if items:
        return proj.item_ids, proj.item_offsets
    return proj.exchange_ids, range(proj.closed_count + 1)


def _fold(ids: Sequence[Any], log: ExchangeLog, *, items: bool, texts: Sequence[str] | None = None) -> list[Any]:
    """Runs of whole closed exchanges (their item ids, or their exchange ids) become ``[first, last]``.

    With ``texts`` (the view's item texts, in step with item ``ids``) a run folds only where the
    texts are the log's too, and any other item is stored as its id when the log holds its text,
    inline otherwise."""
    proj = log.projection()
    flat, offsets = _flat(log, items=items)
    out: list[Any] = []
    at = 0
    while at < len(ids):
        entry = ids[at]
        first = _run_start(entry, log, items=items)
        if first is not None:
            start = offsets[first]

            def matches(end: int, at: int = at, start: int = start) -> bool:
                span = end - start
                if list(ids[at : at + span]) != flat[start:end]:
                    return False
                return texts is None or list(texts[at : at + span]) == proj.item_json[start:end]

            last = _longest_run(first, proj.closed_count, len(ids) - at, offsets, matches)
            if last is not None:
                _append_segment(out, first, last, proj.exchange_ids)
                at += offsets[last + 1] - start
                continue
        if texts is None or not isinstance(entry, str):
            out.append(entry)
        else:
            out.append(entry if _logged_item(log, entry) == texts[at] else json.loads(texts[at]))
        at += 1
    return out


def _run_start(entry: Any, log: ExchangeLog, *, items: bool) -> int | None:
    """The closed exchange a run starting at ``entry`` would start with: the exchange of a first
    item (``ex-000012/0``), or the exchange itself; None if ``entry`` cannot start a run."""
    if not isinstance(entry, str):
        return None
    if items:
        return _closed_index(entry[:-2], log) if entry.endswith("/0") else None
    return _closed_index(entry, log)


def _longest_run(
    first: int, closed: int, room: int, offsets: Sequence[int], matches: Callable[[int], bool]
) -> int | None:
    """The last exchange of the longest run of whole closed exchanges from ``first`` that fits in
    ``room`` entries and ``matches`` (called with the run's end offset), or None.

    Matching a longer run implies matching every shorter one, so the longest is found by trying
    the longest that fits, then bisecting: a few list comparisons, however long the history."""
    lo, hi = first, bisect_right(offsets, offsets[first] + room, first + 1, closed + 1) - 2
    if hi < lo or not matches(offsets[first + 1]):
        return None
    if matches(offsets[hi + 1]):
        return hi
    hi -= 1
    while lo < hi:  # the longest matching run ends at an exchange in [lo, hi]; lo's run matches
        mid = (lo + hi + 1) // 2
        if matches(offsets[mid + 1]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _append_segment(out: list[Any], first: int, last: int, exchange_ids: Sequence[str]) -> None:
    if first > 0 and out and isinstance(out[-1], list) and out[-1][1] == exchange_id_at(first - 1):
        out[-1][1] = exchange_ids[last]
    else:
        out.append([exchange_ids[first], exchange_ids[last]])


def _unfold(segments: Sequence[Any], log: ExchangeLog, *, items: bool) -> list[Any]:
    """The inverse of :func:`_fold` without texts."""
    flat, offsets = _flat(log, items=items)
    out: list[Any] = []
    for segment in segments:
        if isinstance(segment, list):
            first, last = _segment_bounds(segment, log)
            out.extend(flat[offsets[first] : offsets[last + 1]])
        else:
            out.append(segment)
    return out


def _segment_bounds(segment: list[Any], log: ExchangeLog) -> tuple[int, int]:
    """The indexes of a segment's first and last closed exchange; ValueError if the log lacks one."""
    if len(segment) != 2:
        raise ValueError(f"a stored request view segment must be [first, last], got {segment!r}")
    first, last = (_closed_index(str(exchange_id), log) for exchange_id in segment)
    if first is None or last is None or last < first:
        raise ValueError(f"the stored request view selects exchanges {segment!r}, which the log does not hold closed")
    return first, last


def _closed_index(exchange_id: str, log: ExchangeLog) -> int | None:
    """The index of a closed exchange of ``log`` (closed exchanges are its leading ones), or None."""
    try:
        index = log.exchange(exchange_id).index
    except ExchangeLogError:
        return None
    return index if index < log.projection().closed_count else None


def _logged_item(log: ExchangeLog, item_id: str) -> str | None:
    """The JSON text of item ``<exchange id>/<index>`` in ``log``, or None."""
    exchange_id, _, index = item_id.rpartition("/")
    if not index.isdigit():
        return None
    try:
        items = log.exchange(exchange_id).items
    except ExchangeLogError:
        return None
    position = int(index)
    return items[position].json_text if position < len(items) else None
