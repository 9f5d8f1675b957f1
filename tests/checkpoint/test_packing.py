"""Compression of stored bytes (``qitos.checkpoint._packing``)."""

from __future__ import annotations

import os
import zlib

import pytest

from qitos.checkpoint._packing import ZSTD_MAGIC, PackingError, pack, pack_or_raw, unpack

TEXT = b'{"notes":["' + b"a sentence that repeats, " * 200 + b'"]}'


def test_text_that_shrinks_is_packed_as_a_zstd_frame_and_unpacks_to_itself() -> None:
    packed = pack(TEXT)
    assert packed is not None and packed.startswith(ZSTD_MAGIC) and len(packed) < len(TEXT) // 5
    assert unpack(packed) == TEXT
    assert pack_or_raw(TEXT) == packed


def test_bytes_that_do_not_shrink_by_a_tenth_are_kept_as_they_are() -> None:
    dense = b'["' + os.urandom(3000).hex().encode()[:3000] + b'"]'  # hex: ~50% smaller, so packed
    noise = b"[" + os.urandom(3000) + b"]"
    assert pack(dense) is not None
    assert pack(noise) is None
    assert pack_or_raw(noise) == noise


def test_json_text_stored_as_is_and_zlib_streams_of_earlier_versions_unpack() -> None:
    assert unpack(b'["raw"]') == b'["raw"]'
    assert unpack(b'{"a":1}') == b'{"a":1}'
    assert unpack(zlib.compress(TEXT)) == TEXT


@pytest.mark.parametrize(
    "stored",
    [
        b"\x00\x01garbage",
        b"",
        ZSTD_MAGIC + b"\x00\x00\x00truncated",
        zlib.compress(TEXT)[:-9],
    ],
)
def test_bytes_that_are_no_known_frame_or_a_damaged_one_raise_a_packing_error(stored: bytes) -> None:
    with pytest.raises(PackingError):
        unpack(stored)
