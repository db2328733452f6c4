"""The small flax.nnx MLP, loss and batches that test_spmd.py and spmd_two_processes.py train.

Both sides build the same model from the same seed and train it on the same batches, so their
parameters must agree to float32 rounding (max |difference| <= 1e-6).
"""

from __future__ import annotations

import jax
import numpy as np
import optax
from flax import nnx

STEPS = 3
GLOBAL_BATCH = 16
LEARNING_RATE = 0.5


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, din: int = 8, hidden: int = 16, dout: int = 4) -> None:
        self.hidden = nnx.Linear(din, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, dout, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(jax.nn.relu(self.hidden(x)))


def loss_fn(model: MLP, batch: dict) -> jax.Array:
    logits = model(batch["inputs"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()


def training_batches() -> list[dict[str, np.ndarray]]:
    """The global batches of every step."""
    rng = np.random.default_rng(7)
    return [
        {
            "inputs": rng.normal(size=(GLOBAL_BATCH, 8)).astype(np.float32),
            "targets": rng.integers(0, 4, size=GLOBAL_BATCH),
        }
        for _ in range(STEPS)
    ]


def new_model() -> MLP:
    return MLP(nnx.Rngs(0))


def new_optimizer(model: MLP) -> nnx.Optimizer:
    return nnx.Optimizer(model, optax.sgd(LEARNING_RATE), wrt=nnx.Param)


def placed_model_and_optimizer(mesh: jax.sharding.Mesh) -> tuple[MLP, nnx.Optimizer]:
    """The model replicated on ``mesh`` (place_nnx_state_on_shards), then its optimizer."""
    from substrax.spmd import place_nnx_state_on_shards

    model = new_model()
    nnx.update(model, place_nnx_state_on_shards(nnx.state(model), mesh))
    return model, new_optimizer(model)


def params_of(model: MLP) -> list[np.ndarray]:
    """The parameters, in tree order, as host arrays (gathered from every process first)."""
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    if any(not leaf.is_fully_addressable for leaf in leaves):
        from jax.experimental import multihost_utils

        leaves = multihost_utils.process_allgather(leaves, tiled=True)
    return [np.asarray(leaf) for leaf in leaves]
