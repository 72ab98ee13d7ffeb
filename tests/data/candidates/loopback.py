# Connects to a service on the host's loopback (the test listens on TARGET's port).
import socket

TARGET = "@TARGET@"


def run(x, a, b):
    try:
        with socket.create_connection(("127.0.0.1", int(TARGET)), timeout=2) as s:
            s.sendall(b"hello from a candidate")
    except OSError:
        pass
    return a * x + b
