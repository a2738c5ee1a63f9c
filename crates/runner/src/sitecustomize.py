# Pathfinder containment monitor, loaded as `sitecustomize` by every Python process of an
# episode (the runner puts its directory first on PYTHONPATH). It enforces nothing: the sandbox
# does (no network namespace route, pids and memory limits). It records attempts to leave the
# sandbox so that the run can report them. An agent that starts Python with -I or -S, or that
# uses ctypes, escapes the record but not the sandbox.
import os as _os
import sys as _sys

_LOG = _os.environ.get("PATHFINDER_AUDIT_LOG")
_ALLOWED_UNIX = _os.environ.get("PATHFINDER_AUDIT_ALLOW_UNIX", "")
_LIMIT = 50
_state = {"written": 0, "busy": False}


def _text(value):
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = repr(value) if not isinstance(value, str) else value
    return text[:200]


def _record(kind, detail):
    if not _LOG or _state["written"] >= _LIMIT or _state["busy"]:
        return
    _state["busy"] = True
    try:
        _state["written"] += 1
        detail = detail.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
        line = '{"kind": "%s", "pid": %d, "detail": "%s"}\n' % (kind, _os.getpid(), detail)
        fd = _os.open(_LOG, _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT, 0o644)
        try:
            _os.write(fd, line.encode("utf-8", "replace"))
        finally:
            _os.close(fd)
    except Exception:
        pass
    finally:
        _state["busy"] = False


def _hook(event, args):
    if event == "socket.connect" or event == "socket.sendto":
        address = args[1] if len(args) > 1 else None
        if isinstance(address, (str, bytes)):
            path = _text(address)
            if path != _ALLOWED_UNIX:
                _record("network", "%s to unix socket %s" % (event, path))
        else:
            _record("network", "%s to %s" % (event, _text(address)))
    elif event == "socket.getaddrinfo":
        host = args[0] if args else None
        if host not in (None, "", "localhost", b"localhost"):
            _record("network", "name lookup of %s" % _text(host))


if _LOG:
    _sys.addaudithook(_hook)
