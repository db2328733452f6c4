"""PyTorch twin of bench/gpu_mlp.cc: the same mlp (784 inputs, --hidden widths, 10 classes, ReLU),
softmax cross-entropy (mean), adam(lr=1e-3, optax defaults b1=0.9, b2=0.999, eps=1e-8), batch 128,
float32 with TF32 off. Like ours, every step takes its batch from host memory (pinned, copied
without blocking, as CudaPrefetcher does); --resident keeps the batches on the GPU instead.
--tuned is PyTorch as tuned as its documentation makes it: fused Adam (one kernel for the whole
update) and the whole step (forward, backward, update) captured once as a CUDA graph and replayed,
its batch copied into the graph's static inputs; without it, eager PyTorch with the default
Adam. Prints samples_per_second=<n>.

    python3 bench/torch_mlp.py --steps 2000
    python3 bench/torch_mlp.py --steps 2000 --tuned
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
    parser.add_argument("--tuned", action="store_true")
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
    tuned = {"fused": True, "capturable": True} if args.tuned else {}
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, **tuned)
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
    if args.tuned:
        # PyTorch's whole-network capture: warm up on a side stream, then capture one step
        # with static inputs; the gradients stay allocated between replays.
        static_x = xs[0].to(dev).clone()
        static_y = ys[0].to(dev).clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                loss_fn(model(static_x), static_y).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = loss_fn(model(static_x), static_y)
            static_loss.backward()
            opt.step()

        def step(i):  # noqa: F811 (the tuned step replaces the eager one)
            static_x.copy_(xs[i % 16], non_blocking=True)
            static_y.copy_(ys[i % 16], non_blocking=True)
            graph.replay()
            return static_loss.detach().clone()

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
          f"batch=128 resident={args.resident} tuned={args.tuned}")
    print(f"first_loss={first:.4f} mean_loss_timed={mean:.4f}")
    if not mean < first:
        raise SystemExit("verification failed: the loss did not decrease")
    print(f"samples_per_second={args.steps * 128 / elapsed:.0f}")
    print(f"ms_per_step={1e3 * elapsed / args.steps:.4f}")


if __name__ == "__main__":
    main()
