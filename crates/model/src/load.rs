//! Loading base weights: Hugging Face safetensors directories and GGUF files (dequantised).

use crate::config::{Arch, ModelConfig};
use crate::error::{ModelError, Result};
use crate::model::Model;
use crate::tokenizer::ChatTokenizer;
use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// A base model and its tokenizer, loaded together.
pub struct LoadedModel {
    pub model: Model,
    pub tokenizer: ChatTokenizer,
}

/// Loads `path`: a `.gguf` file or a Hugging Face model directory.
pub fn load(path: &Path, dtype: DType, device: &Device) -> Result<LoadedModel> {
    if path.is_dir() {
        Ok(LoadedModel {
            model: load_safetensors_dir(path, dtype, device)?,
            tokenizer: ChatTokenizer::from_dir(path)?,
        })
    } else {
        let (model, tokenizer) = load_gguf(path, dtype, device)?;
        Ok(LoadedModel { model, tokenizer })
    }
}

/// Loads a Hugging Face directory: `config.json` and either `model.safetensors` or the shards
/// listed in `model.safetensors.index.json`.
pub fn load_safetensors_dir(dir: &Path, dtype: DType, device: &Device) -> Result<Model> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: cfg_path.clone(),
        source: e,
    })?;
    let config = ModelConfig::from_hf_json(&cfg_path.display().to_string(), &json)?;
    let index_path = dir.join("model.safetensors.index.json");
    let files: Vec<PathBuf> = if index_path.exists() {
        let text =
            std::fs::read_to_string(&index_path).map_err(|e| ModelError::io(&index_path, e))?;
        let index: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ModelError::Json {
                path: index_path.clone(),
                source: e,
            })?;
        let map = index
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| {
                ModelError::config(
                    index_path.display().to_string(),
                    "weight_map",
                    "missing or not an object",
                )
            })?;
        let shards: BTreeSet<String> = map
            .values()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        shards.into_iter().map(|s| dir.join(s)).collect()
    } else {
        vec![dir.join("model.safetensors")]
    };
    let mut tensors = HashMap::new();
    for file in &files {
        if !file.exists() {
            return Err(ModelError::io(
                file,
                std::io::Error::new(std::io::ErrorKind::NotFound, "weight shard missing"),
            ));
        }
        tracing::debug!(file = %file.display(), "loading safetensors shard");
        let shard = candle_core::safetensors::load(file, &Device::Cpu)
            .map_err(|e| ModelError::weight(file.display().to_string(), "<file>", e.to_string()))?;
        tensors.extend(shard);
    }
    if config.tie_word_embeddings {
        tensors.remove("lm_head.weight");
    }
    let origin = dir.display().to_string();
    let mut model = Model::from_hf_tensors(config, tensors, dtype, device, &origin)?;
    model.source = origin;
    Ok(model)
}

/// GGUF tensor name → Hugging Face name.
fn hf_name(gguf: &str) -> Option<String> {
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, kind) = rest.rsplit_once('.')?;
    let hf_module = match module {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf_module}.{kind}"))
}

/// llama.cpp stores Llama's q/k rows interleaved per head (for its `rope_i` kernel); this
/// restores Hugging Face's half-split layout so RoPE is rotate-half and LoRA factors line up
/// with PEFT's.
fn unpermute_rows(t: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let rows = dims[0];
    let hd = rows / heads;
    let rest: usize = dims[1..].iter().product();
    Ok(t.reshape((heads, hd / 2, 2, rest))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)?)
}

/// Loads a GGUF file (llama or qwen2), dequantising every tensor to f32 then `dtype`, and its
/// embedded tokenizer.
pub fn load_gguf(path: &Path, dtype: DType, device: &Device) -> Result<(Model, ChatTokenizer)> {
    let origin = path.display().to_string();
    let mut file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let content = gguf_file::Content::read(&mut file)
        .map_err(|e| ModelError::weight(&origin, "<header>", e.to_string()))?;
    let config = ModelConfig::from_gguf(&origin, &content)?;
    let tokenizer = ChatTokenizer::from_gguf_content(&origin, &content)?;
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut tensors = HashMap::new();
    for name in names {
        let Some(hf) = hf_name(name) else {
            tracing::debug!(tensor = %name, "ignoring GGUF tensor with no Hugging Face counterpart");
            continue;
        };
        let q = content
            .tensor(&mut file, name, &Device::Cpu)
            .map_err(|e| ModelError::weight(&origin, name.as_str(), e.to_string()))?;
        let mut t = q
            .dequantize(&Device::Cpu)
            .map_err(|e| ModelError::weight(&origin, name.as_str(), e.to_string()))?;
        if config.arch == Arch::Llama {
            if hf.contains("self_attn.q_proj.") {
                t = unpermute_rows(&t, config.num_heads)?;
            } else if hf.contains("self_attn.k_proj.") {
                t = unpermute_rows(&t, config.num_kv_heads)?;
            }
        }
        tensors.insert(hf, t);
    }
    if config.tie_word_embeddings {
        tensors.remove("lm_head.weight");
    }
    let model = Model::from_hf_tensors(config, tensors, dtype, device, &origin)?;
    Ok((model, tokenizer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_gguf_names() {
        assert_eq!(
            hf_name("blk.7.attn_q.bias").as_deref(),
            Some("model.layers.7.self_attn.q_proj.bias")
        );
        assert_eq!(
            hf_name("blk.0.ffn_down.weight").as_deref(),
            Some("model.layers.0.mlp.down_proj.weight")
        );
        assert_eq!(hf_name("rope_freqs.weight"), None);
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permutation() {
        // llama.cpp: reshape(heads, 2, hd/2, in).swapaxes(1, 2).reshape(...)
        let heads = 2;
        let hd = 4;
        let w = Tensor::arange(0f32, (heads * hd * 3) as f32, &Device::Cpu)
            .unwrap()
            .reshape((heads * hd, 3))
            .unwrap();
        let permuted = w
            .reshape((heads, 2, hd / 2, 3))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
            .reshape((heads * hd, 3))
            .unwrap();
        let back = unpermute_rows(&permuted, heads).unwrap();
        assert_eq!(back.to_vec2::<f32>().unwrap(), w.to_vec2::<f32>().unwrap());
    }
}
