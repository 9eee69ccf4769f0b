// The batched-prefill tile shared by the matvec modules (matvec.wgsl, matvec_f16.wgsl,
// matvec_q.wgsl): appended to each one's source (see `gpu::MATVEC_WGSL`), which declares the
// `Params` uniform `p`, the output `y` and `WG` it uses; each module's `matmul*` entry points
// fill a tile's accumulators their own way and end in `reduce_store_tile`.
//
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
