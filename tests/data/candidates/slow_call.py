# A slow call (its host side sleeps): an evaluation that holds the device's turn for a while.
import time


def run(x, a, b):
    time.sleep(0.1)
    return a * x + b
