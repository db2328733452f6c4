"""PyTorch DDP twin of `substrax-job train` on the Fashion-MNIST MLP of bench/train_throughput.sh:
784-512-256-10 with ReLU, softmax cross-entropy (mean), Adam(lr=1e-3, optax's defaults), global
batch 128 split evenly over --procs processes (DistributedDataParallel over the gloo backend on
loopback), one thread per process, batches drawn from the training set in a seeded order. Times
the steps after --warmup and prints `samples_per_second=<global examples per second>` and
`final_loss=<the last step's loss, mean over the processes>`.

    /usr/bin/python3 bench/torch_ddp_mlp.py --procs 2 --steps 300
"""
import argparse
import gzip
import os
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DATA = "/usr/share/datasets/fashion-mnist"


def load_idx(images_path, labels_path):
    with gzip.open(images_path, "rb") as f:
        _, count, rows, cols = struct.unpack(">IIII", f.read(16))
        images = np.frombuffer(f.read(), dtype=np.uint8).reshape(count, rows * cols)
    with gzip.open(labels_path, "rb") as f:
        struct.unpack(">II", f.read(8))
        labels = np.frombuffer(f.read(), dtype=np.uint8)
    return images.astype(np.float32) / 255.0, labels.astype(np.int64)


def worker(rank, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.procs)
    images, labels = load_idx(f"{DATA}/train-images-idx3-ubyte.gz",
                              f"{DATA}/train-labels-idx1-ubyte.gz")
    x_all, y_all = torch.from_numpy(images), torch.from_numpy(labels)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    loss_fn = torch.nn.CrossEntropyLoss()
    per_rank = args.global_batch // args.procs
    order = torch.randperm(x_all.shape[0], generator=torch.Generator().manual_seed(0))
    steps_per_epoch = x_all.shape[0] // args.global_batch
    start = None
    for step in range(args.steps):
        if step == args.warmup:
            dist.barrier()
            start = time.perf_counter()
        s = step % steps_per_epoch
        idx = order[s * args.global_batch + rank * per_rank:s * args.global_batch + (rank + 1) * per_rank]
        opt.zero_grad()
        loss = loss_fn(ddp(x_all[idx]), y_all[idx])
        loss.backward()
        opt.step()
    dist.barrier()
    elapsed = time.perf_counter() - start
    # The last step's loss, averaged over the processes (the bench checks that training worked).
    final = loss.detach().clone()
    dist.all_reduce(final)
    if rank == 0:
        timed = args.steps - args.warmup
        print(f"samples_per_second={timed * args.global_batch / elapsed:.1f}", flush=True)
        print(f"final_loss={final.item() / args.procs:.4f}", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--port", type=int, default=29511)
    args = parser.parse_args()
    if args.global_batch % args.procs:
        raise SystemExit("torch_ddp_mlp: --global-batch must divide by --procs")
    if args.steps <= args.warmup:
        raise SystemExit("torch_ddp_mlp: --steps must exceed --warmup")
    mp.spawn(worker, args=(args, args.port), nprocs=args.procs, join=True)


if __name__ == "__main__":
    main()
