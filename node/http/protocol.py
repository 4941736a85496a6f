"""aiohttp's per-connection protocol, speaking OpenAI's error envelope for the errors it answers itself.

Requests aiohttp refuses before any handler runs (a malformed request line, a bad method, an over-long line
or header, too many headers) are answered by `RequestHandler.handle_error` with a plain-text body, past every
middleware. aiohttp has no hook for that response (aio-libs/aiohttp#3287), so the runner builds a server
whose connections use a `RequestHandler` subclass that answers in the envelope instead. The status and
message stay aiohttp's; the connection is still closed after the answer, as aiohttp does.
"""

from __future__ import annotations

from http import HTTPStatus

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from node.http.errors import error_body


class EnvelopeRequestHandler(RequestHandler):
    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as the base class: a started response cannot be replaced
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        if status >= 500:
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
            text, kind = "The server had an error while processing your request.", "server_error"
        else:
            # A client's malformed request: not our error, so no traceback in the log (the base class logs one).
            self.log_debug("Refused a malformed request from %s: %s", request.remote, message or exc)
            text, kind = message or HTTPStatus(status).phrase, "invalid_request_error"
        resp = web.Response(status=status, body=error_body(text, kind), content_type="application/json")
        resp.force_close()
        return resp


class _EnvelopeServer(web.Server):
    def __call__(self) -> RequestHandler:
        return EnvelopeRequestHandler(self, loop=self._loop, **self._kwargs)


class EnvelopeAppRunner(web.AppRunner):
    """`web.AppRunner` whose connections answer aiohttp's own rejections in OpenAI's envelope."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # AppRunner builds a plain web.Server (Application._make_handler) and offers no factory argument:
        # retype it to the subclass that differs only in the connection protocol it builds.
        server.__class__ = _EnvelopeServer
        return server
