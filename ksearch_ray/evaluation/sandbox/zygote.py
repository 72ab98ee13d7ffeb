"""The zygote: a pre-imported Python that forks one fresh worker per candidate.

Started by `Sandbox` with `python -m ksearch_ray.evaluation.sandbox.zygote FD` and a scrubbed
environment. It imports torch and Triton once (seconds) but never touches CUDA, so each
fork (milliseconds) is safe and gets a process no earlier candidate ran in. Each worker
starts its own session (process group) so the evaluator can kill it and everything it
spawned in one signal, and dies with the zygote (PR_SET_PDEATHSIG).

Control messages (one JSON object per SOCK_SEQPACKET datagram, trusted side only):
  evaluator -> {"cmd": "run"} + the job socket's fd (SCM_RIGHTS)  ;  zygote -> {"pid": N}
  evaluator -> {"cmd": "wait", "pid": N}                          ;  zygote -> {"pid": N, "code": C, "signal": S}
  evaluator -> {"cmd": "ping"}                                    ;  zygote -> {"pong": true}
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import traceback
from typing import Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the evaluator's group kill still applies
        pass


def _reply(ctrl: socket.socket, message: dict[str, Any]) -> None:
    ctrl.send(json.dumps(message).encode())


def _run_child(ctrl: socket.socket, job_fd: int) -> int:
    from ksearch_ray.evaluation.sandbox.channel import Channel
    from ksearch_ray.evaluation.sandbox.worker import serve

    ctrl.close()  # the candidate must not be able to talk to the zygote
    os.setsid()
    _die_with_parent()
    sock = socket.socket(fileno=job_fd)
    key = b""
    while len(key) < 32:
        chunk = sock.recv(32 - len(key))
        if not chunk:
            return 3
        key += chunk
    chan = Channel(sock, key)
    job = chan.recv()
    return serve(chan, job)


def main(ctrl_fd: int) -> None:
    import torch  # noqa: F401  (the whole point: pay for these imports once)
    import triton  # noqa: F401

    import ksearch_ray.evaluation.sandbox.worker  # noqa: F401  (captures the harness's private references pre-candidate)
    import ksearch_ray.taskspec.task  # noqa: F401

    ctrl = socket.socket(fileno=ctrl_fd)
    _reply(ctrl, {"ready": True, "pid": os.getpid()})
    while True:
        data, fds, _, _ = socket.recv_fds(ctrl, 65536, 4)
        if not data:
            return  # the evaluator is gone
        msg = json.loads(data)
        if msg["cmd"] == "run":
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = _run_child(ctrl, fds[0])
                except BaseException:  # noqa: BLE001  (the worker's last words belong in its log)
                    traceback.print_exc()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
            os.close(fds[0])
            _reply(ctrl, {"pid": pid})
        elif msg["cmd"] == "wait":
            _, status = os.waitpid(msg["pid"], 0)
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
            _reply(ctrl, {"pid": msg["pid"], "code": code, "signal": sig})
        elif msg["cmd"] == "ping":
            _reply(ctrl, {"pong": True})
        elif msg["cmd"] == "exit":
            return


if __name__ == "__main__":
    main(int(sys.argv[1]))
