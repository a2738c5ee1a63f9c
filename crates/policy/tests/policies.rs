//! The learned policies on a tiny random model: every reply the grammar admits is a call the
//! Detector's environment accepts, the conversation of an episode is exactly the token
//! sequence the model was prompted with and produced, and expert transcripts become
//! demonstrations in the grammar's own tokenisation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use candle_core::quantized::gguf_file;
use detect::policies::ExpertPolicy;
use detect::{action, Detector};
use model::{Arch, DType, Device, Model};
use policy::{
    choose_injection, demonstration, ActionGrammar, ChatFormat, Conversation, DemoAnswer,
    DetectorOptions, InjectionOption, LearnedDetector, PolicyModel, SharedModel,
};

fn tiny_model(seed: u64) -> PolicyModel {
    let config = model::testing::tiny_config(Arch::Llama, true, 4096).unwrap();
    let m = Model::random(config, DType::F32, &Device::Cpu, seed).unwrap();
    PolicyModel::new(m, model::testing::tiny_tokenizer().unwrap(), "tiny".into()).unwrap()
}

fn catalog() -> taxonomy::Catalog {
    taxonomy::Catalog::embedded().unwrap()
}

#[test]
fn chat_format_accepts_chatml_and_names_other_templates() {
    let pm = tiny_model(1);
    assert_eq!(pm.format.im_end, 2);
    let mut md: HashMap<String, gguf_file::Value> =
        model::testing::tokenizer_metadata().into_iter().collect();
    md.insert(
        "tokenizer.chat_template".into(),
        gguf_file::Value::String(
            "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}".into(),
        ),
    );
    let content = gguf_file::Content {
        magic: gguf_file::VersionedMagic::GgufV3,
        metadata: md,
        tensor_infos: HashMap::new(),
        tensor_data_offset: 0,
    };
    let tok = model::ChatTokenizer::from_gguf_content("other", &content).unwrap();
    let err = ChatFormat::of(&tok).unwrap_err().to_string();
    assert!(err.contains("not ChatML"), "{err}");
}

#[test]
fn every_sampled_reply_is_a_well_formed_call() {
    let pm = tiny_model(2);
    let grammar =
        ActionGrammar::new(&pm.tokenizer, &catalog(), &policy::grammar::LEARNED_TOOLS).unwrap();
    let shared: SharedModel = Arc::new(Mutex::new(pm));
    let mut heads = std::collections::BTreeSet::new();
    for seed in 0..24 {
        let mut pm = shared.lock().unwrap();
        let mut c = Conversation::new();
        c.push_message(&pm.tokenizer, "system", "s").unwrap();
        c.push_message(&pm.tokenizer, "user", "u").unwrap();
        c.open_reply(&pm.tokenizer).unwrap();
        let mut cache = model::KvCache::new(&pm.model, 1);
        let params = model::SamplingParams {
            max_new_tokens: 40,
            temperature: 1.0,
            seed,
            stop_token_ids: Some(vec![pm.format.im_end]),
            ..Default::default()
        };
        let reply = pm
            .reply(None, &mut cache, &c, &params, &|g| grammar.allowed(g))
            .unwrap();
        let text = pm.tokenizer.decode(&reply, true).unwrap();
        let turn = action::parse(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        heads.insert(turn.action.tool());
        if let action::Action::Answer { text: answer } = &turn.action {
            // The id and component are always valid; only the free evidence may be empty.
            let head = answer.split('|').next().unwrap();
            let words: Vec<&str> = head.split_whitespace().collect();
            assert_eq!(words.len(), 2, "{answer:?}");
            assert!(catalog().get(words[0]).is_some(), "{answer:?}");
            assert!(catalog().component(words[1]).is_some(), "{answer:?}");
        }
        let allowed = grammar.allowed_sets(&reply);
        c.push_reply(&pm.tokenizer, pm.format, &reply, allowed)
            .unwrap();
        c.check().unwrap();
    }
    assert!(heads.len() >= 2, "sampling reached only {heads:?}");
}

#[test]
fn an_episode_records_the_exact_tokens_and_demonstrations_follow_the_grammar() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.sqlite");
    let labels = detect::synthetic::build_store(&db, 1).unwrap();
    let (trace_id, _) = &labels[0];
    let pm = tiny_model(3);
    let grammar = Arc::new(
        ActionGrammar::new(&pm.tokenizer, &catalog(), &policy::grammar::LEARNED_TOOLS).unwrap(),
    );
    let shared: SharedModel = Arc::new(Mutex::new(pm));
    let config = detect::Config {
        main_max_turns: 3,
        ..detect::Config::default()
    };
    let detector = Detector::new(&db, config, false).unwrap();
    let sink = Arc::new(Mutex::new(Conversation::new()));
    let policy = LearnedDetector::new(
        Arc::clone(&shared),
        Arc::clone(&grammar),
        DetectorOptions {
            temperature: 1.0,
            max_action_tokens: 24,
            seed: 9,
            ..DetectorOptions::default()
        },
    )
    .with_sink(Arc::clone(&sink));
    let transcript = detector.investigate(trace_id, Box::new(policy)).unwrap();
    let c = sink.lock().unwrap().clone();
    c.check().unwrap();
    // One line per call, and the last turn answers whatever came before.
    assert!(transcript.turns.iter().all(|t| !t.text.contains('\n')));
    assert!(
        transcript.verdict().is_some(),
        "no verdict: {:?} {:?}",
        transcript.outcome,
        transcript
            .turns
            .last()
            .map(|t| (&t.text, &t.observation.text))
    );
    assert_eq!(
        // Message openings written by the conversation (a sampled reply may contain the token).
        c.tokens
            .iter()
            .zip(&c.generated)
            .filter(|&(&t, &g)| t == 1 && !g)
            .count(),
        2 + 2 * transcript.turns.len() - 1,
        "system, task, then a reply per turn and an observation between turns"
    );
    // Every reply's text is what the environment received (compared on ASCII letters and
    // digits: a random model's stray byte tokens decode differently alone and in context).
    let pm = shared.lock().unwrap();
    let plain = |s: &str| -> String { s.chars().filter(char::is_ascii_alphanumeric).collect() };
    let rendered = plain(&pm.tokenizer.decode(&c.tokens, true).unwrap());
    for turn in &transcript.turns {
        assert!(rendered.contains(&plain(&turn.text)), "{:?}", turn.text);
    }

    // The expert's transcript as a demonstration.
    let expert = Detector::new(&db, detect::Config::default(), false)
        .unwrap()
        .investigate(trace_id, Box::new(ExpertPolicy::new()))
        .unwrap();
    let demo_ending_in = |answer| {
        demonstration(
            &pm.tokenizer,
            pm.format,
            &grammar,
            &expert,
            false,
            2,
            200,
            answer,
        )
        .unwrap()
    };
    let demo = demo_ending_in(DemoAnswer::Expert)
        .unwrap_or_else(|| panic!("no demonstration from {:?}", expert.outcome));
    demo.check().unwrap();
    let text = pm.tokenizer.decode(&demo.tokens, false).unwrap();
    // The learned Detector's answer grammar names no step, so the demonstration's answer is
    // the expert's without the `@step` it gave.
    let verdict = match expert.verdict().unwrap().clone() {
        detect::Verdict::Deficiency {
            deficiency_id,
            component,
            evidence,
            ..
        } => detect::Verdict::Deficiency {
            deficiency_id,
            component,
            step: None,
            location: None,
            evidence,
        },
        other => other,
    }
    .render();
    assert!(
        text.contains(&verdict),
        "{verdict} not in the demonstration"
    );
    assert_eq!(
        text.matches("<|im_start|>assistant").count(),
        3,
        "two probes and the answer"
    );

    // The same probes ending in a label the expert did not give: the label's answer, without
    // the expert's evidence (which argues for its own answer).
    let Some(detect::Verdict::Deficiency {
        deficiency_id,
        component,
        evidence,
        ..
    }) = expert.verdict()
    else {
        panic!("the expert gave no deficiency")
    };
    let other = catalog()
        .deficiencies()
        .iter()
        .find(|d| d.id != *deficiency_id)
        .unwrap()
        .id
        .clone();
    let labelled = demo_ending_in(DemoAnswer::Label(&other, component))
        .expect("a label the grammar can write");
    labelled.check().unwrap();
    let labelled_text = pm.tokenizer.decode(&labelled.tokens, false).unwrap();
    let (probes, answer) = labelled_text.rsplit_once("<|im_start|>assistant").unwrap();
    let (expert_probes, _) = text.rsplit_once("<|im_start|>assistant").unwrap();
    assert_eq!(probes, expert_probes, "the expert's probes are kept");
    assert!(
        answer.contains(&format!("{other} {component} |")),
        "{answer:?}"
    );
    assert!(!evidence.is_empty() && !answer.contains(evidence.as_str()));
    // The labelled answer is one the Detector's environment accepts (evidence included).
    let reply = answer
        .trim_start_matches('\n')
        .split("<|im_end|>")
        .next()
        .unwrap();
    let turn = action::parse(reply).unwrap_or_else(|e| panic!("{reply:?}: {e}"));
    let action::Action::Answer { text: verdict } = &turn.action else {
        panic!("{reply:?} is not an answer")
    };
    match action::parse_verdict(verdict, &catalog()).unwrap() {
        detect::Verdict::Deficiency {
            deficiency_id,
            component: c,
            ..
        } => assert_eq!(
            (deficiency_id.as_str(), c.as_str()),
            (other.as_str(), component.as_str())
        ),
        v => panic!("{v:?}"),
    }
    // A label outside the grammar gives no demonstration.
    assert!(demo_ending_in(DemoAnswer::Label("P999", component)).is_none());
}

#[test]
fn the_injector_always_chooses_an_offered_option() {
    let mut pm = tiny_model(4);
    let options: Vec<InjectionOption> = [("P1", "a"), ("P16", "recursive-ref"), ("C3", "b")]
        .iter()
        .map(|(d, v)| InjectionOption {
            deficiency: d.to_string(),
            variant: v.to_string(),
        })
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..12 {
        let choice = choose_injection(
            &mut pm,
            None,
            "toolcaller",
            &["tools.schema".into()],
            "P1 missed",
            &options,
            1.0,
            seed,
        )
        .unwrap();
        choice.conversation.check().unwrap();
        let text = pm
            .tokenizer
            .decode(&choice.conversation.tokens, false)
            .unwrap();
        assert!(text.ends_with(&format!(
            "<|im_start|>assistant\n {}<|im_end|>\n",
            options[choice.index].text()
        )));
        seen.insert(choice.index);
    }
    assert!(
        seen.len() >= 2,
        "temperature 1 should reach several options"
    );
    // One option: nothing to choose, so nothing generated (and nothing to train on).
    let only = &options[1..2];
    let choice = choose_injection(
        &mut pm,
        None,
        "toolcaller",
        &["tools.schema".into()],
        "",
        only,
        1.0,
        0,
    )
    .unwrap();
    assert_eq!(choice.index, 0);
    choice.conversation.check().unwrap();
    assert_eq!(choice.conversation.generated_count(), 0);
    let text = pm
        .tokenizer
        .decode(&choice.conversation.tokens, false)
        .unwrap();
    assert!(
        text.ends_with("<|im_start|>assistant\n P16 recursive-ref<|im_end|>\n"),
        "{text}"
    );
}

/// `rows` investigations of one trace with the same options, decoded together or alone; their
/// conversations.
fn investigations(
    shared: &SharedModel,
    grammar: &Arc<ActionGrammar>,
    detector: &Detector,
    trace_id: &str,
    options: &DetectorOptions,
    rows: usize,
    batched: bool,
) -> Vec<Conversation> {
    let options = vec![options.clone(); rows];
    policy::investigate_many(detector, trace_id, shared, grammar, &options, batched)
        .into_iter()
        .map(|r| r.unwrap().1)
        .collect()
}

/// A store of one synthetic trace, a tiny random model and its grammar, and a Detector with
/// `max_turns` turns.
fn investigation_fixture(
    model_seed: u64,
    max_turns: usize,
) -> (
    tempfile::TempDir,
    String,
    SharedModel,
    Arc<ActionGrammar>,
    Detector,
) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.sqlite");
    let labels = detect::synthetic::build_store(&db, 1).unwrap();
    let trace_id = labels[0].0.clone();
    let pm = tiny_model(model_seed);
    let grammar = Arc::new(
        ActionGrammar::new(&pm.tokenizer, &catalog(), &policy::grammar::LEARNED_TOOLS).unwrap(),
    );
    let shared: SharedModel = Arc::new(Mutex::new(pm));
    let config = detect::Config {
        main_max_turns: max_turns,
        ..detect::Config::default()
    };
    let detector = Detector::new(&db, config, false).unwrap();
    (dir, trace_id, shared, grammar, detector)
}

#[test]
fn investigations_decoded_together_match_those_decoded_alone() {
    let (_dir, trace_id, shared, grammar, detector) = investigation_fixture(5, 3);
    let trace_id = &trace_id;
    let greedy = DetectorOptions {
        temperature: 0.0,
        max_action_tokens: 24,
        seed: 4,
        ..DetectorOptions::default()
    };
    let alone = investigations(&shared, &grammar, &detector, trace_id, &greedy, 1, false);
    let batcher = Arc::new(policy::TurnBatcher::new(
        Arc::clone(&shared),
        Arc::clone(&grammar),
        None,
        0.0,
        4,
    ));
    let together: Vec<Conversation> = std::thread::scope(|scope| {
        let running: Vec<_> = (0..4)
            .map(|k| {
                let (shared, grammar, batcher, detector, greedy) =
                    (&shared, &grammar, &batcher, &detector, &greedy);
                scope.spawn(move || {
                    let sink = Arc::new(Mutex::new(Conversation::new()));
                    let p = LearnedDetector::new(
                        Arc::clone(shared),
                        Arc::clone(grammar),
                        greedy.clone(),
                    )
                    .with_sink(Arc::clone(&sink))
                    .in_batch(Arc::clone(batcher), k);
                    detector.investigate(trace_id, Box::new(p)).unwrap();
                    let c = sink.lock().unwrap().clone();
                    c
                })
            })
            .collect();
        running.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Greedy rows of one batch are the conversation decoded alone, token for token: padding
    // and the other rows change nothing.
    for c in &together {
        c.check().unwrap();
        assert_eq!(c.tokens, alone[0].tokens);
        assert_eq!(c.generated, alone[0].generated);
    }
    // One batched call per turn, not one per investigation and turn.
    let replies = alone[0]
        .generated
        .windows(2)
        .filter(|w| w[0] && !w[1])
        .count()
        + usize::from(alone[0].generated.last() == Some(&true));
    assert_eq!(
        batcher.batches(),
        replies,
        "{replies} replies per investigation"
    );

    // Sampled, each row draws from its own seed's sampler: the batch gives every row the
    // conversation it samples alone.
    let sampled = DetectorOptions {
        temperature: 1.0,
        ..greedy
    };
    let alone = investigations(&shared, &grammar, &detector, trace_id, &sampled, 1, false);
    let rows = investigations(&shared, &grammar, &detector, trace_id, &sampled, 4, true);
    for c in &rows {
        c.check().unwrap();
        assert_eq!(c.tokens, alone[0].tokens);
    }
}
