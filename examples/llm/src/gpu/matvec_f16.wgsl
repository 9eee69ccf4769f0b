enable f16;

// y = W · x for a row-major f16 matrix W [rows, cols], accumulating in f32.
// Same structure as matvec.wgsl; half the weight bytes (decode is memory-bound).
//
// One workgroup of 64 invocations per output row: each invocation sums a strided slice of the
// row, then the workgroup reduces the 64 partial sums in shared memory. Decode is a
// matrix-*vector* product, memory-bound, so this simple shape is close to the best a portable
// kernel can do. The reduction does not assume a subgroup size (8 on lavapipe, 32 on Apple).

struct Params {
    rows: u32,
    cols: u32,
    // Rows handled per dispatch row (grid x dimension); grid y extends past 65535 rows.
    grid_x: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> w: array<f16>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 64u;
var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn matvec(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    // `row` is uniform across the workgroup, so the barriers below stay in uniform control
    // flow even for the padding workgroups past the last row (they just skip the loads).
    let row = wg.x + wg.y * p.grid_x;
    var acc = 0.0;
    if (row < p.rows) {
        let base = row * p.cols;
        for (var c = lid; c < p.cols; c += WG) {
            acc += f32(w[base + c]) * x[c];
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u && row < p.rows) {
        y[row] = partial[0];
    }
}

// ---- Batched prefill: the `matmul*` entry points; their tile (the `Batch` uniform `bt`,
// `TT`, `reduce_store_tile`) is matmul_tile.wgsl, appended to this source.

@compute @workgroup_size(64)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * p.grid_x;
    let t0 = wg.z * TT;
    let nt = min(TT, bt.t - t0);
    // Tail rows past the batch read its last row (results dropped at the store): a loop of
    // constant length, which compilers unroll, keeping `acc` in registers.
    let last = bt.t - 1u;
    var acc: array<f32, 16>;
    if (row < p.rows) {
        let base = row * p.cols;
        for (var c = lid; c < p.cols; c += WG) {
            let wv = f32(w[base + c]);
            for (var j = 0u; j < TT; j++) {
                acc[j] += wv * x[min(t0 + j, last) * p.cols + c];
            }
        }
    }
    reduce_store_tile(lid, row, t0, nt, acc);
}
