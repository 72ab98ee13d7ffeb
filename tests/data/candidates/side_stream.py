import torch

_side = None


def run(x, a, b):
    # Does its (deliberately heavy) work on a side stream that the harness's events, recorded
    # on the current stream, do not cover; the answer itself is right.
    global _side
    if _side is None:
        _side = torch.cuda.Stream()
    _side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_side):
        big = torch.ones(4096, 4096, device=x.device)
        for _ in range(8):
            big = big @ big * 1e-4  # ~0.14 TFLOP each in fp32: milliseconds of hidden GPU work
        y = a * x + b
    return y
