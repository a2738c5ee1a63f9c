//! Shared fixtures: a tiny random model over a byte-level vocabulary, its tokenizer, and a way
//! to write the same weights as a llama.cpp-style GGUF file.
#![allow(dead_code)]

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use model::{Arch, ChatTokenizer, ModelConfig};
use std::collections::HashMap;
use std::path::Path;

pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

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
        table[*b as usize] = char::from_u32(c).unwrap();
    }
    table
}

/// Three special tokens then the 256 byte symbols.
pub fn tokens() -> Vec<String> {
    let mut t: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    t.extend(bytes_to_unicode().into_iter().map(|c| c.to_string()));
    t
}

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
            V::String("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}".into()),
        ),
    ]
}

pub fn tiny_tokenizer() -> ChatTokenizer {
    let content = gguf_file::Content {
        magic: gguf_file::VersionedMagic::GgufV3,
        metadata: tokenizer_metadata().into_iter().collect(),
        tensor_infos: HashMap::new(),
        tensor_data_offset: 0,
    };
    ChatTokenizer::from_gguf_content("tiny", &content).unwrap()
}

/// hidden 32, 2 layers, 4 query heads over 2 key/value heads (GQA), vocab 259.
pub fn tiny_config(arch: Arch, tied: bool) -> ModelConfig {
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
        "max_position_embeddings": 256,
        "bos_token_id": 1,
        "eos_token_id": 2,
    });
    ModelConfig::from_hf_json("tiny", &json).unwrap()
}

/// llama.cpp's q/k row interleaving (the inverse of what the loader undoes).
fn permute_rows(t: &Tensor, heads: usize) -> Tensor {
    let dims = t.dims().to_vec();
    let hd = dims[0] / heads;
    let rest: usize = dims[1..].iter().product();
    t.reshape((heads, 2, hd / 2, rest))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape(dims)
        .unwrap()
}

/// Writes Hugging Face-named f32 `tensors` of a Llama `config` as a GGUF file the way
/// llama.cpp's converter lays them out, with the byte-level tokenizer in the metadata.
pub fn write_llama_gguf(path: &Path, config: &ModelConfig, tensors: &HashMap<String, Tensor>) {
    use gguf_file::Value as V;
    let mut md: Vec<(String, V)> = vec![
        ("general.architecture".into(), V::String("llama".into())),
        ("llama.block_count".into(), V::U32(config.num_layers as u32)),
        ("llama.context_length".into(), V::U32(256)),
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
    for (name, t) in tensors {
        let gguf = match name.as_str() {
            "model.embed_tokens.weight" => "token_embd.weight".to_string(),
            "model.norm.weight" => "output_norm.weight".to_string(),
            "lm_head.weight" => "output.weight".to_string(),
            other => {
                let rest = other.strip_prefix("model.layers.").unwrap();
                let (layer, rest) = rest.split_once('.').unwrap();
                let module = rest.strip_suffix(".weight").unwrap();
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
                    m => panic!("unexpected module {m}"),
                };
                format!("blk.{layer}.{g}.weight")
            }
        };
        let t = if gguf.ends_with("attn_q.weight") {
            permute_rows(t, config.num_heads)
        } else if gguf.ends_with("attn_k.weight") {
            permute_rows(t, config.num_kv_heads)
        } else {
            t.clone()
        };
        q.push((gguf, QTensor::quantize(&t, GgmlDType::F32).unwrap()));
    }
    let md_refs: Vec<(&str, &V)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = q.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &md_refs, &t_refs).unwrap();
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a.to_dtype(candle_core::DType::F32).unwrap() - b.to_dtype(candle_core::DType::F32).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

pub fn ids(rows: &[&[u32]]) -> Tensor {
    let t = rows[0].len();
    let flat: Vec<u32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_vec(flat, (rows.len(), t), &Device::Cpu).unwrap()
}
