"""Compression of stored bytes: a Zstandard frame when it pays, the bytes as they are otherwise.

Zstandard (``compression.zstd`` from Python 3.14, its ``backports.zstd`` package before) is used
for everything the stores write compressed: snapshot payloads, exchange-log and request-view blobs,
state runs. It costs a few microseconds per kilobyte both ways where zlib's set-up alone costs
~100 µs per call here, and it decodes dense text 3x faster. :func:`unpack` also reads the zlib
streams that earlier versions wrote, so old files stay readable.
"""

from __future__ import annotations

import threading
import zlib

try:  # Python 3.14+
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - depends on the Python version
    from backports import zstd  # type: ignore[no-redef,unused-ignore]

__all__ = ["ZSTD_MAGIC", "PackingError", "pack", "unpack"]

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_MIN_GAIN = 0.1
# One compressor per thread and level, reused: setting one up allocates its tables, which costs
# more than compressing a kilobyte.
_COMPRESSORS = threading.local()


class PackingError(ValueError):
    """Stored bytes that are neither a readable compressed frame nor plain JSON text."""


def pack(raw: bytes, *, level: int = 1) -> bytes | None:
    """A Zstandard frame of ``raw``, or None when it is not at least 10% smaller (store it as is)."""
    compressors: dict[int, zstd.ZstdCompressor] | None = getattr(_COMPRESSORS, "by_level", None)
    if compressors is None:
        compressors = _COMPRESSORS.by_level = {}
    compressor = compressors.get(level)
    if compressor is None:
        compressor = compressors[level] = zstd.ZstdCompressor(level=level)
    packed: bytes = compressor.compress(raw, mode=zstd.ZstdCompressor.FLUSH_FRAME)
    return packed if len(packed) < len(raw) * (1 - _MIN_GAIN) else None


def pack_or_raw(raw: bytes, *, level: int = 1) -> bytes:
    """:func:`pack` when it pays, else ``raw`` itself (:func:`unpack` tells the two apart)."""
    packed = pack(raw, level=level)
    return raw if packed is None else packed


def unpack(data: bytes) -> bytes:
    """The raw bytes of a stored blob: a Zstandard frame, a zlib stream, or JSON text as it is."""
    head = data[:4]
    try:
        if head == ZSTD_MAGIC:
            return bytes(zstd.decompress(data))
        if len(head) >= 2 and head[0] == 0x78 and (head[0] * 256 + head[1]) % 31 == 0:
            return zlib.decompress(data)
    except (zstd.ZstdError, zlib.error) as exc:
        raise PackingError(f"compressed bytes are unreadable: {exc}") from exc
    if head[:1] in (b"[", b"{", b'"'):
        return data
    raise PackingError(f"stored bytes start with {bytes(head)!r}: not a known frame or JSON text")
