//! Logits parity with candle-transformers' own Llama, Qwen2 and quantized (GGUF) Llama on the
//! same weights, adapters off; and agreement of this crate's training path, inference path,
//! padding and KV cache with each other.

mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use common::*;
use model::{Arch, KvCache, Model};

const TOL: f32 = 1e-4;
const SEQ: [u32; 9] = [1, 40, 77, 120, 5, 200, 33, 91, 12];

/// Our logits for one unpadded row: (seq, vocab).
fn our_logits(m: &Model, seq: &[u32]) -> Tensor {
    let ids = ids(&[seq]);
    let mask = Tensor::ones(ids.dims(), DType::U32, &Device::Cpu).unwrap();
    let (logits, _) = m.forward_train(&ids, &mask).unwrap();
    logits.squeeze(0).unwrap()
}

#[test]
fn llama_matches_candle_transformers() {
    for tied in [false, true] {
        let cfg = tiny_config(Arch::Llama, tied);
        let tensors = model::random_hf_tensors(&cfg, 11).unwrap();
        let ours =
            Model::from_hf_tensors(cfg.clone(), tensors.clone(), DType::F32, &Device::Cpu, "t")
                .unwrap();
        let ct_cfg: candle_transformers::models::llama::LlamaConfig =
            serde_json::from_value(cfg.to_hf_json()).unwrap();
        let ct_cfg = ct_cfg.into_config(false);
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
        let theirs = candle_transformers::models::llama::Llama::load(vb, &ct_cfg).unwrap();
        let mut cache =
            candle_transformers::models::llama::Cache::new(true, DType::F32, &ct_cfg, &Device::Cpu)
                .unwrap();
        let mine = our_logits(&ours, &SEQ);
        for (pos, &tok) in SEQ.iter().enumerate() {
            let x = Tensor::new(&[[tok]], &Device::Cpu).unwrap();
            let reference = theirs
                .forward(&x, pos, &mut cache)
                .unwrap()
                .squeeze(0)
                .unwrap();
            let got = mine.get(pos).unwrap();
            let diff = max_abs_diff(&got, &reference);
            assert!(
                diff <= TOL,
                "tied={tied} position {pos}: max abs diff {diff}"
            );
        }
    }
}

#[test]
fn qwen2_matches_candle_transformers() {
    let cfg = tiny_config(Arch::Qwen2, true);
    assert!(cfg.qkv_bias);
    let tensors = model::random_hf_tensors(&cfg, 12).unwrap();
    let ours = Model::from_hf_tensors(cfg.clone(), tensors.clone(), DType::F32, &Device::Cpu, "t")
        .unwrap();
    let ct_cfg: candle_transformers::models::qwen2::Config =
        serde_json::from_value(cfg.to_hf_json()).unwrap();
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
    let mut theirs =
        candle_transformers::models::qwen2::ModelForCausalLM::new(&ct_cfg, vb).unwrap();
    let mine = our_logits(&ours, &SEQ);
    for (pos, &tok) in SEQ.iter().enumerate() {
        let x = Tensor::new(&[[tok]], &Device::Cpu).unwrap();
        let reference = theirs
            .forward(&x, pos)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .squeeze(0)
            .unwrap();
        let diff = max_abs_diff(&mine.get(pos).unwrap(), &reference);
        assert!(diff <= TOL, "position {pos}: max abs diff {diff}");
    }
}

#[test]
fn gguf_loading_matches_candle_quantized_llama_and_safetensors() {
    let cfg = tiny_config(Arch::Llama, false);
    let tensors = model::random_hf_tensors(&cfg, 13).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_llama_gguf(&path, &cfg, &tensors);
    let (ours, tok) = model::load_gguf(&path, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(ours.config().num_kv_heads, 2);
    assert_eq!(tok.eos_token_ids(), &[2]);
    // Same weights straight from Hugging Face names: the GGUF q/k un-permutation must be exact.
    let direct =
        Model::from_hf_tensors(cfg.clone(), tensors, DType::F32, &Device::Cpu, "t").unwrap();
    let mine = our_logits(&ours, &SEQ);
    let diff = max_abs_diff(&mine, &our_logits(&direct, &SEQ));
    assert!(diff <= 1e-6, "gguf vs safetensors-named weights: {diff}");

    let mut f = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
    let mut theirs = candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
        content,
        &mut f,
        &Device::Cpu,
    )
    .unwrap();
    for (pos, &tok) in SEQ.iter().enumerate() {
        let x = Tensor::new(&[[tok]], &Device::Cpu).unwrap();
        let reference = theirs.forward(&x, pos).unwrap().squeeze(0).unwrap();
        let diff = max_abs_diff(&mine.get(pos).unwrap(), &reference);
        assert!(diff <= TOL, "position {pos}: max abs diff {diff}");
    }
}

#[test]
fn safetensors_directory_round_trip() {
    let cfg = tiny_config(Arch::Qwen2, false);
    let tensors = model::random_hf_tensors(&cfg, 14).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_string(&cfg.to_hf_json()).unwrap(),
    )
    .unwrap();
    // Two shards plus an index, as large checkpoints are published.
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let (first, second) = names.split_at(names.len() / 2);
    let mut weight_map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", first),
        ("model-00002-of-00002.safetensors", second),
    ] {
        let shard: std::collections::HashMap<String, Tensor> = part
            .iter()
            .map(|n| ((*n).clone(), tensors[*n].clone()))
            .collect();
        candle_core::safetensors::save(&shard, dir.path().join(file)).unwrap();
        for n in part {
            weight_map.insert((*n).clone(), file.into());
        }
    }
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();
    let loaded = model::load_safetensors_dir(dir.path(), DType::F32, &Device::Cpu).unwrap();
    let direct = Model::from_hf_tensors(cfg, tensors, DType::F32, &Device::Cpu, "t").unwrap();
    assert_eq!(
        max_abs_diff(&our_logits(&loaded, &SEQ), &our_logits(&direct, &SEQ)),
        0.0
    );

    // A missing shard is named in the error.
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let err = model::load_safetensors_dir(dir.path(), DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(err.contains("model-00002-of-00002.safetensors"), "{err}");
}

#[test]
fn padding_left_or_right_does_not_change_real_token_logits() {
    let cfg = tiny_config(Arch::Llama, true);
    let m = Model::random(cfg, DType::F32, &Device::Cpu, 15).unwrap();
    let short = &SEQ[..5];
    let alone = our_logits(&m, short);
    let full = our_logits(&m, &SEQ);
    let batch_ids = ids(&[
        &[0, 0, 0, 0, 1, 40, 77, 120, 5],
        &SEQ,
        &[1, 40, 77, 120, 5, 0, 0, 0, 0],
    ]);
    let mask = ids(&[
        &[0, 0, 0, 0, 1, 1, 1, 1, 1],
        &[1; 9],
        &[1, 1, 1, 1, 1, 0, 0, 0, 0],
    ]);
    let (logits, _) = m.forward_train(&batch_ids, &mask).unwrap();
    let left = logits.get(0).unwrap().narrow(0, 4, 5).unwrap();
    let right = logits.get(2).unwrap().narrow(0, 0, 5).unwrap();
    assert!(max_abs_diff(&left, &alone) <= 1e-5);
    assert!(max_abs_diff(&right, &alone) <= 1e-5);
    assert!(max_abs_diff(&logits.get(1).unwrap(), &full) <= 1e-5);
}

#[test]
fn kv_cache_inference_path_matches_training_path_with_adapter() {
    // The inference path uses candle's fused softmax / rms-norm / rope kernels; it must agree
    // with the differentiable path, including a non-trivial adapter and chunked pre-fill.
    let cfg = tiny_config(Arch::Qwen2, false);
    let mut m = Model::random(cfg, DType::F32, &Device::Cpu, 16).unwrap();
    m.add_adapter("a", model::LoraConfig::default(), 1).unwrap();
    for (_, pair) in m.adapter("a").unwrap().pairs() {
        let b = Tensor::randn(0f32, 0.05, pair.b.dims(), &Device::Cpu).unwrap();
        pair.b.set(&b).unwrap();
    }
    m.set_active_adapter(Some("a")).unwrap();
    let full = our_logits(&m, &SEQ);
    let mut cache = KvCache::new(&m, 1);
    let first = m.feed(&mut cache, &[SEQ[..4].to_vec()]).unwrap();
    assert!(max_abs_diff(&first.get(0).unwrap(), &full.get(3).unwrap()) <= 1e-5);
    for (pos, &tok) in SEQ.iter().enumerate().skip(4) {
        let step = m.feed(&mut cache, &[vec![tok]]).unwrap();
        let diff = max_abs_diff(&step.get(0).unwrap(), &full.get(pos).unwrap());
        assert!(diff <= 1e-5, "position {pos}: {diff}");
    }
}

#[test]
fn bf16_forward_tracks_f32() {
    let cfg = tiny_config(Arch::Llama, true);
    let tensors = model::random_hf_tensors(&cfg, 17).unwrap();
    let f32m = Model::from_hf_tensors(cfg.clone(), tensors.clone(), DType::F32, &Device::Cpu, "t")
        .unwrap();
    let bf16m = Model::from_hf_tensors(cfg, tensors, DType::BF16, &Device::Cpu, "t").unwrap();
    let a = our_logits(&f32m, &SEQ);
    let b = our_logits(&bf16m, &SEQ);
    assert_eq!(b.dtype(), DType::BF16);
    let scale = a
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let diff = max_abs_diff(&a, &b);
    assert!(
        diff <= 0.05 * scale.max(1e-3),
        "bf16 drifted: {diff} (logit scale {scale})"
    );
}
