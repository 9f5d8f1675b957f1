"""The sandbox's child process: limits itself, then runs one program (never imported by qitos).

``python -I _sandbox_child.py WORKDIR MEMORY_MB CPU_SECONDS PROGRAM`` sets the resource limits
(address space, CPU time, file size, processes), tries to leave the network (a new, empty network
namespace, when the kernel lets this user make one), installs an audit hook that refuses what a
benchmark's code has no business doing (network, new processes, native code through ctypes, any
write outside WORKDIR) and runs PROGRAM as ``__main__``. Exit status 0: the program ran to the end.
The hook runs for the rest of the process's life: code cannot remove it.
"""

import contextlib
import os
import resource
import sys
from collections.abc import Callable

_NETWORK = frozenset({"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo"})
_PROCESSES = frozenset(
    {
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.exec",
        "os.system",
        "os.startfile",
        "subprocess.Popen",
        "pty.spawn",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
    }
)
_NATIVE = frozenset({"ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof", "ctypes.call_function"})
_PATHS = {  # event -> positions of its path arguments that must stay inside the work directory
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.mkdir": (0,),
    "os.rename": (0, 1),
    "os.replace": (0, 1),
    "os.link": (0, 1),
    "os.symlink": (0, 1),
    "os.truncate": (0,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.utime": (0,),
    "shutil.rmtree": (0,),
    "shutil.move": (0, 1),
    "shutil.copyfile": (1,),
    "shutil.copytree": (1,),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _limit(memory_mb: int, cpu_seconds: int) -> None:
    memory = memory_mb * 1024 * 1024
    for name, soft, hard in (
        ("RLIMIT_AS", memory, memory),
        ("RLIMIT_CPU", cpu_seconds, cpu_seconds + 1),
        ("RLIMIT_FSIZE", 16 * 1024 * 1024, 16 * 1024 * 1024),
        ("RLIMIT_NPROC", 0, 0),  # not enforced for root; the audit hook refuses new processes anyway
        ("RLIMIT_CORE", 0, 0),
    ):
        with contextlib.suppress(ValueError, OSError, AttributeError):
            resource.setrlimit(getattr(resource, name), (soft, hard))


def _leave_network() -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        for flags in (0x40000000, 0x10000000 | 0x40000000):  # CLONE_NEWNET (root), then with CLONE_NEWUSER
            if libc.unshare(flags) == 0:
                return True
    except (OSError, AttributeError):
        pass
    return False


def _inside(path: object, root: str) -> bool:
    if isinstance(path, int):  # a file descriptor already open
        return True
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str):
        return False
    full = os.path.realpath(path)
    return full == root or full.startswith(root + os.sep)


def _guard(root: str) -> Callable[[str, tuple[object, ...]], None]:
    def hook(event: str, args: tuple[object, ...]) -> None:
        if event == "open":
            path, mode, flags = ([*list(args), None, None, None])[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writing and not _inside(path, root):
                raise PermissionError(f"sandbox: writing outside the work directory is not allowed: {path!r}")
        elif event in _NETWORK:
            raise PermissionError(f"sandbox: no network ({event})")
        elif event in _PROCESSES:
            raise PermissionError(f"sandbox: no new processes ({event})")
        elif event in _NATIVE:
            raise PermissionError(f"sandbox: no native code ({event})")
        elif event in _PATHS:
            for position in _PATHS[event]:
                if position < len(args) and not _inside(args[position], root):
                    raise PermissionError(f"sandbox: {event} outside the work directory: {args[position]!r}")

    return hook


def main() -> None:
    root, memory_mb, cpu_seconds, program = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    root = os.path.realpath(root)
    os.chdir(root)
    _leave_network()
    _limit(memory_mb, cpu_seconds)
    with open(program, encoding="utf-8") as handle:
        source = handle.read()
    code = compile(source, program, "exec")
    sys.addaudithook(_guard(root))
    sys.argv = [program]
    exec(code, {"__name__": "__main__", "__file__": program, "__builtins__": __builtins__})


if __name__ == "__main__":
    main()
