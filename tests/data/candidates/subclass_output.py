import torch


class Sneaky(torch.Tensor):
    pass


def run(x, a, b):
    return (a * x + b).as_subclass(Sneaky)
