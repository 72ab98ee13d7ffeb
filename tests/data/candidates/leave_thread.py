import threading
import time


def _busy():
    time.sleep(30)


def run(x, a, b):
    threading.Thread(target=_busy, name="hidden-worker", daemon=True).start()
    return a * x + b
