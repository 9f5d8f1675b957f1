"""How a durable session stores the last request view it sent: exchange items by reference.

A request view holds the exchange items it selected. Those items are already stored once, in the
session's exchange-log blobs; storing them again with every step's view would make storage grow
with the whole history at every model call. The stored form keeps every other field of
``RequestView.to_dict()`` and lists each selected item either as its item id (``ex-000012/1``),
when the exchange log holds exactly that text under that id, or inline otherwise (a compaction
summary, say). Reading it back needs the exchange log at (or after) the step that sent it: items
are only ever appended to an exchange, so an item id keeps its text.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from qitos.core.exchange import ExchangeLog, ExchangeLogError
from qitos.core.request_view import RequestView

__all__ = ["view_from_record", "view_record"]


def view_record(view: RequestView, log: ExchangeLog | None) -> dict[str, Any]:
    """The stored form of ``view``: selected items that ``log`` holds are replaced by their ids."""
    data = dataclasses.replace(view, selected_items_json=()).to_dict()  # no parse of every item
    ids = view.selection.selected_item_ids
    texts = view.selected_items_json
    if log is None or len(ids) != len(texts):
        data["selected_items"] = [json.loads(text) for text in texts]
        return data
    data["selected_items"] = [
        item_id if _logged_item(log, item_id) == text else json.loads(text)
        for item_id, text in zip(ids, texts, strict=True)
    ]
    return data


def view_from_record(data: Mapping[str, Any], log: ExchangeLog) -> RequestView:
    """The request view stored as ``data``; ValueError names an item id that ``log`` does not hold."""
    items: list[Any] = []
    for item in data.get("selected_items") or ():
        if isinstance(item, str):
            text = _logged_item(log, item)
            if text is None:
                raise ValueError(f"the stored request view selects item {item!r}, which the exchange log lacks")
            items.append(json.loads(text))
        else:
            items.append(item)
    return RequestView.from_dict({**data, "selected_items": items})


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
