"""mlx-lm tensor-parallel generation over boltccl, with mlx-lm's own code unchanged.

mlx-lm shards a model with ``sharded_load`` and sums the shards' partial results with
``mx.distributed.all_sum``. MLX's ``mpi`` backend loads the library named by
``MLX_MPI_LIBNAME``; boltccl's ``libboltccl_mpi`` is such a library, so the sums run over
boltccl (Thunderbolt RDMA, TCP or shared memory, with deadlines and checks):

  boltccl launch --hostfile macs.json -- python mlx_lm_generate.py MODEL   # sets MLX_MPI_LIBNAME
  python -m boltccl.launch -n 3 mlx_lm_generate.py MODEL                   # one machine, 3 ranks
  mlx.launch --backend mpi --hostfile hosts.json \\
      --env MLX_MPI_LIBNAME=$(python -c 'import boltccl.mlx as m; print(m.mpi_library())') \\
      -- python mlx_lm_generate.py MODEL
  python mlx_lm_generate.py MODEL                                          # one process (TP=1)

MODEL is an MLX model directory or Hugging Face repo id. Greedy decoding: every size gives the
same text when the model's heads divide by it (SmolLM2-135M: 9 query and 3 KV heads, so TP=3).
Rank 0 prints the answer; ``--json`` prints a RESULT line per rank (text and speeds) instead.
"""

import argparse
import json
import time

import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.utils import sharded_load

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("model")
ap.add_argument("--prompt", default="The capital of France is")
ap.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
ap.add_argument("--max-tokens", type=int, default=24)
ap.add_argument("--json", action="store_true", help="print a RESULT line per rank")
a = ap.parse_args()

world = mx.distributed.init()  # MLX's choice of backend: mpi under boltccl launch
if world.size() > 1:
    model, tokenizer = sharded_load(a.model)
else:
    model, tokenizer = load(a.model)
prompt = a.prompt
if a.chat:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": a.prompt}], add_generation_prompt=True)

start = time.perf_counter()
text, last = "", None
for last in stream_generate(model, tokenizer, prompt, max_tokens=a.max_tokens):
    text += last.text
seconds = time.perf_counter() - start

if a.json:
    result = {
        "rank": world.rank(),
        "size": world.size(),
        "text": text,
        "tokens": last.generation_tokens,
        "seconds": seconds,
        "decode_tok_s": last.generation_tps,
        "prefill_tok_s": last.prompt_tps,
    }
    print("RESULT " + json.dumps(result), flush=True)
elif world.rank() == 0:
    print(text)
    print(f"[{world.size()} ranks: {last.generation_tokens} tokens in {seconds:.2f} s, {last.generation_tps:.1f} tok/s decode]")
