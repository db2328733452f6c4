"""substrax.spmd on four CPU devices of one process, against NumPy references.

Placement, the SPMD reductions (outside and inside nnx.jit), the collectives inside shard_map,
prefetch_to_device, every refusal, and training: spmd_train_step on the 4-device data-parallel
mesh and the collective (nnx.shard_map) step give the parameters of one device with the whole
batch.
"""

from __future__ import annotations

import conftest_spmd

conftest_spmd.require_jax()

import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from spmd_model import (  # noqa: E402
    MLP,
    loss_fn,
    new_model,
    new_optimizer,
    params_of,
    placed_model_and_optimizer,
    training_batches,
)
import substrax  # noqa: E402
from substrax.mesh import DeviceMeshManager  # noqa: E402
from substrax.spmd import (  # noqa: E402
    all_gather,
    collect_from_devices,
    create_data_parallel_sharding,
    place_batch_on_shards,
    place_nnx_state_on_shards,
    prefetch_to_device,
    reduce_custom,
    reduce_gradient_tree,
    reduce_mean,
    reduce_mean_collective,
    reduce_sum,
    reduce_sum_collective,
    spmd_train_step,
)

RNG = np.random.default_rng(35)
DEADLINE_S = 10.0


@pytest.fixture(scope="module")
def mesh() -> jax.sharding.Mesh:
    return DeviceMeshManager.create_data_parallel_mesh()


@pytest.fixture(scope="module")
def sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    return create_data_parallel_sharding(mesh)


def shard_rows(array: jax.Array) -> dict[int, tuple[int, int]]:
    """Device id -> the [start, stop) rows it holds."""
    return {s.device.id: (s.index[0].start or 0, s.index[0].stop) for s in array.addressable_shards}


# --- Placement ------------------------------------------------------------------------------


def test_create_data_parallel_sharding(mesh: jax.sharding.Mesh) -> None:
    sharding = create_data_parallel_sharding(mesh)
    assert sharding.spec == P("data")
    assert sharding.mesh == mesh
    model_mesh = DeviceMeshManager.create_model_parallel_mesh(num_devices=4)
    with pytest.raises(ValueError, match=r"the mesh has no axis 'data'; its axes are \{'model': 4\}"):
        create_data_parallel_sharding(model_mesh)
    assert create_data_parallel_sharding(model_mesh, data_axis="model").spec == P("model")


def test_place_batch_on_shards_splits_rows(sharding: NamedSharding) -> None:
    batch = {"inputs": RNG.normal(size=(8, 3)).astype(np.float32), "targets": np.arange(8),
             "name": "fashion"}
    placed = place_batch_on_shards(batch, sharding)
    assert placed["name"] == "fashion"
    for key in ("inputs", "targets"):
        assert placed[key].shape == batch[key].shape
        assert placed[key].sharding == sharding
        np.testing.assert_array_equal(np.asarray(placed[key]), batch[key])
        assert shard_rows(placed[key]) == {0: (0, 2), 1: (2, 4), 2: (4, 6), 3: (6, 8)}


def test_place_batch_on_shards_on_a_hybrid_mesh_replicates_over_the_model_axis() -> None:
    hybrid = DeviceMeshManager.create_hybrid_mesh(2, 2)
    placed = place_batch_on_shards(np.arange(8.0), create_data_parallel_sharding(hybrid))
    assert shard_rows(placed) == {0: (0, 4), 1: (0, 4), 2: (4, 8), 3: (4, 8)}
    np.testing.assert_array_equal(np.asarray(placed), np.arange(8.0))


def test_place_batch_on_shards_refusals(sharding: NamedSharding) -> None:
    with pytest.raises(ValueError, match=r"batch leaf \['inputs'\] has leading dimension 6, "
                                         r"which does not divide over the 4 shards"):
        place_batch_on_shards({"inputs": np.zeros((6, 2)), "ok": np.zeros(8)}, sharding)
    with pytest.raises(ValueError, match=r"batch leaf \[1\] is 0-d"):
        place_batch_on_shards([np.zeros(4), np.float32(1.0)], sharding)


class SplitMLP(nnx.Module):
    """Its first kernel partitioned over ``axis`` (tensor parallelism's column split)."""

    def __init__(self, rngs: nnx.Rngs, axis: str) -> None:
        init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, axis))
        self.hidden = nnx.Linear(8, 16, kernel_init=init, rngs=rngs)


def test_place_nnx_state_on_shards_replicates_by_default(mesh: jax.sharding.Mesh) -> None:
    state = nnx.state(MLP(nnx.Rngs(0)))
    placed = place_nnx_state_on_shards(state, mesh)
    before = jax.tree.leaves(state)
    after = jax.tree.leaves(placed)
    assert len(after) == len(before) == 4
    for a, b in zip(after, before):
        assert a.sharding == NamedSharding(mesh, P())
        assert len(a.addressable_shards) == 4
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_place_nnx_state_on_shards_splits_where_a_spec_says_so() -> None:
    hybrid = DeviceMeshManager.create_hybrid_mesh(2, 2)
    # flax 0.12 shards an annotated variable when it is created, under a mesh; made without
    # one (eager sharding off), its state is on one device until placed.
    with nnx.use_eager_sharding(False):
        state = nnx.state(SplitMLP(nnx.Rngs(0), axis="model"))
    with jax.set_mesh(hybrid):
        eager = nnx.state(SplitMLP(nnx.Rngs(0), axis="model"))
    for before in (state, eager):
        placed = place_nnx_state_on_shards(before, hybrid)
        kernel = placed["hidden"]["kernel"].get_value()
        assert kernel.sharding == NamedSharding(hybrid, P(None, "model"))
        assert {s.device.id: s.data.shape for s in kernel.addressable_shards} == {
            0: (8, 8), 1: (8, 8), 2: (8, 8), 3: (8, 8)}
        np.testing.assert_array_equal(np.asarray(kernel),
                                      np.asarray(state["hidden"]["kernel"].get_value()))
        assert placed["hidden"]["bias"].get_value().sharding == NamedSharding(hybrid, P())


def test_place_nnx_state_on_shards_refuses_an_axis_the_mesh_lacks(mesh: jax.sharding.Mesh) -> None:
    with nnx.use_eager_sharding(False):
        state = nnx.state(SplitMLP(nnx.Rngs(0), axis="tensor"))
    with pytest.raises(ValueError, match=r"variable \['hidden'\]\['kernel'\] is partitioned as "
                                         r".*the mesh has no axis 'tensor'"):
        place_nnx_state_on_shards(state, mesh)


# --- SPMD reductions ------------------------------------------------------------------------


def stacked_metrics() -> dict[str, np.ndarray]:
    return {"loss": RNG.normal(size=4).astype(np.float32),
            "per_class": RNG.normal(size=(4, 3)).astype(np.float32)}


def test_reduce_mean_and_sum_over_the_device_axis() -> None:
    metrics = stacked_metrics()
    mean = reduce_mean({**metrics, "step": 7})
    total = reduce_sum({**metrics, "global": jnp.float32(2.5)})
    for name, value in metrics.items():
        np.testing.assert_allclose(mean[name], value.mean(axis=0), rtol=1e-6)
        np.testing.assert_allclose(total[name], value.sum(axis=0), rtol=1e-6)
    assert mean["step"] == 7
    assert float(total["global"]) == 2.5


def test_spmd_reductions_inside_jit_on_sharded_arrays(mesh: jax.sharding.Mesh,
                                                     sharding: NamedSharding) -> None:
    metrics = stacked_metrics()
    grads = {"w": RNG.normal(size=(4, 2, 3)).astype(np.float32)}

    @jax.jit
    def reduce(m: dict, g: dict) -> tuple:
        return (reduce_mean(m), reduce_sum(m),
                reduce_custom(m, {"loss": "max", "per_class": "min"}),
                reduce_gradient_tree(g), reduce_gradient_tree(g, reduce_type="sum"))

    with jax.set_mesh(mesh):
        mean, total, custom, g_mean, g_sum = reduce(place_batch_on_shards(metrics, sharding),
                                                     place_batch_on_shards(grads, sharding))
    np.testing.assert_allclose(mean["per_class"], metrics["per_class"].mean(0), rtol=1e-6)
    np.testing.assert_allclose(total["loss"], metrics["loss"].sum(0), rtol=1e-6)
    np.testing.assert_allclose(custom["loss"], metrics["loss"].max(0))
    np.testing.assert_allclose(custom["per_class"], metrics["per_class"].min(0))
    np.testing.assert_allclose(g_mean["w"], grads["w"].mean(0), rtol=1e-6)
    np.testing.assert_allclose(g_sum["w"], grads["w"].sum(0), rtol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "max", "min"])
def test_reduce_custom(reduction: str) -> None:
    metrics = stacked_metrics()
    reduced = reduce_custom(metrics, reduce_fn={"loss": reduction, "per_class": "sum"})
    np.testing.assert_allclose(reduced["loss"], getattr(np, reduction)(metrics["loss"], axis=0),
                               rtol=1e-6)
    np.testing.assert_allclose(reduced["per_class"], metrics["per_class"].sum(0), rtol=1e-6)


def test_reduce_custom_refusals() -> None:
    metrics = {"loss": np.zeros(4), "step": np.zeros(4)}
    with pytest.raises(ValueError, match=r"unknown reduction 'median' for metric 'loss'; use one "
                                         r"of \['max', 'mean', 'min', 'sum'\]"):
        reduce_custom(metrics, {"loss": "median", "step": "max"})
    with pytest.raises(ValueError, match=r"no reduction for metrics \['step'\]"):
        reduce_custom(metrics, {"loss": "mean"})
    with pytest.raises(ValueError, match=r"names metrics \['accuracy'\] that are not"):
        reduce_custom(metrics, {"loss": "mean", "step": "max", "accuracy": "mean"})


def test_reduce_gradient_tree_over_stacked_gradients() -> None:
    grads = {"dense": {"kernel": RNG.normal(size=(4, 3, 2)), "bias": RNG.normal(size=(4, 2))}}
    for reduce_type, ref in (("mean", np.mean), ("sum", np.sum)):
        reduced = reduce_gradient_tree(grads, reduce_type=reduce_type)
        for key in ("kernel", "bias"):
            np.testing.assert_allclose(reduced["dense"][key], ref(grads["dense"][key], axis=0),
                                       rtol=1e-6)


def test_reduce_gradient_tree_refusals() -> None:
    with pytest.raises(ValueError, match=r"unknown reduce_type 'max'; use one of \['mean', 'sum'\]"):
        reduce_gradient_tree({"w": np.zeros((4, 2))}, reduce_type="max")
    with pytest.raises(ValueError, match=r"gradient \['b'\] is 0-d"):
        reduce_gradient_tree({"w": np.zeros((4, 2)), "b": np.float32(0)})


def test_collect_from_devices(sharding: NamedSharding) -> None:
    metrics = stacked_metrics()
    collected = collect_from_devices({**place_batch_on_shards(metrics, sharding), "step": 3})
    assert collected["step"] == 3
    for name, value in metrics.items():
        assert len(collected[name]) == 4
        for device, row in enumerate(collected[name]):
            np.testing.assert_array_equal(np.asarray(row), value[device])


# --- Collectives ----------------------------------------------------------------------------


def test_collectives_inside_shard_map(mesh: jax.sharding.Mesh, sharding: NamedSharding) -> None:
    x = RNG.normal(size=(4, 3)).astype(np.float32)

    # all_gather's result is the same on every device, but JAX types it as varying over the
    # axis (lax.all_gather_invariant is the invariant one), so its out_spec splits it.
    @jax.jit
    @jax.shard_map(mesh=mesh, in_specs=P("data"), out_specs=(P(), P(), P("data")))
    def collect(shard: jax.Array) -> tuple:
        tree = {"a": shard, "b": [2.0 * shard]}
        return (reduce_mean_collective(tree, axis_name="data"),
                reduce_sum_collective(shard, axis_name="data"),
                all_gather({"a": shard}, axis_name="data"))

    mean, total, gathered = collect(place_batch_on_shards(x, sharding))
    np.testing.assert_allclose(mean["a"], x.mean(0, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(mean["b"][0], 2.0 * x.mean(0, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(total, x.sum(0, keepdims=True), rtol=1e-6)
    assert gathered["a"].shape == (4 * 4, 1, 3)  # each device's (4, 1, 3), concatenated
    for device in range(4):
        np.testing.assert_array_equal(gathered["a"][4 * device:4 * (device + 1), 0, :], x)


def test_collectives_inside_pmap() -> None:
    """pmap over plain arrays binds its axis_name as the guide has it ("batch")."""
    x = RNG.normal(size=(4, 2)).astype(np.float32)
    mean, total, gathered = jax.pmap(
        lambda v: (reduce_mean_collective({"a": v}, axis_name="batch"),
                   reduce_sum_collective(v, axis_name="batch"), all_gather(v, axis_name="batch")),
        axis_name="batch")(x)
    for device in range(4):
        np.testing.assert_allclose(mean["a"][device], x.mean(0), rtol=1e-6)
        np.testing.assert_allclose(total[device], x.sum(0), rtol=1e-6)
        np.testing.assert_array_equal(gathered[device], x)


def test_collectives_refuse_an_unbound_axis(mesh: jax.sharding.Mesh,
                                            sharding: NamedSharding) -> None:
    @jax.shard_map(mesh=mesh, in_specs=P("data"), out_specs=P("data"))
    def pmap_style(shard: jax.Array) -> jax.Array:
        return reduce_mean_collective(shard, axis_name="batch")

    with pytest.raises(ValueError, match=r"reduce_mean_collective: axis_name 'batch' is not bound"):
        pmap_style(place_batch_on_shards(np.zeros(4), sharding))
    for collective in (reduce_sum_collective, all_gather):
        with pytest.raises(ValueError, match=r"axis_name 'data' is not bound here"):
            collective(jnp.zeros(4), axis_name="data")


# --- Training -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_device_training() -> tuple[list[float], list[np.ndarray]]:
    """The reference: one device, the whole batch, no mesh."""
    model = new_model()
    optimizer = new_optimizer(model)
    losses = [float(spmd_train_step(model, optimizer, jax.device_put(b), loss_fn))
              for b in training_batches()]
    assert jax.tree.leaves(nnx.state(model))[0].devices() == {jax.devices()[0]}
    return losses, params_of(model)


def assert_same_training(result: tuple[list[float], list[np.ndarray]],
                         reference: tuple[list[float], list[np.ndarray]]) -> None:
    losses, params = result
    ref_losses, ref_params = reference
    assert ref_losses[-1] < ref_losses[0]  # it trains
    np.testing.assert_allclose(losses, ref_losses, atol=1e-6, rtol=0)
    assert max(float(np.max(np.abs(p - r))) for p, r in zip(params, ref_params)) <= 1e-6


def test_spmd_train_step_on_four_devices_equals_one_device(
        mesh: jax.sharding.Mesh, sharding: NamedSharding, one_device_training: tuple) -> None:
    model, optimizer = placed_model_and_optimizer(mesh)

    @nnx.jit
    def train_step(model: MLP, optimizer: nnx.Optimizer, batch: dict) -> jax.Array:
        return spmd_train_step(model, optimizer, batch, loss_fn)

    losses = []
    with jax.set_mesh(mesh):
        for step, batch in enumerate(training_batches()):
            placed = place_batch_on_shards(batch, sharding)
            if step == 1:  # as the guide calls it: inside the caller's nnx.jit
                losses.append(float(train_step(model, optimizer, placed)))
            else:
                losses.append(float(spmd_train_step(model, optimizer, placed, loss_fn)))
    kernel = nnx.state(model, nnx.Param)["hidden"]["kernel"].get_value()
    assert kernel.sharding.is_fully_replicated and len(kernel.devices()) == 4
    assert_same_training((losses, params_of(model)), one_device_training)


def test_collective_step_with_nnx_shard_map_equals_one_device(
        mesh: jax.sharding.Mesh, sharding: NamedSharding, one_device_training: tuple) -> None:
    """The guide's pmap example in its working form: nnx.shard_map, collectives inside."""
    model, optimizer = placed_model_and_optimizer(mesh)

    @nnx.jit
    @nnx.shard_map(mesh=mesh, in_specs=(P(), P(), P("data")), out_specs=P(), check_vma=False)
    def train_step(model: MLP, optimizer: nnx.Optimizer, batch: dict) -> jax.Array:
        loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
        grads = reduce_mean_collective(grads, axis_name="data")
        optimizer.update(model, grads)
        return reduce_mean_collective(loss, axis_name="data")

    losses = [float(train_step(model, optimizer, place_batch_on_shards(b, sharding)))
              for b in training_batches()]
    assert_same_training((losses, params_of(model)), one_device_training)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_of_two_devices_equal_one_device(tmp_path: Path,
                                                       one_device_training: tuple) -> None:
    """spmd_two_processes.py in 2 processes x 2 CPU devices (jax.distributed, Gloo): the meshes
    keep model groups inside a process, each process places its half of every batch, and the
    training ends with the parameters of one device."""
    here = Path(__file__).resolve().parent
    # spmd_model from here; substrax from where this process imported it (installed or src/).
    package_root = Path(substrax.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(here), str(package_root), os.environ.get("PYTHONPATH", "")])}
    for name in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES"):
        env.pop(name, None)
    address = f"127.0.0.1:{free_port()}"
    processes = [subprocess.Popen(
        [sys.executable, str(here / "spmd_two_processes.py"), address, str(i), str(tmp_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = []
    try:
        for p in processes:
            outputs.append(p.communicate(timeout=180)[0])
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, (p, output) in enumerate(zip(processes, outputs)):
        assert p.returncode == 0, f"process {i} exited {p.returncode}:\n{output[-3000:]}"
    ref_losses, ref_params = one_device_training
    for i in range(2):
        result = np.load(tmp_path / f"process-{i}.npz")
        params = [result[f"param{j}"] for j in range(len(ref_params))]
        assert_same_training((list(result["losses"]), params), one_device_training)


# --- prefetch_to_device ---------------------------------------------------------------------


class CountingSource:
    """A pipeline that counts how many batches were taken from it and whether it was closed."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at
        self.taken = 0
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        try:
            for i in range(self.n):
                if i == self.fail_at:
                    raise KeyError(f"record {i} is corrupt")
                self.taken += 1
                yield {"x": np.full((4, 2), i, dtype=np.float32)}
        finally:
            self.closed.set()


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {DEADLINE_S}s waiting until {what}")
        time.sleep(0.005)


def test_prefetch_keeps_order_and_places_batches(sharding: NamedSharding) -> None:
    source = CountingSource(5)
    with prefetch_to_device(source, size=2, sharding=sharding) as batches:
        got = list(batches)
    assert [int(b["x"][0, 0]) for b in got] == [0, 1, 2, 3, 4]
    assert all(b["x"].sharding == sharding for b in got)
    plain = list(prefetch_to_device(iter([{"x": np.ones(3), "tag": "a"}]), size=1))
    assert isinstance(plain[0]["x"], jax.Array) and plain[0]["tag"] == "a"


def test_prefetch_takes_at_most_size_batches_ahead() -> None:
    source = CountingSource(20)
    size = 3
    prefetcher = prefetch_to_device(source, size=size)
    wait_until(lambda: source.taken == size, f"{size} batches are prefetched")
    time.sleep(0.05)  # a negative check: a thread that did not stop would have taken more
    assert source.taken == size
    for consumed in range(1, 6):
        next(prefetcher)
        assert source.taken <= consumed + size
    wait_until(lambda: source.taken == 5 + size, "the thread refills the freed slots")
    prefetcher.close()


def test_prefetch_raises_the_pipelines_error_in_the_consumer() -> None:
    prefetcher = prefetch_to_device(CountingSource(10, fail_at=2), size=2)
    assert int(next(prefetcher)["x"][0, 0]) == 0
    assert int(next(prefetcher)["x"][0, 0]) == 1
    with pytest.raises(KeyError, match="record 2 is corrupt"):
        next(prefetcher)
    assert list(prefetcher) == []
    wait_until(lambda: not prefetcher.running, "the thread ends")


def test_prefetch_raises_a_placement_error_in_the_consumer(sharding: NamedSharding) -> None:
    bad = [{"x": np.zeros((4, 2))}, {"x": np.zeros((6, 2))}]
    prefetcher = prefetch_to_device(bad, size=2, sharding=sharding)
    next(prefetcher)
    with pytest.raises(ValueError, match=r"leading dimension 6"):
        next(prefetcher)


def test_prefetch_close_stops_the_thread_and_closes_the_pipeline() -> None:
    source = CountingSource(1000)
    prefetcher = prefetch_to_device(iter(source), size=2)
    next(prefetcher)
    prefetcher.close()
    assert not prefetcher.running
    assert source.closed.is_set()
    assert source.taken <= 3
    with pytest.raises(StopIteration):
        next(prefetcher)
    prefetcher.close()  # idempotent


def test_an_abandoned_prefetcher_stops_its_thread() -> None:
    prefetcher = prefetch_to_device(CountingSource(1000), size=2)
    next(prefetcher)
    thread = prefetcher._thread  # the thread holds no reference to its prefetcher
    del prefetcher
    wait_until(lambda: not thread.is_alive(), "the abandoned prefetcher's thread ends")


def test_prefetch_refuses_a_size_below_one() -> None:
    with pytest.raises(ValueError, match="size must be >= 1, got 0"):
        prefetch_to_device([], size=0)
