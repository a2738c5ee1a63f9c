//! Sentence embeddings with all-MiniLM-L6-v2 as sentence-transformers computes them: BERT's
//! last hidden states, mean-pooled over the attention mask, L2-normalised.

use std::path::Path;

use candle_core::{DType, Device, Tensor, D};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::Tokenizer;

use crate::{Result, RetrieveError};

/// Texts embedded per forward pass.
const BATCH: usize = 16;

/// A BERT sentence encoder with its tokenizer (whose padding and truncation settings, 128
/// tokens for all-MiniLM-L6-v2, decide the sequence length).
pub struct Embedder {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
}

fn file_err(path: &Path, reason: impl std::fmt::Display) -> RetrieveError {
    RetrieveError::File {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

impl Embedder {
    /// Loads `config.json`, `tokenizer.json` and `model.safetensors` from `dir`.
    pub fn load(dir: &Path, device: &Device) -> Result<Embedder> {
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path).map_err(|source| RetrieveError::Io {
            path: config_path.clone(),
            source,
        })?;
        let config: Config = serde_json::from_str(&text).map_err(|e| file_err(&config_path, e))?;
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer =
            Tokenizer::from_file(&tokenizer_path).map_err(|e| file_err(&tokenizer_path, e))?;
        let weights = dir.join("model.safetensors");
        let tensors =
            candle_core::safetensors::load(&weights, device).map_err(|e| file_err(&weights, e))?;
        let vb = VarBuilder::from_tensors(tensors, DType::F32, device);
        let model = BertModel::load(vb, &config).map_err(|e| file_err(&weights, e))?;
        Ok(Embedder::new(model, tokenizer, device.clone()))
    }

    pub fn new(model: BertModel, tokenizer: Tokenizer, device: Device) -> Embedder {
        Embedder {
            model,
            tokenizer,
            device,
        }
    }

    /// One unit vector per text.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(texts.len());
        for batch in texts.chunks(BATCH) {
            let encodings = self
                .tokenizer
                .encode_batch(batch.to_vec(), true)
                .map_err(|e| RetrieveError::Tokenizer(e.to_string()))?;
            let ids: Vec<Vec<u32>> = encodings.iter().map(|e| e.get_ids().to_vec()).collect();
            let masks: Vec<Vec<u32>> = encodings
                .iter()
                .map(|e| e.get_attention_mask().to_vec())
                .collect();
            out.extend(self.embed_ids(&ids, &masks)?);
        }
        Ok(out)
    }

    /// Embeds token ids with their attention masks (1: a token, 0: padding). Every row of one
    /// call must have the same length.
    pub fn embed_ids(&self, ids: &[Vec<u32>], masks: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let len = ids[0].len();
        if ids.len() != masks.len() || ids.iter().chain(masks).any(|r| r.len() != len) || len == 0 {
            return Err(RetrieveError::Tokenizer(
                "a batch's ids and masks must be non-empty rows of one length".into(),
            ));
        }
        let n = ids.len();
        let flat = |rows: &[Vec<u32>]| rows.iter().flatten().copied().collect::<Vec<u32>>();
        let input_ids = Tensor::from_vec(flat(ids), (n, len), &self.device)?;
        let mask = Tensor::from_vec(flat(masks), (n, len), &self.device)?;
        let type_ids = input_ids.zeros_like()?;
        let hidden = self.model.forward(&input_ids, &type_ids, Some(&mask))?;
        let pooled = l2_normalise(&mean_pool(&hidden, &mask)?)?;
        Ok(pooled.to_dtype(DType::F32)?.to_vec2::<f32>()?)
    }
}

/// The mean of `hidden` (batch, seq, dim) over the positions where `mask` (batch, seq) is 1.
pub fn mean_pool(hidden: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let mask = mask.to_dtype(hidden.dtype())?.unsqueeze(D::Minus1)?;
    let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
    let counts = mask.sum(1)?.clamp(1e-9, f64::MAX)?;
    Ok(summed.broadcast_div(&counts)?)
}

/// Each row of `x` (batch, dim) scaled to unit length.
pub fn l2_normalise(x: &Tensor) -> Result<Tensor> {
    let norm = x
        .sqr()?
        .sum_keepdim(D::Minus1)?
        .sqrt()?
        .clamp(1e-12, f64::MAX)?;
    Ok(x.broadcast_div(&norm)?)
}
