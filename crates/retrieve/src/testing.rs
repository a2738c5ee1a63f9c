//! A tiny random BERT embedder for tests: a whitespace word-level tokenizer that pads to
//! `TINY_LEN` tokens, and random weights, written as the three files [`crate::Embedder::load`]
//! reads.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use crate::{Result, RetrieveError};

/// The tiny tokenizer's fixed length.
pub const TINY_LEN: usize = 24;

const WORDS: &[&str] = &[
    "[PAD]", "[UNK]", "error", "tool", "failed", "call", "agent", "llm", "span", "ok", "status",
    "timeout", "retry", "schema", "memory", "plan", "answer", "in", "out", "the", "a", "of",
];

fn tok_err(e: impl std::fmt::Display) -> RetrieveError {
    RetrieveError::Tokenizer(e.to_string())
}

/// The tiny BERT's configuration.
pub fn tiny_config() -> Config {
    let json = serde_json::json!({
        "vocab_size": WORDS.len(),
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "max_position_embeddings": 64,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "classifier_dropout": null,
        "model_type": "bert"
    });
    serde_json::from_value(json).expect("a valid BERT config")
}

/// Writes `config.json`, `tokenizer.json` and `model.safetensors` of a random tiny embedder.
pub fn write_tiny_embedder(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| RetrieveError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let config = tiny_config();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    BertModel::load(vb, &config)?;
    varmap.save(dir.join("model.safetensors"))?;
    let config_json = serde_json::json!({
        "vocab_size": config.vocab_size, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 64, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0, "max_position_embeddings": 64, "type_vocab_size": 2,
        "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0,
        "model_type": "bert"
    });
    let p = dir.join("config.json");
    std::fs::write(&p, config_json.to_string())
        .map_err(|source| RetrieveError::Io { path: p, source })?;
    let vocab: HashMap<String, u32> = WORDS
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), i as u32))
        .collect();
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("[UNK]".into())
        .build()
        .map_err(tok_err)?;
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Whitespace {}));
    tokenizer.with_padding(Some(PaddingParams {
        strategy: PaddingStrategy::Fixed(TINY_LEN),
        pad_id: 0,
        pad_token: "[PAD]".into(),
        ..PaddingParams::default()
    }));
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: TINY_LEN,
            ..TruncationParams::default()
        }))
        .map_err(tok_err)?;
    tokenizer
        .save(dir.join("tokenizer.json"), false)
        .map_err(tok_err)?;
    Ok(())
}
