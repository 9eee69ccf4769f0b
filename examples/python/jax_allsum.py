"""JAX arrays with boltccl: JAX arrays are immutable, so reductions run out of place into a
numpy buffer (out=), and gathers return new numpy arrays; jnp.asarray brings them back.

  boltccl launch -n 2 -- python jax_allsum.py      # or mlx.launch, torchrun, mpirun, srun
"""

import jax.numpy as jnp
import numpy as np

import boltccl

g = boltccl.init()
x = jnp.arange(8, dtype=jnp.float32) * (g.rank + 1)  # a jax.Array (read-only to boltccl)
total = jnp.asarray(g.all_sum(x, out=np.empty(x.shape, np.float32)))
everyone = jnp.asarray(g.all_gather(x)).reshape(g.size, -1)
n = g.size
assert jnp.array_equal(total, jnp.arange(8) * n * (n + 1) / 2)
assert jnp.array_equal(everyone[-1], jnp.arange(8) * n)
if g.rank == 0:
    print(f"{n} ranks: all_sum {total.tolist()}")
