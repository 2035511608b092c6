"""Runs the documentation's examples for tests/test_readme.py, each in a process of its own forked
from this one once it has imported the packages the examples import (torch, JAX, Flax,
transformers and the project's): a child starts in milliseconds where ``python -c`` spends about
3 s on those imports, and begins as ``python -c`` would: its own ``__main__``, the folder it is
given, no JAX backend (this process computes nothing, so none is started and no thread runs).

Started as ``python -c <this file's text>``, so that ``sys.path`` begins with the current folder as
an example's does. One JSON line each way: ``{"code", "cwd", "stdout", "stderr", "timeout"}`` (the
two file paths take the child's output) -> ``{"returncode"}`` (killed by a signal: minus it).
"""

import atexit
import json
import os
import signal
import sys
import traceback
import types

import flax.nnx  # noqa: F401
import jax.numpy  # noqa: F401
import numpy  # noqa: F401
import torch  # noqa: F401
import transformers  # noqa: F401

import jax_attn  # noqa: F401
import numpy_attn  # noqa: F401
import parity_tests  # noqa: F401
import torch_ref  # noqa: F401


def run_example(code: str) -> int:
    """``code`` as ``python -c`` runs it: the exit status it would have."""
    sys.modules["__main__"] = main = types.ModuleType("__main__")
    sys.argv = ["-c"]
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
        status = 0
    except SystemExit as error:  # sys.exit(): 0; sys.exit(n): n; sys.exit(message): printed, 1
        if error.code is None or isinstance(error.code, int):
            status = error.code or 0
        else:
            print(error.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return status


def child(request: dict) -> None:
    """In the forked child: the example's folder, output files and time limit, then the example."""
    os.chdir(request["cwd"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    signal.alarm(request["timeout"])  # SIGALRM ends the child
    os._exit(run_example(request["code"]))


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                child(request)
            finally:  # never back into this loop
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


serve()
