"""Long list fields of a base snapshot stored as content-addressed runs (``qitos.sessions._state_chunks``)."""

from __future__ import annotations

import random
import string

import pytest

from qitos.checkpoint._packing import ZSTD_MAGIC
from qitos.core._codec import sha256_hex
from qitos.sessions._state_chunks import CHUNK_BYTES, ChunkRef, chunk_list, join_chunks, parse_refs, reusable_runs


def _notes(count: int, start: int = 0, size: int = 1024) -> list[str]:
    letters = string.ascii_letters + " "
    return ["".join(random.Random(i).choices(letters, k=size)) for i in range(start, start + count)]


def test_a_short_list_stays_inline() -> None:
    assert chunk_list(_notes(5), None) is None
    assert chunk_list([], None) is None


def test_a_long_list_is_cut_into_runs_that_join_back_to_it() -> None:
    items = [*_notes(150), {"nested": [1, 2.5, None, "é"]}, 7, None]
    cut = chunk_list(items, None)
    assert cut is not None
    refs, blobs = cut

    assert sum(ref.count for ref in refs) == len(items)
    assert all(sha256_hex(blobs[ref.digest]) == ref.digest for ref in refs)
    assert all(ref.nbytes >= CHUNK_BYTES for ref in refs[:-1])  # every run but the last is closed
    assert join_chunks(refs, blobs) == items


def test_appending_keeps_every_closed_run_and_writes_only_the_new_items() -> None:
    items = _notes(100)
    first = chunk_list(items, None)
    assert first is not None
    refs, blobs = first
    grown = items + _notes(40, start=100)

    closed = reusable_runs(refs, len(grown))
    assert closed == [ref for ref in refs if ref.nbytes >= CHUNK_BYTES // 2] and closed
    second = chunk_list(grown[sum(ref.count for ref in closed) :], closed)
    assert second is not None
    new_refs, new_blobs = second

    assert new_refs[: len(closed)] == closed
    assert not set(new_blobs) & {ref.digest for ref in closed}  # nothing closed is written again
    assert sum(len(blob) for blob in new_blobs.values()) < 0.6 * sum(len(blob) for blob in blobs.values())
    assert join_chunks(new_refs, {**blobs, **new_blobs}) == grown


def test_cutting_from_scratch_is_deterministic_so_equal_runs_are_stored_once() -> None:
    items = _notes(120)
    first, again = chunk_list(items, None), chunk_list(items, None)
    assert first is not None and again is not None
    assert first[0] == again[0]
    longer = chunk_list(items + _notes(60, start=120), None)
    assert longer is not None
    assert longer[0][: len(first[0]) - 1] == first[0][:-1]  # the same prefix cuts to the same runs


def test_runs_that_shrink_are_compressed_and_text_runs_read_too() -> None:
    cut = chunk_list(["the same sentence again"] * 2000, None)
    assert cut is not None
    refs, blobs = cut
    assert all(blobs[ref.digest].startswith(ZSTD_MAGIC) for ref in refs)
    plain = b'["kept",1]'
    assert join_chunks([ChunkRef(sha256_hex(plain), 2, len(plain))], {sha256_hex(plain): plain}) == ["kept", 1]


def test_runs_are_not_reused_for_a_list_shorter_than_they_cover() -> None:
    cut = chunk_list(_notes(80), None)
    assert cut is not None
    assert reusable_runs(cut[0], 79) == []
    assert reusable_runs(None, 80) == [] and reusable_runs([], 80) == []


def test_a_missing_unreadable_or_miscounted_run_is_named() -> None:
    cut = chunk_list(_notes(80), None)
    assert cut is not None
    refs, blobs = cut
    with pytest.raises(ValueError, match=refs[1].digest):
        join_chunks(refs, {k: v for k, v in blobs.items() if k != refs[1].digest})
    with pytest.raises(ValueError, match=refs[0].digest):
        join_chunks(refs, {**blobs, refs[0].digest: b"\x00garbage"})
    miscounted = [ChunkRef(refs[0].digest, refs[0].count + 1, refs[0].nbytes), *refs[1:]]
    with pytest.raises(ValueError, match=f"{refs[0].digest} does not hold"):
        join_chunks(miscounted, blobs)


@pytest.mark.parametrize(
    "value", [{"a": 1}, [["d", 1]], [["d", -1, 3]], [[1, 2, 3]], [["d", 1, 2, 3]], [["d", True, 2]]]
)
def test_malformed_run_references_are_refused(value: object) -> None:
    with pytest.raises(ValueError):
        parse_refs(value)
