//! The learned Detector's rollouts on real weights: `N` investigations of one trace decoded
//! one after another (each through its own cache, as the trainer did before), against the same
//! `N` run on their own threads with their replies decoded together ([`policy::TurnBatcher`],
//! as the trainer does now). Sampled at temperature 1 under the action grammar, the way a
//! PPO step samples; generated tokens per second of wall clock, and the ratio.
//!
//! cargo bench -p policy --bench rollouts -- --gguf PATH [--rows 1,4,8] [--turns 3]
//!     [--tokens 48] [--repeats 2] [--temperature 1]
//!
//! At `--temperature 0` every row decodes the same greedy investigation, so both modes
//! generate the same tokens and the wall clocks compare directly.
//!
//! Prints one JSON object per (rows, mode, repeat) and a summary line per row count.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use detect::Detector;
use model::{DType, Device};
use policy::{ActionGrammar, DetectorOptions, PolicyModel, SharedModel};

struct Args {
    gguf: String,
    rows: Vec<usize>,
    turns: usize,
    tokens: usize,
    repeats: usize,
    temperature: f32,
}

fn parse_args() -> Args {
    let mut a = Args {
        gguf: String::new(),
        rows: vec![1, 4, 8],
        turns: 3,
        tokens: 48,
        repeats: 2,
        temperature: 1.0,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).cloned().unwrap_or_default();
        let num = || {
            value
                .parse::<usize>()
                .unwrap_or_else(|_| panic!("{} needs a number", argv[i]))
        };
        match argv[i].as_str() {
            "--gguf" => a.gguf = value.clone(),
            "--rows" => {
                a.rows = value
                    .split(',')
                    .map(|n| n.parse().expect("--rows takes numbers"))
                    .collect()
            }
            "--turns" => a.turns = num(),
            "--tokens" => a.tokens = num(),
            "--repeats" => a.repeats = num(),
            "--temperature" => a.temperature = value.parse().expect("--temperature takes a number"),
            // cargo bench passes --bench.
            "--bench" => {
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    assert!(!a.gguf.is_empty(), "--gguf PATH is required");
    a
}

/// Generated tokens of `rows` investigations (seeds `options.seed + k`), and the seconds
/// they took.
fn rollouts(
    shared: &SharedModel,
    grammar: &Arc<ActionGrammar>,
    detector: &Detector,
    trace_id: &str,
    options: &DetectorOptions,
    rows: usize,
    batched: bool,
) -> (usize, f64) {
    let options: Vec<DetectorOptions> = (0..rows)
        .map(|k| DetectorOptions {
            seed: options.seed + k as u64,
            ..options.clone()
        })
        .collect();
    let started = Instant::now();
    let tokens = policy::investigate_many(detector, trace_id, shared, grammar, &options, batched)
        .into_iter()
        .map(|r| {
            let (_, c) = r.expect("the investigation runs");
            c.generated.iter().filter(|g| **g).count()
        })
        .sum();
    (tokens, started.elapsed().as_secs_f64())
}

fn main() {
    let args = parse_args();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.sqlite");
    let labels = detect::synthetic::build_store(&db, 1).unwrap();
    let trace_id = labels[0].0.clone();
    let pm = PolicyModel::load(args.gguf.as_ref(), DType::F32, &Device::Cpu).unwrap();
    let catalog = taxonomy::Catalog::embedded().unwrap();
    let grammar = Arc::new(
        ActionGrammar::new(&pm.tokenizer, &catalog, &policy::grammar::LEARNED_TOOLS).unwrap(),
    );
    let shared: SharedModel = Arc::new(Mutex::new(pm));
    let config = detect::Config {
        main_max_turns: args.turns,
        ..detect::Config::default()
    };
    let detector = Detector::new(&db, config, false).unwrap();
    let options = DetectorOptions {
        temperature: args.temperature,
        max_action_tokens: args.tokens,
        observation_chars: 240,
        seed: 7,
        ..DetectorOptions::default()
    };
    // Warm-up: the first prefill pays for page faults and kernel selection.
    rollouts(&shared, &grammar, &detector, &trace_id, &options, 1, false);
    for &rows in &args.rows {
        let mut rates = [Vec::new(), Vec::new()];
        for repeat in 0..args.repeats {
            for (m, batched) in [false, true].into_iter().enumerate() {
                let (tokens, seconds) = rollouts(
                    &shared, &grammar, &detector, &trace_id, &options, rows, batched,
                );
                let rate = tokens as f64 / seconds;
                rates[m].push(rate);
                println!(
                    "{}",
                    serde_json::json!({
                        "rows": rows, "mode": if batched { "batched" } else { "one after another" },
                        "repeat": repeat, "tokens": tokens, "seconds": seconds, "tokens_per_s": rate,
                    })
                );
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (one, together) = (median(&mut rates[0]), median(&mut rates[1]));
        println!(
            "rows {rows}: one after another {one:.1} tokens/s, batched {together:.1} tokens/s, ratio {:.2}x",
            together / one
        );
    }
}
