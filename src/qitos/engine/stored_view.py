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
from collections.abc import Mapping, Sequence
from typing import Any

from qitos.core.exchange import Exchange, ExchangeLog, ExchangeLogError, exchange_id_at
from qitos.core.request_view import RequestView

__all__ = ["view_from_record", "view_record"]

_ITEM_LISTS = ("selected_item_ids", "omitted_item_ids")
_EXCHANGE_LISTS = ("selected_exchange_ids", "omitted_exchange_ids", "protected_exchange_ids")


def view_record(view: RequestView, log: ExchangeLog | None) -> dict[str, Any]:
    """The stored form of ``view``, with what ``log`` holds referenced and folded into segments."""
    data = dataclasses.replace(view, selected_items_json=()).to_dict()  # no parse of every item
    ids = view.selection.selected_item_ids
    texts = view.selected_items_json
    if log is None or len(ids) != len(texts):
        data["selected_items"] = [json.loads(text) for text in texts]
        return data
    items = [
        item_id if _logged_item(log, item_id) == text else json.loads(text)
        for item_id, text in zip(ids, texts, strict=True)
    ]
    data["selected_items"] = _fold_items(items, log)
    selection = data["selection"]
    for name in _ITEM_LISTS:
        selection[name] = _fold_items(selection[name], log)
    for name in _EXCHANGE_LISTS:
        selection[name] = _fold_exchanges(selection[name], log)
    return data


def view_from_record(data: Mapping[str, Any], log: ExchangeLog) -> RequestView:
    """The request view stored as ``data``; ValueError names a reference ``log`` cannot resolve."""
    items: list[Any] = []
    for item in _unfold_items(data.get("selected_items") or (), log):
        if isinstance(item, str):
            text = _logged_item(log, item)
            if text is None:
                raise ValueError(f"the stored request view selects item {item!r}, which the exchange log lacks")
            items.append(json.loads(text))
        else:
            items.append(item)
    selection = dict(data["selection"])
    for name in _ITEM_LISTS:
        selection[name] = _unfold_items(selection.get(name) or (), log)
    for name in _EXCHANGE_LISTS:
        selection[name] = _unfold_exchanges(selection.get(name) or (), log)
    return RequestView.from_dict({**data, "selected_items": items, "selection": selection})


# --------------------------------------------------------------------------- segments


def _fold_items(items: Sequence[Any], log: ExchangeLog) -> list[Any]:
    """Runs of whole closed exchanges' item ids become ``[first, last]``; the rest stays as is."""
    out: list[Any] = []
    at = 0
    while at < len(items):
        exchange = _closed_exchange_of(items[at], log)
        count = len(exchange.items) if exchange is not None else 0
        if exchange is not None and list(items[at : at + count]) == _item_ids(exchange):
            if out and isinstance(out[-1], list) and _follows(out[-1][1], exchange):
                out[-1][1] = exchange.exchange_id
            else:
                out.append([exchange.exchange_id, exchange.exchange_id])
            at += count
        else:
            out.append(items[at])
            at += 1
    return out


def _unfold_items(segments: Sequence[Any], log: ExchangeLog) -> list[Any]:
    out: list[Any] = []
    for segment in segments:
        if isinstance(segment, list):
            for exchange in _exchange_range(segment, log):
                out.extend(_item_ids(exchange))
        else:
            out.append(segment)
    return out


def _fold_exchanges(ids: Sequence[str], log: ExchangeLog) -> list[Any]:
    """Runs of consecutive closed exchange ids become ``[first, last]``."""
    out: list[Any] = []
    for exchange_id in ids:
        exchange = _closed_exchange(exchange_id, log)
        if exchange is None:
            out.append(exchange_id)
        elif out and isinstance(out[-1], list) and _follows(out[-1][1], exchange):
            out[-1][1] = exchange_id
        else:
            out.append([exchange_id, exchange_id])
    return out


def _unfold_exchanges(segments: Sequence[Any], log: ExchangeLog) -> list[str]:
    out: list[str] = []
    for segment in segments:
        if isinstance(segment, list):
            out.extend(exchange.exchange_id for exchange in _exchange_range(segment, log))
        else:
            out.append(str(segment))
    return out


def _exchange_range(segment: list[Any], log: ExchangeLog) -> list[Exchange]:
    """The closed exchanges ``first`` .. ``last`` of a segment; ValueError if the log lacks one."""
    if len(segment) != 2:
        raise ValueError(f"a stored request view segment must be [first, last], got {segment!r}")
    first, last = (_closed_exchange(str(exchange_id), log) for exchange_id in segment)
    if first is None or last is None or last.index < first.index:
        raise ValueError(f"the stored request view selects exchanges {segment!r}, which the log does not hold closed")
    return [log.exchange_at(index) for index in range(first.index, last.index + 1)]


def _follows(exchange_id: str, exchange: Exchange) -> bool:
    return exchange.index > 0 and exchange_id_at(exchange.index - 1) == exchange_id


def _item_ids(exchange: Exchange) -> list[str]:
    return [f"{exchange.exchange_id}/{k}" for k in range(len(exchange.items))]


def _closed_exchange_of(item: Any, log: ExchangeLog) -> Exchange | None:
    if not isinstance(item, str) or not item.endswith("/0"):
        return None
    return _closed_exchange(item[:-2], log)


def _closed_exchange(exchange_id: str, log: ExchangeLog) -> Exchange | None:
    try:
        exchange = log.exchange(exchange_id)
    except ExchangeLogError:
        return None
    return exchange if exchange.closed else None


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
