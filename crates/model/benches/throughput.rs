//! Throughput of this crate on real weights: prefill tokens/s, decode tokens/s, and one LoRA
//! forward + backward + AdamW step on a `batch × seq` batch. The PyTorch reference
//! (bench/pytorch_reference.py) measures the same three numbers on the same GGUF weights.
//! Decode is also measured for several conversations at once (`--decode-batches`), each row
//! its own prompt and its own cache row, as batched rollouts decode them.
//!
//! cargo bench -p model --bench throughput -- --gguf PATH [--threads 2] [--prefill 512]
//!     [--decode 64] [--decode-batches 1,4,8] [--batch 8] [--seq 512] [--micro-batch 2]
//!     [--rank 16] [--repeats 3] [--train-kernels fused,composed] [--device cpu|cuda]
//!     [--dtype f32|bf16] [--check-cpu] [--fit-steps N] [--fit-lr 1e-3]
//!
//! `--device cuda` (a build with `--features cuda`) times the GPU, synchronising before each
//! clock read; `--check-cpu` also runs the prefill on the CPU in f32 and reports how far the
//! device's logits are from it. `--fit-steps N` then fits the adapter to the training batch
//! for N more steps at `--fit-lr` and reports the loss of each (a short training run: the loss
//! must fall). Prints one JSON object on stdout.

use candle_core::{DType, Device, Tensor};
use model::{masked_mean, AdamW, AdamWConfig, Gradients, KvCache, LoraConfig};
use std::time::Instant;

struct Args {
    gguf: String,
    threads: usize,
    prefill: usize,
    decode: usize,
    decode_batches: Vec<usize>,
    batch: usize,
    seq: usize,
    micro_batch: usize,
    rank: usize,
    repeats: usize,
    skip_train: bool,
    /// Which training-path kernels to time: "fused" (the default), "composed", or both.
    train_kernels: Vec<String>,
    /// "cpu" (the default) or "cuda".
    device: String,
    /// "f32" (the default) or "bf16".
    dtype: String,
    /// Compare the device's prefill logits with the CPU's (f32).
    check_cpu: bool,
    /// Steps of the short fit after the timed steps (0: none).
    fit_steps: usize,
    fit_lr: f64,
}

fn parse_args() -> Args {
    let mut a = Args {
        gguf: String::new(),
        threads: 2,
        prefill: 512,
        decode: 64,
        decode_batches: vec![1, 4, 8],
        batch: 8,
        seq: 512,
        micro_batch: 2,
        rank: 16,
        repeats: 3,
        skip_train: false,
        train_kernels: vec!["fused".into()],
        device: "cpu".into(),
        dtype: "f32".into(),
        check_cpu: false,
        fit_steps: 0,
        fit_lr: 1e-3,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = || argv.get(i + 1).cloned().unwrap_or_default();
        let num = || {
            value()
                .parse::<usize>()
                .unwrap_or_else(|_| panic!("{} needs a number", argv[i]))
        };
        match argv[i].as_str() {
            "--gguf" => a.gguf = value(),
            "--threads" => a.threads = num(),
            "--prefill" => a.prefill = num(),
            "--decode" => a.decode = num(),
            "--train-kernels" => {
                a.train_kernels = value().split(',').map(|k| k.trim().to_string()).collect();
                for k in &a.train_kernels {
                    assert!(
                        k == "fused" || k == "composed",
                        "--train-kernels takes fused,composed"
                    );
                }
            }
            "--decode-batches" => {
                a.decode_batches = value()
                    .split(',')
                    .map(|n| n.trim().parse().expect("--decode-batches takes 1,4,8"))
                    .collect()
            }
            "--fit-steps" => a.fit_steps = num(),
            "--fit-lr" => {
                a.fit_lr = value()
                    .parse()
                    .unwrap_or_else(|_| panic!("--fit-lr needs a number"))
            }
            "--batch" => a.batch = num(),
            "--seq" => a.seq = num(),
            "--micro-batch" => a.micro_batch = num(),
            "--rank" => a.rank = num(),
            "--repeats" => a.repeats = num(),
            "--skip-train" => {
                a.skip_train = true;
                i += 1;
                continue;
            }
            "--check-cpu" => {
                a.check_cpu = true;
                i += 1;
                continue;
            }
            "--device" => {
                a.device = value();
                assert!(
                    a.device == "cpu" || a.device == "cuda",
                    "--device takes cpu or cuda"
                );
            }
            "--dtype" => {
                a.dtype = value();
                assert!(
                    a.dtype == "f32" || a.dtype == "bf16",
                    "--dtype takes f32 or bf16"
                );
            }
            "--bench" => {
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    if a.gguf.is_empty() {
        let m = model::fetch::known_model("smollm2-135m").unwrap();
        a.gguf = model::fetch::cached_path(&model::fetch::default_cache_dir(), m)
            .display()
            .to_string();
    }
    a
}

/// Deterministic pseudo-random token ids (an LCG), so every run sees the same inputs.
fn token_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) as usize % (vocab - 256) + 256) as u32
        })
        .collect()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// Seconds for `steps` greedy decoding steps of all `prompts` together (one cache row each),
/// after pre-filling them, which is not timed.
fn decode_seconds(m: &model::Model, prompts: &[Vec<u32>], steps: usize) -> f64 {
    let mut cache = KvCache::new(m, prompts.len());
    let mut logits = m.feed(&mut cache, prompts).unwrap();
    let t = Instant::now();
    for _ in 0..steps {
        let next = logits.argmax(1).unwrap().to_vec1::<u32>().unwrap();
        let chunks: Vec<Vec<u32>> = next.into_iter().map(|id| vec![id]).collect();
        logits = m.feed(&mut cache, &chunks).unwrap();
    }
    logits
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    t.elapsed().as_secs_f64()
}

/// One optimizer step on `ids` in micro-batches of `micro` rows: mean token NLL, gradients
/// accumulated, global norm clipped to 1, AdamW. Returns the batch's loss and the seconds spent
/// in forward passes; the device is synchronised, so the clock sees finished work.
fn train_step(
    m: &model::Model,
    opt: &mut AdamW,
    grads: &mut Gradients,
    ids: &Tensor,
    mask: &Tensor,
    micro: usize,
) -> (f64, f64) {
    let dev = m.device().clone();
    let batch = ids.dim(0).unwrap();
    let n_micro = batch.div_ceil(micro);
    let mut forward_s = 0.0;
    let mut total = 0.0;
    grads.reset();
    for k in 0..n_micro {
        let start = k * micro;
        let len = micro.min(batch - start);
        let fwd = Instant::now();
        let out = m
            .policy_forward(
                &ids.narrow(0, start, len).unwrap(),
                &mask.narrow(0, start, len).unwrap(),
                Some("bench"),
                false,
            )
            .unwrap();
        let loss = (masked_mean(&out.logprobs, &out.valid)
            .unwrap()
            .neg()
            .unwrap()
            / n_micro as f64)
            .unwrap();
        drop(out);
        dev.synchronize().unwrap();
        forward_s += fwd.elapsed().as_secs_f64();
        grads.accumulate(&loss).unwrap();
        total += loss
            .to_dtype(DType::F64)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
    }
    grads.clip_global_norm(1.0).unwrap();
    opt.step(grads).unwrap();
    dev.synchronize().unwrap();
    (total, forward_s)
}

fn main() {
    let args = parse_args();
    // candle's CPU kernels size their thread pools from this variable.
    std::env::set_var("RAYON_NUM_THREADS", args.threads.to_string());
    let dev = match args.device.as_str() {
        "cuda" => Device::new_cuda(0).unwrap_or_else(|e| panic!("--device cuda: {e}")),
        _ => Device::Cpu,
    };
    let dtype = if args.dtype == "bf16" {
        DType::BF16
    } else {
        DType::F32
    };
    let (mut m, _tok) = model::load_gguf(std::path::Path::new(&args.gguf), dtype, &dev)
        .unwrap_or_else(|e| panic!("{e}"));
    let vocab = m.config().vocab_size;

    // Prefill: one prompt of `prefill` tokens into an empty cache.
    let prompt = token_ids(args.prefill, vocab, 1);
    let mut prefill_s = vec![];
    if dev.is_cuda() {
        // The first pass on a GPU loads the kernels; it is not timed, as on the PyTorch side.
        let mut cache = KvCache::new(&m, 1);
        m.feed(&mut cache, std::slice::from_ref(&prompt)).unwrap();
        dev.synchronize().unwrap();
    }
    for _ in 0..args.repeats {
        let mut cache = KvCache::new(&m, 1);
        let t = Instant::now();
        let logits = m.feed(&mut cache, std::slice::from_ref(&prompt)).unwrap();
        logits
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        prefill_s.push(t.elapsed().as_secs_f64());
    }
    let prefill_tok_s = args.prefill as f64 / median(prefill_s);

    // The device's last-position logits of that prompt against the CPU's, relative to their
    // largest magnitude.
    let cpu_relative_diff = args.check_cpu.then(|| {
        let (cpu_m, _) =
            model::load_gguf(std::path::Path::new(&args.gguf), DType::F32, &Device::Cpu)
                .unwrap_or_else(|e| panic!("{e}"));
        let last = |m: &model::Model| {
            let mut cache = KvCache::new(m, 1);
            m.feed(&mut cache, std::slice::from_ref(&prompt)).unwrap()
        };
        let rel = model::testing::max_relative_diff(&last(&cpu_m), &last(&m)).unwrap();
        eprintln!(
            "prefill logits, {} vs cpu: relative diff {rel:.2e}",
            args.device
        );
        rel
    });

    // Decode: greedy steps after a 128-token prompt.
    let short = token_ids(128, vocab, 2);
    if dev.is_cuda() {
        // Loads the kernels of one-token steps, which the prefill above did not use.
        decode_seconds(&m, std::slice::from_ref(&short), 2);
    }
    let decode_s = (0..args.repeats)
        .map(|_| decode_seconds(&m, std::slice::from_ref(&short), args.decode))
        .collect();
    let decode_tok_s = args.decode as f64 / median(decode_s);

    // Batched decode: `rows` conversations with their own 128-token prompts, greedy, together.
    let mut batched = serde_json::Map::new();
    for &rows in &args.decode_batches {
        let prompts: Vec<Vec<u32>> = (0..rows)
            .map(|r| token_ids(128, vocab, 10 + r as u64))
            .collect();
        let times = (0..args.repeats)
            .map(|_| decode_seconds(&m, &prompts, args.decode))
            .collect();
        let tok_s = (rows * args.decode) as f64 / median(times);
        eprintln!("decode at batch {rows}: {tok_s:.1} tokens/s");
        batched.insert(rows.to_string(), serde_json::json!(tok_s));
    }

    let mut train_step_s = None;
    let mut train_by_kernels = serde_json::Map::new();
    let mut fit_losses: Vec<f64> = vec![];
    if !args.skip_train {
        m.add_adapter(
            "bench",
            LoraConfig {
                rank: args.rank,
                alpha: 2.0 * args.rank as f64,
                ..Default::default()
            },
            0,
        )
        .unwrap();
        let vars = m.trainable_vars("bench").unwrap();
        let mut opt = AdamW::new(
            vars.clone(),
            AdamWConfig {
                lr: 1e-4,
                ..Default::default()
            },
        )
        .unwrap();
        let mut grads = Gradients::new(vars);
        let ids = token_ids(args.batch * args.seq, vocab, 3);
        let ids = Tensor::from_vec(ids, (args.batch, args.seq), &dev).unwrap();
        let mask = Tensor::ones((args.batch, args.seq), DType::U32, &dev).unwrap();
        let micro = args.micro_batch.clamp(1, args.batch);
        for asked in &args.train_kernels {
            m.set_fused_training_kernels(asked == "fused");
            // The fused kernels exist on the CPU in f32/f64 only; elsewhere compositions run,
            // and the figures are labelled with what ran.
            let kernels = if m.fused_training_kernels() {
                "fused".to_string()
            } else {
                "composed".to_string()
            };
            if kernels != *asked {
                eprintln!("{asked} kernels asked for; {kernels} run on this device and dtype");
            }
            let mut times = vec![];
            // One untimed warm-up step, then `repeats - 1` (at least one) timed steps.
            for step in 0..args.repeats.max(2) {
                let t = Instant::now();
                let (_, forward_s) = train_step(&m, &mut opt, &mut grads, &ids, &mask, micro);
                let dt = t.elapsed().as_secs_f64();
                eprintln!(
                    "train step {step} ({kernels}): {dt:.2}s, of which forward {forward_s:.2}s"
                );
                if step > 0 {
                    times.push(dt);
                }
            }
            let step_s = median(times);
            eprintln!("train step with {kernels} kernels: {step_s:.2}s");
            if kernels == "fused" || train_step_s.is_none() {
                train_step_s = Some(step_s);
            }
            train_by_kernels.insert(kernels, serde_json::json!(step_s));
        }
        if args.fit_steps > 0 {
            m.set_fused_training_kernels(true);
            let mut opt = AdamW::new(
                m.trainable_vars("bench").unwrap(),
                AdamWConfig {
                    lr: args.fit_lr,
                    ..Default::default()
                },
            )
            .unwrap();
            for step in 0..args.fit_steps {
                let (loss, _) = train_step(&m, &mut opt, &mut grads, &ids, &mask, micro);
                eprintln!("fit step {step}: loss {loss:.4}");
                fit_losses.push(loss);
            }
        }
    }
    println!(
        "{}",
        serde_json::json!({
            "impl": format!("pathfinder-model (candle 0.11.1, {})", args.dtype),
            "device": args.device,
            "threads": args.threads,
            "cpu_relative_diff": cpu_relative_diff,
            "prefill_tokens": args.prefill,
            "prefill_tok_s": prefill_tok_s,
            "decode_tokens": args.decode,
            "decode_tok_s": decode_tok_s,
            "decode_batch_tok_s": batched,
            "train_batch": args.batch,
            "train_seq": args.seq,
            "train_micro_batch": args.micro_batch,
            "lora_rank": args.rank,
            "train_step_s": train_step_s,
            "train_step_s_by_kernels": train_by_kernels,
            "fit_lr": args.fit_lr,
            "fit_losses": fit_losses,
        })
    );
}
