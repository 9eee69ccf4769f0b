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

// ---- Batched prefill: Y = X · Wᵀ for T input rows (X [T][cols], Y [T][rows]). ----
//
// Same shape as the matvec above (one workgroup of 64 per output row, the same strided walk
// along the row and the same reduction tree) but each workgroup also takes a tile of TT input
// rows (dispatch z): every weight it loads is multiplied with all of the tile's rows, so a
// prompt reads (and decodes) each weight once per TT tokens instead of once per token. Each
// token's sum is formed in the matvec's order, so a row of Y is the matvec of that token.

struct Batch {
    // Input rows in this batch; the last tile may hold fewer than TT.
    t: u32,
    _a: u32,
    _b: u32,
    _c: u32,
}

@group(0) @binding(4) var<uniform> bt: Batch;

const TT: u32 = 16u;
// Partial sums of the tile, [TT][WG].
var<workgroup> tile: array<f32, 1024>;

// Reduces the tile's TT x 64 partial sums (the matvec's tree, per input row) and stores the
// `nt` valid rows' results. Reached by the whole workgroup (uniform control flow).
fn reduce_store_tile(lid: u32, row: u32, t0: u32, nt: u32, acc: array<f32, 16>) {
    for (var j = 0u; j < TT; j++) {
        tile[j * WG + lid] = acc[j];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var j = 0u; j < TT; j++) {
                tile[j * WG + lid] += tile[j * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    if (lid < nt && row < p.rows) {
        y[(t0 + lid) * p.rows + row] = tile[lid * WG];
    }
}

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
