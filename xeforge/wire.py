"""The wire format between the xeforge process and its workers: data only, never code.

Owns: the framing of requests and replies (a length prefix and UTF-8 JSON, bounded in size and in nesting) and
tensor bundles on disk (safetensors: a JSON header and raw bytes, no pickling). Whatever a worker writes — a
reply on the protocol stream, a tensor file in its folder — is read here as data and checked: a reply that is
too large, is not JSON, or is not an object is a :class:`ProtocolError`, and a tensor file that is too large,
malformed or holds unexpected names is a :class:`TensorFileError`. Nothing read here can run code in the reader
(``verification.md``, gate 0: the trust boundary).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

HEADER = struct.Struct("<Q")
MAX_MESSAGE_BYTES = 8 << 20  # a reply carries facts and error text, never tensors: 8 MiB is far above any real one
MAX_DEPTH = 64  # JSON nesting a reply may use (json's own recursion limit is a crash, not an error)


class ProtocolError(Exception):
    """A worker's reply is not a well-formed message: too large, not JSON, too deep, or not an object."""


class TensorFileError(Exception):
    """A tensor file from a worker is missing, too large, malformed, or not what was asked for."""


# -------------------------------------------------------------------------------------------- messages
def encode(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj, allow_nan=True, separators=(",", ":")).encode()
    return HEADER.pack(len(data)) + data


def message_length(head: bytes, limit: int = MAX_MESSAGE_BYTES) -> int:
    (n,) = HEADER.unpack(head)
    if n > limit:
        raise ProtocolError(f"a reply of {n:,} bytes (at most {limit:,} are read)")
    return n


def decode(data: bytes) -> dict[str, Any]:
    """Parse one message body; never more than data, never anything but a JSON object."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"a reply that is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if _depth(text) > MAX_DEPTH:
        raise ProtocolError(f"a reply nested deeper than {MAX_DEPTH} levels")
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"a reply that is not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"a reply that is a JSON {type(obj).__name__}, not an object")
    return obj


def _depth(text: str) -> int:
    """Bracket depth outside strings (an upper bound on the nesting json.loads would recurse into)."""
    depth = deepest = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def read_message(stream) -> dict[str, Any] | None:
    """One message from a blocking binary stream (the worker's side); None at end of stream."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    n = message_length(head)
    body = stream.read(n)
    if len(body) < n:
        return None
    return decode(body)


def write_message(stream, obj: dict[str, Any]) -> None:
    stream.write(encode(obj))
    stream.flush()


# -------------------------------------------------------------------------------------------- tensors
def save_tensors(path: str | os.PathLike, tensors: dict[str, Any]) -> None:
    """Write named tensors (moved to the CPU, made contiguous) as a safetensors file."""
    # lazy: safetensors.torch imports torch (seconds); the parent reads and writes JSON frames without it
    from safetensors.torch import save_file

    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}, str(path))


def load_tensors(path: str | os.PathLike, max_bytes: int, expect: set[str] | None = None,
                 device: str = "cpu") -> dict[str, Any]:
    """Read a safetensors file a worker wrote; checked for size and, with ``expect``, for exactly those names."""
    from safetensors import SafetensorError  # lazy, as in save_tensors
    from safetensors.torch import load_file

    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise TensorFileError(f"{p.name}: not written ({exc.strerror})") from None
    if not p.is_file():
        raise TensorFileError(f"{p.name}: not a regular file")
    if size > max_bytes:
        raise TensorFileError(f"{p.name}: {size:,} bytes, more than the {max_bytes:,} the outputs can need")
    try:
        out = load_file(str(p), device=device)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise TensorFileError(f"{p.name}: not a valid tensor file ({exc})") from None
    if expect is not None and set(out) != expect:
        extra, missing = sorted(set(out) - expect), sorted(expect - set(out))
        raise TensorFileError(f"{p.name}: holds {', '.join(extra) or 'nothing extra'} "
                              f"and lacks {', '.join(missing) or 'nothing'}")
    return out
