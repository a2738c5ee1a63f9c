//! The learned blamer's phases (`[blame]`, math in [`crate::blame`]): its logs, its warm start,
//! its PPO update in every step and its evaluations. Every rank computes the same update from
//! the same draws, so the blame head needs no gathering.

use policy::blame_head::BlameHead;

use super::*;
use crate::blame::{self as blamer, BlameAccuracy, SplitLogs as BlameLogs};
use crate::run_log::BlameEval;

/// The blame head, its warm-started reference, and the logs it learns from and is judged on.
pub(super) struct Blamer {
    pub(super) head: BlameHead,
    pub(super) reference: BlameHead,
    pub(super) logs: Option<BlameLogs>,
}

impl Trainer {
    /// Reads and measures the corpus's logs: train, held out and left out.
    fn blame_logs(&self) -> Result<BlameLogs> {
        let logs = blamer::read_split_logs(
            &self.options.root.join(&self.config.eval.corpus),
            &self.config.eval.split,
            &self.config.eval.leave_out,
        )?;
        tracing::info!(
            train = logs.train.len(),
            held_out = logs.held_out.len(),
            left_out = logs.left_out.len(),
            "blame: labelled multi-agent logs"
        );
        Ok(logs)
    }

    /// Fits the blame head on the train logs and logs the fit's curve (`eval-blame.jsonl`). A
    /// corpus without multi-agent logs trains no blamer, and says so once.
    pub(super) fn warm_start_blame(&mut self) -> Result<()> {
        let logs = self.blame_logs()?;
        if logs.train.is_empty() {
            tracing::warn!(
                corpus = %self.config.eval.corpus,
                "blame: the corpus holds no multi-agent train log with a visible departure; no blame head is trained"
            );
            return Ok(());
        }
        let cfg = &self.config.blame;
        let (head, curve) = blamer::fit(
            &logs.train,
            &blamer::FitOptions {
                l2: cfg.l2,
                lr: cfg.lr,
                epochs: cfg.epochs,
            },
        );
        let fit_lines: Vec<BlameEval> = curve
            .iter()
            .map(|c| BlameEval {
                step: 0,
                policy: format!("fit-epoch-{}", c.epoch),
                split: "train".into(),
                logs: logs.train.len(),
                agent: None,
                exact: c.exact,
                within_one: None,
                nll: Some(c.nll),
            })
            .collect();
        if let Some(last) = curve.last() {
            tracing::info!(
                nll = last.nll,
                exact = last.exact,
                epochs = last.epoch,
                "blame: warm start fitted"
            );
        }
        self.log_metrics(run_log::BLAME_FILE, &fit_lines)?;
        self.blamer = Some(Blamer {
            reference: head.clone(),
            head,
            logs: Some(logs),
        });
        Ok(())
    }

    /// A resumed run reads its logs again (the same logs: the corpus and the measurements
    /// are deterministic).
    pub(super) fn reread_blame_logs(&mut self) -> Result<()> {
        if self.blamer.as_ref().is_some_and(|b| b.logs.is_none()) {
            let logs = self.blame_logs()?;
            if let Some(b) = &mut self.blamer {
                b.logs = Some(logs);
            }
        }
        Ok(())
    }

    /// One PPO update of the blame head on `logs_per_step` train logs, `samples_per_log`
    /// sampled turns each; its statistics go to the step's metrics.
    pub(super) fn blame_step(&mut self, step: u64, metrics: &mut StepMetrics) {
        let cfg = self.config.blame.clone();
        let seed = self.config.run.seed;
        let Some(Blamer {
            head,
            reference,
            logs: Some(logs),
        }) = &mut self.blamer
        else {
            return;
        };
        let (samples, stats) = blamer::step(
            head,
            reference,
            &logs.train,
            &blamer::StepOptions {
                logs_per_step: cfg.logs_per_step,
                samples_per_log: cfg.samples_per_log,
                ppo: head::HeadPpo {
                    lr: cfg.ppo_lr,
                    epochs: cfg.ppo_epochs,
                    clip: cfg.clip,
                    kl_coef: cfg.kl_coef,
                },
            },
            |j| mix(seed, step, j, Draw::BlameLog),
            |i| unit(mix(seed, step, i, Draw::BlameTurn)),
        );
        if samples.is_empty() {
            return;
        }
        let b = samples.len().max(1) as f64;
        metrics.blame_reward = Some(stats.mean_reward);
        metrics.blame_exact = Some(samples.iter().filter(|s| s.hit.exact).count() as f64 / b);
        metrics.blame_kl = Some(stats.kl);
        metrics.blame_entropy = Some(stats.entropy);
    }

    /// The greedy blame head on the train, held-out and left-out logs (`eval-blame.jsonl`);
    /// returns the held-out and left-out figures.
    pub(super) fn evaluate_blame(
        &self,
        policy: &str,
    ) -> Result<(Option<BlameAccuracy>, Option<BlameAccuracy>)> {
        let Some(Blamer {
            head,
            logs: Some(logs),
            ..
        }) = &self.blamer
        else {
            return Ok((None, None));
        };
        let (mut held, mut left) = (None, None);
        let mut lines = Vec::new();
        for (split, set) in [
            ("train", &logs.train),
            ("held-out", &logs.held_out),
            ("left-out", &logs.left_out),
        ] {
            if set.is_empty() {
                continue;
            }
            let a = blamer::accuracy(head, set);
            match split {
                "held-out" => held = Some(a),
                "left-out" => left = Some(a),
                _ => {}
            }
            tracing::info!(
                split,
                policy,
                logs = a.logs,
                agent = a.agent,
                exact = a.exact,
                within_one = a.within_one,
                "blame"
            );
            lines.push(BlameEval {
                step: self.state.step,
                policy: policy.into(),
                split: split.into(),
                logs: a.logs,
                agent: Some(a.agent),
                exact: a.exact,
                within_one: Some(a.within_one),
                nll: None,
            });
        }
        self.log_metrics(run_log::BLAME_FILE, &lines)?;
        Ok((held, left))
    }
}
