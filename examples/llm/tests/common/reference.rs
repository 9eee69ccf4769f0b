//! A deliberately naive single-rank reference: full weights, no KV cache (recomputes the whole
//! sequence every call), plain loops, f64 accumulation. It shares no code with the model, so
//! agreement tests the model's cache, sharding and kernels together.

use boltccl_llm::config::RopeStyle;
use boltccl_llm::loader::WeightSource;

fn get(src: &dyn WeightSource, n: &str) -> Vec<f32> {
    src.tensor(n).unwrap().data
}

fn lin(w: &[f32], x: &[f32]) -> Vec<f32> {
    let cols = x.len();
    w.chunks(cols).map(|r| r.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() as f32).collect()
}

fn norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps as f64).sqrt();
    x.iter().zip(w).map(|(a, b)| (*a as f64 * s) as f32 * b).collect()
}

fn rotate(v: &mut [f32], pos: usize, theta: f32, style: RopeStyle) {
    let d = v.len();
    let orig = v.to_vec();
    for i in 0..d / 2 {
        let ang = pos as f64 / (theta as f64).powf(2.0 * i as f64 / d as f64);
        let (a, b) = match style {
            RopeStyle::NeoX => (i, i + d / 2),
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        };
        v[a] = (orig[a] as f64 * ang.cos() - orig[b] as f64 * ang.sin()) as f32;
        v[b] = (orig[a] as f64 * ang.sin() + orig[b] as f64 * ang.cos()) as f32;
    }
}

/// Logits for the last position of `tokens`.
pub fn logits(src: &dyn WeightSource, tokens: &[u32]) -> Vec<f32> {
    let c = src.config().clone();
    let (h, hd) = (c.hidden_size, c.head_dim);
    let emb = get(src, "model.embed_tokens.weight");
    let mut xs: Vec<Vec<f32>> = tokens.iter().map(|&t| emb[t as usize * h..(t as usize + 1) * h].to_vec()).collect();
    for l in 0..c.num_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        let opt = |s: &str| src.contains(&p(s)).then(|| get(src, &p(s)));
        let (wq, wk, wv, wo) = (
            get(src, &p("self_attn.q_proj.weight")),
            get(src, &p("self_attn.k_proj.weight")),
            get(src, &p("self_attn.v_proj.weight")),
            get(src, &p("self_attn.o_proj.weight")),
        );
        let (bq, bk, bv) = (opt("self_attn.q_proj.bias"), opt("self_attn.k_proj.bias"), opt("self_attn.v_proj.bias"));
        let (qn, kn) = (opt("self_attn.q_norm.weight"), opt("self_attn.k_norm.weight"));
        let an = get(src, &p("input_layernorm.weight"));
        let fnw = get(src, &p("post_attention_layernorm.weight"));
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let xn = norm(x, &an, c.rms_eps);
            let add = |mut y: Vec<f32>, b: &Option<Vec<f32>>| {
                if let Some(b) = b {
                    y.iter_mut().zip(b).for_each(|(a, b)| *a += b);
                }
                y
            };
            let mut q = add(lin(&wq, &xn), &bq);
            let mut k = add(lin(&wk, &xn), &bk);
            let v = add(lin(&wv, &xn), &bv);
            for (y, nw) in [(&mut q, &qn), (&mut k, &kn)] {
                for head in y.chunks_mut(hd) {
                    if let Some(w) = nw {
                        let n = norm(head, w, c.rms_eps);
                        head.copy_from_slice(&n);
                    }
                    rotate(head, pos, c.rope_theta, c.rope_style);
                }
            }
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        let group = c.num_heads / c.num_kv_heads;
        let mut new_xs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let mut att = vec![0f32; c.num_heads * hd];
            for head in 0..c.num_heads {
                let kvh = head / group;
                let q = &qs[pos][head * hd..(head + 1) * hd];
                let sc: Vec<f64> = (0..=pos)
                    .map(|j| {
                        let k = &ks[j][kvh * hd..(kvh + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, w) in e.iter().enumerate() {
                    for d in 0..hd {
                        att[head * hd + d] += (w / z * vs[j][kvh * hd + d] as f64) as f32;
                    }
                }
            }
            let o = lin(&wo, &att);
            let mut y: Vec<f32> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
            let yn = norm(&y, &fnw, c.rms_eps);
            let g = lin(&get(src, &p("mlp.gate_proj.weight")), &yn);
            let u = lin(&get(src, &p("mlp.up_proj.weight")), &yn);
            let a: Vec<f32> =
                g.iter().zip(&u).map(|(g, u)| (*g as f64 / (1.0 + (-*g as f64).exp())) as f32 * u).collect();
            let d = lin(&get(src, &p("mlp.down_proj.weight")), &a);
            y.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
            new_xs.push(y);
        }
        xs = new_xs;
    }
    let last = norm(xs.last().unwrap(), &get(src, "model.norm.weight"), c.rms_eps);
    let head = if src.contains("lm_head.weight") && !c.tie_embeddings { get(src, "lm_head.weight") } else { emb };
    lin(&head, &last)
}
