//! Architecture hyper-parameters, read from a Hugging Face `config.json` or GGUF metadata.

use crate::error::{ModelError, Result};
use candle_core::quantized::gguf_file;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The decoder families this crate implements. They differ only in where biases live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// Llama 2/3, SmolLM, Mistral-style: no biases unless `attention_bias`.
    Llama,
    /// Qwen2 / Qwen2.5: biases on q, k and v projections.
    Qwen2,
}

impl Arch {
    /// The `model_type` string Hugging Face uses.
    pub fn hf_name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }
}

/// Llama 3.1-style RoPE frequency scaling (`rope_scaling.rope_type == "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Llama3RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// Everything the forward pass needs to know about the architecture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3RopeScaling>,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// Bias on q, k and v projections (always true for Qwen2).
    pub qkv_bias: bool,
    /// Bias on the output projection (Llama `attention_bias`).
    pub o_bias: bool,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

fn field<'a>(origin: &str, json: &'a Value, name: &str) -> Result<&'a Value> {
    json.get(name)
        .ok_or_else(|| ModelError::config(origin, name, "missing"))
}

fn usize_field(origin: &str, json: &Value, name: &str) -> Result<usize> {
    field(origin, json, name)?
        .as_u64()
        .map(|v| v as usize)
        .ok_or_else(|| ModelError::config(origin, name, "expected a non-negative integer"))
}

fn opt_usize(origin: &str, json: &Value, name: &str) -> Result<Option<usize>> {
    match json.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|v| Some(v as usize))
            .ok_or_else(|| ModelError::config(origin, name, "expected a non-negative integer")),
    }
}

fn opt_f64(origin: &str, json: &Value, name: &str) -> Result<Option<f64>> {
    match json.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| ModelError::config(origin, name, "expected a number")),
    }
}

fn opt_bool(origin: &str, json: &Value, name: &str) -> Result<Option<bool>> {
    match json.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| ModelError::config(origin, name, "expected a boolean")),
    }
}

impl ModelConfig {
    /// Parses a Hugging Face `config.json` (`model_type` "llama" or "qwen2"); `origin` names the
    /// file in errors.
    pub fn from_hf_json(origin: &str, json: &Value) -> Result<Self> {
        let model_type = field(origin, json, "model_type")?
            .as_str()
            .ok_or_else(|| ModelError::config(origin, "model_type", "expected a string"))?;
        let arch = match model_type {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => {
                return Err(ModelError::config(
                    origin,
                    "model_type",
                    format!("unsupported architecture `{other}` (supported: llama, qwen2)"),
                ))
            }
        };
        let hidden_size = usize_field(origin, json, "hidden_size")?;
        let num_heads = usize_field(origin, json, "num_attention_heads")?;
        let num_kv_heads = opt_usize(origin, json, "num_key_value_heads")?.unwrap_or(num_heads);
        let head_dim =
            opt_usize(origin, json, "head_dim")?.unwrap_or(hidden_size / num_heads.max(1));
        let rope_scaling = match json.get("rope_scaling") {
            None | Some(Value::Null) => None,
            Some(rs) => {
                let kind = rs
                    .get("rope_type")
                    .or_else(|| rs.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if kind != "llama3" {
                    return Err(ModelError::config(
                        origin,
                        "rope_scaling.rope_type",
                        format!("unsupported RoPE scaling `{kind}` (supported: llama3)"),
                    ));
                }
                let o = format!("{origin}: rope_scaling");
                Some(Llama3RopeScaling {
                    factor: opt_f64(&o, rs, "factor")?.unwrap_or(8.0),
                    low_freq_factor: opt_f64(&o, rs, "low_freq_factor")?.unwrap_or(1.0),
                    high_freq_factor: opt_f64(&o, rs, "high_freq_factor")?.unwrap_or(4.0),
                    original_max_position_embeddings: opt_usize(
                        &o,
                        rs,
                        "original_max_position_embeddings",
                    )?
                    .unwrap_or(8192),
                })
            }
        };
        let attention_bias = opt_bool(origin, json, "attention_bias")?.unwrap_or(false);
        let eos_token_ids = match json.get("eos_token_id") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64().map(|v| v as u32).ok_or_else(|| {
                        ModelError::config(origin, "eos_token_id", "expected integers")
                    })
                })
                .collect::<Result<_>>()?,
            Some(v) => vec![v.as_u64().ok_or_else(|| {
                ModelError::config(origin, "eos_token_id", "expected an integer or a list")
            })? as u32],
        };
        let cfg = ModelConfig {
            arch,
            vocab_size: usize_field(origin, json, "vocab_size")?,
            hidden_size,
            intermediate_size: usize_field(origin, json, "intermediate_size")?,
            num_layers: usize_field(origin, json, "num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rope_theta: opt_f64(origin, json, "rope_theta")?.unwrap_or(10_000.0),
            rope_scaling,
            rms_norm_eps: opt_f64(origin, json, "rms_norm_eps")?.unwrap_or(1e-6),
            tie_word_embeddings: opt_bool(origin, json, "tie_word_embeddings")?.unwrap_or(false),
            qkv_bias: arch == Arch::Qwen2 || attention_bias,
            o_bias: arch == Arch::Llama && attention_bias,
            max_position_embeddings: opt_usize(origin, json, "max_position_embeddings")?
                .unwrap_or(4096),
            bos_token_id: opt_usize(origin, json, "bos_token_id")?.map(|v| v as u32),
            eos_token_ids,
        };
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// Writes the config back as a Hugging Face `config.json` value (used to hand the same
    /// architecture to other implementations, e.g. PEFT's `base_model` or parity tests).
    pub fn to_hf_json(&self) -> Value {
        let mut v = serde_json::json!({
            "model_type": self.arch.hf_name(),
            "architectures": [match self.arch { Arch::Llama => "LlamaForCausalLM", Arch::Qwen2 => "Qwen2ForCausalLM" }],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "sliding_window": self.max_position_embeddings,
            "max_window_layers": self.num_layers,
            "use_sliding_window": false,
        });
        if self.arch == Arch::Llama {
            v["attention_bias"] = Value::Bool(self.qkv_bias);
        }
        if let Some(bos) = self.bos_token_id {
            v["bos_token_id"] = bos.into();
        }
        if let Some(&eos) = self.eos_token_ids.first() {
            v["eos_token_id"] = eos.into();
        }
        if let Some(rs) = &self.rope_scaling {
            v["rope_scaling"] = serde_json::json!({
                "rope_type": "llama3",
                "factor": rs.factor,
                "low_freq_factor": rs.low_freq_factor,
                "high_freq_factor": rs.high_freq_factor,
                "original_max_position_embeddings": rs.original_max_position_embeddings,
            });
        }
        v
    }

    /// Reads the architecture from GGUF metadata (`general.architecture` = llama or qwen2).
    pub fn from_gguf(origin: &str, content: &gguf_file::Content) -> Result<Self> {
        let md = &content.metadata;
        let get = |key: &str| {
            md.get(key)
                .ok_or_else(|| ModelError::config(origin, key, "missing from GGUF metadata"))
        };
        let arch_name = get("general.architecture")?
            .to_string()
            .map_err(|e| ModelError::config(origin, "general.architecture", e.to_string()))?
            .clone();
        let arch = match arch_name.as_str() {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => {
                return Err(ModelError::config(
                    origin,
                    "general.architecture",
                    format!("unsupported architecture `{other}` (supported: llama, qwen2)"),
                ))
            }
        };
        let u = |key: &str| -> Result<usize> {
            let full = format!("{arch_name}.{key}");
            let v = get(&full)?;
            v.to_u64()
                .or_else(|_| v.to_u32().map(u64::from))
                .or_else(|_| v.to_i32().map(|x| x as u64))
                .map(|v| v as usize)
                .map_err(|e| ModelError::config(origin, &full, e.to_string()))
        };
        let f = |key: &str| -> Result<Option<f64>> {
            let full = format!("{arch_name}.{key}");
            match md.get(&full) {
                None => Ok(None),
                Some(v) => v
                    .to_f32()
                    .map(|x| Some(x as f64))
                    .or_else(|_| v.to_f64().map(Some))
                    .map_err(|e| ModelError::config(origin, &full, e.to_string())),
            }
        };
        let hidden_size = u("embedding_length")?;
        let num_heads = u("attention.head_count")?;
        let num_kv_heads = u("attention.head_count_kv").unwrap_or(num_heads);
        let head_dim = u("attention.key_length")
            .or_else(|_| u("rope.dimension_count"))
            .unwrap_or(hidden_size / num_heads.max(1));
        let vocab_size = match u("vocab_size") {
            Ok(v) => v,
            Err(_) => md
                .get("tokenizer.ggml.tokens")
                .and_then(|t| t.to_vec().ok())
                .map(|t| t.len())
                .ok_or_else(|| {
                    ModelError::config(origin, format!("{arch_name}.vocab_size"), "missing")
                })?,
        };
        let tid = |key: &str| md.get(key).and_then(|v| v.to_u32().ok());
        let has_output = content.tensor_infos.contains_key("output.weight");
        let cfg = ModelConfig {
            arch,
            vocab_size,
            hidden_size,
            intermediate_size: u("feed_forward_length")?,
            num_layers: u("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rope_theta: f("rope.freq_base")?.unwrap_or(10_000.0),
            rope_scaling: None,
            rms_norm_eps: f("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6),
            tie_word_embeddings: !has_output,
            qkv_bias: content.tensor_infos.contains_key("blk.0.attn_q.bias"),
            o_bias: content.tensor_infos.contains_key("blk.0.attn_output.bias"),
            max_position_embeddings: u("context_length").unwrap_or(4096),
            bos_token_id: tid("tokenizer.ggml.bos_token_id"),
            eos_token_ids: tid("tokenizer.ggml.eos_token_id").into_iter().collect(),
        };
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// Rejects configurations the forward pass cannot run.
    pub fn validate(&self, origin: &str) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(ModelError::config(origin, name, "must be positive"));
            }
        }
        if self.num_heads % self.num_kv_heads != 0 {
            return Err(ModelError::config(
                origin,
                "num_key_value_heads",
                format!(
                    "{} query heads are not a multiple of {} key/value heads",
                    self.num_heads, self.num_kv_heads
                ),
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(ModelError::config(
                origin,
                "head_dim",
                "must be even for RoPE",
            ));
        }
        Ok(())
    }

    /// RoPE inverse frequencies (`head_dim / 2` of them), with Llama 3 scaling applied.
    pub fn inv_freq(&self) -> Vec<f32> {
        let half = self.head_dim / 2;
        (0..half)
            .map(|i| {
                let base = 1.0 / self.rope_theta.powf(2.0 * i as f64 / self.head_dim as f64);
                match &self.rope_scaling {
                    None => base as f32,
                    Some(rs) => {
                        let low_wavelen =
                            rs.original_max_position_embeddings as f64 / rs.low_freq_factor;
                        let high_wavelen =
                            rs.original_max_position_embeddings as f64 / rs.high_freq_factor;
                        let wavelen = 2.0 * std::f64::consts::PI / base;
                        if wavelen < high_wavelen {
                            base as f32
                        } else if wavelen > low_wavelen {
                            (base / rs.factor) as f32
                        } else {
                            let smooth = (rs.original_max_position_embeddings as f64 / wavelen
                                - rs.low_freq_factor)
                                / (rs.high_freq_factor - rs.low_freq_factor);
                            ((1.0 - smooth) * base / rs.factor + smooth * base) as f32
                        }
                    }
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_qwen2_config_with_bias_and_defaults() {
        let json = serde_json::json!({
            "model_type": "qwen2", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "tie_word_embeddings": true, "eos_token_id": [5, 6]
        });
        let cfg = ModelConfig::from_hf_json("config.json", &json).unwrap();
        assert_eq!(cfg.arch, Arch::Qwen2);
        assert!(cfg.qkv_bias && !cfg.o_bias);
        assert_eq!(cfg.head_dim, 8);
        assert_eq!(cfg.eos_token_ids, vec![5, 6]);
        let back = ModelConfig::from_hf_json("x", &cfg.to_hf_json()).unwrap();
        assert_eq!(back.arch, cfg.arch);
        assert_eq!(back.num_kv_heads, 2);
    }

    #[test]
    fn rejects_bad_head_counts_with_field_name() {
        let json = serde_json::json!({
            "model_type": "llama", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 3
        });
        let err = ModelConfig::from_hf_json("cfg.json", &json)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cfg.json") && err.contains("num_key_value_heads"),
            "{err}"
        );
        let json = serde_json::json!({"model_type": "gpt2"});
        let err = ModelConfig::from_hf_json("c", &json)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unsupported architecture"), "{err}");
    }
}
