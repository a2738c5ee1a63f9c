//! Training the learned blamer (`policy::blame_head`): labelled logs from the corpus, a
//! cross-entropy warm start, and PPO on a blame reward.
//!
//! **Labels.** Every injected multi-agent trace of the corpus becomes a chat log whose decisive
//! turn is where the injected run first departs from its clean twin (`corpus::chatlogs`); the
//! logs are imported and measured exactly as the Detector measures a user's log (the overview
//! and the per-turn table, `detect::policies::blame::Measure`), so training reads what
//! inference reads.
//!
//! **Warm start.** Minimise the mean negative log-likelihood of the labelled turn,
//! `L(w) = −(1/N) Σ_n log p(t_n | log_n) + (λ/2)‖w‖²`, by full-batch Adam; its gradient for one
//! log is `Σ_i p_i z_i − z_t`.
//!
//! **PPO.** Each step samples `samples_per_log` turns from the head for each of
//! `logs_per_step` train logs and scores them with [`reward`]; advantages are group-relative
//! per log (`ppo::group_advantages`), and the clipped surrogate with a KL penalty towards the
//! warm-started head is
//! `L = −(1/B) Σ_b min(ρ_b A_b, clip(ρ_b, 1±ε) A_b) + β KL(π ‖ π_ref)`, `ρ_b = π(a_b)/π_old(a_b)`,
//! whose gradient through one log's softmax is `∂ log π(a) / ∂w = z_a − Σ_i p_i z_i`.

use std::path::Path;

use detect::policies::blame::{self, Turn};
use policy::blame_head::{self, BlameHead};
use serde::{Deserialize, Serialize};

use crate::head::{clipped_term, HeadPpo, HeadStats};
use crate::ppo::group_advantages;
use crate::{Result, RlError};

/// One labelled, measured log.
#[derive(Debug, Clone, PartialEq)]
pub struct BlameLog {
    /// The log's trace id in the corpus store.
    pub trace_id: String,
    pub turns: Vec<Turn>,
    /// Features of each acting turn (`blame_head::turn_features`).
    pub rows: Vec<Vec<f32>>,
    /// The labelled agent and step.
    pub agent: Option<String>,
    pub step: Option<i64>,
}

impl BlameLog {
    /// The acting turn the label names, when it is one.
    pub fn truth(&self) -> Option<usize> {
        let step = self.step?;
        blame_head::acting(&self.turns)
            .iter()
            .position(|t| t.step == step)
    }

    /// How a choice of acting turn `i` scores against the label.
    pub fn hit(&self, i: usize) -> Hit {
        let acting = blame_head::acting(&self.turns);
        let Some(t) = acting.get(i) else {
            return Hit::default();
        };
        Hit {
            agent: self
                .agent
                .as_deref()
                .is_some_and(|a| eval::metrics::same_agent(&t.agent, a)),
            exact: self.step == Some(t.step),
            within_one: self.step.is_some_and(|s| s.abs_diff(t.step) <= 1),
        }
    }
}

/// Whether a chosen turn names the labelled agent, the exact step, the step within one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hit {
    pub agent: bool,
    pub exact: bool,
    pub within_one: bool,
}

/// The blame reward: 1 for the exact step, ½ for a step within one, ½ for the right agent
/// (at most 2). The step matters most (Who&When's harder question); the agent alone still
/// earns something, as it is what a user asks first.
pub fn reward(hit: Hit) -> f64 {
    f64::from(u8::from(hit.exact))
        + 0.5 * f64::from(u8::from(hit.within_one))
        + 0.5 * f64::from(u8::from(hit.agent))
}

/// Reads the labelled multi-agent logs of `corpus` whose record `keep` accepts: exported as
/// chat logs into a scratch directory, imported, and measured by the Detector's blame
/// measurements. Empty when the corpus has no multi-agent trace with a visible departure.
pub fn read_logs(
    corpus: &Path,
    keep: impl Fn(&corpus::record::Record) -> bool,
) -> Result<Vec<BlameLog>> {
    let scratch = tempfile::tempdir().map_err(|e| RlError::io(&std::env::temp_dir(), e))?;
    let exported = corpus::chatlogs::export_where(corpus, scratch.path(), keep)
        .map_err(|e| RlError::Environment(format!("exporting blame logs: {e}")))?;
    if exported.written == 0 {
        return Ok(Vec::new());
    }
    read_chatlogs(scratch.path())
}

/// A corpus's labelled multi-agent logs as a run divides them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SplitLogs {
    /// The train split's, frameworks left out excepted.
    pub train: Vec<BlameLog>,
    /// The evaluation split's (`split`, e.g. `val+test`), frameworks left out excepted.
    pub held_out: Vec<BlameLog>,
    /// Every log of the frameworks left out (`leave_out`), whatever its split.
    pub left_out: Vec<BlameLog>,
}

/// [`read_logs`] for the three sets a run learns from and is judged on.
pub fn read_split_logs(corpus: &Path, split: &str, leave_out: &[String]) -> Result<SplitLogs> {
    let left = |r: &corpus::record::Record| leave_out.contains(&r.manifest.agent);
    let held = |r: &corpus::record::Record| split.split('+').any(|s| s == r.split);
    Ok(SplitLogs {
        train: read_logs(corpus, |r| r.split == "train" && !left(r))?,
        held_out: read_logs(corpus, |r| held(r) && !left(r))?,
        left_out: if leave_out.is_empty() {
            Vec::new()
        } else {
            read_logs(corpus, left)?
        },
    })
}

/// Reads the labelled chat logs (Who&When's format) under `dir`, measured as the Detector
/// measures them.
pub fn read_chatlogs(dir: &Path) -> Result<Vec<BlameLog>> {
    let imported = eval::chatlog::import(dir)
        .map_err(|e| RlError::Environment(format!("importing blame logs: {e}")))?;
    let detector = detect::Detector::new(imported.db.clone(), detect::Config::default(), false)
        .map_err(|e| RlError::Environment(format!("starting the blame measurements: {e}")))?;
    let mut logs = Vec::with_capacity(imported.logs.len());
    for (trace_id, _, label) in &imported.logs {
        let transcript = detector
            .investigate(trace_id, Box::new(blame::Measure::new()))
            .map_err(|e| RlError::Environment(format!("measuring blame log {trace_id}: {e}")))?;
        let turns = blame::measured(&transcript.turns);
        let rows = blame_head::turn_features(&turns);
        logs.push(BlameLog {
            trace_id: trace_id.clone(),
            turns,
            rows,
            agent: label.truth.agent.clone(),
            step: label.truth.step,
        });
    }
    Ok(logs)
}

/// How the warm start fits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitOptions {
    pub l2: f64,
    pub lr: f64,
    pub epochs: usize,
}

/// One line of the fit's log: the decision's loss and accuracy so far.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FitLine {
    pub epoch: usize,
    pub nll: f64,
    pub exact: f64,
}

/// The warm start: a head standardised on the train logs' turns, fitted to their labelled
/// turns. Logs whose label is no acting turn are left out of the loss (not of the
/// standardisation). Returns the head and its loss curve (every 25 epochs and the last).
pub fn fit(logs: &[BlameLog], opts: &FitOptions) -> (BlameHead, Vec<FitLine>) {
    let rows: Vec<&[f32]> = logs
        .iter()
        .flat_map(|l| l.rows.iter().map(|r| r.as_slice()))
        .collect();
    let mut head = BlameHead::standardised_on(&rows);
    let labelled: Vec<(Vec<Vec<f32>>, usize)> = logs
        .iter()
        .filter_map(|l| Some((l.rows.iter().map(|r| head.z(r)).collect(), l.truth()?)))
        .collect();
    let mut curve = Vec::new();
    if labelled.is_empty() {
        return (head, curve);
    }
    let d = head.weight.len();
    let n = labelled.len() as f64;
    let mut adam = linear::Adam::new(d);
    for epoch in 0..=opts.epochs {
        let mut grad = vec![0f32; d];
        let (mut nll, mut exact) = (0f64, 0usize);
        for (z, t) in &labelled {
            let lp = log_probs_z(&head.weight, z);
            nll -= lp[*t] as f64;
            exact += usize::from(linear::argmax(&lp) == *t);
            for (i, zi) in z.iter().enumerate() {
                let g = lp[i].exp() - f32::from(u8::from(i == *t));
                grad.iter_mut().zip(zi).for_each(|(gw, x)| *gw += g * x);
            }
        }
        if epoch % 25 == 0 || epoch == opts.epochs {
            curve.push(FitLine {
                epoch,
                nll: nll / n,
                exact: exact as f64 / n,
            });
        }
        if epoch == opts.epochs {
            break;
        }
        grad.iter_mut()
            .zip(&head.weight)
            .for_each(|(g, w)| *g = (*g as f64 / n + opts.l2 * *w as f64) as f32);
        adam.step(&mut head.weight, &grad, opts.lr as f32);
    }
    (head, curve)
}

/// Log-probabilities of one log's standardised rows under `weight`.
fn log_probs_z(weight: &[f32], z: &[Vec<f32>]) -> Vec<f32> {
    let mut logits: Vec<f32> = z
        .iter()
        .map(|zi| zi.iter().zip(weight).map(|(a, b)| a * b).sum())
        .collect();
    linear::log_softmax(&mut logits);
    logits
}

/// One sampled blame, ready for PPO.
#[derive(Debug, Clone, PartialEq)]
pub struct BlameSample {
    /// Index of the log in the logs the batch was drawn from.
    pub log: usize,
    /// The chosen acting turn.
    pub action: usize,
    pub old_log_prob: f32,
    pub reward: f64,
    pub hit: Hit,
}

/// Samples a turn of `logs[log]` by inverse CDF at `u` ∈ [0, 1) under `head`.
pub fn sample(head: &BlameHead, logs: &[BlameLog], log: usize, u: f64) -> Option<BlameSample> {
    let l = &logs[log];
    let lp = head.log_probs(&l.rows);
    if lp.is_empty() {
        return None;
    }
    let mut acc = 0f64;
    let action = lp
        .iter()
        .position(|p| {
            acc += p.exp() as f64;
            u < acc
        })
        .unwrap_or(lp.len() - 1);
    let hit = l.hit(action);
    Some(BlameSample {
        log,
        action,
        old_log_prob: lp[action],
        reward: reward(hit),
        hit,
    })
}

/// One PPO update of `head` on `samples` (drawn from `logs`), anchored at `reference`.
pub fn update(
    head: &mut BlameHead,
    reference: &BlameHead,
    logs: &[BlameLog],
    samples: &[BlameSample],
    cfg: &HeadPpo,
) -> HeadStats {
    let b = samples.len();
    let rewards: Vec<(f64, u64)> = samples.iter().map(|s| (s.reward, s.log as u64)).collect();
    let advantages = group_advantages(&rewards);
    let mut stats = HeadStats {
        samples: b,
        mean_reward: rewards.iter().map(|r| r.0).sum::<f64>() / b.max(1) as f64,
        ..HeadStats::default()
    };
    if b == 0 || advantages.iter().all(|a| *a == 0.0) {
        stats.skipped = true;
        return stats;
    }
    // The standardisation is the warm start's and stays fixed; only the weights move.
    let z: Vec<Vec<Vec<f32>>> = samples
        .iter()
        .map(|s| logs[s.log].rows.iter().map(|r| head.z(r)).collect())
        .collect();
    let ref_lp: Vec<Vec<f32>> = z
        .iter()
        .map(|zs| log_probs_z(&reference.weight, zs))
        .collect();
    let d = head.weight.len();
    for epoch in 0..cfg.epochs {
        let mut grad = vec![0f64; d];
        let (mut loss, mut kl_sum, mut clipped, mut ent) = (0f64, 0f64, 0usize, 0f64);
        for ((s, zs), (a, rl)) in samples.iter().zip(&z).zip(advantages.iter().zip(&ref_lp)) {
            let lp = log_probs_z(&head.weight, zs);
            let term = clipped_term(&lp, s.action, s.old_log_prob, *a as f64, rl, cfg);
            loss += term.loss;
            kl_sum += term.kl;
            clipped += usize::from(term.clipped);
            ent += term.entropy;
            // ∂logit_i/∂w = z_i.
            for (zi, g) in zs.iter().zip(&term.logit_grad) {
                let g = g / b as f64;
                grad.iter_mut()
                    .zip(zi)
                    .for_each(|(gw, x)| *gw += g * *x as f64);
            }
        }
        if epoch == 0 {
            stats.kl = kl_sum / b as f64;
            stats.policy_loss = loss / b as f64;
            stats.clip_fraction = clipped as f64 / b as f64;
            stats.entropy = ent / b as f64;
        }
        let lr = cfg.lr;
        head.weight
            .iter_mut()
            .zip(&grad)
            .for_each(|(w, g)| *w -= (lr * g) as f32);
    }
    stats
}

/// How one PPO step of the blame head draws and updates (`[blame]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOptions {
    pub logs_per_step: usize,
    pub samples_per_log: usize,
    pub ppo: HeadPpo,
}

/// One PPO step: `logs_per_step` train logs, each drawn by `draw_log(j)` (a 64-bit number,
/// reduced modulo the logs), `samples_per_log` turns sampled from each at `draw_turn(j · S +
/// k)` ∈ [0, 1), scored, and one update. Returns the batch and what the update did.
pub fn step(
    head: &mut BlameHead,
    reference: &BlameHead,
    train: &[BlameLog],
    opts: &StepOptions,
    draw_log: impl Fn(u64) -> u64,
    draw_turn: impl Fn(u64) -> f64,
) -> (Vec<BlameSample>, HeadStats) {
    if train.is_empty() {
        return (Vec::new(), HeadStats::default());
    }
    let n = train.len() as u64;
    let per = opts.samples_per_log as u64;
    let samples: Vec<BlameSample> = (0..opts.logs_per_step as u64)
        .flat_map(|j| {
            let log = (draw_log(j) % n) as usize;
            let head = &*head;
            let draw_turn = &draw_turn;
            (0..per).filter_map(move |k| sample(head, train, log, draw_turn(j * per + k)))
        })
        .collect();
    // Two slots may draw one log: its samples are one group wherever they were drawn.
    let stats = update(head, reference, train, &samples, &opts.ppo);
    (samples, stats)
}

/// The greedy head's blame over `logs`: agent, exact step, step within one (shares of the
/// logs that carry each label).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct BlameAccuracy {
    pub logs: usize,
    pub agent: f64,
    pub exact: f64,
    pub within_one: f64,
}

pub fn accuracy(head: &BlameHead, logs: &[BlameLog]) -> BlameAccuracy {
    let (mut agent, mut exact, mut within) = (0usize, 0usize, 0usize);
    for l in logs {
        let lp = head.log_probs(&l.rows);
        if lp.is_empty() {
            continue;
        }
        let hit = l.hit(linear::argmax(&lp));
        agent += usize::from(hit.agent);
        exact += usize::from(hit.exact);
        within += usize::from(hit.within_one);
    }
    let n = logs.len().max(1) as f64;
    BlameAccuracy {
        logs: logs.len(),
        agent: agent as f64 / n,
        exact: exact as f64 / n,
        within_one: within as f64 / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(step: i64, agent: &str, tool: bool, failed: u8) -> Turn {
        Turn::measured_as(step, agent, tool, failed)
    }

    /// Logs whose decisive turn is the one just before the first failure — a rule none of the
    /// expert's features states alone, but the features can express.
    fn logs(n: usize) -> Vec<BlameLog> {
        (0..n)
            .map(|k| {
                let fail_at = 2 + (k % 4) as i64;
                let mut turns = vec![turn(0, "human", false, 0)];
                for s in 1..=6 {
                    let agent = if s % 2 == 0 { "B" } else { "A" };
                    turns.push(turn(s, agent, false, u8::from(s == fail_at)));
                }
                let rows = blame_head::turn_features(&turns);
                let agent = if (fail_at - 1) % 2 == 0 { "B" } else { "A" };
                BlameLog {
                    trace_id: format!("t{k}"),
                    turns,
                    rows,
                    agent: Some(agent.into()),
                    step: Some(fail_at - 1),
                }
            })
            .collect()
    }

    #[test]
    fn the_warm_start_learns_the_labelled_turn_and_its_loss_falls() {
        let train = logs(24);
        let opts = FitOptions {
            l2: 1e-3,
            lr: 0.05,
            epochs: 200,
        };
        let (head, curve) = fit(&train, &opts);
        assert!(curve.last().unwrap().nll < curve[0].nll / 4.0, "{curve:?}");
        let acc = accuracy(&head, &logs(8));
        assert_eq!((acc.exact, acc.agent, acc.within_one), (1.0, 1.0, 1.0));
        // The untrained head (ties → the first acting turn) does not.
        let untrained = fit(&train, &FitOptions { epochs: 0, ..opts }).0;
        assert!(accuracy(&untrained, &logs(8)).exact < 0.5);
    }

    #[test]
    fn ppo_moves_probability_towards_rewarded_turns_and_reports_its_statistics() {
        let train = logs(12);
        let (reference, _) = fit(
            &train,
            &FitOptions {
                l2: 1e-3,
                lr: 0.05,
                epochs: 0,
            },
        );
        let mut head = reference.clone();
        let cfg = HeadPpo {
            lr: 0.5,
            epochs: 4,
            clip: 0.2,
            kl_coef: 0.0,
        };
        let truth_prob = |h: &BlameHead| {
            train
                .iter()
                .map(|l| h.log_probs(&l.rows)[l.truth().unwrap()].exp() as f64)
                .sum::<f64>()
                / train.len() as f64
        };
        let before = truth_prob(&head);
        for round in 0..20 {
            let samples: Vec<BlameSample> = (0..train.len())
                .flat_map(|i| {
                    let head = &head;
                    let train = &train;
                    (0..4).filter_map(move |k| {
                        let u = ((i * 7 + k * 13 + round * 5) % 29) as f64 / 29.0;
                        sample(head, train, i, u)
                    })
                })
                .collect();
            let stats = update(&mut head, &reference, &train, &samples, &cfg);
            assert_eq!(stats.samples, samples.len());
            if round == 0 {
                assert!(
                    stats.kl.abs() < 1e-9,
                    "the first update starts at the reference"
                );
            }
        }
        assert!(
            truth_prob(&head) > before + 0.2,
            "{before} → {}",
            truth_prob(&head)
        );
        // A batch whose rewards are all equal teaches nothing.
        let flat = vec![
            BlameSample {
                log: 0,
                action: 0,
                old_log_prob: 0.0,
                reward: 1.0,
                hit: Hit::default(),
            };
            3
        ];
        assert!(update(&mut head, &reference, &train, &flat, &cfg).skipped);
    }

    #[test]
    fn the_reward_ranks_exact_over_near_over_agent_alone() {
        let r = |agent, exact, within_one| {
            reward(Hit {
                agent,
                exact,
                within_one,
            })
        };
        assert_eq!(r(true, true, true), 2.0);
        assert!(r(true, true, true) > r(true, false, true));
        assert!(r(true, false, true) > r(true, false, false));
        assert!(r(true, false, false) > r(false, false, false));
        assert_eq!(r(false, false, false), 0.0);
    }
}
