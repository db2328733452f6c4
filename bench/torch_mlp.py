"""PyTorch twin of bench/gpu_mlp.cc: the same mlp (784-512-256-10, ReLU), softmax cross-entropy
(mean), adam(lr=1e-3, optax defaults b1=0.9, b2=0.999, eps=1e-8), batch 128, float32 with TF32
off, batches resident on the GPU. Prints samples_per_second=<n>.

    python3 bench/torch_mlp.py --steps 1000
"""
import argparse
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    loss_fn = torch.nn.CrossEntropyLoss()
    xs = [torch.rand(128, 784, device=dev) for _ in range(16)]
    ys = [(x[:, 0] * 10).floor().long() for x in xs]

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xs[i % 16]), ys[i % 16])
        loss.backward()
        opt.step()
        return loss

    first = step(0).item()
    for i in range(1, 50):
        step(i)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(args.steps):
        loss = step(i)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    last = loss.item()
    print(f"device={torch.cuda.get_device_name()} steps={args.steps} batch=128")
    print(f"first_loss={first:.4f} last_loss={last:.4f}")
    if not last < first:
        raise SystemExit("verification failed: the loss did not decrease")
    print(f"samples_per_second={args.steps * 128 / elapsed:.0f}")
    print(f"ms_per_step={1e3 * elapsed / args.steps:.4f}")


if __name__ == "__main__":
    main()
