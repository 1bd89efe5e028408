"""A small reader of the protobuf wire format, for walking a message in place.

The ONNX loader uses it to find where each tensor's `raw_data` lies inside the
model file without parsing (or copying) the weights. It knows nothing about
ONNX: it splits a message into fields, stepping over payloads, and checks every
length against the end of the enclosing message. It can scan a message through
windows of its bytes, so a caller that reads the file (rather than touching a
mapping) only reads the field headers. Positions are absolute offsets into the
file, so an error names the byte offset.
"""

from ..errors import MalformedModelError

VARINT = 0
FIXED64 = 1
LENGTH_DELIMITED = 2
FIXED32 = 5

MAX_VARINT_BYTES = 10
MAX_FIELD_NUMBER = (1 << 29) - 1


def read_varint(buf, pos, end, base=0):
    """Decode the varint at index `pos` of `buf` (absolute offset base+pos); return
    (value, index after it)."""
    value = 0
    shift = 0
    start = pos
    while pos < end:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if pos - start == MAX_VARINT_BYTES:
            raise MalformedModelError(f"malformed protobuf at byte offset {base + start}: varint longer "
                             f"than {MAX_VARINT_BYTES} bytes")
    raise MalformedModelError(f"truncated protobuf at byte offset {base + start}: varint runs past the "
                     f"end of its message (byte {base + end})")


# A field's tag and length, or tag and varint value, take at most this many bytes.
MAX_HEADER_BYTES = 2 * MAX_VARINT_BYTES


def scan_fields(data, base, end, numbers, min_length, found):
    """Step over the fields of a message, collecting the length-delimited ones wanted.

    `data` holds the message's bytes from absolute offset `base` on: all of them
    up to `end`, or a window that stops short of it. Every field whose number is
    in `numbers` and whose payload is longer than `min_length` is appended to
    `found` as (field number, payload start, payload end, field start), all
    absolute offsets. Payloads are never read, only stepped over, so they may lie
    beyond the window. Returns where the scan stopped: `end`, or (for a window)
    the start of the first field whose header the window does not hold whole;
    the caller reads the next window from there. Every length is checked against
    `end`. Groups (wire types 3 and 4), which ONNX never uses, and unknown wire
    types are errors.
    """
    stop = end - base
    limit = min(len(data), stop)
    window = limit < stop
    i = 0
    while i < stop:
        # This loop runs once per field of every message walked: one-byte tags and
        # varints and one- or two-byte lengths, nearly all of them, are decoded inline.
        if window and limit - i < MAX_HEADER_BYTES:
            return base + i
        field_start = i
        tag = data[i]
        if tag < 0x80:
            i += 1
        else:
            tag, i = read_varint(data, i, limit, base)
        wire_type = tag & 7
        number = tag >> 3
        if wire_type == LENGTH_DELIMITED:
            if i >= limit:
                raise MalformedModelError(f"truncated protobuf at byte offset {base + field_start}: "
                                 f"field {number} has no length")
            length = data[i]
            if length < 0x80:
                i += 1
            elif i + 1 < limit and data[i + 1] < 0x80:
                length = (length & 0x7F) | data[i + 1] << 7
                i += 2
            else:
                length, i = read_varint(data, i, limit, base)
            value_end = i + length
            if value_end > stop:
                raise MalformedModelError(f"truncated protobuf at byte offset {base + field_start}: "
                                 f"field {number} of {length} bytes runs past the end of its "
                                 f"message (byte {end})")
            if length > min_length and number in numbers:
                found.append((number, base + i, base + value_end, base + field_start))
            i = value_end
        elif wire_type == VARINT:
            if i < limit and data[i] < 0x80:
                i += 1
            else:
                _, i = read_varint(data, i, limit, base)
        elif wire_type == FIXED64 or wire_type == FIXED32:
            i += 8 if wire_type == FIXED64 else 4
            if i > stop:
                raise MalformedModelError(f"truncated protobuf at byte offset {base + field_start}: "
                                 f"fixed-size field {number} runs past the end of its message "
                                 f"(byte {end})")
        else:
            kind = "groups are not supported" if wire_type in (3, 4) else "unknown wire type"
            raise MalformedModelError(f"malformed protobuf at byte offset {base + field_start}: field "
                             f"{number} has wire type {wire_type} ({kind})")
        if number == 0 or number > MAX_FIELD_NUMBER:
            raise MalformedModelError(f"malformed protobuf at byte offset {base + field_start}: "
                             f"invalid field number {number}")
    return end


def encode_varint(value):
    """The varint encoding of a non-negative int."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited_header(number, length):
    """Tag and length prefix of a length-delimited field."""
    tag = number << 3 | LENGTH_DELIMITED
    if tag < 0x80 and length < 0x80:
        return bytes((tag, length))
    return encode_varint(tag) + encode_varint(length)


def length_delimited(number, payload):
    """A whole length-delimited field: tag, length, payload."""
    return length_delimited_header(number, len(payload)) + payload
