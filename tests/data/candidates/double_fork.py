# A classic daemon: fork, setsid, fork again, the middle process exits (TARGET marks the survivor).
import os

TARGET = "@TARGET@"
_done = []


def run(x, a, b):
    if not _done:
        _done.append(True)
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", TARGET])
            os._exit(0)
        os.waitpid(pid, 0)
    return a * x + b
