//! Batched generation with a KV cache that survives across the turns of a conversation.

use crate::error::{ModelError, Result};
use crate::model::{LayerKv, Model, PassOptions};
use crate::tokenizer::ChatTokenizer;
use candle_core::{DType, Tensor};
use rand::{Rng, SeedableRng};

/// How to pick tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Upper bound on generated tokens per row.
    pub max_new_tokens: usize,
    /// 0 means greedy (argmax); otherwise logits are divided by it before sampling.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability mass reaches `p`.
    pub top_p: Option<f32>,
    /// Seed of the sampler; the same seed, prompts and model give the same output.
    pub seed: u64,
    /// One seed per row instead: each row gets its own sampler, so a row samples what it
    /// would have sampled alone with that seed, whatever else is in the batch. Empty: one
    /// sampler from `seed` for the whole batch.
    pub row_seeds: Vec<u64>,
    /// Generation of a row stops once its decoded text contains one of these; the returned
    /// text is cut before it.
    pub stop_sequences: Vec<String>,
    /// Token ids that end a row; `None` uses the tokenizer's end-of-turn ids.
    pub stop_token_ids: Option<Vec<u32>>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_new_tokens: 256,
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
            row_seeds: vec![],
            stop_sequences: vec![],
            stop_token_ids: None,
        }
    }
}

/// A per-step restriction of the next token, for structured outputs (e.g. a Detector action
/// grammar). Called once per row per step with the tokens that row generated so far.
pub trait TokenConstraint {
    /// The tokens allowed next for `row`, or `None` for no restriction. An empty list is an
    /// error (the row could not continue).
    fn allowed_tokens(&mut self, row: usize, generated: &[u32]) -> Option<Vec<u32>>;
}

impl<F: FnMut(usize, &[u32]) -> Option<Vec<u32>>> TokenConstraint for F {
    fn allowed_tokens(&mut self, row: usize, generated: &[u32]) -> Option<Vec<u32>> {
        self(row, generated)
    }
}

/// Why a row stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token (eos) was produced; it is the last element of `tokens`.
    StopToken(u32),
    /// The text contained this stop sequence.
    StopSequence(String),
    /// `max_new_tokens` was reached.
    Length,
}

/// The output for one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Every generated token, including a final stop token.
    pub tokens: Vec<u32>,
    /// Decoded text without special tokens, cut before a stop sequence.
    pub text: String,
    pub finish: FinishReason,
}

/// Keys and values of everything a batch has seen, plus the token ids behind them, so the next
/// turn of a conversation only pre-fills its new suffix.
///
/// Rows are independent: each has its own key mask (padding columns are masked) and its own
/// positions, so rows may hold conversations of different lengths.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub(crate) layers: Vec<Option<LayerKv>>,
    /// `batch × columns`: 1 where the column holds a real token of that row.
    pub(crate) key_mask: Vec<Vec<u8>>,
    /// Real tokens fed per row, in order.
    pub(crate) tokens: Vec<Vec<u32>>,
    /// The adapter the keys and values were computed with (`None` = base); fixed at first use.
    pub(crate) adapter: Option<Option<String>>,
}

impl KvCache {
    /// An empty cache for `batch` conversations.
    pub fn new(model: &Model, batch: usize) -> Self {
        KvCache {
            layers: vec![None; model.config().num_layers],
            key_mask: vec![vec![]; batch],
            tokens: vec![vec![]; batch],
            adapter: None,
        }
    }

    /// Number of conversations.
    pub fn batch(&self) -> usize {
        self.tokens.len()
    }

    /// Tokens already fed for `row`.
    pub fn tokens(&self, row: usize) -> &[u32] {
        &self.tokens[row]
    }

    /// Columns in the cache (real tokens plus padding), the cost driver of attention.
    pub fn columns(&self) -> usize {
        self.key_mask.first().map_or(0, Vec::len)
    }

    /// Forgets everything `row` saw after its first `keep` tokens (the columns stay, masked),
    /// e.g. when a conversation is rewound.
    pub fn truncate_row(&mut self, row: usize, keep: usize) {
        if keep >= self.tokens[row].len() {
            return;
        }
        self.tokens[row].truncate(keep);
        let mut seen = 0;
        for m in self.key_mask[row].iter_mut() {
            if *m == 1 {
                if seen >= keep {
                    *m = 0;
                }
                seen += 1;
            }
        }
    }
}

impl Model {
    /// Generates a continuation of each prompt (token ids, e.g. from
    /// [`ChatTokenizer::apply_chat_template`] + [`ChatTokenizer::encode`]) with the active
    /// adapter and a fresh cache.
    pub fn generate(
        &self,
        tokenizer: &ChatTokenizer,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        constraint: Option<&mut dyn TokenConstraint>,
    ) -> Result<Vec<Generation>> {
        let mut cache = KvCache::new(self, prompts.len());
        self.generate_with_cache(&mut cache, tokenizer, prompts, params, constraint)
    }

    /// Like [`Model::generate`], but continues `cache`. Each prompt should be the whole
    /// conversation so far; only the part after what the cache already holds for that row is
    /// pre-filled (if a prompt diverges from the cached tokens, the row is rewound to the common
    /// prefix). After the call the cache holds the prompts and all generated tokens but the last
    /// of each row, which the next turn's prompt naturally contains.
    pub fn generate_with_cache(
        &self,
        cache: &mut KvCache,
        tokenizer: &ChatTokenizer,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        mut constraint: Option<&mut dyn TokenConstraint>,
    ) -> Result<Vec<Generation>> {
        if prompts.len() != cache.batch() {
            return Err(ModelError::InvalidArgument(format!(
                "{} prompts for a cache of batch {}",
                prompts.len(),
                cache.batch()
            )));
        }
        if let Some(r) = prompts.iter().position(Vec::is_empty) {
            return Err(ModelError::InvalidArgument(format!("prompt {r} is empty")));
        }
        if params.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
            return Err(ModelError::InvalidArgument(
                "top_p must be in (0, 1]".into(),
            ));
        }
        let stop_ids: Vec<u32> = params
            .stop_token_ids
            .clone()
            .unwrap_or_else(|| tokenizer.eos_token_ids().to_vec());
        let mut chunks = Vec::with_capacity(prompts.len());
        for (r, prompt) in prompts.iter().enumerate() {
            let cached = cache.tokens(r);
            let mut common = cached
                .iter()
                .zip(prompt)
                .take_while(|(a, b)| a == b)
                .count();
            if common == prompt.len() {
                // The logits of the last prompt token are needed again: re-feed it.
                common -= 1;
            }
            cache.truncate_row(r, common);
            chunks.push(prompt[common..].to_vec());
        }
        if !params.row_seeds.is_empty() && params.row_seeds.len() != prompts.len() {
            return Err(ModelError::InvalidArgument(format!(
                "{} row seeds for {} prompts",
                params.row_seeds.len(),
                prompts.len()
            )));
        }
        let mut logits = self.feed(cache, &chunks)?;
        let mut rngs: Vec<rand::rngs::StdRng> = if params.row_seeds.is_empty() {
            vec![rand::rngs::StdRng::seed_from_u64(params.seed)]
        } else {
            params
                .row_seeds
                .iter()
                .map(|s| rand::rngs::StdRng::seed_from_u64(*s))
                .collect()
        };
        let b = prompts.len();
        let mut generated: Vec<Vec<u32>> = vec![vec![]; b];
        let mut finish: Vec<Option<FinishReason>> = vec![None; b];
        let mut texts = vec![String::new(); b];
        if params.max_new_tokens == 0 {
            return Ok((0..b)
                .map(|_| Generation {
                    tokens: vec![],
                    text: String::new(),
                    finish: FinishReason::Length,
                })
                .collect());
        }
        loop {
            let rows: Vec<Vec<f32>> = logits.to_dtype(DType::F32)?.to_vec2()?;
            let mut next_chunks = vec![vec![]; b];
            for r in 0..b {
                if finish[r].is_some() {
                    continue;
                }
                let allowed = match constraint.as_deref_mut() {
                    Some(c) => c.allowed_tokens(r, &generated[r]),
                    None => None,
                };
                let rng = match rngs.len() {
                    1 => &mut rngs[0],
                    _ => &mut rngs[r],
                };
                let tok = sample(&rows[r], allowed.as_deref(), params, rng)
                    .map_err(|e| ModelError::InvalidArgument(format!("row {r}: {e}")))?;
                generated[r].push(tok);
                if stop_ids.contains(&tok) {
                    finish[r] = Some(FinishReason::StopToken(tok));
                    texts[r] = tokenizer.decode(&generated[r][..generated[r].len() - 1], true)?;
                    continue;
                }
                let text = tokenizer.decode(&generated[r], true)?;
                if let Some((at, stop)) = params
                    .stop_sequences
                    .iter()
                    .filter_map(|s| text.find(s.as_str()).map(|at| (at, s)))
                    .min_by_key(|(at, _)| *at)
                {
                    texts[r] = text[..at].to_string();
                    finish[r] = Some(FinishReason::StopSequence(stop.clone()));
                    continue;
                }
                texts[r] = text;
                if generated[r].len() >= params.max_new_tokens {
                    finish[r] = Some(FinishReason::Length);
                    continue;
                }
                next_chunks[r] = vec![tok];
            }
            if finish.iter().all(Option::is_some) {
                break;
            }
            logits = self.feed(cache, &next_chunks)?;
        }
        Ok(generated
            .into_iter()
            .zip(texts)
            .zip(finish)
            .map(|((tokens, text), finish)| Generation {
                tokens,
                text,
                finish: finish.expect("every row finished"),
            })
            .collect())
    }

    /// Feeds one chunk of tokens per row (rows may be empty) through the model with the active
    /// adapter, appending to `cache`, and returns the logits after each row's last token,
    /// `(batch, vocab)`. Chunks are left-padded to a common length; padding is masked.
    pub fn feed(&self, cache: &mut KvCache, chunks: &[Vec<u32>]) -> Result<Tensor> {
        let hidden = self.feed_hidden(cache, chunks)?;
        let len = hidden.dim(1)?;
        let last = hidden.narrow(1, len - 1, 1)?.squeeze(1)?;
        self.decode_logits(&last)
    }

    /// [`Model::feed`] without the LM head: the final-normed hidden states of every fed
    /// position, `(batch, len, hidden)` (left padding included). A cache filled with a shared
    /// prefix (a system prompt) can be cloned and fed each continuation.
    pub fn feed_hidden(&self, cache: &mut KvCache, chunks: &[Vec<u32>]) -> Result<Tensor> {
        let adapter_name = self.active.clone();
        match &cache.adapter {
            Some(a) if *a != adapter_name => {
                return Err(ModelError::InvalidArgument(format!(
                    "the cache was filled with adapter {a:?} but the active adapter is {adapter_name:?}; use a new cache"
                )))
            }
            _ => cache.adapter = Some(adapter_name.clone()),
        }
        let adapter = adapter_name
            .as_deref()
            .map(|n| self.adapter_or_err(n))
            .transpose()?;
        let b = chunks.len();
        let len = chunks.iter().map(Vec::len).max().unwrap_or(0);
        if len == 0 || b != cache.batch() {
            return Err(ModelError::InvalidArgument(
                "feed needs one chunk per cache row and at least one token".into(),
            ));
        }
        let vocab = self.config.vocab_size as u32;
        let past = cache.columns();
        let mut ids = Vec::with_capacity(b * len);
        let mut positions = Vec::with_capacity(b);
        for (r, chunk) in chunks.iter().enumerate() {
            if let Some(&bad) = chunk.iter().find(|&&t| t >= vocab) {
                return Err(ModelError::InvalidArgument(format!(
                    "row {r}: token {bad} is outside the vocabulary of {vocab}"
                )));
            }
            let pad = len - chunk.len();
            let start = cache.tokens[r].len() as u32;
            ids.extend(std::iter::repeat_n(0u32, pad));
            ids.extend_from_slice(chunk);
            let mut pos = vec![start; pad];
            pos.extend((0..chunk.len() as u32).map(|i| start + i));
            positions.push(pos);
            cache.key_mask[r].extend(std::iter::repeat_n(0u8, pad));
            cache.key_mask[r].extend(std::iter::repeat_n(1u8, chunk.len()));
            cache.tokens[r].extend_from_slice(chunk);
        }
        let bias = self.attention_bias(&cache.key_mask, past, len)?;
        let flat = Tensor::from_vec(ids, b * len, &self.device)?;
        let opts = PassOptions {
            adapter,
            fused: true,
            dropout: false,
        };
        let hidden = self.forward_hidden(
            &flat,
            b,
            len,
            &positions,
            &bias,
            Some(&mut cache.layers),
            opts,
        )?;
        Ok(hidden.reshape((b, len, self.config.hidden_size))?)
    }
}

/// Picks one token from a row of logits.
fn sample(
    logits: &[f32],
    allowed: Option<&[u32]>,
    params: &SamplingParams,
    rng: &mut rand::rngs::StdRng,
) -> std::result::Result<u32, String> {
    let mut candidates: Vec<(u32, f32)> = match allowed {
        Some(list) => {
            if list.is_empty() {
                return Err("the token constraint allowed no token".into());
            }
            list.iter()
                .map(|&t| {
                    logits.get(t as usize).map(|&l| (t, l)).ok_or_else(|| {
                        format!("constraint allowed token {t}, outside the vocabulary")
                    })
                })
                .collect::<std::result::Result<_, _>>()?
        }
        None => logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect(),
    };
    if params.temperature <= 0.0 {
        // First maximum wins, so ties resolve to the lowest id like argmax elsewhere.
        let mut best = candidates[0];
        for &c in &candidates[1..] {
            if c.1 > best.1 || (c.1 == best.1 && c.0 < best.0) {
                best = c;
            }
        }
        return Ok(best.0);
    }
    candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if let Some(k) = params.top_k {
        candidates.truncate(k.max(1));
    }
    let max = candidates[0].1;
    let mut probs: Vec<f32> = candidates
        .iter()
        .map(|&(_, l)| ((l - max) / params.temperature).exp())
        .collect();
    let total: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(p) = params.top_p {
        let mut mass = 0.0;
        let mut keep = probs.len();
        for (i, &q) in probs.iter().enumerate() {
            mass += q;
            if mass >= p {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep);
        candidates.truncate(keep);
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);
    }
    let u: f32 = rng.random();
    let mut acc = 0.0;
    for (i, q) in probs.iter().enumerate() {
        acc += q;
        if u < acc {
            return Ok(candidates[i].0);
        }
    }
    Ok(candidates[candidates.len() - 1].0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_picks_argmax_within_allowed_set() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let logits = [0.1, 3.0, 2.0, -1.0];
        assert_eq!(sample(&logits, None, &params(0.0), &mut rng).unwrap(), 1);
        assert_eq!(
            sample(&logits, Some(&[2, 3]), &params(0.0), &mut rng).unwrap(),
            2
        );
        assert!(sample(&logits, Some(&[]), &params(0.0), &mut rng).is_err());
        assert!(sample(&logits, Some(&[9]), &params(0.0), &mut rng).is_err());
    }

    #[test]
    fn top_k_one_is_greedy_and_sampling_is_seeded() {
        let logits = [0.0, 1.0, 0.5, 0.9];
        let p = SamplingParams {
            temperature: 1.0,
            top_k: Some(1),
            ..Default::default()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for _ in 0..20 {
            assert_eq!(sample(&logits, None, &p, &mut rng).unwrap(), 1);
        }
        let p = params(1.0);
        let draw = |seed| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            (0..50)
                .map(|_| sample(&logits, None, &p, &mut rng).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        let d = draw(7);
        assert!(d.iter().any(|&t| t != d[0]), "temperature 1 should vary");
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // Probabilities ~ [0.64, 0.24, 0.09, 0.03]: p = 0.5 keeps only the first.
        let logits = [3.0, 2.0, 1.0, 0.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_p: Some(0.5),
            ..Default::default()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..20 {
            assert_eq!(sample(&logits, None, &p, &mut rng).unwrap(), 0);
        }
    }
}
