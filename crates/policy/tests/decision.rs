//! The whole-choice decision on a tiny random model: features of a probe battery, a head
//! fitted on them whose distribution sums to one over the whole options and whose greedy answer
//! is its argmax, an answer line the Detector's environment accepts, and a head file that
//! round-trips and refuses a corrupted copy.

use detect::probes::ProbeResult;
use linear::{FitOptions, Softmax};
use model::{Arch, DType, Device, Model};
use policy::decision::{self, DecisionHead};
use policy::PolicyModel;

fn tiny_model() -> PolicyModel {
    let config = model::testing::tiny_config(Arch::Llama, true, 8192).unwrap();
    let m = Model::random(config, DType::F32, &Device::Cpu, 4).unwrap();
    PolicyModel::new(m, model::testing::tiny_tokenizer().unwrap(), "tiny".into()).unwrap()
}

fn battery(signal: &str) -> Vec<ProbeResult> {
    vec![
        ProbeResult {
            probe: "shape",
            digest: "trace spans 12 errors 1".into(),
        },
        ProbeResult {
            probe: "flags",
            digest: signal.into(),
        },
    ]
}

#[test]
fn a_fitted_head_decides_among_whole_options_and_answers_validly() {
    let pm = tiny_model();
    let catalog = taxonomy::Catalog::embedded().unwrap();
    let system = decision::system_prompt(&catalog);
    assert!(system.contains("P11 Temperature value out of model's accepted"));
    let signals = ["flag temperature 3", "flag recursion 2", "none"];
    let labels = ["P11", "P16", taxonomy::NONE];
    let mut x = Vec::new();
    let mut y = Vec::new();
    for (k, s) in signals.iter().enumerate() {
        let f = decision::features(&pm, None, &system, &battery(s)).unwrap();
        assert_eq!(f.len(), 2 * pm.model.config().hidden_size);
        x.push(f);
        y.push(k);
    }
    // The reader that computes the system prompt once gives the same features.
    let mut pm = pm;
    let reader = decision::FeatureReader::new(&mut pm, None, &system).unwrap();
    for (s, f) in signals.iter().zip(&x) {
        let g = reader.features(&mut pm, &battery(s)).unwrap();
        let diff = f
            .iter()
            .zip(&g)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-3, "{s}: {diff}");
    }
    let options = FitOptions {
        max_epochs: 200,
        ..FitOptions::default()
    };
    let fit = |y: &[usize], k: usize| Softmax::fit(&x, y, k, &options, None, |_| {}).unwrap();
    let head = DecisionHead {
        types: labels.iter().map(|s| s.to_string()).collect(),
        type_model: fit(&y, 3),
        components: vec![
            "llm_client.request".into(),
            "tools.schema".into(),
            "none".into(),
        ],
        component_model: fit(&y, 3),
        reads: decision::HeadReads::default(),
        healthy_mean: Vec::new(),
        calibration: None,
        frames: Default::default(),
        frame: None,
    };
    for (k, f) in x.iter().enumerate() {
        let d = head.decide(f, 0.0, 0.0);
        let p: Vec<f32> = d.type_log_probs.iter().map(|l| l.exp()).collect();
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        assert_eq!(d.type_index, linear::argmax(&p));
        assert_eq!(d.type_index, k, "the fit separates its three examples");
        let answer = head.answer(&d);
        let verdict =
            detect::action::parse_verdict(answer.strip_prefix("answer:").unwrap(), &catalog)
                .unwrap_or_else(|e| panic!("{answer}: {e}"));
        let detect::Verdict::Deficiency { deficiency_id, .. } = verdict else {
            panic!("{answer}")
        };
        assert_eq!(deficiency_id, labels[k]);
    }
    // Sampling covers the options by their probabilities.
    let d = head.decide(&x[0], 1.0, 0.999_999);
    assert!(d.type_index < 3);

    // One route: on every synthetic trace, the answer the investigation's transcript holds
    // (text, parsed back) is the verdict the trainer builds from what the policy left it.
    let store = tempfile::tempdir().unwrap();
    let db = store.path().join("s.sqlite");
    let traces = detect::synthetic::build_store(&db, 1).unwrap();
    let detector = detect::Detector::new(
        db,
        detect::Config {
            main_max_turns: detect::probes::battery_turns(),
            ..detect::Config::default()
        },
        false,
    )
    .unwrap();
    let shared = std::sync::Arc::new(std::sync::Mutex::new(pm));
    let (head, reader) = (std::sync::Arc::new(head), std::sync::Arc::new(reader));
    let mut placed = 0;
    for (trace, _) in &traces {
        let sink = std::sync::Arc::new(std::sync::Mutex::new(None));
        let policy = decision::policy(
            std::sync::Arc::clone(&shared),
            std::sync::Arc::clone(&head),
            std::sync::Arc::clone(&reader),
            0.0,
            0.0,
            Some(std::sync::Arc::clone(&sink)),
        );
        let transcript = detector.investigate(trace, policy).unwrap();
        let left = sink
            .lock()
            .unwrap()
            .take()
            .expect("the policy left its decision");
        let rebuilt = head.located_verdict(&left.choice, left.failing_function.as_deref());
        assert_eq!(transcript.verdict(), Some(&rebuilt), "{trace}");
        placed += usize::from(matches!(
            rebuilt,
            detect::Verdict::Deficiency {
                location: Some(_),
                ..
            }
        ));
    }
    // Some answers are placed at a failing function (the synthetic traces hold failing tool
    // spans), and those agree too.
    assert!(placed > 0, "no answer was placed at a function");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(decision::HEAD_FILE);
    head.save(&path).unwrap();
    assert_eq!(DecisionHead::load(&path).unwrap(), *head);
    let mut broken = (*head).clone();
    broken.types.pop();
    broken.save(&path).unwrap();
    let err = DecisionHead::load(&path).unwrap_err().to_string();
    assert!(err.contains(decision::HEAD_FILE), "{err}");
}
