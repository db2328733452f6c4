"""PyTorch twin of bench/gpu_mlp.cc: the same mlp (784 inputs, --hidden widths, 10 classes, ReLU),
softmax cross-entropy (mean), adam(lr=1e-3, optax defaults b1=0.9, b2=0.999, eps=1e-8), batch 128,
float32 with TF32 off. Like ours, every step takes its batch from host memory (pinned, copied
without blocking, as CudaPrefetcher does); --resident keeps the batches on the GPU instead.
Prints samples_per_second=<n>.

    python3 bench/torch_mlp.py --steps 2000
    python3 bench/torch_mlp.py --steps 200 --hidden 8192,8192
"""
import argparse
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--hidden", default="512,256")
    parser.add_argument("--resident", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_mlp: no CUDA device visible to PyTorch")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    torch.manual_seed(0)
    widths = [784] + [int(w) for w in args.hidden.split(",")]
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(widths[-1], 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    loss_fn = torch.nn.CrossEntropyLoss()
    xs = [torch.rand(128, 784) for _ in range(16)]
    ys = [(x[:, 0] * 10).floor().long() for x in xs]
    if args.resident:
        xs = [x.to(dev) for x in xs]
        ys = [y.to(dev) for y in ys]
    else:
        xs = [x.pin_memory() for x in xs]
        ys = [y.pin_memory() for y in ys]

    def step(i):
        x = xs[i % 16].to(dev, non_blocking=True)
        y = ys[i % 16].to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    first = step(0).item()
    for i in range(1, 50):
        step(i)
    torch.cuda.synchronize()
    losses = []
    start = time.perf_counter()
    for i in range(args.steps):
        losses.append(step(i))
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    mean = torch.stack(losses).mean().item()
    params = sum(p.numel() for p in model.parameters())
    print(f"device={torch.cuda.get_device_name()} torch={torch.__version__} "
          f"model=mlp {'-'.join(map(str, widths))}-10 params={params} steps={args.steps} "
          f"batch=128 resident={args.resident}")
    print(f"first_loss={first:.4f} mean_loss_timed={mean:.4f}")
    if not mean < first:
        raise SystemExit("verification failed: the loss did not decrease")
    print(f"samples_per_second={args.steps * 128 / elapsed:.0f}")
    print(f"ms_per_step={1e3 * elapsed / args.steps:.4f}")


if __name__ == "__main__":
    main()
