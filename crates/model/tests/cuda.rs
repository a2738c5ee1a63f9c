//! The CUDA backend against the CPU, on the same random weights and the same batch: forward
//! logits, cached decoding, every LoRA gradient, and AdamW steps agree within stated
//! tolerances. Built only with `--features cuda` and run on a GPU machine by
//! `bench/gpu-check.sh`; on a build with the feature and no GPU every test fails, saying so.
//!
//! Tolerances are relative to the largest magnitude compared, because cuBLAS sums in another
//! order than the CPU GEMM: f32 within 1e-4, gradients within 1e-3, bf16 within 5e-2.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use model::{masked_mean, AdamW, AdamWConfig, Arch, Gradients, KvCache, LoraConfig, Model};

fn gpu() -> Device {
    Device::new_cuda(0).expect("no CUDA device: these tests need a GPU (bench/gpu-check.sh)")
}

/// The same random model on `device`, with a rank-4 adapter whose B is non-zero (so the
/// adapter changes the output) and a value head with non-zero weights.
fn pair_of_models(arch: Arch, dtype: DType, device: &Device) -> Model {
    let cfg = tiny_config(arch, false);
    let mut m = Model::random(cfg, dtype, device, 31).unwrap();
    m.add_adapter(
        "a",
        LoraConfig {
            rank: 4,
            alpha: 8.0,
            ..Default::default()
        },
        5,
    )
    .unwrap();
    m.add_value_head("a").unwrap();
    let adapter = m.adapter("a").unwrap();
    for (i, (_, pair)) in adapter.pairs().enumerate() {
        // A fixed pattern, so that both devices get the same values.
        let n = pair.b.elem_count();
        let pattern: Vec<f32> = (0..n)
            .map(|k| (((k * 7 + i * 13) % 17) as f32 - 8.0) / 40.0)
            .collect();
        let b = Tensor::from_vec(pattern, pair.b.dims(), &Device::Cpu).unwrap();
        pair.b
            .set(
                &b.to_dtype(pair.b.dtype())
                    .unwrap()
                    .to_device(device)
                    .unwrap(),
            )
            .unwrap();
    }
    let vh = adapter.value_head().unwrap();
    let n = vh.weight.elem_count();
    let w: Vec<f32> = (0..n).map(|k| ((k % 5) as f32 - 2.0) / 10.0).collect();
    let w = Tensor::from_vec(w, vh.weight.dims(), &Device::Cpu).unwrap();
    vh.weight
        .set(
            &w.to_dtype(vh.weight.dtype())
                .unwrap()
                .to_device(device)
                .unwrap(),
        )
        .unwrap();
    m
}

fn batch(device: &Device) -> (Tensor, Tensor) {
    let tokens = ids(&[
        &[0, 0, 1, 40, 77, 120, 5, 9, 31, 250],
        &[1, 33, 91, 12, 200, 7, 64, 3, 18, 2],
    ]);
    let mask = ids(&[&[0, 0, 1, 1, 1, 1, 1, 1, 1, 1], &[1; 10]]);
    (
        tokens.to_device(device).unwrap(),
        mask.to_device(device).unwrap(),
    )
}

fn objective(m: &Model, ids: &Tensor, mask: &Tensor) -> Tensor {
    let out = m.policy_forward(ids, mask, Some("a"), true).unwrap();
    let weights = Tensor::arange(
        0f32,
        out.logprobs.elem_count() as f32,
        out.logprobs.device(),
    )
    .unwrap()
    .reshape(out.logprobs.dims())
    .unwrap()
    .affine(0.05, -0.4)
    .unwrap()
    .to_dtype(out.logprobs.dtype())
    .unwrap();
    let lp = (out.logprobs * &weights).unwrap().sum_all().unwrap();
    let ent = (out.entropy.unwrap() * 0.3).unwrap().sum_all().unwrap();
    let val = (out.values.unwrap() * &weights).unwrap().sum_all().unwrap();
    ((lp + ent).unwrap() + val).unwrap()
}

#[test]
fn forward_logits_on_cuda_match_the_cpu() {
    let gpu = gpu();
    for arch in [Arch::Llama, Arch::Qwen2] {
        let cpu_m = pair_of_models(arch, DType::F32, &Device::Cpu);
        let gpu_m = pair_of_models(arch, DType::F32, &gpu);
        for adapter in [None, Some("a")] {
            let (ids_c, mask_c) = batch(&Device::Cpu);
            let (ids_g, mask_g) = batch(&gpu);
            let c = cpu_m
                .forward_train_with(&ids_c, &mask_c, adapter)
                .unwrap()
                .0;
            let g = gpu_m
                .forward_train_with(&ids_g, &mask_g, adapter)
                .unwrap()
                .0;
            let d = relative_diff(&c, &g);
            assert!(d < 1e-4, "{arch:?} adapter {adapter:?}: relative diff {d}");
        }
    }
}

#[test]
fn cached_decoding_on_cuda_matches_the_cpu() {
    let gpu = gpu();
    let cpu_m = pair_of_models(Arch::Llama, DType::F32, &Device::Cpu);
    let gpu_m = pair_of_models(Arch::Llama, DType::F32, &gpu);
    let prompts = vec![vec![1u32, 40, 77, 120, 5], vec![1u32, 9, 31]];
    let mut cc = KvCache::new(&cpu_m, 2);
    let mut gc = KvCache::new(&gpu_m, 2);
    let mut c = cpu_m.feed(&mut cc, &prompts).unwrap();
    let mut g = gpu_m.feed(&mut gc, &prompts).unwrap();
    for step in 0..6 {
        let d = relative_diff(&c, &g);
        assert!(d < 1e-4, "decode step {step}: relative diff {d}");
        // Both sides continue with the CPU's choice, so a near-tie cannot fork them.
        let next = c.argmax(1).unwrap().to_vec1::<u32>().unwrap();
        let chunks: Vec<Vec<u32>> = next.into_iter().map(|t| vec![t]).collect();
        c = cpu_m.feed(&mut cc, &chunks).unwrap();
        g = gpu_m.feed(&mut gc, &chunks).unwrap();
    }
}

#[test]
fn every_lora_gradient_on_cuda_matches_the_cpu() {
    let gpu = gpu();
    let cpu_m = pair_of_models(Arch::Qwen2, DType::F32, &Device::Cpu);
    let gpu_m = pair_of_models(Arch::Qwen2, DType::F32, &gpu);
    let (ids_c, mask_c) = batch(&Device::Cpu);
    let (ids_g, mask_g) = batch(&gpu);
    let cpu_vars = cpu_m.trainable_vars("a").unwrap();
    let gpu_vars = gpu_m.trainable_vars("a").unwrap();
    let mut cg = Gradients::new(cpu_vars.clone());
    let mut gg = Gradients::new(gpu_vars.clone());
    cg.accumulate(&objective(&cpu_m, &ids_c, &mask_c)).unwrap();
    gg.accumulate(&objective(&gpu_m, &ids_g, &mask_g)).unwrap();
    assert!(
        gg.missing().is_empty(),
        "no CUDA gradient for {:?}",
        gg.missing()
    );
    for i in 0..cpu_vars.len() {
        let d = relative_diff(cg.get(i).unwrap(), gg.get(i).unwrap());
        assert!(d < 1e-3, "parameter {i}: relative diff {d}");
    }
}

#[test]
fn adamw_steps_on_cuda_match_the_cpu_and_lower_the_loss() {
    let gpu = gpu();
    let nll = |m: &Model, dev: &Device| {
        let (ids, mask) = batch(dev);
        let out = m.policy_forward(&ids, &mask, Some("a"), false).unwrap();
        masked_mean(&out.logprobs, &out.valid)
            .unwrap()
            .neg()
            .unwrap()
    };
    let scalar = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_scalar::<f32>().unwrap();
    let mut losses = vec![];
    let mut weights = vec![];
    for dev in [Device::Cpu, gpu] {
        let m = pair_of_models(Arch::Llama, DType::F32, &dev);
        let vars = m.trainable_vars("a").unwrap();
        let mut opt = AdamW::new(
            vars.clone(),
            AdamWConfig {
                lr: 1e-2,
                ..Default::default()
            },
        )
        .unwrap();
        let mut grads = Gradients::new(vars.clone());
        let mut curve = vec![];
        for _ in 0..5 {
            grads.reset();
            let loss = nll(&m, &dev);
            curve.push(scalar(&loss));
            grads.accumulate(&loss).unwrap();
            grads.clip_global_norm(1.0).unwrap();
            opt.step(&grads).unwrap();
        }
        curve.push(scalar(&nll(&m, &dev)));
        losses.push(curve);
        weights.push(vars);
    }
    let (cpu, gpu) = (&losses[0], &losses[1]);
    assert!(gpu[5] < gpu[0] - 0.05, "CUDA loss did not fall: {gpu:?}");
    for (c, g) in cpu.iter().zip(gpu) {
        assert!(
            (c - g).abs() < 1e-3 * c.abs().max(1.0),
            "losses {cpu:?} vs {gpu:?}"
        );
    }
    for (i, (c, g)) in weights[0].iter().zip(&weights[1]).enumerate() {
        let d = relative_diff(c.as_tensor(), g.as_tensor());
        assert!(d < 1e-3, "parameter {i} after 5 steps: relative diff {d}");
    }
}

#[test]
fn bf16_on_cuda_stays_near_the_f32_cpu_and_trains() {
    let gpu = gpu();
    let cpu_m = pair_of_models(Arch::Llama, DType::F32, &Device::Cpu);
    let gpu_m = pair_of_models(Arch::Llama, DType::BF16, &gpu);
    let (ids_c, mask_c) = batch(&Device::Cpu);
    let (ids_g, mask_g) = batch(&gpu);
    let c = cpu_m
        .forward_train_with(&ids_c, &mask_c, Some("a"))
        .unwrap()
        .0;
    let g = gpu_m
        .forward_train_with(&ids_g, &mask_g, Some("a"))
        .unwrap()
        .0;
    let d = relative_diff(&c, &g);
    assert!(d < 5e-2, "bf16 relative diff {d}");
    let vars = gpu_m.trainable_vars("a").unwrap();
    let mut grads = Gradients::new(vars);
    grads
        .accumulate(&objective(&gpu_m, &ids_g, &mask_g))
        .unwrap();
    assert!(
        grads.missing().is_empty(),
        "bf16 CUDA lacks gradients for {:?}",
        grads.missing()
    );
    assert!(grads.global_norm().unwrap().is_finite());
}
