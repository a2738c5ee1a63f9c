//! Tiny randomly initialised models and a byte-level ChatML tokenizer, for tests and smoke
//! runs of code that needs a model but not a good one (the trainer's end-to-end tests, the
//! CLI's). Nothing here is a trained model; nothing is downloaded.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Tensor};

use crate::config::{Arch, ModelConfig};
use crate::error::{ModelError, Result};
use crate::tokenizer::ChatTokenizer;

/// The special tokens, ids 0, 1 and 2.
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// The ChatML template SmolLM2 and Qwen2 use, without a default system prompt.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GPT-2's byte → printable character table, so every byte is one vocabulary entry.
fn bytes_to_unicode() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec![' '; 256];
    for (b, c) in bs.iter().zip(cs) {
        table[*b as usize] = char::from_u32(c).unwrap_or(' ');
    }
    table
}

/// Three special tokens then the 256 byte symbols.
pub fn tokens() -> Vec<String> {
    let mut t: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    t.extend(bytes_to_unicode().into_iter().map(|c| c.to_string()));
    t
}

/// GGUF tokenizer metadata of the byte-level vocabulary with the ChatML template.
pub fn tokenizer_metadata() -> Vec<(String, gguf_file::Value)> {
    use gguf_file::Value as V;
    let tokens = tokens();
    let mut types = vec![3i32; SPECIALS.len()];
    types.extend(std::iter::repeat_n(1, tokens.len() - SPECIALS.len()));
    vec![
        ("tokenizer.ggml.model".into(), V::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), V::String("smollm".into())),
        (
            "tokenizer.ggml.tokens".into(),
            V::Array(tokens.into_iter().map(V::String).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            V::Array(types.into_iter().map(V::I32).collect()),
        ),
        ("tokenizer.ggml.merges".into(), V::Array(vec![])),
        ("tokenizer.ggml.bos_token_id".into(), V::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), V::U32(2)),
        (
            "tokenizer.chat_template".into(),
            V::String(CHATML_TEMPLATE.into()),
        ),
    ]
}

/// The byte-level ChatML tokenizer (vocabulary 259).
pub fn tiny_tokenizer() -> Result<ChatTokenizer> {
    let content = gguf_file::Content {
        magic: gguf_file::VersionedMagic::GgufV3,
        metadata: tokenizer_metadata().into_iter().collect(),
        tensor_infos: HashMap::new(),
        tensor_data_offset: 0,
    };
    ChatTokenizer::from_gguf_content("tiny", &content)
}

/// Hidden 32, 2 layers, 4 query heads over 2 key/value heads (GQA), vocabulary 259, context
/// `context` tokens.
pub fn tiny_config(arch: Arch, tied: bool, context: usize) -> Result<ModelConfig> {
    let json = serde_json::json!({
        "model_type": arch.hf_name(),
        "vocab_size": tokens().len(),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": tied,
        "max_position_embeddings": context,
        "bos_token_id": 1,
        "eos_token_id": 2,
    });
    ModelConfig::from_hf_json("tiny", &json)
}

/// llama.cpp's q/k row interleaving (the inverse of what the loader undoes).
fn permute_rows(t: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let hd = dims[0] / heads;
    let rest: usize = dims[1..].iter().product();
    Ok(t.reshape((heads, 2, hd / 2, rest))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)?)
}

/// Writes Hugging Face-named f32 `tensors` of a Llama `config` as a GGUF file the way
/// llama.cpp's converter lays them out, with the byte-level tokenizer in the metadata.
pub fn write_llama_gguf(
    path: &Path,
    config: &ModelConfig,
    tensors: &HashMap<String, Tensor>,
) -> Result<()> {
    use gguf_file::Value as V;
    let mut md: Vec<(String, V)> = vec![
        ("general.architecture".into(), V::String("llama".into())),
        ("llama.block_count".into(), V::U32(config.num_layers as u32)),
        (
            "llama.context_length".into(),
            V::U32(config.max_position_embeddings as u32),
        ),
        (
            "llama.embedding_length".into(),
            V::U32(config.hidden_size as u32),
        ),
        (
            "llama.feed_forward_length".into(),
            V::U32(config.intermediate_size as u32),
        ),
        (
            "llama.attention.head_count".into(),
            V::U32(config.num_heads as u32),
        ),
        (
            "llama.attention.head_count_kv".into(),
            V::U32(config.num_kv_heads as u32),
        ),
        (
            "llama.rope.dimension_count".into(),
            V::U32(config.head_dim as u32),
        ),
        (
            "llama.rope.freq_base".into(),
            V::F32(config.rope_theta as f32),
        ),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            V::F32(config.rms_norm_eps as f32),
        ),
    ];
    md.extend(tokenizer_metadata());
    let mut q: Vec<(String, QTensor)> = vec![];
    let bad = |name: &str| ModelError::Weight {
        origin: path.display().to_string(),
        name: name.to_string(),
        reason: "not a Llama tensor name".into(),
    };
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    for name in names {
        let t = &tensors[name];
        let gguf = match name.as_str() {
            "model.embed_tokens.weight" => "token_embd.weight".to_string(),
            "model.norm.weight" => "output_norm.weight".to_string(),
            "lm_head.weight" => "output.weight".to_string(),
            other => {
                let rest = other
                    .strip_prefix("model.layers.")
                    .ok_or_else(|| bad(other))?;
                let (layer, rest) = rest.split_once('.').ok_or_else(|| bad(other))?;
                let module = rest.strip_suffix(".weight").ok_or_else(|| bad(other))?;
                let g = match module {
                    "input_layernorm" => "attn_norm",
                    "post_attention_layernorm" => "ffn_norm",
                    "self_attn.q_proj" => "attn_q",
                    "self_attn.k_proj" => "attn_k",
                    "self_attn.v_proj" => "attn_v",
                    "self_attn.o_proj" => "attn_output",
                    "mlp.gate_proj" => "ffn_gate",
                    "mlp.up_proj" => "ffn_up",
                    "mlp.down_proj" => "ffn_down",
                    _ => return Err(bad(other)),
                };
                format!("blk.{layer}.{g}.weight")
            }
        };
        let t = if gguf.ends_with("attn_q.weight") {
            permute_rows(t, config.num_heads)?
        } else if gguf.ends_with("attn_k.weight") {
            permute_rows(t, config.num_kv_heads)?
        } else {
            t.clone()
        };
        q.push((gguf, QTensor::quantize(&t, GgmlDType::F32)?));
    }
    let md_refs: Vec<(&str, &V)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = q.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).map_err(|e| ModelError::io(path, e))?;
    gguf_file::write(&mut f, &md_refs, &t_refs)?;
    Ok(())
}

/// Writes a tiny random Llama (seeded) with the byte-level ChatML tokenizer to `path`.
pub fn write_tiny_gguf(path: &Path, context: usize, seed: u64) -> Result<()> {
    let config = tiny_config(Arch::Llama, false, context)?;
    let tensors = crate::model::random_hf_tensors(&config, seed)?;
    write_llama_gguf(path, &config, &tensors)
}

/// The real SmolLM2-135M-Instruct GGUF for tests that need real weights: `$PATHFINDER_SMOLLM2_GGUF`
/// when set, else the model cache (`pathfinder model fetch smollm2-135m`); see
/// [`missing_weights`] for a missing file.
pub fn smollm2_weights() -> Option<std::path::PathBuf> {
    let path = match std::env::var_os("PATHFINDER_SMOLLM2_GGUF") {
        Some(p) => std::path::PathBuf::from(p),
        None => {
            let known = crate::fetch::known_model("smollm2-135m").expect("a known model");
            crate::fetch::cached_path(&crate::fetch::default_cache_dir(), known)
        }
    };
    if path.exists() {
        return Some(path);
    }
    missing_weights(&format!(
        "SmolLM2 weights not found at {} (run `pathfinder model fetch smollm2-135m` or set PATHFINDER_SMOLLM2_GGUF)",
        path.display()
    ))
}

/// What a real-weights test does when its weights are missing: under CI (`CI=true` or `CI=1`),
/// where `.ci/test` fetches them first, it panics with `msg`; elsewhere it prints why and
/// returns `None`, so that the caller skips.
pub fn missing_weights<T>(msg: &str) -> Option<T> {
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("{msg}");
    }
    eprintln!("skipping: {msg}");
    None
}

/// The largest absolute elementwise difference between two tensors of one shape, in f32.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok(max_abs_diff_f64(a, b)? as f32)
}

/// `max |a − b| / max(1, max |a|)`, both brought to the CPU first: for comparing two devices,
/// or two precisions, whose rounding differs in proportion to the values' size.
pub fn max_relative_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    let cpu = candle_core::Device::Cpu;
    let (a, b) = (a.to_device(&cpu)?, b.to_device(&cpu)?);
    let scale = a
        .to_dtype(DType::F64)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f64>()?;
    Ok((max_abs_diff_f64(&a, &b)? / scale.max(1.0)) as f32)
}

/// The largest `|a − b|`, computed in f64: for comparisons finer than f32 resolves (f64 models,
/// gradient checks, bit-for-bit reproductions), which [`max_abs_diff`] would round away.
pub fn max_abs_diff_f64(a: &Tensor, b: &Tensor) -> Result<f64> {
    Ok((a.to_dtype(DType::F64)? - b.to_dtype(DType::F64)?)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f64>()?)
}
