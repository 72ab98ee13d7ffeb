import os


def run(x, a, b):
    os.abort()
