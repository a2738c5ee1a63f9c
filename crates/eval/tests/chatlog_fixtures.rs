//! Blame on the chat logs in Who&When's format that the repository carries
//! (tests/fixtures/who-and-when, written for this project; see its README.md): the import of a
//! directory of logs, the `first-error` baseline's answers and figures, and the expert's
//! answers, without building the command line.

use std::path::{Path, PathBuf};

use eval::metrics::{agent_correct, step_within, BlameCase};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/who-and-when")
}

/// `set/N.json` of a case's source path.
fn name(case: &BlameCase) -> String {
    let path = Path::new(&case.source);
    let set = path
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy();
    format!("{set}/{}", path.file_name().unwrap().to_string_lossy())
}

/// Hits of a figure, out of the six logs.
fn hits(cases: &[BlameCase], figure: impl Fn(&BlameCase) -> Option<bool>) -> usize {
    cases.iter().filter(|c| figure(c) == Some(true)).count()
}

#[test]
fn first_error_blames_each_fixture_as_its_rule_says() {
    let cases = eval::chatlog::evaluate(&fixtures(), "first-error", |_| {}).unwrap();
    // Each log as `file: truth AGENT@STEP, predicted AGENT@STEP`.
    let got: Vec<String> = cases
        .iter()
        .map(|c| {
            let truth = format!(
                "{}@{}",
                c.truth.agent.as_deref().unwrap(),
                c.truth.step.unwrap()
            );
            let (agent, step) = c.blamed().expect("an answer");
            format!("{}: truth {truth}, predicted {agent}@{step}", name(c))
        })
        .collect();
    // Only algorithm-generated/3.json has a failing turn (the exit code 124 at turn 3), which
    // is blamed on the turn that wrote the code (2). No other turn carries a failure word, so
    // every other log is blamed on its first acting turn: turn 0 of an algorithm-generated log
    // (its first speaker is an agent, not the human), turn 1 of a hand-crafted one (turn 0 is
    // the human's request).
    assert_eq!(
        got,
        [
            "algorithm-generated/1.json: truth Spreadsheet_Expert@0, predicted Spreadsheet_Expert@0",
            "algorithm-generated/2.json: truth DataCheck_Expert@2, predicted Records_Expert@0",
            "algorithm-generated/3.json: truth Checking_Expert@4, predicted Statistics_Expert@2",
            "algorithm-generated/4.json: truth Property_Expert@2, predicted Property_Expert@0",
            "hand-crafted/1.json: truth WebSurfer@12, predicted Orchestrator@1",
            "hand-crafted/2.json: truth WebSurfer@4, predicted Orchestrator@1",
        ]
    );
    // So: the agent in 2 of 6 (algorithm-generated/1 and 4), the exact step in 1 of 6
    // (algorithm-generated/1), and no other answer within one turn of the label.
    assert_eq!(hits(&cases, agent_correct), 2);
    assert_eq!(hits(&cases, |c| step_within(c, 0)), 1);
    assert_eq!(hits(&cases, |c| step_within(c, 1)), 1);
}

#[test]
fn the_expert_answers_every_fixture_with_one_of_its_turns() {
    let cases = eval::chatlog::evaluate(&fixtures(), "expert", |_| {}).unwrap();
    assert_eq!(cases.len(), 6);
    for case in &cases {
        let log: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&case.source).unwrap()).unwrap();
        let history = log["history"].as_array().unwrap();
        let (agent, step) = case.blamed().expect("an answer");
        let turn = &history[step as usize];
        let speaker = turn["name"]
            .as_str()
            .or(turn["role"].as_str())
            .unwrap()
            .split(" (")
            .next()
            .unwrap()
            .replace(' ', "_");
        assert_eq!(agent, speaker, "{}: step {step}", name(case));
    }
}
