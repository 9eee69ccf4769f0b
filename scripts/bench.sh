#!/usr/bin/env bash
# Every benchmark, one entry point. Figures go to stdout (and target/ where noted).
#   scripts/bench.sh peers      float32 all_sum beside MLX's ring, Open MPI (TCP and shared
#                               memory) and Gloo, one side-by-side table (installs the peers)
#   scripts/bench.sh bindings   Python vs Rust all_sum at 2 ranks (after scripts/test-bindings.sh)
#   scripts/bench.sh llm        the inference example's decode speed beside llama.cpp
#   scripts/bench.sh netns      direct vs ring over rate-capped links in network namespaces
#                               (root; RDMA over softverbs)
#   scripts/bench.sh hosts      2 namespaces x 2 ranks: shared memory inside + TCP between,
#                               against TCP everywhere (root)
#   scripts/bench.sh torch      torch.distributed all_reduce, backend boltccl vs gloo, beside
#                               `boltccl bench` (after scripts/test-frameworks.sh)
#   scripts/bench.sh overlap    compute (matrix products) while an async 64 MiB all_sum runs
#   scripts/bench.sh mlx        mx.distributed.all_sum and mlx-lm TP=3 over MLX's ring backend,
#                               Open MPI and libboltccl_mpi, beside `boltccl bench`
#   scripts/bench.sh shrink     kill a rank, shrink, sum: 3 -> 2 and 4 -> 3 ranks, TCP and shared
#                               memory, medians of 20
#   scripts/bench.sh rejoin     kill / shrink / join (grow) / verify for 10 minutes a transport,
#                               with the open files and memory of a long-lived rank
#   scripts/bench.sh alltoall   float32 all_to_all, both schedules, beside Open MPI's MPI_Alltoall
#                               (shared memory and TCP), and through torch: Gloo and boltccl
# Each one's knobs are described at the top of scripts/bench/<name>.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
what="${1:-}"
case "$what" in
    peers | bindings | llm | netns | hosts | torch | overlap | mlx | shrink | rejoin | alltoall)
        shift
        exec bash "$here/bench/$what.sh" "$@"
        ;;
    *)
        sed -n '2,22p' "$0" >&2
        exit 2
        ;;
esac
