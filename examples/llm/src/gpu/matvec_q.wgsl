// y = W · x for a matrix W [rows, cols] kept in GGML blocks of 32 (Q4_0, Q4_1, Q8_0), decoded
// here, in registers, instead of read as f32 or f16 copies: 20 bytes per 32 weights for Q4_1
// (0.625 bytes a weight, a sixth of f32's traffic in a memory-bound product).
//
// Layout of `w` (u32 words, little-endian bytes), as the CPU's QuantRows keeps them:
//   words [0, dm_offset):    the quants, row after row; a block is 4 words (16 bytes of
//                            nibbles: byte i holds element i low, element i + 16 high) or, for
//                            Q8_0, 8 words (32 signed bytes in element order);
//   words [dm_offset, ...):  one word per block, row after row: its f16 scale d in the low half
//                            and, for Q4_1, its f16 minimum m in the high half.
// Decoded values: Q4_0 d * (n - 8), Q4_1 d * n + m, Q8_0 d * q. x stays f32 (no activation
// quantisation), so this is the CPU's `--weights quant` arithmetic up to rounding order.
//
// Same shape as matvec.wgsl: one workgroup of 64 per output row, each invocation taking one
// word of quants at a time, then a workgroup-memory reduction (no subgroup-size assumption).

struct Params {
    rows: u32,
    cols: u32,
    // Rows handled per dispatch row (grid x dimension); grid y extends past 65535 rows.
    grid_x: u32,
    // Index in `w` of the first scale word.
    dm_offset: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 64u;
var<workgroup> partial: array<f32, 64>;

// An f16 bit pattern (the low 16 bits of `h`) as f32, exactly. Done by hand rather than with
// unpack2x16float, which naga only accepts with the float16-in-float32 capability.
fn half_to_f32(h: u32) -> f32 {
    let e = (h >> 10u) & 0x1Fu;
    let m = h & 0x3FFu;
    var v: f32;
    if (e == 0u) {
        v = f32(m) * 5.9604645e-8; // subnormal: m * 2^-24
    } else if (e == 31u) {
        v = bitcast<f32>(0x7F800000u | (m << 13u)); // inf / NaN
    } else {
        v = bitcast<f32>(((e + 112u) << 23u) | (m << 13u));
    }
    return select(v, -v, (h & 0x8000u) != 0u);
}

// Sums the workgroup's partials and stores row `row`'s result. Must be reached by the whole
// workgroup (uniform control flow), also by the padding workgroups past the last row.
fn reduce_store(lid: u32, row: u32, acc: f32) {
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

// Nibble-block rows (Q4_0 when `offset` is 8, Q4_1 when it is 0 and the minimum is used).
fn q4_row(row: u32, lid: u32, offset: f32, with_min: bool) -> f32 {
    let nb = p.cols / 32u;
    let words = nb * 4u;
    var acc = 0.0;
    for (var i = lid; i < words; i += WG) {
        let b = i / 4u;
        let q = w[row * words + i];
        let dm = w[p.dm_offset + row * nb + b];
        let d = half_to_f32(dm & 0xFFFFu);
        let m = half_to_f32(dm >> 16u);
        // This word's bytes are elements 4k..4k+3 (low nibbles) and 16+4k.. (high nibbles).
        let xb = b * 32u + (i % 4u) * 4u;
        var s = 0.0;
        var sx = 0.0;
        for (var e = 0u; e < 4u; e++) {
            let byte = (q >> (8u * e)) & 0xFFu;
            let x0 = x[xb + e];
            let x1 = x[xb + 16u + e];
            s += (f32(byte & 0xFu) - offset) * x0 + (f32(byte >> 4u) - offset) * x1;
            sx += x0 + x1;
        }
        acc += d * s;
        if (with_min) {
            acc += m * sx;
        }
    }
    return acc;
}

@compute @workgroup_size(64)
fn matvec_q4_0(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * p.grid_x;
    var acc = 0.0;
    if (row < p.rows) {
        acc = q4_row(row, lid, 8.0, false);
    }
    reduce_store(lid, row, acc);
}

@compute @workgroup_size(64)
fn matvec_q4_1(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * p.grid_x;
    var acc = 0.0;
    if (row < p.rows) {
        acc = q4_row(row, lid, 0.0, true);
    }
    reduce_store(lid, row, acc);
}

@compute @workgroup_size(64)
fn matvec_q8_0(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * p.grid_x;
    var acc = 0.0;
    if (row < p.rows) {
        let nb = p.cols / 32u;
        let words = nb * 8u;
        for (var i = lid; i < words; i += WG) {
            let q = w[row * words + i];
            let d = half_to_f32(w[p.dm_offset + row * nb + i / 8u] & 0xFFFFu);
            let xb = i * 4u; // 8 words of 4 bytes per 32-element block
            var s = 0.0;
            for (var e = 0u; e < 4u; e++) {
                // Sign-extend byte e.
                let v = i32(q << (24u - 8u * e)) >> 24u;
                s += f32(v) * x[xb + e];
            }
            acc += d * s;
        }
    }
    reduce_store(lid, row, acc);
}

// ---- Batched prefill: the `matmul*` entry points; their tile (the `Batch` uniform `bt`,
// `TT`, `reduce_store_tile`) is matmul_tile.wgsl, appended to this source.

// Nibble-block rows for a tile of input rows: each word of quants and its scale are decoded
// once and used for all TT rows, each row's sum formed as in q4_row.
fn q4_tile(row: u32, lid: u32, t0: u32, offset: f32, with_min: bool) -> array<f32, 16> {
    // Tail rows past the batch read its last row (results dropped at the store): a loop of
    // constant length, which compilers unroll, keeping `acc` in registers.
    let last = bt.t - 1u;
    let nb = p.cols / 32u;
    let words = nb * 4u;
    var acc: array<f32, 16>;
    for (var i = lid; i < words; i += WG) {
        let b = i / 4u;
        let q = w[row * words + i];
        let dm = w[p.dm_offset + row * nb + b];
        let d = half_to_f32(dm & 0xFFFFu);
        let m = half_to_f32(dm >> 16u);
        let xb = b * 32u + (i % 4u) * 4u;
        var lo: array<f32, 4>;
        var hi: array<f32, 4>;
        for (var e = 0u; e < 4u; e++) {
            let byte = (q >> (8u * e)) & 0xFFu;
            lo[e] = f32(byte & 0xFu) - offset;
            hi[e] = f32(byte >> 4u) - offset;
        }
        for (var j = 0u; j < TT; j++) {
            let xr = min(t0 + j, last) * p.cols + xb;
            var s = 0.0;
            var sx = 0.0;
            for (var e = 0u; e < 4u; e++) {
                let x0 = x[xr + e];
                let x1 = x[xr + 16u + e];
                s += lo[e] * x0 + hi[e] * x1;
                sx += x0 + x1;
            }
            acc[j] += d * s;
            if (with_min) {
                acc[j] += m * sx;
            }
        }
    }
    return acc;
}

@compute @workgroup_size(64)
fn matmul_q4_0(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * p.grid_x;
    let t0 = wg.z * TT;
    let nt = min(TT, bt.t - t0);
    var acc: array<f32, 16>;
    if (row < p.rows) {
        acc = q4_tile(row, lid, t0, 8.0, false);
    }
    reduce_store_tile(lid, row, t0, nt, acc);
}

@compute @workgroup_size(64)
fn matmul_q4_1(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * p.grid_x;
    let t0 = wg.z * TT;
    let nt = min(TT, bt.t - t0);
    var acc: array<f32, 16>;
    if (row < p.rows) {
        acc = q4_tile(row, lid, t0, 0.0, true);
    }
    reduce_store_tile(lid, row, t0, nt, acc);
}

@compute @workgroup_size(64)
fn matmul_q8_0(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * p.grid_x;
    let t0 = wg.z * TT;
    let nt = min(TT, bt.t - t0);
    // Tail rows past the batch read its last row (results dropped at the store): a loop of
    // constant length, which compilers unroll, keeping `acc` in registers.
    let last = bt.t - 1u;
    var acc: array<f32, 16>;
    if (row < p.rows) {
        let nb = p.cols / 32u;
        let words = nb * 8u;
        for (var i = lid; i < words; i += WG) {
            let q = w[row * words + i];
            let d = half_to_f32(w[p.dm_offset + row * nb + i / 8u] & 0xFFFFu);
            let xb = i * 4u;
            var v: array<f32, 4>;
            for (var e = 0u; e < 4u; e++) {
                v[e] = f32(i32(q << (24u - 8u * e)) >> 24u);
            }
            for (var j = 0u; j < TT; j++) {
                let xr = min(t0 + j, last) * p.cols + xb;
                var s = 0.0;
                for (var e = 0u; e < 4u; e++) {
                    s += v[e] * x[xr + e];
                }
                acc[j] += d * s;
            }
        }
    }
    reduce_store_tile(lid, row, t0, nt, acc);
}
