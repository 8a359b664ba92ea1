"""The product's commands as forks of one process that has imported them once: for tests that start a command
dozens of times to kill it at chosen moments.

Each start of `python -m training.finetune` or `python -m export.onnx` imports torch and the product (about 1.5 s
of CPU) before it reaches the moment a kill test is after. `ForkServer(modules)` imports `modules` once in a
process of its own; `start(argv)` then forks a child of it that runs `python ARGV` as a fresh interpreter would:
`-m MODULE ARGS` through runpy as `__main__` (or a script path), with the environment, working directory and
standard streams given, as a real process that a real SIGKILL stops. Only the imports are shared, and nothing
computes in the forking process, so no thread pool is forked. The child answers Popen's `pid`, `poll`, `wait`,
`kill`, `send_signal`, `returncode` and `stderr` (a pipe, text, when asked for).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class Child:
    """One forked command: the part of subprocess.Popen's interface the kill tests use."""

    def __init__(self, server: ForkServer, pid: int, stderr):
        self.server, self.pid, self.stderr = server, pid, stderr

    @property
    def returncode(self) -> int | None:
        return self.server.exits.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.server.changed:
            while self.pid not in self.server.exits:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout)
                if self.server.dead:
                    raise RuntimeError(f"the fork server exited; pid {self.pid}'s end is unknown")
                self.server.changed.wait(left if left is not None else 1.0)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """("", everything on stderr) once the child ends; on timeout it is killed and TimeoutExpired raised."""
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.append(self.stderr.read()), daemon=True)
        reader.start()
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait(30)
            raise
        reader.join(30)
        self.stderr.close()
        return "", "".join(chunks)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkServer:
    def __init__(self, modules: list[str], env: dict | None = None, cwd: Path = REPO):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.env = dict(env if env is not None else os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno()), *modules],
            pass_fds=[theirs.fileno()],
            cwd=cwd,
            env=self.env,
        )
        theirs.close()
        self.exits: dict[int, int] = {}
        self.replies: list[dict] = []
        self.changed = threading.Condition()
        self.dead = False
        self.lock = threading.Lock()  # one start at a time
        threading.Thread(target=self._listen, daemon=True).start()
        self._reply(timeout=120)  # {"ready": true} once the modules are imported

    def _listen(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            with self.changed:
                if not data:
                    self.dead = True
                    self.changed.notify_all()
                    return
                message = json.loads(data)
                if "exit" in message:
                    self.exits[message["exit"]] = message["code"]
                else:
                    self.replies.append(message)
                self.changed.notify_all()

    def _reply(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not self.replies:
                if self.dead:
                    raise RuntimeError(f"the fork server exited with {self.proc.wait()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the fork server did not answer")
                self.changed.wait(left)
            return self.replies.pop(0)

    def start(self, argv: list[str], env: dict | None = None, cwd: Path = REPO, stdout=None, stderr=None) -> Child:
        """Fork `python ARGV`. stdout and stderr as Popen takes them: None (this process's), subprocess.DEVNULL,
        subprocess.PIPE (a text pipe on .stderr; stderr only), subprocess.STDOUT (stderr only), a file or an fd."""
        opened: list[int] = []

        def fd_for(target, ours: int) -> int:
            if target is None:
                fd = os.dup(ours)
            elif target == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
            elif isinstance(target, int) and target >= 0:
                fd = os.dup(target)
            else:
                fd = os.dup(target.fileno())
            opened.append(fd)
            return fd

        read_end = None
        try:
            out_fd = fd_for(stdout, 1)
            if stderr == subprocess.PIPE:
                read_end, err_fd = os.pipe()
                opened.append(err_fd)
            elif stderr == subprocess.STDOUT:
                err_fd = out_fd
            else:
                err_fd = fd_for(stderr, 2)
            in_fd = fd_for(subprocess.DEVNULL, 0)
            request = {"argv": list(argv), "env": dict(env if env is not None else self.env), "cwd": str(cwd)}
            with self.lock:
                socket.send_fds(self.sock, [json.dumps(request).encode()], [in_fd, out_fd, err_fd])
                reply = self._reply(timeout=60)
        finally:
            for fd in opened:
                os.close(fd)
        stream = os.fdopen(read_end, "r", encoding="utf-8", errors="replace") if read_end is not None else None
        return Child(self, reply["pid"], stream)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the listening thread; the server sees the end and exits
        except OSError:
            pass
        self.sock.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Lazy:
    """A fork server started on first use: `forks = Lazy(modules, env)` at a test module's top, `forks()` where a
    command starts, and `_close_forks = forks.fixture()` to close it after the module (env: a function giving the
    server's environment)."""

    def __init__(self, modules: list[str], env):
        self.modules, self.env, self.server = modules, env, None

    def __call__(self) -> ForkServer:
        if self.server is None:
            self.server = ForkServer(self.modules, env=self.env())
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def fixture(self):
        import pytest

        @pytest.fixture(scope="module", autouse=True)
        def close_forks():
            yield
            self.close()

        return close_forks


def _run_child(request: dict, fds: list[int]) -> int:
    """In the forked child: become `python ARGV`; its exit code (the interpreter then exits as after a script)."""
    import runpy
    import traceback

    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = request["cwd"]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = str(Path(argv[0]).resolve().parent)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # as the interpreter ends on one: the traceback, then killed by SIGINT
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
        code = 1
    return code


def _serve(fd: int, modules: list[str]) -> int:
    sock = socket.socket(fileno=fd)
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional dependency not installed: the child imports what it needs itself
            continue
        if "." in name and hasattr(sys.modules[name], "main"):  # a command module is run afresh as __main__,
            sys.modules.pop(name)  # as `python -m` does, without runpy's warning
    sock.send(json.dumps({"ready": True}).encode())
    while True:
        ready, _, _ = select.select([sock], [], [], 0.02)
        while True:  # report every child that has ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
        if not ready:
            continue
        data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not data:  # the test process closed its end
            return 0
        pid = os.fork()
        if pid == 0:
            sock.close()
            return _run_child(json.loads(data), fds)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())


def _end_child(code: int) -> None:
    """Exit a child as the interpreter would (non-daemon threads joined, atexit handlers run, streams flushed), but
    without the C++ static destructors of the libraries the fork server imported: they would join threads that live
    only in the fork server, and abort."""
    import atexit

    try:
        threading._shutdown()
    except Exception:
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code & 0xFF if code >= 0 else 1)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    server_pid = os.getpid()
    code = _serve(int(sys.argv[1]), sys.argv[2:])
    if os.getpid() != server_pid:
        _end_child(code)
    sys.exit(code)
