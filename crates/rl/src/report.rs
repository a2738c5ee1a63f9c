//! A run's report, read from its `metrics.jsonl` and `eval.jsonl`: held-out detection of the
//! warm-started policy (SFT only) against the policy after PPO, the paper's Table 9 (injection
//! diversity, detection accuracy and query depth at each step), and throughput. Several runs
//! (seeds) are compared side by side. `pathfinder report` writes this beside the charts.
//!
//! Reads only; the Markdown is a pure function of the logs.

use std::fmt::Write;
use std::path::Path;

use crate::run_log::{self, BlameEval, EvalMetrics, StepMetrics};
use crate::Result;

/// Everything a run logged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunLog {
    pub name: String,
    pub steps: Vec<StepMetrics>,
    pub evals: Vec<EvalMetrics>,
    /// Per held-out trace and evaluation: (step, policy, trace id, detected); healthy traces
    /// are left out (`eval-cases.jsonl`, absent in older runs).
    pub cases: Vec<(u64, String, String, bool)>,
    /// The same on the frameworks left out of training (`eval-left-out.jsonl` and its cases;
    /// empty unless the run left some out).
    pub left_out: Vec<EvalMetrics>,
    pub left_out_cases: Vec<(u64, String, String, bool)>,
    /// The learned blamer's fit and evaluations (`eval-blame.jsonl`; empty unless the run
    /// trained one).
    pub blame: Vec<BlameEval>,
}

/// The deficient cases of `eval-cases.jsonl` as (step, policy, trace id, detected).
fn read_cases(path: &Path) -> Result<Vec<(u64, String, String, bool)>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for v in run_log::read_jsonl::<serde_json::Value>(path)? {
        let truth = v["truth"]["deficiency_id"].as_str().unwrap_or_default();
        if truth.eq_ignore_ascii_case(taxonomy::NONE) {
            continue;
        }
        let predicted = v["predicted"]["deficiency_id"].as_str().unwrap_or_default();
        out.push((
            v["step"].as_u64().unwrap_or_default(),
            v["policy"].as_str().unwrap_or_default().to_owned(),
            v["trace_id"].as_str().unwrap_or_default().to_owned(),
            predicted.eq_ignore_ascii_case(truth),
        ));
    }
    Ok(out)
}

/// The paired difference in held-out detection, SFT + PPO (the last `ppo` evaluation) less
/// SFT only (step 0), over the deficient traces both evaluated, with a bootstrap interval.
pub fn paired_gain(log: &RunLog) -> Option<eval::Estimate> {
    paired_gain_of(&log.evals, &log.cases)
}

/// [`paired_gain`] over one set of evaluations and their cases.
fn paired_gain_of(
    evals: &[EvalMetrics],
    cases: &[(u64, String, String, bool)],
) -> Option<eval::Estimate> {
    let after = last_after(evals)?.step;
    let before: std::collections::BTreeMap<&str, bool> = cases
        .iter()
        .filter(|c| c.0 == 0 && c.1 == "sft")
        .map(|c| (c.2.as_str(), c.3))
        .collect();
    let diffs: Vec<f64> = cases
        .iter()
        .filter(|c| c.0 == after && c.1 == "ppo")
        .filter_map(|c| {
            let b = before.get(c.2.as_str())?;
            Some(f64::from(u8::from(c.3)) - f64::from(u8::from(*b)))
        })
        .collect();
    eval::bootstrap::mean(&diffs, &eval::Bootstrap::default())
}

impl RunLog {
    /// Reads `RUN/metrics.jsonl` and `RUN/eval.jsonl`; the run's name is its directory's.
    pub fn read(run: &Path) -> Result<RunLog> {
        let name = run
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| run.display().to_string());
        Ok(RunLog {
            name,
            steps: run_log::read_jsonl(&run.join("metrics.jsonl"))?,
            evals: read_evals(&run.join(run_log::EVAL_FILE))?,
            cases: read_cases(&run.join("eval-cases.jsonl"))?,
            left_out: read_evals(&run.join(run_log::LEFT_OUT_FILE))?,
            left_out_cases: read_cases(&run.join("eval-left-out-cases.jsonl"))?,
            blame: if run.join(run_log::BLAME_FILE).exists() {
                run_log::read_jsonl(&run.join(run_log::BLAME_FILE))?
            } else {
                Vec::new()
            },
        })
    }

    /// PPO steps only (warm-start updates are logged with phase `sft`).
    pub fn ppo_steps(&self) -> impl Iterator<Item = &StepMetrics> {
        self.steps.iter().filter(|m| m.phase == "ppo")
    }

    /// The held-out evaluation of the warm-started policy, before any PPO step.
    pub fn before(&self) -> Option<&EvalMetrics> {
        first_before(&self.evals)
    }

    /// The last held-out evaluation after PPO.
    pub fn after(&self) -> Option<&EvalMetrics> {
        last_after(&self.evals)
    }
}

/// An evaluation log, empty when the file is absent (a run without that evaluation).
fn read_evals(path: &Path) -> Result<Vec<EvalMetrics>> {
    if path.exists() {
        run_log::read_jsonl(path)
    } else {
        Ok(Vec::new())
    }
}

fn first_before(evals: &[EvalMetrics]) -> Option<&EvalMetrics> {
    evals.iter().find(|e| e.policy == "sft")
}

fn last_after(evals: &[EvalMetrics]) -> Option<&EvalMetrics> {
    evals.iter().rev().find(|e| e.policy == "ppo")
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
}

fn pct(v: f64) -> String {
    format!("{:.1}%", 100.0 * v)
}

/// The report of one run.
pub fn markdown(log: &RunLog) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Run `{}`\n", log.name);
    let ppo: Vec<&StepMetrics> = log.ppo_steps().collect();
    let sft = log.steps.iter().filter(|m| m.phase == "sft").count();
    let _ = writeln!(
        s,
        "{sft} warm-start updates, {} PPO steps, {} held-out evaluations.\n",
        ppo.len(),
        log.evals.len()
    );

    let fit: Vec<&StepMetrics> = log.steps.iter().filter(|m| m.phase == "sft-head").collect();
    if !fit.is_empty() {
        s.push_str("## Warm start: the decision head's fit\n\n");
        s.push_str("What the answer has learned, epoch by epoch: its mean negative log-likelihood and top-1/top-5 accuracy on the train split and on the validation split.\n\n");
        s.push_str(
            "| epoch | train NLL | train top-1 | train top-5 | val NLL | val top-1 | val top-5 |\n",
        );
        s.push_str("|---:|---:|---:|---:|---:|---:|---:|\n");
        for m in &fit {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                m.epoch.map_or("–".into(), |e| e.to_string()),
                opt(m.answer_nll, 3),
                m.answer_top1.map_or("–".into(), pct),
                m.answer_top5.map_or("–".into(), pct),
                opt(m.val_answer_nll, 3),
                m.val_answer_top1.map_or("–".into(), pct),
                m.val_answer_top5.map_or("–".into(), pct),
            );
        }
        s.push('\n');
    }

    detection_section(
        &mut s,
        "## Held-out detection: SFT only against SFT + PPO",
        &log.evals,
        &log.cases,
    );
    if let Some(name) = log.left_out.first().map(|e| e.split.clone()) {
        detection_section(
            &mut s,
            &format!("## On the frameworks never trained on ({name}): SFT only against SFT + PPO"),
            &log.left_out,
            &log.left_out_cases,
        );
    }

    blame_section(&mut s, log);

    s.push_str("## Training dynamics (Table 9)\n\n");
    s.push_str(
        "| step | valid injections | unique types | type entropy | detection | localisation \
         | query depth | R_inj | R_det | KL | clip | episodes/min | tokens/s |\n",
    );
    s.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for m in &ppo {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            m.step,
            m.valid_injections
                .map_or("–".into(), |v| format!("{v}/{}", m.episodes.unwrap_or(v))),
            m.injection_unique_types
                .map_or("–".into(), |v| v.to_string()),
            opt(m.injection_entropy, 2),
            m.detection_accuracy.map_or("–".into(), pct),
            m.localisation_accuracy.map_or("–".into(), pct),
            opt(m.query_depth, 2),
            opt(m.reward_injector, 3),
            opt(m.reward_detector, 3),
            opt(m.kl.or(m.head_kl), 4),
            opt(m.clip_fraction, 3),
            opt(m.episodes_per_min, 2),
            opt(m.tokens_per_s, 1),
        );
    }
    if ppo.is_empty() {
        s.push_str("| – | no PPO steps logged | | | | | | | | | | | |\n");
    }
    let secs: f64 = log.steps.iter().filter_map(|m| m.seconds).sum();
    let _ = writeln!(
        s,
        "\nWall time logged across steps: {:.1} min.",
        secs / 60.0
    );
    s
}

/// The learned blamer: its fit's last line, then each evaluation on the train, held-out and
/// left-out logs (greedy choices), and its PPO steps' reward, exact share and KL.
fn blame_section(s: &mut String, log: &RunLog) {
    if log.blame.is_empty() {
        return;
    }
    s.push_str("## Blame: the learned blamer, warm start against PPO\n\n");
    if let Some(fit) = log.blame.iter().rev().find(|b| b.nll.is_some()) {
        let _ = writeln!(
            s,
            "Warm start ({}): NLL of the labelled turn {} and top-1 {} on {} train logs.\n",
            fit.policy,
            opt(fit.nll, 3),
            pct(fit.exact),
            fit.logs
        );
    }
    s.push_str("| step | policy | logs | n | agent | step exact | step ±1 |\n");
    s.push_str("|---:|---|---|---:|---:|---:|---:|\n");
    for b in log.blame.iter().filter(|b| b.nll.is_none()) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            b.step,
            b.policy,
            b.split,
            b.logs,
            b.agent.map_or("–".into(), pct),
            pct(b.exact),
            b.within_one.map_or("–".into(), pct),
        );
    }
    let steps: Vec<&StepMetrics> = log
        .ppo_steps()
        .filter(|m| m.blame_reward.is_some())
        .collect();
    if let (Some(first), Some(last)) = (steps.first(), steps.last()) {
        let _ = writeln!(
            s,
            "\nPPO on the blame reward, {} steps: sampled reward {} → {}, exact share {} → {}, KL to the warm start {} at the last.",
            steps.len(),
            opt(first.blame_reward, 3),
            opt(last.blame_reward, 3),
            first.blame_exact.map_or("–".into(), pct),
            last.blame_exact.map_or("–".into(), pct),
            opt(last.blame_kl, 4),
        );
    }
    s.push('\n');
}

/// A table of `evals` and the paired change from the warm start to the last PPO evaluation.
fn detection_section(
    s: &mut String,
    title: &str,
    evals: &[EvalMetrics],
    cases: &[(u64, String, String, bool)],
) {
    let _ = writeln!(s, "{title}\n");
    s.push_str(
        "| policy | step | traces | detection | false positives | localisation | tool calls |\n",
    );
    s.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
    for e in evals {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {:.2} |",
            e.policy,
            e.step,
            e.n,
            pct(e.detection_accuracy),
            e.false_positive_rate.map_or("–".into(), pct),
            pct(e.localisation_accuracy),
            e.avg_tool_calls
        );
    }
    match (first_before(evals), last_after(evals)) {
        (Some(b), Some(a)) => {
            let _ = writeln!(
                s,
                "\nChange in detection accuracy after step {}: {:+.1} points ({} → {}).\n",
                a.step,
                100.0 * (a.detection_accuracy - b.detection_accuracy),
                pct(b.detection_accuracy),
                pct(a.detection_accuracy)
            );
            if let Some(g) = paired_gain_of(evals, cases) {
                let _ = writeln!(
                    s,
                    "Paired on the same {} deficient traces: {:+.1} points, 95% bootstrap interval [{:+.1}, {:+.1}].\n",
                    g.n,
                    100.0 * g.value,
                    100.0 * g.lo,
                    100.0 * g.hi
                );
            }
        }
        _ => s.push_str(
            "\nNo before/after pair yet (the run has no held-out evaluation after PPO).\n\n",
        ),
    }
}

/// Several runs (e.g. seeds) side by side: held-out detection before and after PPO.
pub fn comparison_markdown(logs: &[RunLog]) -> String {
    let mut s = String::from("# Runs compared\n\n");
    s.push_str("| run | SFT only | SFT + PPO | change | after step | traces |\n");
    s.push_str("|---|---:|---:|---:|---:|---:|\n");
    for log in logs {
        let before = log.before().map(|e| e.detection_accuracy);
        let after = log.after().map(|e| e.detection_accuracy);
        let change = before.zip(after).map_or("–".into(), |(b, a)| {
            format!("{:+.1} pts", 100.0 * (a - b))
        });
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            log.name,
            before.map_or("–".into(), pct),
            after.map_or("–".into(), pct),
            change,
            log.after().map_or("–".into(), |e| e.step.to_string()),
            log.after()
                .or(log.before())
                .map_or("–".into(), |e| e.n.to_string()),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(step: u64, policy: &str, acc: f64) -> EvalMetrics {
        EvalMetrics {
            step,
            split: "test".into(),
            detection_accuracy: acc,
            localisation_accuracy: acc / 2.0,
            avg_tool_calls: 2.0,
            n: 12,
            policy: policy.into(),
            false_positive_rate: None,
        }
    }

    #[test]
    fn report_reads_logs_and_states_the_change() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("seed-1");
        std::fs::create_dir(&run).unwrap();
        for step in 1..=2 {
            run_log::append(
                &run.join("metrics.jsonl"),
                &StepMetrics {
                    step,
                    phase: "ppo".into(),
                    injection_unique_types: Some(3),
                    detection_accuracy: Some(0.25),
                    query_depth: Some(1.5),
                    ..Default::default()
                },
            )
            .unwrap();
        }
        run_log::append(&run.join("eval.jsonl"), &eval(0, "sft", 0.25)).unwrap();
        run_log::append(&run.join("eval.jsonl"), &eval(2, "ppo", 0.5)).unwrap();
        let log = RunLog::read(&run).unwrap();
        assert_eq!(log.name, "seed-1");
        let md = markdown(&log);
        assert!(md.contains("+25.0 points (25.0% → 50.0%)"), "{md}");
        assert!(!md.contains("never trained on"), "{md}");
        // A run that left a framework out reports it in a section of its own.
        let left_out = |step, policy, acc| EvalMetrics {
            split: "left out: ag2".into(),
            ..eval(step, policy, acc)
        };
        run_log::append(&run.join(run_log::LEFT_OUT_FILE), &left_out(0, "sft", 0.1)).unwrap();
        run_log::append(&run.join(run_log::LEFT_OUT_FILE), &left_out(2, "ppo", 0.2)).unwrap();
        let with_left_out = markdown(&RunLog::read(&run).unwrap());
        let section = with_left_out
            .split("## On the frameworks never trained on (left out: ag2)")
            .nth(1)
            .expect("a left-out section");
        assert!(
            section.contains("+10.0 points (10.0% → 20.0%)"),
            "{section}"
        );
        assert_eq!(md.matches("| 3 |").count(), 2, "{md}");
        assert!(!md.contains("## Blame"), "{md}");
        // A run that trained a blamer reports its fit and evaluations.
        for line in [
            BlameEval {
                step: 0,
                policy: "fit-epoch-300".into(),
                split: "train".into(),
                logs: 20,
                agent: None,
                exact: 0.6,
                within_one: None,
                nll: Some(1.25),
            },
            BlameEval {
                step: 2,
                policy: "ppo".into(),
                split: "held-out".into(),
                logs: 8,
                agent: Some(0.75),
                exact: 0.5,
                within_one: Some(0.875),
                nll: None,
            },
        ] {
            run_log::append(&run.join(run_log::BLAME_FILE), &line).unwrap();
        }
        let with_blame = markdown(&RunLog::read(&run).unwrap());
        assert!(
            with_blame.contains("NLL of the labelled turn 1.250 and top-1 60.0% on 20 train logs"),
            "{with_blame}"
        );
        assert!(
            with_blame.contains("| 2 | ppo | held-out | 8 | 75.0% | 50.0% | 87.5% |"),
            "{with_blame}"
        );
        let cmp = comparison_markdown(&[log]);
        assert!(
            cmp.contains("| seed-1 | 25.0% | 50.0% | +25.0 pts | 2 | 12 |"),
            "{cmp}"
        );
    }

    #[test]
    fn a_bad_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("eval.jsonl"), "{\"step\": 0}\n").unwrap();
        let e = RunLog::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("eval.jsonl") && e.contains("line 1"), "{e}");
    }
}
