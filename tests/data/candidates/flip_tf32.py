import torch

torch.backends.cuda.matmul.allow_tf32 = True  # faster matmuls, looser numbers: not allowed silently


def run(x, a, b):
    return a * x + b
