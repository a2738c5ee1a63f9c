//! The fused training kernels (`model::ops`) against the compositions they replace: the same
//! outputs, the same gradients, and gradients that match central finite differences.

use candle_core::{DType, Device, Tensor, Var, D};
use model::ops;

const CPU: Device = Device::Cpu;

fn randn(shape: &[usize], seed: u64) -> Tensor {
    // A small LCG keeps the inputs identical across runs and platforms.
    let n: usize = shape.iter().product();
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let data: Vec<f64> = (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect();
    Tensor::from_vec(data, shape, &CPU).unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    model::testing::max_abs_diff_f64(a, b).unwrap()
}

/// Checks `fused` against `composed` on input `x`: outputs, the gradient of `Σ out ⊙ weights`,
/// and that gradient against central differences at a spread of coordinates.
fn check(x: Tensor, fused: impl Fn(&Tensor) -> Tensor, composed: impl Fn(&Tensor) -> Tensor) {
    let var = Var::from_tensor(&x).unwrap();
    let out_fused = fused(var.as_tensor());
    let out_composed = composed(var.as_tensor());
    assert_eq!(out_fused.dims(), out_composed.dims());
    let diff = max_abs_diff(&out_fused, &out_composed);
    assert!(diff < 1e-12, "outputs differ by {diff}");

    let weights = randn(out_fused.dims(), 99);
    let objective = |out: &Tensor| (out * &weights).unwrap().sum_all().unwrap();
    let grad_of = |out: &Tensor| {
        let grads = objective(out).backward().unwrap();
        grads
            .get(var.as_tensor())
            .expect("a gradient for x")
            .clone()
    };
    let g_fused = grad_of(&out_fused);
    let g_composed = grad_of(&out_composed);
    let diff = max_abs_diff(&g_fused, &g_composed);
    assert!(diff < 1e-10, "gradients differ by {diff}");

    let flat: Vec<f64> = x.flatten_all().unwrap().to_vec1().unwrap();
    let g: Vec<f64> = g_fused.flatten_all().unwrap().to_vec1().unwrap();
    let eps = 1e-6;
    let step = (flat.len() / 17).max(1);
    for i in (0..flat.len()).step_by(step) {
        let at = |delta: f64| {
            let mut data = flat.clone();
            data[i] += delta;
            let t = Tensor::from_vec(data, x.dims(), &CPU).unwrap();
            objective(&fused(&t)).to_scalar::<f64>().unwrap()
        };
        let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
        let err = (numeric - g[i]).abs() / numeric.abs().max(1.0);
        assert!(
            err < 1e-6,
            "coordinate {i}: analytic {} numeric {numeric}",
            g[i]
        );
    }
}

fn composed_softmax(x: &Tensor) -> Tensor {
    let max = x.max_keepdim(D::Minus1).unwrap().detach();
    let e = x.broadcast_sub(&max).unwrap().exp().unwrap();
    e.broadcast_div(&e.sum_keepdim(D::Minus1).unwrap()).unwrap()
}

/// A causal mask with one padded key column in batch row 1, as the model builds it.
fn causal_mask(b: usize, q: usize) -> Tensor {
    let mut data = vec![0f64; b * q * q];
    for r in 0..b {
        for i in 0..q {
            for j in 0..q {
                if j > i || (r == 1 && j == 0 && i > 0) {
                    data[(r * q + i) * q + j] = -1e9;
                }
            }
        }
    }
    Tensor::from_vec(data, (b, 1, q, q), &CPU).unwrap()
}

#[test]
fn masked_softmax_matches_the_composition_and_finite_differences() {
    let mask = causal_mask(2, 5);
    check(
        randn(&[2, 3, 5, 5], 1),
        |s| ops::masked_softmax(s, &mask).unwrap(),
        |s| composed_softmax(&s.broadcast_add(&mask).unwrap()),
    );
}

/// Log-softmax from candle's differentiable primitives, as the training path had it.
fn composed_log_softmax(x: &Tensor) -> Tensor {
    let max = x.max_keepdim(D::Minus1).unwrap().detach();
    let shifted = x.broadcast_sub(&max).unwrap();
    let lse = shifted
        .exp()
        .unwrap()
        .sum_keepdim(D::Minus1)
        .unwrap()
        .log()
        .unwrap();
    shifted.broadcast_sub(&lse).unwrap()
}

#[test]
fn log_softmax_matches_the_composition_and_finite_differences() {
    check(
        randn(&[3, 4, 11], 2),
        |x| ops::log_softmax(x).unwrap(),
        composed_log_softmax,
    );
}

#[test]
fn rms_norm_matches_the_composition_and_finite_differences() {
    let weight = randn(&[8], 3).affine(0.5, 1.0).unwrap();
    let eps = 1e-5;
    check(
        randn(&[6, 8], 4),
        |x| ops::rms_norm(x, &weight, eps).unwrap(),
        |x| {
            let inv = (x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap() + eps)
                .unwrap()
                .sqrt()
                .unwrap()
                .recip()
                .unwrap();
            x.broadcast_mul(&inv)
                .unwrap()
                .broadcast_mul(&weight)
                .unwrap()
        },
    );
}

#[test]
fn rope_matches_rotate_half_and_finite_differences() {
    let (b, t, h, d) = (2, 4, 3, 6);
    let angles = randn(&[b, t, d / 2], 5);
    let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
    check(
        randn(&[b, t, h, d], 6),
        |x| ops::rope(x, &cos, &sin).unwrap(),
        |x| {
            let full = |t: &Tensor| {
                Tensor::cat(&[t, t], D::Minus1)
                    .unwrap()
                    .unsqueeze(2)
                    .unwrap()
            };
            let x1 = x.narrow(D::Minus1, 0, d / 2).unwrap();
            let x2 = x.narrow(D::Minus1, d / 2, d / 2).unwrap();
            let rotated = Tensor::cat(&[&x2.neg().unwrap(), &x1], D::Minus1).unwrap();
            (x.broadcast_mul(&full(&cos)).unwrap() + rotated.broadcast_mul(&full(&sin)).unwrap())
                .unwrap()
        },
    );
}

#[test]
fn rope_to_heads_matches_rotate_transpose_fold_scale_and_finite_differences() {
    // 6 query heads over 2 key/value heads: the result folds 3 heads into each group's rows.
    let (b, t, h, d, groups, scale) = (2, 4, 6, 6, 2, 0.37);
    let angles = randn(&[b, t, d / 2], 15);
    let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
    for (groups, scale) in [(groups, scale), (h, 1.0)] {
        check(
            randn(&[b, t, h, d], 16),
            |x| ops::rope_to_heads(x, &cos, &sin, scale, groups).unwrap(),
            |x| {
                let rotated = ops::rope(x, &cos, &sin).unwrap();
                let heads = rotated.transpose(1, 2).unwrap().contiguous().unwrap();
                (heads.reshape((b, groups, h / groups * t, d)).unwrap() * scale).unwrap()
            },
        );
    }
    let err = ops::rope_to_heads(&randn(&[b, t, h, d], 17), &cos, &sin, 1.0, 4).unwrap_err();
    assert!(
        err.to_string()
            .contains("6 heads do not split into 4 groups"),
        "{err}"
    );
}

#[test]
fn rope_agrees_with_candles_inference_kernel() {
    let (b, t, h, d) = (1, 5, 2, 8);
    let angles = randn(&[b, t, d / 2], 7).to_dtype(DType::F32).unwrap();
    let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
    let x = randn(&[b, t, h, d], 8).to_dtype(DType::F32).unwrap();
    let ours = ops::rope(&x, &cos, &sin).unwrap().transpose(1, 2).unwrap();
    let theirs = candle_nn::rotary_emb::rope(
        &x.transpose(1, 2).unwrap().contiguous().unwrap(),
        &cos,
        &sin,
    )
    .unwrap();
    let diff = max_abs_diff(&ours, &theirs);
    assert!(diff < 1e-5, "rope differs from candle's by {diff}");
}

#[test]
fn the_ops_refuse_shapes_and_dtypes_they_cannot_handle() {
    let x = randn(&[2, 3, 4, 4], 9);
    let err = ops::masked_softmax(&x, &randn(&[2, 3, 4, 4], 10)).unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
    let err = ops::rms_norm(&randn(&[2, 8], 11), &randn(&[7], 12), 1e-5).unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
    let tables = randn(&[1, 4, 2], 13);
    let err = ops::rope(&randn(&[1, 4, 2, 6], 14), &tables, &tables).unwrap_err();
    assert!(err.to_string().contains("do not fit"), "{err}");
    let half = x.to_dtype(DType::BF16).unwrap();
    let err = ops::log_softmax(&half).unwrap_err();
    assert!(err.to_string().contains("only f32 and f64"), "{err}");
    assert!(!ops::available(&CPU, DType::BF16));
    assert!(ops::available(&CPU, DType::F32));
}

#[test]
fn lora_linear_matches_the_composition_and_finite_differences_in_every_input() {
    let (m, inp, out, rank, scale) = (5, 7, 6, 3, 1.7);
    let weight = randn(&[out, inp], 20);
    let bias = randn(&[out], 21);
    let x = Var::from_tensor(&randn(&[m, inp], 22)).unwrap();
    let a = Var::from_tensor(&randn(&[rank, inp], 23)).unwrap();
    let b = Var::from_tensor(&randn(&[out, rank], 24)).unwrap();
    let probe = randn(&[m, out], 25);
    let fused = |x: &Tensor, a: &Tensor, b: &Tensor| {
        ops::lora_linear(x, &weight, Some(&bias), a, b, scale).unwrap()
    };
    let composed = |x: &Tensor, a: &Tensor, b: &Tensor| {
        let base = x
            .matmul(&weight.t().unwrap())
            .unwrap()
            .broadcast_add(&bias)
            .unwrap();
        let delta = x
            .matmul(&a.t().unwrap())
            .unwrap()
            .matmul(&b.t().unwrap())
            .unwrap();
        (base + (delta * scale).unwrap()).unwrap()
    };
    let objective = |y: &Tensor| (y * &probe).unwrap().sum_all().unwrap();
    let vars = [&x, &a, &b];
    let (yf, yc) = (
        fused(x.as_tensor(), a.as_tensor(), b.as_tensor()),
        composed(x.as_tensor(), a.as_tensor(), b.as_tensor()),
    );
    assert!(max_abs_diff(&yf, &yc) < 1e-12);
    let gf = objective(&yf).backward().unwrap();
    let gc = objective(&yc).backward().unwrap();
    for (i, v) in vars.iter().enumerate() {
        let (f, c) = (
            gf.get(v.as_tensor()).unwrap(),
            gc.get(v.as_tensor()).unwrap(),
        );
        let diff = max_abs_diff(f, c);
        assert!(diff < 1e-10, "input {i}: gradients differ by {diff}");
        // Central differences at a few coordinates of this input.
        let flat: Vec<f64> = v.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let grad: Vec<f64> = f.flatten_all().unwrap().to_vec1().unwrap();
        for j in (0..flat.len()).step_by(4) {
            let at = |delta: f64| {
                let mut data = flat.clone();
                data[j] += delta;
                let t = Tensor::from_vec(data, v.dims(), &CPU).unwrap();
                let mut args = [
                    x.as_tensor().clone(),
                    a.as_tensor().clone(),
                    b.as_tensor().clone(),
                ];
                args[i] = t;
                objective(&fused(&args[0], &args[1], &args[2]))
                    .to_scalar::<f64>()
                    .unwrap()
            };
            let numeric = (at(1e-6) - at(-1e-6)) / 2e-6;
            let err = (numeric - grad[j]).abs() / numeric.abs().max(1.0);
            assert!(
                err < 1e-6,
                "input {i} coordinate {j}: {} vs {numeric}",
                grad[j]
            );
        }
    }
    // A frozen weight and bias get no gradient.
    assert!(gf.get(&weight).is_none() && gf.get(&bias).is_none());
    let err = ops::lora_linear(
        x.as_tensor(),
        &weight,
        None,
        b.as_tensor(),
        a.as_tensor(),
        1.0,
    )
    .unwrap_err();
    assert!(err.to_string().contains("do not fit"), "{err}");
}

#[test]
fn token_logprobs_match_the_full_log_softmax_across_chunks_and_finite_differences() {
    // More rows than one chunk of logits (128), so the chunk boundary is crossed both ways.
    let (rows, h, vocab) = (131, 4, 9);
    let head = randn(&[vocab, h], 30);
    let targets: Vec<u32> = (0..rows as u32)
        .map(|i| (i * 7 + 3) % vocab as u32)
        .collect();
    let target_ids = Tensor::from_vec(targets.clone(), (rows, 1), &CPU).unwrap();
    check(
        randn(&[rows, h], 31),
        |x| ops::token_logprobs(x, &head, &targets).unwrap(),
        |x| {
            let logits = x.matmul(&head.t().unwrap()).unwrap();
            composed_log_softmax(&logits)
                .gather(&target_ids, D::Minus1)
                .unwrap()
                .squeeze(D::Minus1)
                .unwrap()
        },
    );
    let err = ops::token_logprobs(&randn(&[2, h], 32), &head, &[0, vocab as u32]).unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    let err = ops::token_logprobs(&randn(&[2, h], 33), &head, &[0]).unwrap_err();
    assert!(err.to_string().contains("do not fit"), "{err}");
}

#[test]
fn swiglu_matches_silu_times_up_and_finite_differences_in_both_inputs() {
    let up = randn(&[4, 6], 40);
    check(
        randn(&[4, 6], 41),
        |gate| ops::swiglu(gate, &up).unwrap(),
        |gate| (candle_nn::ops::silu(gate).unwrap() * &up).unwrap(),
    );
    let gate = randn(&[4, 6], 42);
    check(
        randn(&[4, 6], 43),
        |up| ops::swiglu(&gate, up).unwrap(),
        |up| (candle_nn::ops::silu(&gate).unwrap() * up).unwrap(),
    );
    let err = ops::swiglu(&gate, &randn(&[4, 5], 44)).unwrap_err();
    assert!(err.to_string().contains("differ"), "{err}");
}
