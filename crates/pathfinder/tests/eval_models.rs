//! `pathfinder eval --db` with the model-backed detectors on a tiny random model: the
//! zero-shot and RAG baselines give a valid verdict on every trace, a training checkpoint is scored
//! exactly as the trainer's held-out evaluation scores it, and what is not there is refused.

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use model::{DType, Device, LoraConfig};
use policy::{ActionGrammar, DetectorOptions, PolicyModel};
use serde_json::Value;

fn pathfinder() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pathfinder"))
}

/// A synthetic store and a split of its first `n` traces.
fn store(dir: &Path, n: usize) -> (std::path::PathBuf, std::path::PathBuf, Vec<String>) {
    let db = dir.join("traces.db");
    let built = detect::synthetic::build_store(&db, 1).unwrap();
    let ids: Vec<String> = built.into_iter().take(n).map(|(id, _)| id).collect();
    let split = dir.join("test.jsonl");
    let lines: Vec<String> = ids
        .iter()
        .map(|id| serde_json::json!({ "trace_id": id }).to_string())
        .collect();
    std::fs::write(&split, lines.join("\n")).unwrap();
    (db, split, ids)
}

const MAX_TURNS: usize = 2;

/// A checkpoint directory as the trainer writes it: config.toml naming the base, and the
/// Detector's adapter with its value head.
fn checkpoint(dir: &Path, gguf: &Path) -> std::path::PathBuf {
    let step = dir.join("run/step-0");
    std::fs::create_dir_all(&step).unwrap();
    let config = format!(
        "[model]\npath = \"{}\"\n[lora]\nrank = 2\nalpha = 4.0\n[run]\nseed = 1\nsteps = 1\nagents = [\"toolcaller\"]\ninjections_per_step = 1\n[detector]\nmax_turns = {MAX_TURNS}\nmax_action_tokens = 24\nobservation_chars = 120\n[eval]\ncorpus = \"\"\n",
        gguf.display()
    );
    std::fs::write(step.join("config.toml"), config).unwrap();
    let mut pm = PolicyModel::load(gguf, DType::F32, &Device::Cpu).unwrap();
    pm.model
        .add_adapter(
            "detector",
            LoraConfig {
                rank: 2,
                alpha: 4.0,
                ..LoraConfig::default()
            },
            3,
        )
        .unwrap();
    pm.model.add_value_head("detector").unwrap();
    pm.model
        .save_adapter("detector", &step.join("detector"))
        .unwrap();
    step
}

fn eval(args: &[&str]) -> std::process::Output {
    pathfinder().arg("eval").args(args).output().unwrap()
}

#[test]
fn zero_shot_rag_and_checkpoint_detectors_answer_every_trace() {
    let dir = tempfile::tempdir().unwrap();
    let (db, split, ids) = store(dir.path(), 3);
    let gguf = dir.path().join("tiny.gguf");
    model::testing::write_tiny_gguf(&gguf, 8192, 17).unwrap();
    let step = checkpoint(dir.path(), &gguf);
    let embedder = dir.path().join("embedder");
    retrieve::testing::write_tiny_embedder(&embedder).unwrap();
    let detector = format!("zero-shot,rag,checkpoint:{}", step.display());
    let out = eval(&[
        "--json",
        "--resamples",
        "50",
        "--db",
        db.to_str().unwrap(),
        "--split",
        split.to_str().unwrap(),
        "--model",
        gguf.to_str().unwrap(),
        "--embedder",
        embedder.to_str().unwrap(),
        // The tiny tokenizer spends a token per byte: the catalog alone takes ~3,900.
        "--max-prompt-tokens",
        "6000",
        "--detector",
        &detector,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    let catalog = taxonomy::Catalog::embedded().unwrap();

    // The baselines: one answer per trace, always a verdict the catalog knows, no tool calls.
    for (run, name) in runs.iter().zip(["zero-shot", "rag"]) {
        assert_eq!(run["detector"], name);
        let cases = run["cases"].as_array().unwrap();
        let seen: Vec<&str> = cases
            .iter()
            .map(|c| c["trace_id"].as_str().unwrap())
            .collect();
        assert_eq!(seen, ids.iter().map(String::as_str).collect::<Vec<_>>());
        for c in cases {
            let p = &c["predicted"];
            let id = p["deficiency_id"]
                .as_str()
                .unwrap_or_else(|| panic!("{c:#}"));
            let component = p["component"].as_str().unwrap();
            assert!(catalog.get(id).is_some(), "{c:#}");
            assert!(catalog.component(component).is_some(), "{c:#}");
            assert_eq!(c["tool_calls"], 0, "{c:#}");
        }
    }

    // The checkpoint: the same cases as the trainer's own evaluation of that adapter.
    let mut pm = PolicyModel::load(&gguf, DType::F32, &Device::Cpu).unwrap();
    rl::checkpoint::load_adapter(&mut pm.model, &step, "detector").unwrap();
    let grammar = Arc::new(
        ActionGrammar::new(&pm.tokenizer, &catalog, &policy::grammar::LEARNED_TOOLS).unwrap(),
    );
    let shared = Arc::new(Mutex::new(pm));
    let labelled = eval::store_eval::labelled_traces(&db, Some(&ids)).unwrap();
    let split_traces = rl::evaluate::SplitTraces {
        db: db.clone(),
        traces: labelled,
    };
    let mut expected = Vec::new();
    rl::evaluate::evaluate(
        &shared,
        &grammar,
        &DetectorOptions {
            adapter: Some("detector".into()),
            max_action_tokens: 24,
            observation_chars: 120,
            ..DetectorOptions::default()
        },
        MAX_TURNS,
        &split_traces,
        |c| expected.push(serde_json::to_value(c).unwrap()),
    )
    .unwrap();
    assert_eq!(
        runs[2]["detector"],
        // The report names the calibration a checkpoint decided by (none here).
        format!("checkpoint:{} (no calibration)", step.display())
    );
    assert_eq!(runs[2]["cases"].as_array().unwrap(), &expected);
    for c in &expected {
        if let Some(id) = c["predicted"]["deficiency_id"].as_str() {
            assert!(catalog.get(id).is_some(), "{c:#}");
        }
    }
}

#[test]
fn missing_models_checkpoints_and_embedders_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _, _) = store(dir.path(), 1);
    let db = db.to_str().unwrap();
    let err = |args: &[&str]| {
        let out = eval(args);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let e = err(&["--db", db, "--detector", "checkpoint:/nonexistent/step-3"]);
    assert!(e.contains("/nonexistent/step-3/config.toml"), "{e}");
    let gguf = dir.path().join("tiny.gguf");
    model::testing::write_tiny_gguf(&gguf, 512, 1).unwrap();
    let gguf = gguf.to_str().unwrap();
    let e = err(&[
        "--db",
        db,
        "--detector",
        "rag",
        "--model",
        gguf,
        "--embedder",
        "/nonexistent-embedder",
    ]);
    assert!(e.contains("/nonexistent-embedder/config.json"), "{e}");
    let e = err(&["--db", db, "--detector", "zero-shot", "--embedder", "/x"]);
    assert!(e.contains("rag"), "{e}");
    let e = err(&[
        "--db",
        db,
        "--detector",
        "zero-shot",
        "--model",
        "/nonexistent.gguf",
    ]);
    assert!(e.contains("/nonexistent.gguf"), "{e}");
    let e = err(&["--db", db, "--detector", "zero-shot", "--no-sql"]);
    assert!(e.contains("ablation"), "{e}");
    let e = err(&["--db", db, "--detector", "keyword", "--model", "/x.gguf"]);
    assert!(e.contains("zero-shot"), "{e}");
    let e = err(&["--db", db, "--detector", "keyword", "--max-traces", "0"]);
    assert!(e.contains("--max-traces"), "{e}");
    let e = err(&[
        "--db",
        db,
        "--detector",
        "zero-shot",
        "--model",
        "no-such-model",
    ]);
    assert!(e.contains("not a known model name"), "{e}");
    let e = err(&["--db", db, "--detector", "oracle"]);
    assert!(e.contains("checkpoint:DIR"), "{e}");
}
