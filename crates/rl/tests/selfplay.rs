//! The self-play loop end to end on real agents with a tiny random model: injections are
//! chosen, applied, run and investigated; both adapters are updated; checkpoints and metrics
//! are written; and a run stopped after its first step and resumed ends with exactly the
//! adapters, optimizer moments and metrics of an uninterrupted run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use model::{Arch, DType, Device, Model, Tensor};
use policy::PolicyModel;
use rl::config::RunConfig;
use rl::trainer::{TrainOptions, Trainer};

const CONFIG: &str = r#"
[model]
path = "tiny"
[lora]
rank = 2
alpha = 4.0
[run]
seed = 5
steps = 2
agents = ["toolcaller"]
injections_per_step = 2
[detector]
max_turns = 2
max_action_tokens = 24
observation_chars = 120
[higher_order]
per_step = 1
[eval]
corpus = ""
"#;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tiny() -> PolicyModel {
    let config = model::testing::tiny_config(Arch::Llama, true, 8192).unwrap();
    let m = Model::random(config, DType::F32, &Device::Cpu, 3).unwrap();
    PolicyModel::new(m, model::testing::tiny_tokenizer().unwrap(), "tiny".into()).unwrap()
}

/// Options for a run in `run_dir` without a progress bar.
fn options(run_dir: &Path, resume: bool, max_steps: Option<u64>) -> TrainOptions {
    TrainOptions {
        root: root(),
        run_dir: run_dir.to_owned(),
        resume,
        sft_only: false,
        max_steps,
        progress: false,
        ranks: std::sync::Arc::new(collective::Single),
    }
}

fn train(run_dir: &Path, resume: bool, max_steps: Option<u64>) -> u64 {
    let config = RunConfig::parse(CONFIG, Path::new("test.toml")).unwrap();
    let options = options(run_dir, resume, max_steps);
    let mut t = Trainer::with_model(config, CONFIG, options, tiny()).unwrap();
    t.run().unwrap().last_step
}

fn tensors(path: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(path, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn assert_same_tensors(a: &Path, b: &Path) {
    let (ta, tb) = (tensors(a), tensors(b));
    assert_eq!(
        ta.keys().collect::<std::collections::BTreeSet<_>>(),
        tb.keys().collect()
    );
    for (k, x) in &ta {
        let d = model::testing::max_abs_diff_f64(x, &tb[k]).unwrap();
        assert_eq!(
            d,
            0.0,
            "{k} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

/// The deterministic fields of each metrics line (no clock readings).
fn deterministic_metrics(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            let o = v.as_object_mut().unwrap();
            for k in [
                "unix_ms",
                "seconds",
                "episodes_per_min",
                "tokens_per_s",
                "phase_seconds",
            ] {
                o.remove(k);
            }
            v
        })
        .collect()
}

#[test]
fn self_play_trains_checkpoints_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    assert_eq!(train(&whole, false, None), 2);

    let lines = deterministic_metrics(&whole);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["step"], i as u64 + 1);
        assert_eq!(l["phase"], "ppo");
        assert_eq!(l["episodes"], 2);
        assert!(l["reward_injector"].is_number(), "{l}");
        assert!(l["injection_entropy"].as_f64().unwrap() >= 0.0);
    }
    // Something was investigated and trained on, or the test proves nothing.
    assert!(
        lines
            .iter()
            .any(|l| l["reward_detector"].is_number() && l["kl"].is_number()),
        "no valid injection was investigated: {lines:?}"
    );
    for step in 0..=2 {
        let ck = whole.join(format!("step-{step}"));
        for f in [
            "state.json",
            "config.toml",
            "detector/adapter_config.json",
            "detector/adapter_model.safetensors",
            "detector/value_head.safetensors",
            "injector/adapter_model.safetensors",
            "optimizer-detector.safetensors",
            "optimizer-injector.safetensors",
        ] {
            assert!(ck.join(f).is_file(), "{} lacks {f}", ck.display());
        }
    }
    // Training changed both adapters (B starts at zero).
    let b_norm = |p: &Path| {
        tensors(p)
            .iter()
            .filter(|(k, _)| k.contains("lora_B"))
            .map(|(_, t)| {
                t.sqr()
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap()
            })
            .sum::<f32>()
    };
    assert_eq!(
        b_norm(&whole.join("step-0/injector/adapter_model.safetensors")),
        0.0
    );
    assert!(b_norm(&whole.join("step-2/injector/adapter_model.safetensors")) > 0.0);
    assert!(b_norm(&whole.join("step-2/detector/adapter_model.safetensors")) > 0.0);

    // Interrupted after step 1, then resumed.
    let split = dir.path().join("split");
    assert_eq!(train(&split, false, Some(1)), 1);
    assert!(!split.join("step-2").exists());
    assert_eq!(train(&split, true, None), 2);
    for f in [
        "detector/adapter_model.safetensors",
        "detector/value_head.safetensors",
        "injector/adapter_model.safetensors",
        "optimizer-detector.safetensors",
        "optimizer-injector.safetensors",
    ] {
        assert_same_tensors(&whole.join("step-2").join(f), &split.join("step-2").join(f));
    }
    assert_eq!(deterministic_metrics(&whole), deterministic_metrics(&split));

    // A finished run refuses a fresh start in the same directory.
    let config = RunConfig::parse(CONFIG, Path::new("test.toml")).unwrap();
    let options = options(&whole, false, None);
    let err = Trainer::with_model(config, CONFIG, options, tiny())
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("--resume"), "{err}");
}

#[test]
fn several_investigations_of_each_trace_train_against_each_other() {
    let config_text = CONFIG
        .replace("steps = 2", "steps = 1")
        .replace("max_turns = 2", "max_turns = 2\nsamples_per_trace = 3")
        .replace(
            "[higher_order]",
            "[ppo]\nbaseline = \"group\"\n[higher_order]",
        );
    let config = RunConfig::parse(&config_text, Path::new("test.toml")).unwrap();
    assert_eq!(config.detector.samples_per_trace, 3);
    let dir = tempfile::tempdir().unwrap();
    let options = options(&dir.path().join("grouped"), false, None);
    let mut t = Trainer::with_model(config, &config_text, options, tiny()).unwrap();
    assert_eq!(t.run().unwrap().last_step, 1);
    let lines = deterministic_metrics(&dir.path().join("grouped"));
    let l = &lines[0];
    let valid = l["valid_injections"].as_u64().unwrap();
    assert!(valid > 0, "no valid injection was investigated: {l}");
    assert_eq!(l["investigations"].as_u64().unwrap(), 3 * valid, "{l}");
    assert!(l["kl"].is_number(), "{l}");
}

#[test]
fn a_free_form_injector_writes_a_diff_that_the_engine_judges() {
    let text = CONFIG
        .replace(
            "[detector]",
            "[injector]\nmode = \"diff\"\nmax_diff_tokens = 48\n[detector]",
        )
        .replace("steps = 2", "steps = 1")
        .replace("injections_per_step = 2", "injections_per_step = 1");
    let config = RunConfig::parse(&text, Path::new("diff.toml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = options(&dir.path().join("diff"), false, None);
    let mut t = Trainer::with_model(config, &text, options, tiny()).unwrap();
    assert_eq!(t.run().unwrap().last_step, 1);
    let line: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(dir.path().join("diff/metrics.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    // A random model's patch does not apply: the engine says why and the Injector is punished.
    assert_eq!(line["valid_injections"], 0, "{line}");
    assert_eq!(line["reward_injector"], -1.0, "{line}");
    assert!(
        line["kl"].is_number(),
        "the Injector's choice and diff were trained: {line}"
    );
    let manifests: Vec<serde_json::Value> = walk(&dir.path().join("diff/live/episodes"))
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "manifest.json"))
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect();
    assert_eq!(manifests.len(), 1);
    assert_eq!(manifests[0]["strategy"], "free-form");
    assert_eq!(manifests[0]["validation"]["applies"]["passed"], false);
    assert!(!manifests[0]["validation"]["applies"]["detail"]
        .as_str()
        .unwrap()
        .is_empty());
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The decision head's run configuration of the test below, on the corpus in `corpus`.
fn head_config(corpus: &Path) -> String {
    CONFIG
        .replace(
            "max_turns = 2",
            "max_turns = 2\ndecision = \"head\"\nsamples_per_trace = 4",
        )
        // One clean run a step is investigated as a healthy trace beside the injected ones.
        // Two episodes at once (the step's outcome must not depend on which finishes first).
        .replace(
            "injections_per_step = 2",
            "injections_per_step = 4\nhealthy_per_step = 1\njobs = 2",
        )
        // The head reviews its failures (head::review, with Adam) in every step, so the
        // resumed run must carry them in its state to repeat the uninterrupted one.
        .replace(
            "[higher_order]\nper_step = 1",
            "[higher_order]\nepochs = 5\nbuffer = 16\noptimizer = \"adam\"\nlr = 0.01",
        )
        .replace(
            "[eval]\ncorpus = \"\"",
            &format!(
                "[injector]\nfocus = \"coverage\"\n[ppo]\nbaseline = \"group\"\n[head]\nmax_epochs = 60\npatience = 20\nreplay = 6\nrecalibrate_every = 2\n[blame]\nenabled = true\nepochs = 1\nlogs_per_step = 4\nsamples_per_log = 3\nppo_lr = 0.05\n[eval]\ncorpus = \"{}\"\nsplit = \"val+test\"",
                corpus.display()
            ),
        )
}

#[test]
fn the_decision_head_warm_starts_trains_with_ppo_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus");
    rl::testing::synthetic_corpus(&corpus).unwrap();
    // Three-agent runs with a labelled decisive turn: the blame head learns from them.
    rl::testing::add_blame_logs(&corpus, 24).unwrap();
    let text = head_config(&corpus);
    let run_with = |text: &str, run_dir: &Path, resume: bool, max_steps: Option<u64>| {
        let config = RunConfig::parse(text, Path::new("head.toml")).unwrap();
        let mut t =
            Trainer::with_model(config, text, options(run_dir, resume, max_steps), tiny()).unwrap();
        t.run().unwrap()
    };
    let run = |run_dir: &Path, resume: bool, max_steps: Option<u64>| {
        run_with(&text, run_dir, resume, max_steps)
    };
    let whole = dir.path().join("whole");
    let outcome = run(&whole, false, None);
    assert_eq!(outcome.last_step, 2);
    let before = outcome.before.expect("evaluated after the warm start");
    assert_eq!(before.n, 14, "every val and test trace was evaluated");
    // The fit is logged epoch by epoch with the answer's loss and accuracy on train and val.
    let lines = deterministic_metrics(&whole);
    let fit: Vec<&serde_json::Value> = lines.iter().filter(|l| l["phase"] == "sft-head").collect();
    assert!(fit.len() >= 2, "{lines:?}");
    let (first, last) = (fit[0], fit[fit.len() - 1]);
    assert!(last["answer_nll"].as_f64().unwrap() < first["answer_nll"].as_f64().unwrap());
    assert!(last["answer_top1"].as_f64().unwrap() > 0.5, "{last}");
    assert!(last["val_answer_top5"].is_number(), "{last}");
    // PPO steps ran on the head: a KL to the warm-started head is logged for each.
    let ppo: Vec<&serde_json::Value> = lines.iter().filter(|l| l["phase"] == "ppo").collect();
    assert_eq!(ppo.len(), 2);
    assert!(ppo.iter().all(|l| l["head_kl"].is_number()), "{ppo:?}");
    let head = |run: &Path, step: u64, file: &str| {
        std::fs::read_to_string(run.join(format!("step-{step}/detector/{file}"))).unwrap()
    };
    // The reference stays the warm start; the head itself moved unless no batch had signal.
    assert_eq!(
        head(&whole, 2, policy::decision::REFERENCE_HEAD_FILE),
        head(&whole, 0, policy::decision::HEAD_FILE)
    );
    let moved = head(&whole, 2, policy::decision::HEAD_FILE)
        != head(&whole, 0, policy::decision::HEAD_FILE);
    let skipped = ppo.iter().all(|l| l["skipped_update"] == true);
    // Each step also reviews the live traces the head named wrongly (logged, with the share
    // it names after the review).
    assert!(
        ppo.iter().all(|l| l["review_failures"].is_number()),
        "{ppo:?}"
    );
    // The first step with a valid injection also investigated the clean run beside it (the
    // agent's clean runs succeed), and no step more than one; they are in the step's log.
    let first_valid = ppo
        .iter()
        .find(|l| l["valid_injections"].as_u64().unwrap() > 0)
        .expect("a valid injection in two steps");
    assert_eq!(first_valid["healthy_investigated"], 1, "{first_valid}");
    assert!(first_valid["healthy_false_positive_rate"].is_number());
    assert!(ppo
        .iter()
        .all(|l| l["healthy_investigated"].as_u64().unwrap_or(0) <= 1));
    let step = first_valid["step"].as_u64().unwrap();
    let log = std::fs::read_to_string(whole.join(format!("live/investigations/step-{step}.jsonl")))
        .unwrap();
    assert!(log.lines().any(|l| l.contains("\"healthy\":true")), "{log}");
    let reviewed = ppo
        .iter()
        .any(|l| l["review_failures"].as_u64().unwrap() > 0);
    assert_eq!(
        moved,
        !skipped || reviewed,
        "moved {moved}, every update skipped {skipped}, failures reviewed {reviewed}"
    );

    // The blame head warm-started on the train logs, then PPO moved it in each step from
    // the same reference; its evaluations are logged, on the held-out logs too.
    assert_eq!(
        head(&whole, 2, rl::checkpoint::BLAME_REFERENCE_FILE),
        head(&whole, 0, policy::blame_head::FILE)
    );
    // (One epoch leaves the warm start unsure enough that sampled turns differ.)
    assert_ne!(
        head(&whole, 2, policy::blame_head::FILE),
        head(&whole, 0, policy::blame_head::FILE),
        "{ppo:?}"
    );
    assert!(
        ppo.iter()
            .all(|l| l["blame_reward"].is_number() && l["blame_kl"].is_number()),
        "{ppo:?}"
    );
    let blame: Vec<serde_json::Value> = std::fs::read_to_string(whole.join("eval-blame.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let held_out: Vec<&serde_json::Value> =
        blame.iter().filter(|l| l["split"] == "held-out").collect();
    assert_eq!(
        held_out.len(),
        2,
        "after the warm start and at the end: {blame:?}"
    );
    assert_eq!(held_out[0]["logs"], 8);
    // The rule (the turn that wrote the failed code) is learnt from 16 train logs.
    assert_eq!(held_out[0]["exact"], 1.0, "{blame:?}");
    let before = outcome.blame_before.expect("the blame head was evaluated");
    assert_eq!((before.logs, before.exact), (8, 1.0));
    assert!(blame
        .iter()
        .any(|l| l["split"] == "train" && l["nll"].is_number()));

    // The coverage focus planted only templates of types the head has a class for, and counted
    // each episode's template and task; step 2 set the operating point again.
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(whole.join("step-2/state.json")).unwrap())
            .unwrap();
    let planted = state["planted"].as_object().unwrap();
    assert_eq!(
        planted.values().map(|v| v.as_u64().unwrap()).sum::<u64>(),
        8,
        "{planted:?}"
    );
    let fitted: serde_json::Value =
        serde_json::from_str(&head(&whole, 2, policy::decision::HEAD_FILE)).unwrap();
    let classes: Vec<&str> = fitted["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    for key in planted.keys() {
        let ty = key.split('/').nth(1).unwrap();
        assert!(
            classes.contains(&ty),
            "planted {key}, head classes {classes:?}"
        );
    }
    assert!(!state["planted_tasks"].as_array().unwrap().is_empty());
    assert!(ppo[1]["none_shift"].is_number(), "{}", ppo[1]);

    // Interrupted after step 1 and resumed: the same head and metrics as the whole run.
    let split = dir.path().join("split");
    assert_eq!(run(&split, false, Some(1)).last_step, 1);
    assert_eq!(run(&split, true, None).last_step, 2);
    assert_eq!(
        head(&whole, 2, policy::decision::HEAD_FILE),
        head(&split, 2, policy::decision::HEAD_FILE)
    );
    assert_eq!(
        head(&whole, 2, policy::blame_head::FILE),
        head(&split, 2, policy::blame_head::FILE)
    );
    assert_eq!(deterministic_metrics(&whole), deterministic_metrics(&split));

    // One episode at a time: the same step, only slower.
    let serial = dir.path().join("serial");
    let one_job = text.replace("jobs = 2", "jobs = 1");
    assert_eq!(run_with(&one_job, &serial, false, None).last_step, 2);
    assert_eq!(
        head(&whole, 2, policy::decision::HEAD_FILE),
        head(&serial, 2, policy::decision::HEAD_FILE)
    );
    assert_eq!(
        deterministic_metrics(&whole),
        deterministic_metrics(&serial)
    );
}

#[test]
fn a_framed_head_trains_on_framed_inputs_saves_its_frames_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus");
    rl::testing::synthetic_corpus(&corpus).unwrap();
    let text = head_config(&corpus).replace("[head]\n", "[head]\nframe = \"framework\"\n");
    assert!(text.contains("frame = \"framework\""));
    let run = |run_dir: &Path, resume: bool, max_steps: Option<u64>| {
        let config = RunConfig::parse(&text, Path::new("framed.toml")).unwrap();
        let mut t = Trainer::with_model(config, &text, options(run_dir, resume, max_steps), tiny())
            .unwrap();
        t.run().unwrap()
    };
    let whole = dir.path().join("whole");
    let outcome = run(&whole, false, None);
    assert_eq!(outcome.last_step, 2);
    assert_eq!(outcome.before.expect("evaluated").n, 14);
    let head = |run: &Path, step: u64| -> serde_json::Value {
        let path = run.join(format!(
            "step-{step}/detector/{}",
            policy::decision::HEAD_FILE
        ));
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    // The head keeps the frame of each framework it was fitted on (the synthetic corpus's
    // traces name none), one value per input; the live toolcaller traces are read through
    // their median.
    let fitted = head(&whole, 2);
    let frames = fitted["frames"]
        .as_object()
        .expect("frames saved with the head");
    assert_eq!(frames.len(), 1, "{frames:?}");
    let dim = fitted["type_model"]["dim"].as_u64().unwrap() as usize;
    for frame in frames.values() {
        assert_eq!(frame["centre"].as_array().unwrap().len(), dim);
        assert_eq!(frame["traces"], 14 * 2);
    }
    // Stopped after step 1 and resumed: the replayed train traces are framed again as the
    // warm start framed them, so the run ends with the same head and metrics.
    let split = dir.path().join("split");
    assert_eq!(run(&split, false, Some(1)).last_step, 1);
    assert_eq!(run(&split, true, None).last_step, 2);
    assert_eq!(head(&whole, 2), head(&split, 2));
    assert_eq!(deterministic_metrics(&whole), deterministic_metrics(&split));
}
