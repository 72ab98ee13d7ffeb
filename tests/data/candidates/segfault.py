import ctypes


def run(x, a, b):
    ctypes.memmove(8, b"boom", 4)  # writes near address 0: SIGSEGV
    return a * x + b
