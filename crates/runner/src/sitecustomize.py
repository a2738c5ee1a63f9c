# Pathfinder containment monitor, loaded as `sitecustomize` by every Python process of an
# episode (the runner puts its directory first on PYTHONPATH). It enforces nothing: the sandbox
# does (no network namespace route, a read-only root, pids and memory limits). It records
# attempts to leave the sandbox -- connections other than the LLM socket, and writes outside
# the episode's directory and /tmp -- so that the run can report them. An agent that starts Python with -I or -S, or that
# uses ctypes, escapes the record but not the sandbox.
import os as _os
import sys as _sys

_LOG = _os.environ.get("PATHFINDER_AUDIT_LOG")
_ALLOWED_UNIX = _os.environ.get("PATHFINDER_AUDIT_ALLOW_UNIX", "")
_LIMIT = 50
# Where an episode may write (the runner names its directory and /tmp), and devices.
_WRITABLE = tuple(
    p.rstrip("/") + "/"
    for p in _os.environ.get("PATHFINDER_AUDIT_WRITABLE", "/tmp").split(":")
    + ["/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"]
    if p
)
# Never writable, even under a writable prefix: the agent's repository and the task corpus (on
# the local sandbox they may live under the host's /tmp).
_READ_ONLY = tuple(
    p.rstrip("/") + "/" for p in _os.environ.get("PATHFINDER_AUDIT_READ_ONLY", "").split(":") if p
)
_WRITE_FLAGS = _os.O_WRONLY | _os.O_RDWR | _os.O_CREAT | _os.O_TRUNC | _os.O_APPEND
_FS_EVENTS = {
    "os.remove": "remove",
    "os.rmdir": "rmdir",
    "os.mkdir": "mkdir",
    "os.rename": "rename",
    "os.link": "link",
    "os.symlink": "symlink",
    "os.chmod": "chmod",
    "os.chown": "chown",
    "os.truncate": "truncate",
    "shutil.rmtree": "rmtree",
}
# Which arguments of an event name paths it changes: a link's or symlink's target is only read
# (the new link is what is written); a rename changes both ends.
_CHANGED_ARGS = {"os.link": (1,), "os.symlink": (1,), "os.rename": (0, 1)}
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


def _outside(path):
    """Whether a path an event names lies outside what the episode may write."""
    if isinstance(path, int) or path is None:
        return False
    try:
        path = _os.fsdecode(path)
        full = _os.path.abspath(path) + "/"
    except Exception:
        return False
    return full.startswith(_READ_ONLY) or not full.startswith(_WRITABLE)


def _hook(event, args):
    if event == "open":
        path = args[0] if args else None
        mode = args[1] if len(args) > 1 else None
        flags = args[2] if len(args) > 2 else 0
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS
        )
        if writes and _outside(path):
            _record("filesystem", "write to %s" % _text(_os.fsdecode(path)))
        return
    action = _FS_EVENTS.get(event)
    if action is not None:
        for i in _CHANGED_ARGS.get(event, (0,)):
            if len(args) > i and _outside(args[i]):
                _record("filesystem", "%s of %s" % (action, _text(_os.fsdecode(args[i]))))
                break
        return
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


_previous_excepthook = _sys.excepthook


def _excepthook(kind, value, tb):
    # Under the local sandbox the memory limit is an address-space rlimit: allocations fail
    # instead of the kernel killing the process, so the record comes from here.
    if isinstance(kind, type) and issubclass(kind, MemoryError):
        _record("memory", "MemoryError ended the process")
    _previous_excepthook(kind, value, tb)


if _LOG:
    _sys.addaudithook(_hook)
    _sys.excepthook = _excepthook
