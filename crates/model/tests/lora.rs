//! LoRA correctness: gradients against finite differences for every adapted projection,
//! zero-init no-op, PEFT save/load round trip, merge, adapter switching, and AdamW lowering
//! a fixed batch's loss while the base stays frozen.

mod common;

use candle_core::{DType, Device, Tensor, Var};
use common::*;
use model::{masked_mean, AdamW, AdamWConfig, Arch, Gradients, LoraConfig, Model, Projection};
use rand::{Rng, SeedableRng};

fn batch() -> (Tensor, Tensor) {
    let ids = ids(&[
        &[0, 0, 1, 40, 77, 120, 5, 9],
        &[1, 33, 91, 12, 200, 7, 64, 3],
    ]);
    let mask = ids_mask(&[&[0, 0, 1, 1, 1, 1, 1, 1], &[1; 8]]);
    (ids, mask)
}

fn ids_mask(rows: &[&[u32]]) -> Tensor {
    ids(rows)
}

fn randomize_b(m: &Model, name: &str, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for (_, pair) in m.adapter(name).unwrap().pairs() {
        let n = pair.b.elem_count();
        let data: Vec<f64> = (0..n).map(|_| rng.random_range(-0.2..0.2)).collect();
        let t = Tensor::from_vec(data, pair.b.dims(), &Device::Cpu)
            .unwrap()
            .to_dtype(pair.b.dtype())
            .unwrap();
        pair.b.set(&t).unwrap();
    }
}

fn logits_with(m: &Model, adapter: Option<&str>) -> Tensor {
    let (ids, mask) = batch();
    m.forward_train_with(&ids, &mask, adapter).unwrap().0
}

/// A scalar depending on log-probs, entropies and values, weighted so no term cancels.
fn objective(m: &Model, weights: &Tensor) -> Tensor {
    let (ids, mask) = batch();
    let out = m.policy_forward(&ids, &mask, Some("a"), true).unwrap();
    let lp = (out.logprobs * weights).unwrap().sum_all().unwrap();
    let ent = (out.entropy.unwrap() * 0.3).unwrap().sum_all().unwrap();
    let val = (out.values.unwrap() * weights).unwrap().sum_all().unwrap();
    ((lp + ent).unwrap() + val).unwrap()
}

fn scalar(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
}

fn perturb(var: &Var, index: usize, delta: f64) {
    let dims = var.dims().to_vec();
    let mut data = var
        .as_tensor()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    data[index] += delta;
    var.set(&Tensor::from_vec(data, dims, &Device::Cpu).unwrap())
        .unwrap();
}

#[test]
fn lora_gradients_match_finite_differences_for_every_projection() {
    let cfg = tiny_config(Arch::Qwen2, false);
    let mut m = Model::random(cfg, DType::F64, &Device::Cpu, 21).unwrap();
    m.add_adapter(
        "a",
        LoraConfig {
            rank: 2,
            alpha: 4.0,
            ..Default::default()
        },
        5,
    )
    .unwrap();
    m.add_value_head("a").unwrap();
    randomize_b(&m, "a", 6);
    let vh = m.adapter("a").unwrap().value_head().unwrap().clone();
    vh.weight
        .set(&Tensor::randn(0f64, 0.3, (1, 32), &Device::Cpu).unwrap())
        .unwrap();
    let weights = Tensor::randn(0f64, 1.0, (2, 8), &Device::Cpu).unwrap();

    let vars = m.trainable_vars("a").unwrap();
    let mut grads = Gradients::new(vars.clone());
    grads.accumulate(&objective(&m, &weights)).unwrap();
    assert!(
        grads.missing().is_empty(),
        "no gradient for params {:?}",
        grads.missing()
    );

    let adapter = m.adapter("a").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut checked = std::collections::BTreeSet::new();
    let eps = 1e-5;
    for (i, var) in vars.iter().enumerate() {
        let grad = grads
            .get(i)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        for _ in 0..2 {
            let idx = rng.random_range(0..var.elem_count());
            perturb(var, idx, eps);
            let up = scalar(&objective(&m, &weights));
            perturb(var, idx, -2.0 * eps);
            let down = scalar(&objective(&m, &weights));
            perturb(var, idx, eps);
            let numeric = (up - down) / (2.0 * eps);
            let err = (numeric - grad[idx]).abs() / numeric.abs().max(grad[idx].abs()).max(1e-3);
            assert!(
                err < 1e-5,
                "param {i} element {idx}: analytic {} vs numeric {numeric}",
                grad[idx]
            );
        }
    }
    for ((layer, proj), _) in adapter.pairs() {
        checked.insert((*layer, *proj));
    }
    // Every projection of every layer was adapted and checked (A and B each).
    assert_eq!(checked.len(), 2 * Projection::ALL.len());
    assert_eq!(vars.len(), 2 * 2 * Projection::ALL.len() + 2);
}

#[test]
fn zero_initialised_lora_leaves_logits_unchanged() {
    let cfg = tiny_config(Arch::Llama, true);
    let mut m = Model::random(cfg, DType::F32, &Device::Cpu, 22).unwrap();
    m.add_adapter("a", LoraConfig::default(), 1).unwrap();
    let base = logits_with(&m, None);
    assert_eq!(max_abs_diff(&base, &logits_with(&m, Some("a"))), 0.0);
    randomize_b(&m, "a", 2);
    assert!(max_abs_diff(&base, &logits_with(&m, Some("a"))) > 1e-3);
}

#[test]
fn peft_save_then_load_reproduces_logits_exactly() {
    let cfg = tiny_config(Arch::Qwen2, false);
    let mut m = Model::random(cfg.clone(), DType::F32, &Device::Cpu, 23).unwrap();
    let lcfg = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.05,
        target_modules: vec![Projection::Q, Projection::V, Projection::Down],
        use_rslora: false,
    };
    m.add_adapter("a", lcfg.clone(), 3).unwrap();
    m.add_value_head("a").unwrap();
    randomize_b(&m, "a", 4);
    let dir = tempfile::tempdir().unwrap();
    m.save_adapter("a", dir.path()).unwrap();

    // PEFT's file layout and names.
    let cfg_json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cfg_json["peft_type"], "LORA");
    assert_eq!(cfg_json["r"], 4);
    assert_eq!(cfg_json["lora_alpha"], 8.0);
    assert_eq!(
        cfg_json["target_modules"],
        serde_json::json!(["q_proj", "v_proj", "down_proj"])
    );
    let saved =
        candle_core::safetensors::load(dir.path().join("adapter_model.safetensors"), &Device::Cpu)
            .unwrap();
    assert_eq!(saved.len(), 2 * 3 * 2);
    let a = &saved["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"];
    assert_eq!(a.dims(), &[4, 32]);
    let b = &saved["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"];
    assert_eq!(b.dims(), &[32, 4]);

    let mut fresh = Model::random(cfg, DType::F32, &Device::Cpu, 23).unwrap();
    fresh.load_adapter("loaded", dir.path()).unwrap();
    assert_eq!(fresh.adapter("loaded").unwrap().config, lcfg);
    let before = logits_with(&m, Some("a"));
    let after = logits_with(&fresh, Some("loaded"));
    assert_eq!(max_abs_diff(&before, &after), 0.0);
    assert!(fresh.adapter("loaded").unwrap().value_head().is_some());

    // A truncated adapter is rejected naming the missing tensor.
    let mut partial = saved.clone();
    partial.remove("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
    candle_core::safetensors::save(&partial, dir.path().join("adapter_model.safetensors")).unwrap();
    let err = fresh
        .load_adapter("bad", dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("layers.1.self_attn.v_proj.lora_B"), "{err}");
}

#[test]
fn merged_adapter_matches_unmerged_and_adapters_share_the_base() {
    let cfg = tiny_config(Arch::Llama, false);
    let mut m = Model::random(cfg, DType::F32, &Device::Cpu, 24).unwrap();
    m.add_adapter("injector", LoraConfig::default(), 1).unwrap();
    m.add_adapter(
        "detector",
        LoraConfig {
            rank: 4,
            ..Default::default()
        },
        2,
    )
    .unwrap();
    randomize_b(&m, "injector", 3);
    randomize_b(&m, "detector", 4);
    let base = logits_with(&m, None);
    let inj = logits_with(&m, Some("injector"));
    let det = logits_with(&m, Some("detector"));
    assert!(max_abs_diff(&inj, &det) > 1e-3 && max_abs_diff(&inj, &base) > 1e-3);
    // Run-time switching through the active adapter.
    m.set_active_adapter(Some("detector")).unwrap();
    let (ids, mask) = batch();
    assert_eq!(
        max_abs_diff(&m.forward_train(&ids, &mask).unwrap().0, &det),
        0.0
    );
    m.set_active_adapter(None).unwrap();
    assert_eq!(
        max_abs_diff(&m.forward_train(&ids, &mask).unwrap().0, &base),
        0.0
    );
    assert!(m.set_active_adapter(Some("nope")).is_err());

    m.merge_adapter("injector").unwrap();
    assert!(m.adapter("injector").is_none());
    let merged = logits_with(&m, None);
    let diff = max_abs_diff(&merged, &inj);
    assert!(diff < 1e-4, "merged vs adapter: {diff}");
}

#[test]
fn dropout_only_in_training_mode() {
    let cfg = tiny_config(Arch::Llama, true);
    let mut m = Model::random(cfg, DType::F32, &Device::Cpu, 25).unwrap();
    m.add_adapter(
        "a",
        LoraConfig {
            dropout: 0.5,
            ..Default::default()
        },
        1,
    )
    .unwrap();
    randomize_b(&m, "a", 2);
    assert_eq!(
        max_abs_diff(&logits_with(&m, Some("a")), &logits_with(&m, Some("a"))),
        0.0
    );
    m.set_training(true);
    assert!(max_abs_diff(&logits_with(&m, Some("a")), &logits_with(&m, Some("a"))) > 0.0);
}

fn nll(m: &Model) -> Tensor {
    let (ids, mask) = batch();
    let out = m.policy_forward(&ids, &mask, Some("a"), false).unwrap();
    masked_mean(&out.logprobs, &out.valid)
        .unwrap()
        .neg()
        .unwrap()
}

#[test]
fn adamw_steps_lower_the_loss_of_a_fixed_batch_and_leave_the_base_frozen() {
    let cfg = tiny_config(Arch::Qwen2, true);
    let mut m = Model::random(cfg, DType::F32, &Device::Cpu, 26).unwrap();
    m.add_adapter("a", LoraConfig::default(), 1).unwrap();
    let base_before = m.hf_tensors();
    let vars = m.trainable_vars("a").unwrap();
    let mut opt = AdamW::new(
        vars.clone(),
        AdamWConfig {
            lr: 1e-2,
            ..Default::default()
        },
    )
    .unwrap();
    let mut grads = Gradients::new(vars);
    let initial = scalar(&nll(&m));
    let mut last = initial;
    for _ in 0..8 {
        grads.reset();
        let loss = nll(&m);
        last = scalar(&loss);
        grads.accumulate(&loss).unwrap();
        assert!(grads.missing().is_empty());
        grads.clip_global_norm(1.0).unwrap();
        let report = opt.step(&grads).unwrap();
        assert_eq!(report.skipped, 0);
    }
    let fin = scalar(&nll(&m));
    assert!(fin < initial - 0.1, "loss {initial} -> {last} -> {fin}");
    for (name, t) in m.hf_tensors() {
        assert_eq!(
            max_abs_diff(&t, &base_before[&name]),
            0.0,
            "base weight {name} changed"
        );
    }
}

#[test]
fn gradient_accumulation_equals_the_full_batch() {
    let cfg = tiny_config(Arch::Llama, true);
    let mut m = Model::random(cfg, DType::F64, &Device::Cpu, 27).unwrap();
    m.add_adapter("a", LoraConfig::default(), 1).unwrap();
    randomize_b(&m, "a", 2);
    let (ids, mask) = batch();
    let sum_lp = |ids: &Tensor, mask: &Tensor| {
        m.policy_forward(ids, mask, Some("a"), false)
            .unwrap()
            .logprobs
            .sum_all()
            .unwrap()
    };
    let vars = m.trainable_vars("a").unwrap();
    let mut full = Gradients::new(vars.clone());
    full.accumulate(&sum_lp(&ids, &mask)).unwrap();
    let mut acc = Gradients::new(vars.clone());
    for r in 0..2 {
        acc.accumulate(&sum_lp(
            &ids.narrow(0, r, 1).unwrap(),
            &mask.narrow(0, r, 1).unwrap(),
        ))
        .unwrap();
    }
    assert_eq!(acc.micro_batches(), 2);
    for i in 0..vars.len() {
        let d = max_abs_diff(full.get(i).unwrap(), acc.get(i).unwrap());
        assert!(d < 1e-9, "param {i}: {d}");
    }
}

#[test]
fn bf16_model_trains_f32_adapter_parameters() {
    let cfg = tiny_config(Arch::Llama, true);
    let mut m = Model::random(cfg, DType::BF16, &Device::Cpu, 28).unwrap();
    m.add_adapter("a", LoraConfig::default(), 1).unwrap();
    let vars = m.trainable_vars("a").unwrap();
    assert!(vars.iter().all(|v| v.dtype() == DType::F32));
    let mut opt = AdamW::new(
        vars.clone(),
        AdamWConfig {
            lr: 1e-2,
            ..Default::default()
        },
    )
    .unwrap();
    let mut grads = Gradients::new(vars);
    let initial = scalar(&nll(&m));
    for _ in 0..8 {
        grads.reset();
        grads.accumulate(&nll(&m)).unwrap();
        assert!(grads.missing().is_empty());
        opt.step(&grads).unwrap();
    }
    let fin = scalar(&nll(&m));
    assert!(fin < initial - 0.1, "bf16 loss {initial} -> {fin}");
}

/// The scored-rows path (`hidden_train_with`, a few rows, `logits`) is the full pass's
/// logits at those rows, with the same gradient for every adapter parameter.
#[test]
fn logits_of_chosen_rows_match_the_full_pass_and_its_gradients() {
    let cfg = tiny_config(Arch::Llama, true);
    let mut m = Model::random(cfg, DType::F32, &Device::Cpu, 31).unwrap();
    m.add_adapter("a", LoraConfig::default(), 1).unwrap();
    randomize_b(&m, "a", 5);
    let (ids, mask) = batch();
    let (b, t) = ids.dims2().unwrap();
    let rows = Tensor::new(&[3u32, 6, 7, 9, 14], &Device::Cpu).unwrap();
    let weights = Tensor::new(&[0.5f32, -1.0, 2.0, 0.25, 1.5], &Device::Cpu).unwrap();
    let loss_of = |logits: &Tensor| -> Tensor {
        // A different vocabulary column per row, weighted so no row cancels another.
        let cols = Tensor::new(&[[1u32], [7], [0], [11], [4]], &Device::Cpu).unwrap();
        logits
            .gather(&cols, 1)
            .unwrap()
            .squeeze(1)
            .unwrap()
            .mul(&weights)
            .unwrap()
            .sum_all()
            .unwrap()
    };

    let (full, _) = m.forward_train_with(&ids, &mask, Some("a")).unwrap();
    let vocab = full.dim(2).unwrap();
    let full_rows = full
        .reshape((b * t, vocab))
        .unwrap()
        .index_select(&rows, 0)
        .unwrap();
    let hidden = m.hidden_train_with(&ids, &mask, Some("a")).unwrap();
    let width = hidden.dim(2).unwrap();
    let chosen = m
        .logits(
            &hidden
                .reshape((b * t, width))
                .unwrap()
                .index_select(&rows, 0)
                .unwrap(),
        )
        .unwrap();
    assert!(max_abs_diff(&full_rows, &chosen) < 1e-5);

    let g_full = loss_of(&full_rows).backward().unwrap();
    let g_rows = loss_of(&chosen).backward().unwrap();
    let vars = m.trainable_vars("a").unwrap();
    assert!(!vars.is_empty());
    for var in &vars {
        let a = g_full.get(var.as_tensor()).expect("full pass: no gradient");
        let c = g_rows
            .get(var.as_tensor())
            .expect("chosen rows: no gradient");
        let scale = 1.0 + scalar(&a.abs().unwrap().flatten_all().unwrap().max(0).unwrap()) as f32;
        assert!(
            max_abs_diff(a, c) < 1e-4 * scale,
            "gradients differ by {}",
            max_abs_diff(a, c)
        );
    }
}

/// The inference path's hidden states of one sequence (`Model::hidden`, fused kernels, the
/// decision head's features) agree with the training path's.
#[test]
fn hidden_states_of_the_fused_path_match_the_training_path() {
    let cfg = tiny_config(Arch::Llama, true);
    let mut m = Model::random(cfg, DType::F32, &Device::Cpu, 41).unwrap();
    m.add_adapter("a", LoraConfig::default(), 2).unwrap();
    randomize_b(&m, "a", 9);
    let tokens: Vec<u32> = (0..12u32).map(|i| (i * 7 + 3) % 32).collect();
    let ids = Tensor::new(tokens.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let mask = Tensor::ones((1, tokens.len()), DType::U32, &Device::Cpu).unwrap();
    for adapter in [None, Some("a")] {
        let fused = m.hidden(&tokens, adapter).unwrap();
        let train = m
            .hidden_train_with(&ids, &mask, adapter)
            .unwrap()
            .squeeze(0)
            .unwrap();
        assert_eq!(fused.dims(), train.dims());
        assert!(max_abs_diff(&fused, &train) < 1e-4, "{adapter:?}");
    }
    assert!(m.hidden(&[], None).is_err());
    assert!(m.hidden(&[1_000_000], None).is_err());
}
