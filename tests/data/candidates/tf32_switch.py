import torch

# A kernel's own numeric choices: TF32 and a looser float32 matmul precision, set at import.
# Its process is its own and references are computed elsewhere: judged by the tolerance alone.
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
torch.set_float32_matmul_precision("high")


def run(x, a, b):
    return a * x + b
