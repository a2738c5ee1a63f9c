//! Episodes end to end on synthetic traces with known deficiencies (generated here by
//! `detect::synthetic`; the real corpus generator comes later).

use detect::policies::{ExpertPolicy, KeywordPolicy};
use detect::{Config, Detector, Outcome, Policy, Status, Transcript, Verdict, View};

fn store(
    repeats: u64,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    Vec<(String, traces::Label)>,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("traces.db");
    let labels = detect::synthetic::build_store(&path, repeats).unwrap();
    (dir, path, labels)
}

fn accuracy(
    detector: &Detector,
    labels: &[(String, traces::Label)],
    make: &dyn Fn() -> Box<dyn Policy>,
) -> (usize, usize, Vec<String>) {
    let mut ids = 0;
    let mut both = 0;
    let mut lines = Vec::new();
    for (trace, label) in labels {
        let t = detector.investigate(trace, make()).unwrap();
        let (id, component) = match t.verdict() {
            Some(Verdict::Deficiency {
                deficiency_id,
                component,
                ..
            }) => (deficiency_id.clone(), component.clone()),
            _ => ("-".into(), "-".into()),
        };
        let want = label.truth.deficiency_id.clone().unwrap();
        if id == want {
            ids += 1;
            if Some(&component) == label.truth.component.as_ref() {
                both += 1;
            }
        }
        lines.push(format!("{want} -> {id} {component}"));
    }
    (ids, both, lines)
}

#[test]
fn expert_beats_keyword_on_known_deficiencies() {
    let (_dir, path, labels) = store(2);
    let detector = Detector::new(&path, Config::default(), false).unwrap();
    let (k_ids, k_both, k_lines) = accuracy(&detector, &labels, &|| {
        Box::new(KeywordPolicy::new().unwrap())
    });
    let (e_ids, e_both, e_lines) = accuracy(&detector, &labels, &|| Box::new(ExpertPolicy::new()));
    eprintln!(
        "keyword: {k_ids}/{} ids, {k_both} with component\n{}",
        labels.len(),
        k_lines.join("\n")
    );
    eprintln!(
        "expert: {e_ids}/{} ids, {e_both} with component\n{}",
        labels.len(),
        e_lines.join("\n")
    );
    assert!(e_both > k_both, "expert {e_both} vs keyword {k_both}");
    assert!(
        e_ids * 10 >= labels.len() * 8,
        "expert should be right on at least 80%: {e_ids}/{}",
        labels.len()
    );
}

#[test]
fn expert_transcript_round_trips_through_the_trace_importer() {
    let (dir, path, labels) = store(1);
    let detector = Detector::new(&path, Config::default(), false).unwrap();
    // P11 fails on LLM spans, so the expert delegates: the transcript has a subagent.
    let (trace, _) = labels
        .iter()
        .find(|(_, l)| l.truth.deficiency_id.as_deref() == Some("P11"))
        .unwrap();
    let transcript = detector
        .investigate(trace, Box::new(ExpertPolicy::new()))
        .unwrap();
    assert!(
        transcript.turns.iter().any(|t| !t.subagents.is_empty()),
        "{}",
        transcript.render()
    );
    assert!(
        transcript
            .turns
            .iter()
            .all(|t| t.observation.status == Status::Ok),
        "{}",
        transcript.render()
    );

    let json = serde_json::to_string(&transcript).unwrap();
    assert_eq!(
        serde_json::from_str::<Transcript>(&json).unwrap(),
        transcript
    );

    let mut episodes = traces::Store::open(dir.path().join("episodes.db")).unwrap();
    let report = episodes
        .import_spans(transcript.to_spans(), "detect-episode")
        .unwrap();
    assert_eq!(report.trace_ids, vec![transcript.episode_id.clone()]);
    let back = Transcript::from_spans(&episodes.spans(&transcript.episode_id).unwrap()).unwrap();
    assert_eq!(back, transcript);
}

/// Plays fixed texts, then repeats the last.
struct Scripted(Vec<String>);

impl Policy for Scripted {
    fn name(&self) -> String {
        "scripted".into()
    }
    fn act(&mut self, view: &View<'_>) -> Result<String, String> {
        Ok(self
            .0
            .get(view.turns.len())
            .or(self.0.last())
            .cloned()
            .unwrap_or_default())
    }
    fn subagent(&self, task: &str) -> Result<Box<dyn Policy>, String> {
        Ok(Box::new(Scripted(vec![format!(
            "answer: looked at {task}"
        )])))
    }
}

fn scripted(texts: &[&str]) -> Box<dyn Policy> {
    Box::new(Scripted(texts.iter().map(|s| s.to_string()).collect()))
}

#[test]
fn malformed_calls_get_observations_and_limits_end_runaway_episodes() {
    let (_dir, path, labels) = store(1);
    let trace = &labels[0].0;
    let detector = Detector::new(&path, Config::default(), false).unwrap();
    let t = detector
        .investigate(
            trace,
            scripted(&[
                "hello",
                "sql: SELECT 1\nbash: cat x",
                "answer: P99 x | y",
                "answer: P2 llm_client.stream | cut JSON",
            ]),
        )
        .unwrap();
    let statuses: Vec<Status> = t.turns.iter().map(|t| t.observation.status).collect();
    assert_eq!(
        statuses,
        [
            Status::Malformed,
            Status::Malformed,
            Status::Malformed,
            Status::Ok
        ]
    );
    assert!(
        t.turns[1].observation.text.contains("line 2"),
        "{}",
        t.turns[1].observation.text
    );
    assert!(matches!(t.outcome, Outcome::Answered { .. }));

    let t = detector
        .investigate(trace, scripted(&["sql: SELECT COUNT(*) FROM spans"]))
        .unwrap();
    assert_eq!(t.outcome, Outcome::TurnLimit);
    assert_eq!(t.turns.len(), Config::default().main_max_turns);

    let small = Config {
        main_token_budget: 4_000,
        ..Config::default()
    };
    let detector = Detector::new(&path, small, false).unwrap();
    let t = detector
        .investigate(trace, scripted(&["bash: cat spans.jsonl"]))
        .unwrap();
    assert_eq!(t.outcome, Outcome::TokenBudget);
}

#[test]
fn output_limits_are_asymmetric_and_subagents_run() {
    let (_dir, path, labels) = store(1);
    let trace = &labels[0].0;
    let detector = Detector::new(&path, Config::default(), false).unwrap();
    let t = detector
        .investigate(
            trace,
            scripted(&[
                "sql: WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 150) SELECT i, printf('%.100c', 'x') FROM n",
                "delegate: first\n- second",
                "history: printf",
                "answer: P2 llm_client.stream | test",
            ]),
        )
        .unwrap();
    let big = &t.turns[0].observation;
    assert!(
        big.text.contains("[output cut: showed 10000 of"),
        "{}",
        big.text
    );
    assert!(big.text.contains("delegate: TASK"));
    assert_eq!(t.turns[1].subagents.len(), 2);
    assert!(
        t.turns[1]
            .observation
            .text
            .contains("subagent 1 (first): looked at first"),
        "{}",
        t.turns[1].observation.text
    );
    assert!(
        t.turns[2]
            .observation
            .text
            .contains("Q: sql: WITH RECURSIVE"),
        "{}",
        t.turns[2].observation.text
    );
}

#[test]
fn ablations_switch_tools_off() {
    let (_dir, path, labels) = store(1);
    let trace = &labels[0].0;
    let config = Config {
        ablations: detect::Ablations {
            no_sql: true,
            no_shell: true,
            no_subagents: true,
            no_schema: true,
            no_history: true,
        },
        ..Config::default()
    };
    let detector = Detector::new(&path, config, false).unwrap();
    let t = detector
        .investigate(
            trace,
            scripted(&[
                "sql: SELECT 1",
                "bash: cat trace.json",
                "delegate: x",
                "history: x",
                "answer: P2 llm_client.stream | none",
            ]),
        )
        .unwrap();
    assert!(
        t.turns[..4]
            .iter()
            .all(|t| t.observation.status == Status::Refused),
        "{}",
        t.render()
    );
    assert!(!t.system_prompt.contains("\nsql: ") && !t.system_prompt.contains("## Trace store"));
}

#[test]
fn history_can_be_shared_across_a_run() {
    let (_dir, path, labels) = store(1);
    let detector = Detector::new(&path, Config::default(), true).unwrap();
    detector
        .investigate(
            &labels[0].0,
            scripted(&[
                "sql: SELECT name FROM spans LIMIT 1",
                "answer: P2 llm_client.stream | x",
            ]),
        )
        .unwrap();
    let t = detector
        .investigate(
            &labels[1].0,
            scripted(&["history: name spans", "answer: P2 llm_client.stream | x"]),
        )
        .unwrap();
    assert!(
        t.turns[0]
            .observation
            .text
            .contains("SELECT name FROM spans"),
        "{}",
        t.turns[0].observation.text
    );
}

/// `--references`: a run that acts as a healthy run of the same task does, span for span, is
/// answered `none`; one that departs from it is answered with the step of its first differing
/// span. The reference is never the trace itself.
#[test]
fn a_healthy_reference_clears_a_matching_run_and_places_a_departing_one() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("traces.db");
    let (failing, twin, healthy) = ("a".repeat(32), "b".repeat(32), "c".repeat(32));
    let mut store = traces::Store::open(&path).unwrap();
    let (spans, _) = detect::synthetic::scenario("P16", &failing, 3).unwrap();
    store.import_spans(spans, "test").unwrap();
    let (spans, _) = detect::synthetic::scenario("P16", &twin, 3).unwrap();
    store.import_spans(spans, "test").unwrap();
    // The same run with its failures repaired: where they were is where the run departs.
    let (mut spans, _) = detect::synthetic::scenario("P16", &healthy, 3).unwrap();
    let first_failure = spans
        .iter()
        .filter(|s| s.is_error())
        .filter_map(|s| s.step)
        .min();
    for s in &mut spans {
        s.status = traces::StatusCode::Ok;
        s.status_message = None;
        s.error_type = None;
        s.error_message = None;
        s.events.clear();
    }
    store.import_spans(spans, "test").unwrap();
    drop(store);

    let answer = |references: Option<Vec<String>>, trace: &str| {
        let config = Config {
            references: references.map(|ids| Arc::new(detect::References::new(ids))),
            ..Config::default()
        };
        let detector = Detector::new(&path, config, false).unwrap();
        let t = detector
            .investigate(trace, Box::new(ExpertPolicy::new()))
            .unwrap();
        match t.verdict() {
            Some(Verdict::Deficiency {
                deficiency_id,
                step,
                ..
            }) => (deficiency_id.clone(), *step),
            other => panic!("{other:?}"),
        }
    };
    let alone = answer(None, &failing);
    assert_eq!(alone.0, "P16");
    assert_eq!(
        answer(Some(vec![twin.clone(), failing.clone()]), &failing).0,
        "none",
        "an identical healthy run of the same task (itself never chosen)"
    );
    let placed = answer(Some(vec![healthy.clone()]), &failing);
    assert_eq!(placed.0, "P16");
    assert_eq!(placed.1, first_failure);
    // Only itself as a reference: nothing to compare with, the answer it gives alone.
    assert_eq!(answer(Some(vec![failing.clone()]), &failing), alone);
}
