//! `model`: a trainable Llama / Qwen2 decoder on candle with LoRA adapters.
//!
//! * [`Model`]: frozen base weights plus named LoRA [`Adapter`]s (several can share one base;
//!   `None` selects the bare base, the reference policy of a KL term). Loaded from Hugging Face
//!   safetensors directories or GGUF files ([`load`]); adapters saved and loaded in PEFT's format.
//! * Training: [`Model::forward_train`] / [`Model::policy_forward`] (differentiable with respect
//!   to the adapter), [`Gradients`] (accumulation, global-norm clipping), [`AdamW`].
//! * Inference: [`Model::generate`] / [`Model::generate_with_cache`] with a [`KvCache`] reusable
//!   across turns, sampling parameters, stop sequences and a [`TokenConstraint`] hook.
//! * [`ChatTokenizer`]: tokenizer + chat template, from `tokenizer.json` or GGUF metadata.
//! * [`fetch`]: pinned real weights (SmolLM2-135M-Instruct) placed in a local cache.

pub mod config;
pub mod error;
pub mod fetch;
mod frozen;
pub mod generate;
pub mod load;
pub mod lora;
pub mod model;
pub mod ops;
pub mod testing;
pub mod tokenizer;
pub mod train;

pub use candle_core::{DType, Device, Tensor, Var};
pub use config::{Arch, ModelConfig};
pub use error::{ModelError, Result};
pub use generate::{FinishReason, Generation, KvCache, SamplingParams, TokenConstraint};
pub use load::{load, load_gguf, load_safetensors_dir, LoadedModel};
pub use lora::{Adapter, LoraConfig, LoraPair, Projection, ValueHead};
pub use model::{random_hf_tensors, Model};
pub use tokenizer::{ChatMessage, ChatTokenizer};
pub use train::{
    entropy, gather_logprobs, log_softmax, masked_mean, AdamW, AdamWConfig, AdamWState, Gradients,
    PolicyOutput, StepReport,
};
