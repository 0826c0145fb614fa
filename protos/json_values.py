"""Protobuf messages as plain JSON values: the one conversion behind the CLI's --json, the web console's API and
what the harness runners show a model (projected history, the MCP bridge's tool results).

Why not json_format.MessageToDict: it writes 64-bit integers as strings (token counts, sizes, seq), which a
consumer then has to convert before `.usage.input_tokens + 1` works; JSON numbers have no width, and every
integer these messages carry fits a double's 53 bits. Field names are the proto's own, enums their names, bytes
base64. Unset sub-messages and oneof members that are not set are left out."""

from __future__ import annotations

import base64
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message


def to_jsonable(message: Message, *, defaults: bool = True) -> dict[str, Any]:
    """`defaults`: include scalar fields at their default value (0, "", false) and empty lists; False leaves them
    out, for a compact payload (what a model reads)."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        v = getattr(message, field.name)
        if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            if v or defaults:
                vfield = field.message_type.fields_by_name["value"]
                out[field.name] = {k: _value(vfield, item, defaults) for k, item in v.items()}
        elif field.is_repeated:
            if v or defaults:
                out[field.name] = [_value(field, item, defaults) for item in v]
        elif field.has_presence:
            if message.HasField(field.name):
                out[field.name] = _value(field, v, defaults)
        elif defaults or v:
            out[field.name] = _value(field, v, defaults)
    return out


def _value(field: FieldDescriptor, v: Any, defaults: bool) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return to_jsonable(v, defaults=defaults)
    if field.type == FieldDescriptor.TYPE_ENUM:
        enum = field.enum_type.values_by_number.get(v)
        return enum.name if enum is not None else v
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(v).decode()
    return v
