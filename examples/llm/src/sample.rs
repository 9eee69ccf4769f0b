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

    /// Whether this sampler takes the largest logit (which ranks can choose together without
    /// gathering the logits: [`crate::model::Model::forward_greedy`]).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Picks a token id from `logits`.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.is_greedy() {
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

/// Index of the largest logit: the first one on ties, NaN never the largest (0 when every
/// logit is NaN).
pub fn argmax(logits: &[f32]) -> u32 {
    Best::of(logits, 0).map_or(0, |b| b.index)
}

/// [`argmax`] of logits held in slices, from each slice's [`Best::of`] in the slices' order:
/// the same index as `argmax` of the slices joined.
pub fn argmax_of(slices: impl IntoIterator<Item = Option<Best>>) -> u32 {
    slices.into_iter().fold(None, Best::or_later).map_or(0, |b| b.index)
}

/// The largest logit of a slice of the vocabulary and its index in the whole vocabulary: what
/// a rank contributes to a greedy choice made across ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Best {
    /// The logit (never NaN).
    pub value: f32,
    /// Its token id.
    pub index: u32,
}

impl Best {
    /// The first largest non-NaN value of `logits`, whose first value is token `offset`;
    /// `None` for an empty or all-NaN slice.
    pub fn of(logits: &[f32], offset: usize) -> Option<Best> {
        let mut best: Option<Best> = None;
        for (i, &value) in logits.iter().enumerate() {
            if !value.is_nan() && best.is_none_or(|b| value > b.value) {
                best = Some(Best { value, index: (offset + i) as u32 });
            }
        }
        best
    }

    /// Of `a` and `later` (from a slice further on in the vocabulary): the larger, `a` on a tie.
    pub fn or_later(a: Option<Best>, later: Option<Best>) -> Option<Best> {
        match (a, later) {
            (Some(a), Some(l)) if l.value > a.value => Some(l),
            (Some(a), _) => Some(a),
            (None, l) => l,
        }
    }

    /// `b` in one word, for a collective: the value's bits above the index; `None` as all ones
    /// (an index no vocabulary reaches).
    pub fn to_word(b: Option<Best>) -> u64 {
        b.map_or(u64::MAX, |b| (u64::from(b.value.to_bits()) << 32) | u64::from(b.index))
    }

    /// The inverse of [`Best::to_word`].
    pub fn from_word(w: u64) -> Option<Best> {
        (w != u64::MAX).then(|| Best { value: f32::from_bits((w >> 32) as u32), index: w as u32 })
    }
}
