"""The JSON codec envd speaks: proto JSON, unknown fields ignored both ways, as the SDK's own
codec does (an older SDK sends fields a newer one dropped and the reverse)."""

from __future__ import annotations

from typing import Any, TypeVar

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from protobuf import Message

__all__ = ["ENVD_JSON_CODEC"]

_M = TypeVar("_M", bound=Message[Any])


class _ProtoJSONCodec:
    def name(self) -> str:
        return "json"

    def encode(self, message: Message[Any]) -> bytes:
        return message.to_json().encode("utf-8")

    def decode(self, data: Any, message_class: type[_M]) -> _M:
        try:
            return message_class.from_json(data, ignore_unknown_fields=True)
        except Exception as exc:  # the client's message, any way it can be wrong
            raise ConnectError(Code.INVALID_ARGUMENT, f"cannot decode the request: {exc}") from exc


ENVD_JSON_CODEC = _ProtoJSONCodec()
