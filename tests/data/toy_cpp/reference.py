import torch


def generate_inputs(workload, seed, device, options=frozenset()):
    g = torch.Generator(device=device).manual_seed(seed)
    n = workload.axes["N"]
    x = torch.randn(n, generator=g, device=device)
    a = torch.randn(n, generator=g, device=device)
    b = float(torch.randn(1, generator=g, device=device).item())
    return {"x": x, "a": a, "b": b}


def reference(inputs):
    return inputs["a"] * inputs["x"] + inputs["b"]
