"""The guide's data-parallel, metrics and collective functions over JAX and flax.nnx.

Three groups, as in the guide (docs/python-api.md maps each name and says where current JAX makes
this module differ from the guide):

- Placement: ``create_data_parallel_sharding``, ``place_batch_on_shards`` (this process's part of
  the global batch, so one script is right on one process and on many),
  ``place_nnx_state_on_shards``, and ``prefetch_to_device`` (a background thread that places the
  next ``size`` batches while the devices compute).
- SPMD reductions on global arrays, valid inside and outside ``nnx.jit``, with no axis name:
  ``reduce_mean``, ``reduce_sum``, ``reduce_custom``, ``reduce_gradient_tree`` reduce over the
  leading (stacked per-device) axis; under ``jax.set_mesh`` with that axis sharded, XLA turns the
  reduction into an all-reduce. ``collect_from_devices`` splits that axis into lists.
  ``spmd_train_step`` is the guide's training-step body, compiled.
- Collectives, only inside ``nnx.shard_map`` / ``jax.shard_map`` (or ``pmap``) over a named axis:
  ``reduce_mean_collective``, ``reduce_sum_collective``, ``all_gather``.

Bad input (an axis the mesh lacks or that is not bound, a batch that does not divide over the
data axis, an unknown reduction) raises ``ValueError`` naming it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from substrax._prefetch import DevicePrefetcher
from substrax.mesh import DATA_AXIS

PyTree = Any

# The reductions reduce_custom and reduce_gradient_tree accept, by name.
REDUCTIONS: Mapping[str, Callable[..., jax.Array]] = {
    "mean": jnp.mean,
    "sum": jnp.sum,
    "max": jnp.max,
    "min": jnp.min,
}
GRADIENT_REDUCTIONS = ("mean", "sum")


# --- Placement ------------------------------------------------------------------------------


def create_data_parallel_sharding(mesh: Mesh, data_axis: str = DATA_AXIS) -> NamedSharding:
    """The sharding that splits an array's leading dimension over ``data_axis`` of ``mesh``.

    ``NamedSharding(mesh, PartitionSpec(data_axis))``: on a hybrid mesh the batch is split over
    the data axis and replicated over the model axis.

    Raises:
        ValueError: ``mesh`` has no axis ``data_axis``.
    """
    _require_mesh_axes(mesh, (data_axis,), "create_data_parallel_sharding")
    return NamedSharding(mesh, PartitionSpec(data_axis))


def place_batch_on_shards(batch: PyTree, sharding: Sharding) -> PyTree:
    """This process's part of the global batch, as global arrays on ``sharding``.

    Every array leaf (NumPy or ``jax.Array``) is this process's rows of the global batch, as
    ``jax.make_array_from_process_local_data`` takes them: one process passes the whole batch, N
    processes each pass 1/N of it (the rows that process's devices hold), and the result is the
    same global array. Other leaves (strings, Python numbers) are returned unchanged.

    Raises:
        ValueError: a leaf's leading dimension does not divide over the shards of the data axis
            this process holds, or a leaf to be split has no leading dimension; the message
            names the leaf.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(batch)
    positions = [i for i, (_, leaf) in enumerate(leaves) if _is_array(leaf)]
    for i in positions:
        path, leaf = leaves[i]
        _check_splits(jax.tree_util.keystr(path), np.shape(leaf), sharding)
    placed = jax.make_array_from_process_local_data(sharding, [leaves[i][1] for i in positions])
    values = [leaf for _, leaf in leaves]
    for i, array in zip(positions, placed):
        values[i] = array
    return jax.tree_util.tree_unflatten(treedef, values)


def place_nnx_state_on_shards(state: nnx.State, mesh: Mesh) -> nnx.State:
    """``state`` (e.g. ``nnx.state(model)``) placed on ``mesh``: replicated by default.

    A variable created with a sharding (``nnx.with_partitioning``, the ``out_sharding``
    metadata) is split as its ``PartitionSpec`` says; every other one is replicated on all the
    mesh's devices. Apply the result with ``nnx.update(model, placed)``. Every process passes the
    same values (as after initialising from the same seed).

    Raises:
        ValueError: a variable's spec names an axis ``mesh`` lacks; the message names the
            variable.
    """

    def place(path: tuple[Any, ...], leaf: Any) -> Any:
        name = jax.tree_util.keystr(path)
        if isinstance(leaf, nnx.Variable):
            spec = nnx.get_partition_spec(leaf).get_value()
            return leaf.replace(_place_replicated_or_split(name, leaf.get_value(), mesh, spec))
        if _is_array(leaf):
            return _place_replicated_or_split(name, leaf, mesh, PartitionSpec())
        return leaf

    return jax.tree_util.tree_map_with_path(
        place, state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )


# --- SPMD reductions (global arrays, no axis name) ------------------------------------------------


def reduce_mean(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Each metric's mean over its leading (per-device) axis; 0-d values are already global."""
    return {name: _reduce_leading(value, jnp.mean) for name, value in metrics.items()}


def reduce_sum(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Each metric's sum over its leading (per-device) axis; 0-d values are already global."""
    return {name: _reduce_leading(value, jnp.sum) for name, value in metrics.items()}


def reduce_custom(metrics: Mapping[str, Any], reduce_fn: Mapping[str, str]) -> dict[str, Any]:
    """Each metric reduced over its leading axis by the reduction ``reduce_fn`` names for it.

    ``reduce_fn`` maps every metric to one of ``"mean"``, ``"sum"``, ``"max"``, ``"min"``, e.g.
    ``{"loss": "mean", "step": "max"}``.

    Raises:
        ValueError: a metric has no reduction, a reduction names a metric that is not there, or
            a reduction name does not exist.
    """
    missing = sorted(set(metrics) - set(reduce_fn))
    if missing:
        raise ValueError(f"reduce_custom: no reduction for metrics {missing}; add them to reduce_fn")
    extra = sorted(set(reduce_fn) - set(metrics))
    if extra:
        raise ValueError(
            f"reduce_custom: reduce_fn names metrics {extra} that are not among the metrics "
            f"{sorted(metrics)}"
        )
    for name, reduction in reduce_fn.items():
        if reduction not in REDUCTIONS:
            raise ValueError(
                f"reduce_custom: unknown reduction {reduction!r} for metric {name!r}; use one "
                f"of {sorted(REDUCTIONS)}"
            )
    return {
        name: _reduce_leading(value, REDUCTIONS[reduce_fn[name]]) for name, value in metrics.items()
    }


def reduce_gradient_tree(gradients: PyTree, reduce_type: str = "mean") -> PyTree:
    """Per-device gradients, stacked on a leading axis, reduced over it (mean or sum).

    Each leaf is ``(devices, *parameter_shape)``, e.g. one gradient per data shard from
    ``jax.vmap``; under ``nnx.jit`` with that axis sharded over the mesh's data axis the
    reduction is an all-reduce. A gradient of the global loss (``nnx.value_and_grad`` in
    ``spmd_train_step``) is already reduced and needs no call.

    Raises:
        ValueError: ``reduce_type`` is not ``"mean"`` or ``"sum"``, or a leaf has no leading
            axis (the message names it).
    """
    if reduce_type not in GRADIENT_REDUCTIONS:
        raise ValueError(
            f"reduce_gradient_tree: unknown reduce_type {reduce_type!r}; use one of "
            f"{list(GRADIENT_REDUCTIONS)}"
        )
    op = REDUCTIONS[reduce_type]

    def reduce(path: tuple[Any, ...], leaf: Any) -> Any:
        if np.ndim(leaf) == 0:
            raise ValueError(
                f"reduce_gradient_tree: gradient {jax.tree_util.keystr(path)} is 0-d, with no "
                "leading per-device axis to reduce; stack one gradient per device on axis 0"
            )
        return op(leaf, axis=0)

    return jax.tree_util.tree_map_with_path(reduce, gradients)


def collect_from_devices(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Stacked per-device metrics split into per-device lists (0-d values unchanged).

    A global array that other processes hold parts of is gathered to every process first, so
    each process gets every device's values.
    """
    result: dict[str, Any] = {}
    for name, value in metrics.items():
        if isinstance(value, jax.Array) and not value.is_fully_addressable:
            value = multihost_utils.process_allgather(value, tiled=True)
        result[name] = list(value) if np.ndim(value) > 0 else value
    return result


LossFn = Callable[[nnx.Module, PyTree], jax.Array]


def spmd_train_step(
    model: nnx.Module, optimizer: nnx.Optimizer, batch: PyTree, loss_fn: LossFn
) -> jax.Array:
    """One training step: ``nnx.value_and_grad(loss_fn)(model, batch)``, then
    ``optimizer.update(model, grads)``; returns the loss. Updates ``model`` and ``optimizer``.

    Compiled (``nnx.jit``, ``loss_fn`` static: define it once, not per step); it may also be
    called inside the caller's own ``nnx.jit``. Under ``jax.set_mesh(mesh)`` with the batch from
    ``place_batch_on_shards`` and the state replicated, XLA all-reduces the gradients.
    """
    return _train_step(model, optimizer, batch, loss_fn=loss_fn)


@nnx.jit(static_argnames="loss_fn")
def _train_step(
    model: nnx.Module, optimizer: nnx.Optimizer, batch: PyTree, loss_fn: LossFn
) -> jax.Array:
    loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
    optimizer.update(model, grads)
    return loss


# --- Collectives (inside shard_map / pmap) ------------------------------------------------------


def reduce_mean_collective(x: PyTree, axis_name: Hashable = DATA_AXIS) -> PyTree:
    """Every leaf of ``x`` averaged over the devices of the mapped axis ``axis_name``
    (``lax.pmean``). Only inside ``nnx.shard_map``/``jax.shard_map``/``pmap`` binding it.

    Raises:
        ValueError: ``axis_name`` is not bound here.
    """
    _require_bound_axis(axis_name, "reduce_mean_collective")
    return jax.tree.map(lambda v: lax.pmean(v, axis_name), x)


def reduce_sum_collective(x: PyTree, axis_name: Hashable = DATA_AXIS) -> PyTree:
    """Every leaf of ``x`` summed over the mapped axis ``axis_name`` (``lax.psum``).

    Raises:
        ValueError: ``axis_name`` is not bound here.
    """
    _require_bound_axis(axis_name, "reduce_sum_collective")
    return jax.tree.map(lambda v: lax.psum(v, axis_name), x)


def all_gather(x: PyTree, axis_name: Hashable = DATA_AXIS) -> PyTree:
    """Every leaf of ``x`` from each device of ``axis_name``, stacked on a new leading axis.

    Raises:
        ValueError: ``axis_name`` is not bound here.
    """
    _require_bound_axis(axis_name, "all_gather")
    return jax.tree.map(lambda v: lax.all_gather(v, axis_name), x)


# --- Prefetching --------------------------------------------------------------------------------


def prefetch_to_device(
    pipeline: Iterable[PyTree], size: int = 2, sharding: Sharding | None = None
) -> DevicePrefetcher[PyTree]:
    """Iterate ``pipeline`` with the next ``size`` batches already on the devices.

    A background thread takes batches from ``pipeline`` and places them (with ``sharding``:
    ``place_batch_on_shards``; without: ``jax.device_put`` on the default device), at most
    ``size`` ahead of the consumer. An exception in ``pipeline`` or in the placement is raised
    in the consumer where that batch would have come. ``close()`` (or leaving a ``with`` block)
    stops the thread.

    Raises:
        ValueError: ``size`` < 1.
    """
    if size < 1:
        raise ValueError(f"prefetch_to_device: size must be >= 1, got {size}")
    if sharding is None:
        transfer: Callable[[PyTree], PyTree] = lambda batch: jax.tree.map(
            lambda leaf: jax.device_put(leaf) if _is_array(leaf) else leaf, batch
        )
    else:
        transfer = lambda batch: place_batch_on_shards(batch, sharding)
    return DevicePrefetcher(pipeline, size, transfer)


# --- Helpers --------------------------------------------------------------------------------


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, (np.ndarray, np.generic, jax.Array))


def _spec_axes(entry: Any) -> tuple[Any, ...]:
    """The mesh axes one entry of a PartitionSpec names (None, a name, or a tuple of names)."""
    if entry is None or entry is PartitionSpec.UNCONSTRAINED:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _require_mesh_axes(mesh: Mesh, axes: Iterable[Any], what: str) -> None:
    for axis in axes:
        if axis not in mesh.axis_names:
            raise ValueError(
                f"{what}: the mesh has no axis {axis!r}; its axes are "
                f"{dict(zip(mesh.axis_names, mesh.devices.shape))}"
            )


def _check_splits(name: str, shape: tuple[int, ...], sharding: Sharding) -> None:
    """Refuse a batch leaf whose leading dimension does not divide over this process's shards."""
    if not isinstance(sharding, NamedSharding) or not sharding.spec:
        return
    axes = _spec_axes(sharding.spec[0])
    if not axes:
        return
    if not shape:
        raise ValueError(
            f"place_batch_on_shards: batch leaf {name} is 0-d, but the sharding splits the "
            f"leading dimension over {axes}; give it a batch dimension"
        )
    mesh = sharding.mesh
    positions = [mesh.axis_names.index(a) for a in axes]
    total = math.prod(mesh.devices.shape[p] for p in positions)
    here = jax.process_index()
    local = len(
        {
            tuple(index[p] for p in positions)
            for index, device in np.ndenumerate(mesh.devices)
            if device.process_index == here
        }
    )
    if local and shape[0] % local:
        whole = "the batch" if local == total else "this process's part of the batch"
        raise ValueError(
            f"place_batch_on_shards: batch leaf {name} has leading dimension {shape[0]}, which "
            f"does not divide over the {local} shards of axis {axes} this process holds (of "
            f"{total}); make {whole} a multiple of {local}"
        )


def _place_replicated_or_split(name: str, value: Any, mesh: Mesh, spec: PartitionSpec) -> Any:
    for entry in spec:
        for axis in _spec_axes(entry):
            if axis not in mesh.axis_names:
                raise ValueError(
                    f"place_nnx_state_on_shards: variable {name} is partitioned as {spec}, but "
                    f"the mesh has no axis {axis!r} (its axes: "
                    f"{dict(zip(mesh.axis_names, mesh.devices.shape))})"
                )
    sharding = NamedSharding(mesh, spec)
    if sharding.is_fully_addressable or (
        isinstance(value, jax.Array) and not value.is_fully_addressable
    ):
        return jax.device_put(value, sharding)
    # Other processes hold part of the mesh: every process builds its own shards from its copy.
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _reduce_leading(value: Any, op: Callable[..., jax.Array]) -> Any:
    return op(value, axis=0) if np.ndim(value) > 0 else value


def _require_bound_axis(axis_name: Hashable, what: str) -> None:
    """Refuse an axis name that no enclosing shard_map or pmap binds, naming it."""
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    for name in names:
        try:
            lax.axis_size(name)
        except NameError as error:
            raise ValueError(
                f"{what}: axis_name {name!r} is not bound here; call it inside nnx.shard_map or "
                f"jax.shard_map over a mesh with an axis {name!r} (or pmap(axis_name={name!r})); "
                "outside them use reduce_mean/reduce_sum"
            ) from error
