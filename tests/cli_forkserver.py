"""`csekit` commands for the tests, each in a fresh process forked from one that imported csekit once.

A test that runs `python -m csekit.cli ...` spends about 7 s of CPU importing torch and transformers before the
command starts (measured on a 2-core AMD EPYC, AVX2 only): most of such a test's time, and about half of the
suite's. This server (one a pytest worker, started on first use by `conftest.run_csekit`) imports the command line
and the trainer once, then forks a child for each command: the child gets the test's environment, folder,
arguments and output files, runs `csekit.cli.main()` and exits with its status; a signal that ends it (a test's
SIGKILL) is its return code, as with subprocess. The child leads its own process group, as a process started
with `start_new_session=True`; tests that signal a process from outside start a real one (`conftest`).

The server never runs a tensor operation before forking (torch's thread pools start with the first one).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import traceback
from typing import Any


def _child(request: dict[str, Any]) -> None:
    """Run one command as `python -m csekit.cli ARGS` would, then exit with its status (never returns)."""
    code = 1
    try:
        os.setpgid(0, 0)
        os.chdir(request["cwd"])
        sys.path[0] = os.getcwd()  # `python -m` puts the working folder first (the server's is tests/)
        os.environ.clear()
        os.environ.update(request["env"])
        # A fresh interpreter puts PYTHONPATH's entries first (test parts' plugin folders among them).
        entries = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
        sys.path[:0] = [entry for entry in entries if entry not in sys.path]
        importlib.invalidate_caches()
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        sys.argv = ["csekit", *request["argv"]]
        from csekit import cli

        try:
            cli.main()
            code = 0
        except SystemExit as stop:
            if isinstance(stop.code, int) or stop.code is None:
                code = stop.code or 0
            else:  # sys.exit("message"): Python prints it and exits with 1
                print(stop.code, file=sys.stderr)
    except BaseException:  # an uncaught exception: the traceback a fresh interpreter prints, status 1
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()  # what the interpreter runs at exit (loader workers, trackers)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def serve() -> None:
    """Read one JSON request a line (argv, cwd, env, stdout, stderr); answer each with the child's return code."""
    import csekit.cli  # the imports every command pays, paid once
    import csekit.training.trainer  # noqa: F401

    requests, answers = sys.stdin, sys.stdout
    answers.write("ready\n")
    answers.flush()
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
