//! Shared fixtures: thin wrappers over `model::testing` (a tiny random model over a byte-level
//! vocabulary, its tokenizer, and GGUF writing), panicking on failure as tests may.
#![allow(dead_code)]

use candle_core::Tensor;
use model::{Arch, ChatTokenizer, ModelConfig};
use std::collections::HashMap;
use std::path::Path;

pub fn tiny_tokenizer() -> ChatTokenizer {
    model::testing::tiny_tokenizer().unwrap()
}

/// hidden 32, 2 layers, 4 query heads over 2 key/value heads (GQA), vocab 259.
pub fn tiny_config(arch: Arch, tied: bool) -> ModelConfig {
    model::testing::tiny_config(arch, tied, 256).unwrap()
}

/// Writes Hugging Face-named f32 `tensors` of a Llama `config` as a GGUF file.
pub fn write_llama_gguf(path: &Path, config: &ModelConfig, tensors: &HashMap<String, Tensor>) {
    model::testing::write_llama_gguf(path, config, tensors).unwrap()
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    model::testing::max_abs_diff(a, b).unwrap()
}

pub fn relative_diff(a: &Tensor, b: &Tensor) -> f32 {
    model::testing::max_relative_diff(a, b).unwrap()
}

pub fn ids(rows: &[&[u32]]) -> Tensor {
    let t = rows[0].len();
    let flat: Vec<u32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_vec(flat, (rows.len(), t), &candle_core::Device::Cpu).unwrap()
}
