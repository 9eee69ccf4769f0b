//! Token selection on rank 0: greedy, or seeded temperature + top-p (nucleus) sampling.

/// SplitMix64: tiny, seedable, good enough for sampling (no dependency needed).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// How rank 0 picks the next token.
#[derive(Debug, Clone)]
pub struct Sampler {
    /// `<= 0` means greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables top-p.
    pub top_p: f32,
    rng: Rng,
}

impl Sampler {
    /// Greedy argmax.
    pub fn greedy() -> Self {
        Self::new(0.0, 1.0, 0)
    }
    /// Temperature / top-p sampler with a seed.
    pub fn new(temperature: f32, top_p: f32, seed: u64) -> Self {
        Self { temperature, top_p, rng: Rng::new(seed) }
    }

    /// Picks a token id from `logits`.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.temperature <= 0.0 {
            return argmax(logits);
        }
        let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<(u32, f32)> =
            logits.iter().enumerate().map(|(i, &l)| (i as u32, ((l - m) / self.temperature).exp())).collect();
        // Sort by probability, ties broken by id, so a seed always gives the same token.
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let total: f32 = probs.iter().map(|p| p.1).sum();
        let mut keep = probs.len();
        if self.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, p) in probs.iter().enumerate() {
                cum += p.1 / total;
                if cum >= self.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        let kept = &probs[..keep];
        let mass: f32 = kept.iter().map(|p| p.1).sum();
        let mut r = self.rng.next_f32() * mass;
        for &(id, p) in kept {
            if r < p {
                return id;
            }
            r -= p;
        }
        kept[kept.len() - 1].0
    }
}

/// Index of the largest logit (first one on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}
