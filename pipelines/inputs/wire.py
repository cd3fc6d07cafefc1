"""What SIG's processes exchange: Arrow IPC streams and JSON, never pickle.

``table_bytes`` / ``bytes_table`` turn a table into an Arrow IPC stream and back (the
reader fully validates what it receives). ``write_frame`` / ``read_frame`` put one message
on a byte stream (a pipe between a pool and its reader processes): a JSON header and an
optional payload, each preceded by its length.
"""

import json
import struct
from typing import Any, BinaryIO, Dict, Optional, Tuple

import pyarrow as pa
import pyarrow.ipc as ipc

_LENGTHS = struct.Struct("<IQ")  # header bytes, payload bytes
MAX_HEADER_BYTES = 1 << 20


class WireError(ValueError):
    """A message that is not what the protocol allows."""


def table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def bytes_table(data: bytes) -> pa.Table:
    """The table an Arrow IPC stream holds, validated in full (offsets, lengths, UTF-8)."""
    try:
        table = ipc.open_stream(pa.py_buffer(data)).read_all()
        table.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as error:
        raise WireError(f"not an Arrow IPC stream of a valid table ({error})") from error
    return table


def write_frame(stream: BinaryIO, header: Dict[str, Any], payload: bytes = b"") -> None:
    encoded = json.dumps(header).encode()
    stream.write(_LENGTHS.pack(len(encoded), len(payload)) + encoded + payload)
    stream.flush()


def _exactly(stream: BinaryIO, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = stream.read(count - len(data))
        if not chunk:
            raise EOFError(f"stream ended {count - len(data)} bytes into a frame")
        data += chunk
    return data


def read_frame(stream: BinaryIO, max_payload: int = 1 << 34) -> Optional[Tuple[Dict[str, Any], bytes]]:
    """The next (header, payload), or None at a clean end of the stream."""
    prefix = stream.read(_LENGTHS.size)
    if not prefix:
        return None
    header_bytes, payload_bytes = _LENGTHS.unpack(prefix + _exactly(stream, _LENGTHS.size - len(prefix)))
    if header_bytes > MAX_HEADER_BYTES or payload_bytes > max_payload:
        raise WireError(f"frame of {header_bytes} header and {payload_bytes} payload bytes: too large")
    try:
        header = json.loads(_exactly(stream, header_bytes))
    except json.JSONDecodeError as error:
        raise WireError(f"frame header is not JSON ({error})") from error
    if not isinstance(header, dict):
        raise WireError("frame header is not a JSON object")
    return header, _exactly(stream, payload_bytes)
