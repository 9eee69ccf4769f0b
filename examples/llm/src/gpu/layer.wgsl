// Per-layer kernels for the GPU decode path: everything between the matrix products, so a
// layer needs only two GPU round trips (attention segment, MLP segment), each ending in the
// partial hidden vector that the host all_sums.
//
// All kernels use workgroups of 64 and workgroup-memory reductions (no subgroup-size
// assumption: 8 on lavapipe, 32 on Apple GPUs).
//
// Every kernel also takes T token rows at once for batched prefill: the row is the workgroup's
// y index (x for rmsnorm), and the row stride comes from the dispatch size, so a decode
// dispatch (one row) computes exactly what it did before rows existed.

struct Params {
    n: u32,        // rmsnorm/silu: vector length. qk_prep/attention: head_dim
    heads: u32,    // qk_prep: heads in the vector. attention: local query heads
    pos: u32,      // qk_prep: position of row 0. attention: sequence length (pos + 1) of row 0
    flags: u32,    // qk_prep: 1 = add bias, 2 = per-head rmsnorm, 4 = interleaved rope, 8 = rope.
                   // attention: query-head skew (local query head h reads local KV head
                   // (h + skew) / group, as a rank's heads may start inside a KV group)
    eps: f32,
    scale: f32,    // attention: 1/sqrt(head_dim)
    group: u32,    // attention: query heads per KV head
    n_kv: u32,     // attention: local KV heads
}

@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read> c: array<f32>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

const WG: u32 = 64u;
var<workgroup> red: array<f32, 64>;

fn reduce_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// o = a / rms(a) * b   (a: input rows [T][n], b: norm weight). One workgroup per row.
@compute @workgroup_size(64)
fn rmsnorm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wg.x * p.n;
    var ss = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        ss += a[base + i] * a[base + i];
    }
    let inv = 1.0 / sqrt(reduce_sum(lid, ss) / f32(p.n) + p.eps);
    for (var i = lid; i < p.n; i += WG) {
        o[base + i] = a[base + i] * inv * b[i];
    }
}

// In place on a = [T][heads][head_dim]: + bias (b, [heads][head_dim]), per-head rmsnorm
// (weight c[0..hd]) and RoPE at position pos + row (inverse frequencies in o[0..hd/2]). One
// workgroup per head (x) and row (y).
@compute @workgroup_size(64)
fn qk_prep(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let hd = p.n;
    let base = (wg.y * nwg.x + wg.x) * hd;
    let pos = p.pos + wg.y;
    if ((p.flags & 1u) != 0u) {
        for (var i = lid; i < hd; i += WG) {
            a[base + i] += b[wg.x * hd + i];
        }
    }
    workgroupBarrier();
    if ((p.flags & 2u) != 0u) {
        var ss = 0.0;
        for (var i = lid; i < hd; i += WG) {
            ss += a[base + i] * a[base + i];
        }
        let inv = 1.0 / sqrt(reduce_sum(lid, ss) / f32(hd) + p.eps);
        for (var i = lid; i < hd; i += WG) {
            a[base + i] = a[base + i] * inv * c[i];
        }
    }
    workgroupBarrier();
    let half = hd / 2u;
    let rope_on = (p.flags & 8u) != 0u;
    for (var i = lid; i < half && rope_on; i += WG) {
        let ang = f32(pos) * o[i];
        let s = sin(ang);
        let co = cos(ang);
        var ia = base + i;
        var ib = base + i + half;
        if ((p.flags & 4u) != 0u) {
            ia = base + 2u * i;
            ib = ia + 1u;
        }
        let x0 = a[ia];
        let x1 = a[ib];
        a[ia] = x0 * co - x1 * s;
        a[ib] = x0 * s + x1 * co;
    }
}

// Causal attention, one workgroup per local query head (x) and token row (y): row r is the
// token at position pos - 1 + r and sees cache positions 0..pos + r (its own K/V included, the
// later rows' not). a: scores scratch [T][heads][max_seq], b: K cache, c: V cache (both
// [pos][n_kv][hd]), o: the queries [T][heads][hd] on entry and the outputs on exit (each
// workgroup copies its query head to workgroup memory before overwriting it, which keeps the
// bindings to five).
var<workgroup> qv: array<f32, 256>;

@compute @workgroup_size(64)
fn attention(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let hd = p.n;
    let kvh = (wg.x + p.flags) / p.group;
    let h = wg.y * nwg.x + wg.x; // query head row in o and in the scratch
    let seq = p.pos + wg.y;
    for (var i = lid; i < hd; i += WG) {
        qv[i] = o[h * hd + i];
    }
    workgroupBarrier();
    let srow = h * p.heads; // p.heads carries the scratch row stride (max sequence length)
    var m = -3.0e38;
    for (var t = lid; t < seq; t += WG) {
        let kb = (t * p.n_kv + kvh) * hd;
        var d = 0.0;
        for (var i = 0u; i < hd; i++) {
            d += qv[i] * b[kb + i];
        }
        d *= p.scale;
        a[srow + t] = d;
        m = max(m, d);
    }
    let mx = reduce_max(lid, m);
    var sum = 0.0;
    for (var t = lid; t < seq; t += WG) {
        let e = exp(a[srow + t] - mx);
        a[srow + t] = e;
        sum += e;
    }
    let total = reduce_sum(lid, sum);
    storageBarrier();
    workgroupBarrier();
    for (var i = lid; i < hd; i += WG) {
        var acc = 0.0;
        for (var t = 0u; t < seq; t++) {
            acc += a[srow + t] * c[(t * p.n_kv + kvh) * hd + i];
        }
        o[h * hd + i] = acc / total;
    }
}

// o = silu(a) * b, element-wise (gate, up) on rows of n values, row gid.y: a grid row per
// token keeps each dispatch dimension small whatever the batch.
@compute @workgroup_size(64)
fn silu_mul(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < p.n) {
        let i = gid.y * p.n + gid.x;
        let g = a[i];
        o[i] = g / (1.0 + exp(-g)) * b[i];
    }
}
