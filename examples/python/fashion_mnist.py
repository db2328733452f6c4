"""The distributed-training guide's data-parallel example, as a substrax job.

A flax.nnx MLP (784-512-256-10) learns Fashion-MNIST (Debian's dataset-fashion-mnist, IDX files)
with optax's Adam, data-parallel over every device of every process of the job:

    mesh = DeviceMeshManager.create_data_parallel_mesh()
    sharding = create_data_parallel_sharding(mesh)
    ... place_batch_on_shards(batch, sharding); spmd_train_step(model, optimizer, batch, loss_fn)

as the guide writes it (`--step spmd`, the default: XLA all-reduces the gradients), or on the
collective path (`--step collective`: `nnx.shard_map` over the data axis with the gradients
averaged by `reduce_mean_collective`, the working form of the guide's `pmap` example).

Everything about the job comes from substrax's contract (docs/command-jobs.md), read through the
`substrax` package (docs/python.md): the processes meet through `substrax.distributed.initialize`,
the batch size, epochs or steps, seed and report interval are the spec's, metrics go to the
report file (`substrax.job.report`), checkpoints go to the spec's checkpoint directory and are
listed (`report_checkpoint`), a restarted attempt resumes from the newest one
(`report_resumed`), SIGTERM (a preemption, a cancel) makes it checkpoint the step it is at and
exit 0 (`stop_requested`), and the test accuracy is the job's final metric. Each process reads its own
rows of every global batch, so the same script is right on one process and on many: run it by
hand (`python fashion_mnist.py`), under `python -m substrax.launch -n 2 --devices-per-process 2
-- python fashion_mnist.py`, or as a job (examples/python/fashion_mnist.yaml).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import struct
import time
from typing import Any

import numpy as np

from substrax import distributed, job

DATA = "/usr/share/datasets/fashion-mnist"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DATA, help="directory of the four IDX files (.gz)")
    parser.add_argument("--hidden", default="512,256", help="hidden layer sizes")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--step", choices=("spmd", "collective"), default="spmd")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="save every N steps into the spec's checkpoint directory (0: never)")
    parser.add_argument("--export", metavar="FILE.npz",
                        help="process 0 writes the trained parameters there (param0, param1, ... "
                        "in the model's order)")
    return parser.parse_args()


def load_idx(path: str) -> np.ndarray:
    """An IDX file (gzip): uint8 images (n, 28, 28) or labels (n,)."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, count = struct.unpack(">II", data[:8])
    if magic == 0x803:
        rows, cols = struct.unpack(">II", data[8:16])
        return np.frombuffer(data, np.uint8, offset=16).reshape(count, rows * cols)
    if magic == 0x801:
        return np.frombuffer(data, np.uint8, offset=8)
    raise ValueError(f"{path}: not an IDX image or label file (magic {magic:#x})")


def load_split(data: str, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    images = load_idx(os.path.join(data, f"{prefix}-images-idx3-ubyte.gz"))
    labels = load_idx(os.path.join(data, f"{prefix}-labels-idx1-ubyte.gz"))
    return (images.astype(np.float32) / 255.0), labels.astype(np.int32)


def newest_checkpoint(directory: str | None) -> tuple[int, str] | None:
    """The committed step-N directory of `directory` with the largest N."""
    if not directory or not os.path.isdir(directory):
        return None
    steps = [(int(m.group(1)), os.path.join(directory, name))
             for name in os.listdir(directory)
             if (m := re.fullmatch(r"step-(\d+)", name))
             and os.path.exists(os.path.join(directory, name, "state.npz"))]
    return max(steps) if steps else None


def main() -> None:
    args = parse_args()
    job.install_error_hook()
    me = distributed.initialize()

    import flax.nnx as nnx
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils
    import optax
    from jax.sharding import PartitionSpec as P

    from substrax.mesh import DeviceMeshManager
    from substrax.spmd import (create_data_parallel_sharding, place_batch_on_shards,
                               place_nnx_state_on_shards, reduce_mean_collective, spmd_train_step)

    class MLP(nnx.Module):
        def __init__(self, sizes: list[int], rngs: nnx.Rngs):
            self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes, sizes[1:])])

        def __call__(self, x: jax.Array) -> jax.Array:
            for layer in self.layers[:-1]:
                x = jax.nn.relu(layer(x))
            return self.layers[-1](x)

    def loss_fn(model: MLP, batch: dict[str, jax.Array]) -> jax.Array:
        logits = model(batch["inputs"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

    mesh = DeviceMeshManager.create_data_parallel_mesh()
    sharding = create_data_parallel_sharding(mesh)
    devices, processes = jax.device_count(), jax.process_count()

    sizes = [784] + [int(h) for h in args.hidden.split(",")] + [10]
    model = MLP(sizes, nnx.Rngs(me.seed))
    optimizer = nnx.Optimizer(model, optax.adam(args.learning_rate), wrt=nnx.Param)

    def place(state: Any) -> None:
        """Replicates the model's and optimizer's state on the mesh (every process holds the
        same values: the same seed, or the same checkpoint)."""
        nnx.update(model, place_nnx_state_on_shards(nnx.state(model), mesh))
        nnx.update(optimizer, place_nnx_state_on_shards(nnx.state(optimizer), mesh))

    place(None)

    if args.step == "spmd":
        def train_step(batch: dict[str, jax.Array]) -> jax.Array:
            return spmd_train_step(model, optimizer, batch, loss_fn)
    else:
        # The guide's pmap example in its working form on jax 0.10 / flax 0.12
        # (docs/python-api.md, "The collective path"): the step runs once per device on its rows,
        # and check_vma=False keeps the gradients per-device, as under pmap, so that
        # reduce_mean_collective averages them (with the check on they arrive already summed).
        @nnx.jit
        @nnx.shard_map(mesh=mesh, in_specs=(P(), P(), P("data")), out_specs=P(),
                       check_vma=False)
        def collective_step(model: MLP, optimizer: nnx.Optimizer,
                            batch: dict[str, jax.Array]) -> jax.Array:
            loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
            grads = reduce_mean_collective(grads, axis_name="data")
            optimizer.update(model, grads)
            return reduce_mean_collective(loss, axis_name="data")

        def train_step(batch: dict[str, jax.Array]) -> jax.Array:
            return collective_step(model, optimizer, batch)

    @nnx.jit
    def correct(model: MLP, batch: dict[str, jax.Array]) -> jax.Array:
        return (jnp.argmax(model(batch["inputs"]), -1) == batch["targets"]).sum()

    train_x, train_y = load_split(args.data, "train")
    test_x, test_y = load_split(args.data, "t10k")
    global_batch = me.global_batch_size or (me.per_device_batch_size or 32) * devices
    if global_batch % devices:
        raise ValueError(f"global batch {global_batch} does not divide over {devices} devices")
    rows = global_batch // processes  # this process's rows of each global batch
    first_row = jax.process_index() * rows
    steps_per_epoch = len(train_x) // global_batch
    total_steps = me.steps or (me.epochs or 1) * steps_per_epoch
    report_every = me.report_every_steps or 50
    job.report_total_steps(total_steps)

    # Resume from the newest whole checkpoint, as built-in jobs do.
    step = 0
    found = newest_checkpoint(me.resume_from or me.checkpoint_dir)
    if found is not None:
        step, path = found
        saved = np.load(os.path.join(path, "state.npz"))
        state = nnx.state((model, optimizer))
        leaves, treedef = jax.tree.flatten(state)
        nnx.update((model, optimizer), jax.tree.unflatten(
            treedef, [saved[f"leaf{i}"] for i in range(len(leaves))]))
        place(None)
        if me.is_main:
            job.report_resumed(step, path)
        print(f"resumed from the checkpoint of step {step} ({path})", flush=True)

    job.stop_requested()  # from the main thread: SIGTERM now only sets the flag

    def stop_agreed(step: int) -> bool:
        """Whether to stop after `step`: at every step on one process; on several, at reports,
        where every process agrees (a process that left alone would hang the others)."""
        if processes == 1:
            return job.stop_requested()
        if step % report_every != 0:
            return False
        wanted = np.int32(job.stop_requested())
        return bool(np.max(multihost_utils.process_allgather(wanted)))

    def save(step: int) -> None:
        """Process 0 writes the replicated state; the directory appears whole or not at all."""
        if not me.is_main or not me.checkpoint_dir:
            return
        leaves = jax.tree.leaves(nnx.state((model, optimizer)))
        host = {f"leaf{i}": np.asarray(x.addressable_data(0)) for i, x in enumerate(leaves)}
        final = os.path.join(me.checkpoint_dir, f"step-{step}")
        partial = final + ".partial"
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        np.savez(os.path.join(partial, "state.npz"), **host)
        os.replace(partial, final)
        job.report_checkpoint(step, final,
                              size_bytes=os.path.getsize(os.path.join(final, "state.npz")))

    with jax.set_mesh(mesh):
        started, since = time.perf_counter(), step
        while step < total_steps:
            epoch, offset = divmod(step, steps_per_epoch)
            order = np.random.default_rng(me.seed + epoch).permutation(len(train_x))
            start = offset * global_batch + first_row
            idx = order[start:start + rows]
            batch = place_batch_on_shards({"inputs": train_x[idx], "targets": train_y[idx]},
                                          sharding)
            loss = train_step(batch)
            step += 1
            if step % report_every == 0 or step == total_steps:
                elapsed = time.perf_counter() - started
                job.report(step, {"loss": float(loss)},
                           samples_per_second=(step - since) * rows / elapsed)
                started, since = time.perf_counter(), step
            stop = step < total_steps and stop_agreed(step)
            if stop or (args.checkpoint_every and step % args.checkpoint_every == 0):
                save(step)
            if stop:
                written = "checkpoint written" if me.checkpoint_dir else "no checkpoint directory"
                print(f"stopped at step {step} (SIGTERM): {written}", flush=True)
                return

        eval_batch = 1000  # divides the 10,000 test images and every device count up to 8
        eval_rows = eval_batch // processes
        right = 0.0
        for begin in range(0, len(test_x), eval_batch):
            lo = begin + jax.process_index() * eval_rows
            batch = place_batch_on_shards({"inputs": test_x[lo:lo + eval_rows],
                                           "targets": test_y[lo:lo + eval_rows]}, sharding)
            right += float(correct(model, batch))
    accuracy = right / len(test_x)
    if args.export and me.is_main:
        params = jax.tree.leaves(nnx.state(model, nnx.Param))
        np.savez(args.export, **{f"param{i}": np.asarray(p.addressable_data(0))
                                 for i, p in enumerate(params)})
    job.report_final({"test_accuracy": accuracy})
    print(f"process {me.process_index} of {me.num_processes}: trained {total_steps} steps on "
          f"{devices} devices, test_accuracy={accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
