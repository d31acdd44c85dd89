"""Request bodies: read within the size limit and undo their `Content-Encoding`.

Engines get the decoded body, without `Content-Encoding` (forward.py drops the header; the
client session sets `Content-Length` from the bytes). gzip and deflate are decoded; neither
Brotli nor zstd has a library installed, so `br`, `zstd` and any other coding get 415. The
decoded size is held to the same limit as the body itself (a small compressed body can expand
a thousandfold), checked while decoding, so memory never holds more than the limit.
"""

from __future__ import annotations

import zlib

from aiohttp import web

from proxy.errors import ProxyError

GZIP_WBITS = 16 + zlib.MAX_WBITS
"""zlib's window-bits value for the gzip container."""
IDENTITY = frozenset({"", "identity"})
DECODABLE = ("gzip", "x-gzip", "deflate")


def codings(header_values: list[str]) -> list[str]:
    """The content codings in the order they were applied, identity left out (lowercase)."""
    listed = (c.strip().lower() for value in header_values for c in value.split(","))
    return [c for c in listed if c not in IDENTITY]


def check_codings(applied: list[str]) -> None:
    """415 for a coding the proxy cannot undo, before the body is read."""
    for coding in applied:
        if coding not in DECODABLE:
            raise ProxyError(415, f"Unsupported Content-Encoding {coding!r}: send the body as gzip, deflate "
                                  f"or uncompressed.", code="unsupported_content_encoding")


def too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"The request body is larger than {limit} bytes.")


def decode(data: bytes, coding: str, limit: int) -> bytes:
    """Undo one coding; 413 past `limit` decoded bytes, 400 for a corrupt or truncated body (pure)."""
    if coding == "deflate":
        # RFC 9110 deflate is the zlib container; some clients send the raw stream (no header).
        wbits = zlib.MAX_WBITS if data[:1] and data[0] & 0x0F == 8 else -zlib.MAX_WBITS
    else:
        wbits = GZIP_WBITS
    out = bytearray()
    try:
        while data:  # a gzip body may hold several members back to back
            d = zlib.decompressobj(wbits)
            out += d.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                raise too_large(limit)
            if not d.eof:
                raise ProxyError(400, f"The {coding} request body is truncated.")
            data = d.unused_data if wbits == GZIP_WBITS else b""
    except zlib.error:
        raise ProxyError(400, f"The request body is not valid {coding} data.") from None
    return bytes(out)


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request body, decoded, at most `limit` bytes both as sent and as decoded."""
    applied = codings(request.headers.getall("Content-Encoding", []))
    check_codings(applied)
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(limit) from None
    if applied and request.content.total_compressed_bytes is not None:
        # A server run with aiohttp's default auto_decompress decoded one coding already
        # (start_proxy turns that off); more than one would be ambiguous.
        if len(applied) > 1:
            raise ProxyError(415, "Send the body with one Content-Encoding.", code="unsupported_content_encoding")
        return raw
    for coding in reversed(applied):
        raw = decode(raw, coding, limit)
    return raw
