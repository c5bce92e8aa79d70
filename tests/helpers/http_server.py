"""A local HTTP server for tests that exercise real HTTP clients (yt-dlp) without the internet.

Serves the files of one directory on 127.0.0.1 with an ephemeral port, answers Range requests
(206 / 416), and lets a test program individual paths:

    with LocalHTTPServer(tmp_path) as server:
        server.respond("/gone.mp4", status=404)
        server.fail_then_serve("/busy.mp4", status=429, times=2, headers={"Retry-After": "7"})
        server.delay("/slow.mp4", seconds=2.0)
        server.cut_off("/cut.mp4", after_bytes=1000)
        server.stream("/endless.mp4", total_bytes=40 * 2**20)
        server.trickle("/slow.mp4", bytes_per_step=512, every_s=2.0)
        url = server.url("/clip.mp4")

Every request is recorded in `server.requests` (method, path, headers, status, arrival time; for a
streamed path also the body bytes sent) so that a test can assert how many times a client asked for
what. A subclass may decide answers itself (`_route_for`) and follow transfers (`_transfer_ended`):
tests/helpers/throttling_host.py does. As a pytest fixture:

    http_server = http_server_fixture()            # in a test module or conftest.py

    def test_x(http_server): ...                   # serves http_server.root, a fresh tmp dir
"""

from __future__ import annotations

import mimetypes
import re
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

# Content types that yt-dlp's generic extractor recognises as a direct video link.
_CONTENT_TYPES = {".mp4": "video/mp4", ".webm": "video/webm", ".mkv": "video/x-matroska"}
_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    status: int = 0
    bytes_sent: int = 0  # streamed and trickled routes: body bytes written (read or not)
    at: float = field(default_factory=time.monotonic)  # arrival


@dataclass
class Route:
    """What a programmed path answers. `status=None` means: serve the file from the root."""

    status: int | None = None
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str | None = None  # overrides the type guessed from the file extension
    fail_times: int | None = None  # answer `status` this many times, then serve the file
    fail_after: int = 0  # serve the file this many times before the failures start
    cut_after_bytes: int | None = None  # announce the full length, send only this many bytes
    stall_s: float = 0.0  # with cut_after_bytes: keep the connection silent this long, then close
    body_s: float = 0.0  # spread the body over this many seconds (a slow transfer)
    trickle: tuple[int, float] | None = None  # send (bytes, every seconds) of the body at a time
    delay_s: float = 0.0  # sleep before sending the response headers
    stream_bytes: int | None = None  # send this many filler bytes, chunked, without a length
    hits: int = 0


class LocalHTTPServer:
    """Threaded HTTP server on 127.0.0.1:<ephemeral port> serving `root`. Start with `with`."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.routes: dict[str, Route] = {}
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- programming routes --------------------------------------------------------------

    def respond(
        self,
        path: str,
        *,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> None:
        """Always answer `path` with `status` (and `body`), e.g. 404 or 500."""
        self.routes[path] = Route(status=status, body=body, headers=dict(headers or {}))

    def fail_then_serve(
        self,
        path: str,
        *,
        status: int,
        times: int,
        after: int = 0,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Serve `path` `after` times, then answer `status` `times` times, then serve it again.

        yt-dlp's generic extractor requests a URL twice (metadata, then download): `after=1`
        makes the failure hit the download request.
        """
        self.routes[path] = Route(
            status=status, fail_times=times, fail_after=after, headers=dict(headers or {})
        )

    def cut_off(self, path: str, *, after_bytes: int) -> None:
        """Announce the file's full length but close the connection after `after_bytes`."""
        self.routes[path] = Route(cut_after_bytes=after_bytes)

    def stream(self, path: str, *, total_bytes: int, content_type: str = "video/mp4") -> None:
        """Answer `path` with `total_bytes` of filler in chunked transfer encoding, without a
        Content-Length, as a live or generated response does (no file needed)."""
        self.routes[path] = Route(stream_bytes=total_bytes, content_type=content_type)

    def trickle(self, path: str, *, bytes_per_step: int, every_s: float) -> None:
        """Serve the file at `path` with its full Content-Length, `bytes_per_step` bytes every
        `every_s` seconds: a host too slow for any timeout of one read to notice."""
        self.routes[path] = Route(trickle=(bytes_per_step, every_s))

    def delay(self, path: str, *, seconds: float) -> None:
        """Serve the file at `path` only after `seconds` (to trigger client timeouts)."""
        self.routes[path] = Route(delay_s=seconds)

    def serve_as(self, path: str, *, content_type: str) -> None:
        """Serve the file at `path` with an explicit Content-Type."""
        self.routes[path] = Route(content_type=content_type)

    def hits(self, path: str) -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.path == path)

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the server is not running; use it as a context manager")
        return self._httpd.server_address[1]

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def start(self) -> LocalHTTPServer:
        self.root.mkdir(parents=True, exist_ok=True)
        handler = type("_BoundHandler", (_Handler,), {"server_state": self})
        self._httpd = _QuietThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> LocalHTTPServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- used by the handler -------------------------------------------------------------

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _transfer_ended(self, record: RecordedRequest) -> None:
        """The answer to `record` is sent, cut off or stalled (no more bytes will come)."""

    def _route_for(self, path: str, record: RecordedRequest) -> tuple[Route | None, bool]:
        """The route for `path` and whether this request should get the route's failure."""
        with self._lock:
            route = self.routes.get(path)
            if route is None:
                return None, False
            route.hits += 1
            if route.status is None:
                return route, False
            if route.fail_times is None:
                return route, True
            failures_so_far = route.hits - route.fail_after
            return route, 0 < failures_so_far <= route.fail_times


class _QuietThreadingHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request, client_address) -> None:
        # Clients (yt-dlp's extractor) often read the headers and hang up mid-body: not an error.
        if isinstance(sys.exception(), BrokenPipeError | ConnectionResetError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server_state: LocalHTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_CONNECT(self) -> None:
        """A client that uses this server as its proxy for https: recorded (path `host:port`),
        and refused with 404, as no tunnel is offered."""
        self._answer(send_body=False)

    def _answer(self, *, send_body: bool) -> None:
        path = self.path if self.command == "CONNECT" else unquote(urlsplit(self.path).path)
        record = RecordedRequest(self.command, path, dict(self.headers.items()))
        self.server_state._record(record)
        try:
            self._answer_route(record, path, send_body=send_body)
        finally:
            self.server_state._transfer_ended(record)

    def _answer_route(self, record: RecordedRequest, path: str, *, send_body: bool) -> None:
        route, fail = self.server_state._route_for(path, record)
        if route is not None and route.delay_s:
            time.sleep(route.delay_s)
        if fail:
            self._send_status(record, route, send_body=send_body)
            return
        if route is not None and route.stream_bytes is not None:
            self._send_stream(record, route, send_body=send_body)
            return
        file = self._resolve(path)
        if file is None:
            record.status = HTTPStatus.NOT_FOUND
            self._send_simple(HTTPStatus.NOT_FOUND, b"not found", {}, send_body=send_body)
            return
        content_type = (route.content_type if route else None) or _content_type(file)
        cut_after = route.cut_after_bytes if route else None
        self._send_file(
            record,
            file,
            content_type,
            send_body=send_body,
            cut_after=cut_after,
            stall_s=route.stall_s if route else 0.0,
            body_s=route.body_s if route else 0.0,
            trickle=route.trickle if route else None,
        )

    def _resolve(self, path: str) -> Path | None:
        root = self.server_state.root.resolve()
        candidate = (root / path.lstrip("/")).resolve()
        if not candidate.is_relative_to(root) or not candidate.is_file():
            return None
        return candidate

    def _send_status(self, record: RecordedRequest, route: Route, *, send_body: bool) -> None:
        record.status = route.status
        body = route.body or f"{route.status} {HTTPStatus(route.status).phrase}".encode()
        self._send_simple(
            route.status, body, route.headers, send_body=send_body, content_type=route.content_type
        )

    def _send_stream(self, record: RecordedRequest, route: Route, *, send_body: bool) -> None:
        record.status = HTTPStatus.OK
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", route.content_type or "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not send_body:
            return
        self.close_connection = True
        # A small send buffer, so that what was sent is close to what the client read.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        chunk = bytes(64 * 1024)
        try:
            while record.bytes_sent < route.stream_bytes:
                size = min(len(chunk), route.stream_bytes - record.bytes_sent)
                self.wfile.write(b"%x\r\n%s\r\n" % (size, chunk[:size]))
                record.bytes_sent += size
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _send_simple(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str],
        *,
        send_body: bool,
        content_type: str | None = None,
    ):
        self.send_response(status)
        self.send_header("Content-Type", content_type or "text/plain")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def _send_file(
        self,
        record,
        file: Path,
        content_type: str,
        *,
        send_body: bool,
        cut_after,
        stall_s=0.0,
        body_s=0.0,
        trickle=None,
    ):
        size = file.stat().st_size
        start, end = 0, size - 1
        status = HTTPStatus.OK
        range_header = self.headers.get("Range")
        if range_header:
            parsed = _parse_range(range_header, size)
            if parsed is None:
                record.status = HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE
                self._send_simple(
                    HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE,
                    b"",
                    {"Content-Range": f"bytes */{size}"},
                    send_body=send_body,
                )
                return
            start, end = parsed
            status = HTTPStatus.PARTIAL_CONTENT
        record.status = status
        length = max(0, end - start + 1)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if not send_body or length == 0:
            return
        if cut_after is not None:
            self.close_connection = True
        with file.open("rb") as handle:
            handle.seek(start)
            try:
                if trickle is not None:
                    _trickle(handle, self.wfile, length, record, *trickle)
                else:
                    _copy_exactly(handle, self.wfile, min(length, cut_after or length), body_s)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
                return
        if cut_after is not None and stall_s:
            self.server_state._transfer_ended(record)  # silent from here on
            time.sleep(stall_s)


def _content_type(file: Path) -> str:
    suffix = file.suffix.lower()
    return (
        _CONTENT_TYPES.get(suffix)
        or mimetypes.guess_type(file.name)[0]
        or "application/octet-stream"
    )


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """(start, end) inclusive for a single-range `bytes=` header; None when unsatisfiable."""
    match = _RANGE.match(header.strip())
    if not match or not any(match.groups()):
        return None
    first, last = match.groups()
    if first:
        start = int(first)
        end = min(int(last), size - 1) if last else size - 1
    else:  # suffix range: the last N bytes
        start, end = max(0, size - int(last)), size - 1
    if start >= size or start > end:
        return None
    return start, end


def _copy_exactly(source, target, length: int, spread_s: float = 0.0) -> None:
    """Copy `length` bytes; with `spread_s`, in eight pieces over that many seconds."""
    remaining = length
    piece = max(1, -(-length // 8)) if spread_s else 64 * 1024
    while remaining > 0:
        chunk = source.read(min(piece, remaining))
        if not chunk:
            break
        target.write(chunk)
        remaining -= len(chunk)
        if spread_s:
            target.flush()
            time.sleep(spread_s / 8)
    target.flush()


def _trickle(source, target, length: int, record, step: int, every_s: float) -> None:
    """Copy `length` bytes, `step` at a time with `every_s` seconds between them, counting them
    in `record.bytes_sent`."""
    while record.bytes_sent < length:
        chunk = source.read(min(step, length - record.bytes_sent))
        if not chunk:
            break
        target.write(chunk)
        target.flush()
        record.bytes_sent += len(chunk)
        time.sleep(every_s)


def http_server_fixture(*, scope: str = "function"):
    """A pytest fixture that yields a running LocalHTTPServer over a fresh temporary directory.

    Assign it to a name in a test module or conftest.py: `http_server = http_server_fixture()`.
    """
    import pytest

    @pytest.fixture(scope=scope)
    def _fixture(tmp_path_factory):
        root = tmp_path_factory.mktemp("www")
        with LocalHTTPServer(root) as server:
            yield server
        shutil.rmtree(root, ignore_errors=True)

    return _fixture
