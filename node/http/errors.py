"""Errors at the HTTP edge: OpenAI's error body, and reading a JSON body into a typed, limit-checked request.
Which envelope a route answers in, and the mapping of every exception, is node/http/middleware.py's."""

from __future__ import annotations

import asyncio
import re
from typing import TypeVar

import msgspec
from aiohttp import web

from node.config import RequestLimits
from node.errors import GatewayError, InvalidRequest, PayloadTooLarge
from node.http.limits import check_request, inflate

T = TypeVar("T")

_ENCODER = msgspec.json.Encoder()
_DEFAULT_LIMITS = RequestLimits()

#: The node's request limits, set on the application by `build_app` (defaults when absent).
REQUEST_LIMITS = web.AppKey("request_limits", RequestLimits)
#: Handler arguments of the app: aiohttp must not inflate bodies itself (it would on the event loop, and keep
#: inflating what is left of a refused body while draining it); `read_json` does, bounded and off the loop.
NO_AUTO_DECOMPRESS = {"auto_decompress": False}
_PATH = re.compile(r" - at `\$\.?([^`]*)`$")


def error_body(
    message: str, error_type: str, *, param: str | None = None, code: str | None = None, request_id: str | None = None
) -> bytes:
    error: dict[str, str | None] = {"message": message, "type": error_type, "param": param, "code": code}
    if request_id is not None:
        error["request_id"] = request_id
    return _ENCODER.encode({"error": error})


def error_object(exc: GatewayError) -> dict[str, str | None]:
    """The inner object of the envelope, e.g. for an error event inside a stream."""
    return {"message": exc.message, "type": exc.error_type, "param": exc.param, "code": exc.code}


def error_response(exc: GatewayError) -> web.Response:
    return web.Response(
        status=exc.status,
        body=error_body(exc.message, exc.error_type, param=exc.param, code=exc.code),
        content_type="application/json",
        headers=exc.headers,
    )


def from_validation(exc: msgspec.ValidationError) -> InvalidRequest:
    """Turn msgspec's 'Expected `int`, got `str` - at `$.messages[0].role`' into a 400 naming the field."""
    text = str(exc)
    match = _PATH.search(text)
    param = match.group(1) if match else None
    detail = _PATH.sub("", text)
    if param:
        return InvalidRequest(f"Invalid value for '{param}': {detail}", param=param)
    missing = re.match(r"Object missing required field `([^`]+)`", text)
    if missing:
        return InvalidRequest(f"Missing required parameter: '{missing.group(1)}'.", param=missing.group(1))
    return InvalidRequest(f"Invalid request body: {detail}")


async def read_json(request: web.Request, kind: type[T], max_bytes: int) -> T:
    """Read, inflate (gzip/deflate), decode a JSON body as ``kind`` and check it against the app's
    `RequestLimits`. Raises PayloadTooLarge (413, before or after inflating), UnsupportedEncoding (415) or
    InvalidRequest (400, naming the field)."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise PayloadTooLarge(f"Request body of {request.content_length} bytes exceeds the limit of {max_bytes}.")
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise PayloadTooLarge(f"Request body exceeds the limit of {max_bytes} bytes.") from exc
    if len(body) > max_bytes:
        raise PayloadTooLarge(f"Request body of {len(body)} bytes exceeds the limit of {max_bytes}.")
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    data: bytes | bytearray = body
    if encoding not in ("", "identity"):
        data = await asyncio.to_thread(inflate, body, encoding, max_bytes)
    limits = request.config_dict.get(REQUEST_LIMITS, _DEFAULT_LIMITS)
    try:
        value = msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as exc:
        raise from_validation(exc) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request. The body must be a valid JSON object ({exc})."
        ) from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid UTF-8 ({exc.reason} at byte {exc.start}).") from exc
    except RecursionError:
        raise InvalidRequest(
            f"The JSON body nests deeper than this server's limit of {limits.max_json_depth} levels (max_json_depth).",
            code="max_json_depth",
        ) from None
    check_request(value, limits)
    return value
