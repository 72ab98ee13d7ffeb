# Forks up to 1,000 processes that wait for it, then says how many it got and fails with the error
# that stopped it (none: the bomb went off and the candidate answers correctly).
import errno
import os

TRIES = 1000


def run(x, a, b):
    r, w = os.pipe()
    children, error = [], None
    for _ in range(TRIES):
        try:
            pid = os.fork()
        except OSError as exc:
            error = exc
            break
        if pid == 0:
            os.close(w)
            os.read(r, 1)  # until the parent closes its end
            os._exit(0)
        children.append(pid)
    os.close(w)
    for pid in children:
        os.waitpid(pid, 0)
    if error is not None:
        raise BlockingIOError(error.errno or errno.EAGAIN, f"forked {len(children)} processes, then: {error.strerror}")
    return a * x + b
