"""Safety defaults of the server (DESIGN §7): bind rule, token, Origin check, safe paths, uploads.

* The server binds 127.0.0.1 by default; any other address needs a token (`--token`), unless
  `--insecure` is given explicitly (`check_bind`).
* With a token, every request carries it: `Authorization: Bearer T`, `?token=T`, or the cookie
  set when a browser first opens a page with `?token=T` (so the editor's own requests pass).
* A state-changing request (POST/PUT/PATCH/DELETE) or a WebSocket upgrade whose `Origin` is not
  the server itself is refused with 403: a web page on another site must not queue prompts on a
  local server. On a loopback bind without a token the `Host` header must be a loopback name too,
  which stops DNS rebinding (a hostile name resolving to 127.0.0.1 makes Origin and Host agree;
  behind a reverse proxy that passes its own Host, use a token).
* `--enable-cors-header ORIGIN` (ComfyUI's flag) names one foreign origin that is trusted: its
  requests get CORS headers (preflight `OPTIONS` answered without a token, as browsers send none)
  and may change state; every other foreign origin is still refused. `*` (trust every origin)
  would switch the Origin rule off, so it is refused unless a token guards the server or
  `--insecure` is given (`check_cors`); then CORS headers go to every origin.
* Files named by clients resolve inside their folder: no absolute paths, no `..`, no symlink that
  leads out (`safe_path`).
* A name no file can have (NUL, a lone surrogate, a component over 255 bytes, a path over
  1,024 characters) is a `BadFileName`, answered 400 rather than failing in the OS call; an
  upload's own name must also be printable and more than dots and spaces (`check_upload_name`).
* Uploads are read with a size limit and must decode as images of sane size (`check_image`).
* Request bodies are JSON parsed by `graph.safe_json` (`read_json`, in `ui.server.limits` with
  the size and arrival-time limits): depth and number limits.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import ipaddress
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from mixgraph.ui.server.limits import read_json  # noqa: F401 - the routes' one JSON body reader

__all__ = ["SecurityError", "BadFileName", "is_loopback", "bind_is_loopback", "check_bind",
           "check_cors", "security_middleware",
           "safe_path", "check_upload_name", "read_json", "read_limited", "check_image",
           "unique_name", "TOKEN_COOKIE", "MAX_IMAGE_SIDE"]

TOKEN_COOKIE = "mixgraph_token"
MAX_IMAGE_SIDE = 16384          # ComfyUI's MAX_RESOLUTION
NAME_MAX = 255                  # bytes in one path component (Linux and macOS file systems)
REL_PATH_MAX = 1024             # characters in a relative path a client may name
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class SecurityError(ValueError):
    """A configuration or request the safety rules refuse; the message says what to do."""


class BadFileName(SecurityError):
    """A file name that is malformed rather than an attempt to leave a folder (HTTP 400, not
    403): NUL or control characters, undecodable, too long, nothing but dots."""


def is_loopback(host: str | None) -> bool:
    """True for localhost names and loopback addresses (127.0.0.0/8, ::1)."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_is_loopback(host: str) -> bool:
    """True when every address of a bind (`host` may list several, comma-separated) is loopback."""
    hosts = [h.strip() for h in host.split(",") if h.strip()]
    return bool(hosts) and all(is_loopback(h) for h in hosts)


def check_bind(host: str, token: str | None, insecure: bool) -> None:
    """Refuse to listen beyond this machine without a token, unless explicitly insecure."""
    if bind_is_loopback(host) or token or insecure:
        return
    raise SecurityError(
        f"refusing to listen on {host!r} without a token: anyone who can reach this address could "
        f"run workflows and read your files. Pass --token SECRET (clients send 'Authorization: "
        f"Bearer SECRET' or '?token=SECRET'), or --insecure if you really mean it.")


def check_cors(origin: str | None, token: str | None, insecure: bool) -> None:
    """Refuse a CORS origin that cannot be used safely: `*` without a token or --insecure, or
    something that is not an http(s) origin."""
    if origin is None:
        return
    if origin == "*":
        if token or insecure:
            return
        raise SecurityError(
            "refusing --enable-cors-header without an origin ('*'): any web page could then queue "
            "prompts on this server. Name the origin (--enable-cors-header https://app.example), "
            "or add --token SECRET, or --insecure if you really mean it.")
    if _origin_key(origin) is None:
        raise SecurityError(f"--enable-cors-header {origin!r}: expected an origin such as "
                            f"https://app.example or http://localhost:3000, or no value for '*'")


def _origin_key(origin: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) origin, default ports filled in; None otherwise."""
    o = urlsplit(origin.strip())
    if o.scheme not in ("http", "https") or not o.hostname or o.path not in ("", "/"):
        return None
    try:
        return o.scheme, o.hostname.lower(), o.port or (443 if o.scheme == "https" else 80)
    except ValueError:
        return None


def cors_allows(origin: str, cors_origin: str | None) -> bool:
    """Does `--enable-cors-header` trust the request's `Origin`?"""
    if cors_origin is None:
        return False
    if cors_origin == "*":
        return True
    key = _origin_key(origin)
    return key is not None and key == _origin_key(cors_origin)


def _cors_headers(origin: str, cors_origin: str) -> dict[str, str]:
    headers = {"Access-Control-Allow-Origin": "*" if cors_origin == "*" else origin,
               "Access-Control-Allow-Methods": "POST, GET, DELETE, PUT, OPTIONS, PATCH",
               "Access-Control-Allow-Headers": "Content-Type, Authorization, comfy-user",
               "Vary": "Origin"}
    if cors_origin != "*":
        headers["Access-Control-Allow-Credentials"] = "true"
    return headers


def _split_host(value: str, default_port: int | None) -> tuple[str, int | None]:
    """'host:port' / '[::1]:port' / 'host' -> (host, port)."""
    parts = urlsplit(f"//{value}")
    try:
        port = parts.port
    except ValueError:
        port = None
    return (parts.hostname or "").lower(), port if port is not None else default_port


def origin_allowed(origin: str, host_header: str) -> bool:
    """Is a browser `Origin` this server itself (same host:port, or both loopback, same port)?"""
    o = urlsplit(origin)
    if o.scheme not in ("http", "https") or not o.hostname:
        return False                      # "null", file://, extensions...
    default = 443 if o.scheme == "https" else 80
    try:
        o_port = o.port or default
    except ValueError:
        return False
    o_host = o.hostname.lower()
    h_host, h_port = _split_host(host_header, default)
    if o_port != h_port:
        return False
    return o_host == h_host or (is_loopback(o_host) and is_loopback(h_host))


def _token_ok(request: web.Request, token: str) -> bool:
    given = None
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        given = auth[7:].strip()
    given = given or request.query.get("token") or request.cookies.get(TOKEN_COOKIE)
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def security_middleware(*, token: str | None, loopback_only: bool, cors_origin: str | None = None):
    """aiohttp middleware enforcing the token, the Origin rule and (on loopback) the Host rule;
    with `cors_origin` (--enable-cors-header) that origin is trusted and gets CORS headers."""

    @web.middleware
    async def middleware(request: web.Request, handler):
        host_header = request.headers.get("Host", "")
        if loopback_only and not is_loopback(_split_host(host_header, None)[0]):
            raise web.HTTPForbidden(text="forbidden: this server only answers to localhost "
                                         "(the Host header names another host)")
        origin = request.headers.get("Origin")
        trusted = origin is not None and cors_allows(origin, cors_origin)
        if trusted and request.method == "OPTIONS":   # CORS preflight: browsers send no token
            return web.Response(headers=_cors_headers(origin, cors_origin))
        try:
            response = await _checked(request, handler, host_header, origin, trusted)
        except web.HTTPException as e:
            if trusted:       # let the trusted page read the error too
                e.headers.update(_cors_headers(origin, cors_origin))
            raise
        if trusted and not response.prepared:   # a finished WebSocket needs none
            response.headers.update(_cors_headers(origin, cors_origin))
        return response

    async def _checked(request: web.Request, handler, host_header: str, origin: str | None,
                       trusted: bool):
        if token is not None and not _token_ok(request, token):
            raise web.HTTPUnauthorized(
                text="unauthorized: send the server token as 'Authorization: Bearer TOKEN' "
                     "or '?token=TOKEN'", headers={"WWW-Authenticate": "Bearer"})
        is_ws = request.headers.get("Upgrade", "").lower() == "websocket"
        if origin is not None and (request.method in STATE_CHANGING or is_ws):
            if not (trusted or origin_allowed(origin, host_header)):
                raise web.HTTPForbidden(text=f"forbidden: requests from origin {origin!r} may not "
                                             f"change this server's state")
        response = await handler(request)
        if token is not None and request.query.get("token") and not is_ws:
            # A browser opened a page with ?token=: let its follow-up requests through.
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict", path="/")
        return response

    return middleware


def safe_path(root: Path, filename: str, subfolder: str = "") -> Path:
    """root/subfolder/filename, or SecurityError if that would leave `root` (absolute paths,
    `..`, drive letters, symlinks pointing out), BadFileName if no file can have that name (NUL,
    lone surrogates, a component over NAME_MAX bytes, REL_PATH_MAX characters in all)."""
    rel_parts: list[str] = []
    for piece in (subfolder or "", filename or ""):
        text = piece.replace("\\", "/")
        if "\x00" in text:
            raise BadFileName(f"path {piece!r} contains a NUL character")
        if text.startswith("/") or (len(text) > 1 and text[1] == ":"):
            raise SecurityError(f"path {piece!r} is not a plain relative path")
        for part in text.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise SecurityError(f"path {piece!r} may not contain '..'")
            try:
                size = len(part.encode("utf-8"))
            except UnicodeEncodeError:
                raise BadFileName(f"path {piece!r} is not valid Unicode text") from None
            if size > NAME_MAX:
                raise BadFileName(f"name {part[:40]!r}... is {size} bytes long; at most "
                                  f"{NAME_MAX} are allowed")
            rel_parts.append(part)
    if not rel_parts:
        raise BadFileName("no file name given")
    if sum(len(p) + 1 for p in rel_parts) > REL_PATH_MAX:
        raise BadFileName(f"path of {len(rel_parts)} parts is longer than {REL_PATH_MAX} "
                          f"characters")
    path = Path(root).joinpath(*rel_parts)
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
        raise SecurityError(f"path {'/'.join(rel_parts)!r} resolves outside its folder")
    return path


def check_upload_name(name: str) -> None:
    """An uploaded file's own name: one path component, printable, not only dots and spaces
    (`...` or ` ` would be a valid name on Linux but a trap everywhere else). Raises
    BadFileName; the containment checks are `safe_path`'s."""
    if not name or not name.strip(" ."):
        raise BadFileName(f"upload file name {name!r} has no name part; send a name such as "
                          f"'image.png'")
    if not name.isprintable():
        raise BadFileName(f"upload file name {name!r} contains control characters")


async def read_limited(part, limit: int) -> bytes:
    """Read a multipart part (or any object with `read_chunk`) refusing more than `limit` bytes."""
    buf = bytearray()
    while True:
        chunk = await part.read_chunk(1 << 16)
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(buf))


def check_image(data: bytes) -> tuple[str, tuple[int, int]]:
    """(PIL format, (width, height)) of an image file's bytes; SecurityError if it does not decode
    as an image, is absurdly large, or would take more than the memory budget to decode (judged
    from its header: `memory_guards`, which takes the place of PIL's decompression-bomb limit)."""
    from PIL import Image

    from mixgraph.nodes.media import memory_guards
    try:
        with memory_guards.bomb_limit_lifted(), Image.open(io.BytesIO(data)) as im:
            fmt, size = im.format, im.size
            im.verify()
    except Exception as e:  # noqa: BLE001 - PIL raises many types for undecodable data
        raise SecurityError(f"not a readable image ({type(e).__name__}: {e})") from None
    if max(size) > MAX_IMAGE_SIDE or min(size) < 1:
        raise SecurityError(f"image of {size[0]}x{size[1]} px refused (sides must be 1..{MAX_IMAGE_SIDE})")
    problem = memory_guards.image_problem(data, "image refused")
    if problem:
        raise SecurityError(problem)
    return fmt or "", size


def unique_name(folder: Path, name: str, data: bytes, overwrite: bool = False) -> tuple[str, bool]:
    """(file name to use, whether to write it). A taken name with different contents becomes
    'name (1).ext', 'name (2).ext', ...; a byte-identical file is reused, not written again."""
    if overwrite or not (folder / name).exists():
        return name, True
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    digest = hashlib.sha256(data).digest()
    candidate, i = name, 0
    while (folder / candidate).exists():
        existing = folder / candidate
        if existing.is_file() and existing.stat().st_size == len(data) and \
                hashlib.sha256(existing.read_bytes()).digest() == digest:
            return candidate, False
        i += 1
        candidate = f"{stem} ({i}).{ext}" if dot else f"{stem} ({i})"
    return candidate, True
