def run(x, a, b):
    while True:
        pass


def custom_kernel(data):  # the same hang in GPUMode's calling convention (TriMul)
    while True:
        pass
