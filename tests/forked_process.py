"""A child process forked from the test process, for tests that signal or kill a child: a real process of its own
(its own pid, signalled and killed for real, setting its own signal dispositions), that skips a fresh interpreter's
~4 s of imports (torch, torchvision, optuna) because the test process has them already."""

import os
import signal
import subprocess
import sys
import tempfile
import time


class ForkedScript:
    """``python script args`` as a child forked from this process: ``runpy`` runs the script as ``__main__`` there,
    with stdout and stderr to one file, one torch thread (as :func:`tests.conftest.child_env` gives a child), and
    SIGINT as a fresh interpreter's (``sigint=signal.default_int_handler``) or as a shell's background job's
    (``signal.SIG_IGN``); SIGTERM is the default. The part of :class:`subprocess.Popen` the tests use: pid, poll, wait,
    communicate (the output as text), send_signal, kill, returncode (``-signum`` for a death by a signal)."""

    def __init__(self, script, *args, sigint=signal.default_int_handler):
        fd, self._out = tempfile.mkstemp(prefix="forked_script_", suffix=".txt")
        self.returncode = None
        sys.stdout.flush(), sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the child: it never returns into pytest
            status = 1
            try:
                os.dup2(fd, 1), os.dup2(fd, 2)
                sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)
                sys.stdin = open(os.devnull)
                signal.signal(signal.SIGINT, sigint)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                if "torch" in sys.modules:
                    sys.modules["torch"].set_num_threads(1)
                sys.argv = [script, *map(str, args)]
                status = _run_script(script)
            finally:
                os._exit(status)
        os.close(fd)

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.time() + timeout
        while self.poll() is None:
            if deadline is not None and time.time() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.02)
        return self.returncode

    def communicate(self, timeout=None):
        self.wait(timeout)
        with open(self._out) as f:
            out = f.read()
        if os.path.exists(self._out):
            os.unlink(self._out)
        return out, None

    def send_signal(self, signum):
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def _run_script(script):
    """The child's ``python script``: its exit status; after an uncaught KeyboardInterrupt it dies by SIGINT, as the
    interpreter does."""
    import runpy
    import traceback

    try:
        runpy.run_path(script, run_name="__main__")
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stdout.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    return status
