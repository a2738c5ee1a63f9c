//! The held-out evaluation before the first step and after the last, on this rank's share of
//! the split.

use super::*;

impl Trainer {
    pub(super) fn detector_options(&self, seed: u64) -> DetectorOptions {
        DetectorOptions {
            adapter: Some(self.adapter(Role::Detector).into()),
            temperature: self.config.detector.temperature,
            max_action_tokens: self.config.detector.max_action_tokens,
            observation_chars: self.config.detector.observation_chars,
            seed,
        }
    }

    pub(super) fn held_out(&self) -> Result<Option<SplitTraces>> {
        if self.config.eval.corpus.is_empty() {
            return Ok(None);
        }
        let corpus = self.options.root.join(&self.config.eval.corpus);
        let split = evaluate::split_traces(
            &corpus,
            &self.config.eval.split,
            self.config.eval.max_traces,
            &self.config.eval.leave_out,
        )?;
        evaluate::rekey(&split, &self.rank_file("held-out.sqlite")).map(Some)
    }

    /// Every trace of the frameworks left out of training (`[eval] leave_out`), if any.
    pub(super) fn left_out(&self) -> Result<Option<SplitTraces>> {
        if self.config.eval.leave_out.is_empty() {
            return Ok(None);
        }
        let corpus = self.options.root.join(&self.config.eval.corpus);
        let traces = evaluate::framework_traces(&corpus, &self.config.eval.leave_out)?;
        evaluate::rekey(&traces, &self.rank_file("left-out.sqlite")).map(Some)
    }

    /// Evaluates the Detector on the held-out split and appends the result to `eval.jsonl`.
    pub(super) fn evaluate(&self, split: &SplitTraces, label: &str) -> Result<Accuracy> {
        self.evaluate_into(split, label, &self.config.eval.split, run_log::EVAL_FILE)
    }

    /// Evaluates the Detector on every trace of the frameworks left out of training and
    /// appends the result to `eval-left-out.jsonl`.
    pub(super) fn evaluate_left_out(&self, traces: &SplitTraces, label: &str) -> Result<Accuracy> {
        let name = format!("left out: {}", self.config.eval.leave_out.join(", "));
        self.evaluate_into(traces, label, &name, run_log::LEFT_OUT_FILE)
    }

    /// Evaluates the Detector on `split` (called `split_name` in the record) and appends the
    /// result to `file` (`STEM.jsonl`) and its cases to `STEM-cases.jsonl`. Each rank
    /// evaluates its share of the traces; the cases are gathered in the split's order.
    fn evaluate_into(
        &self,
        split: &SplitTraces,
        label: &str,
        split_name: &str,
        file: &str,
    ) -> Result<Accuracy> {
        let whole = split;
        let mine = self.share(whole);
        let split = &mine;
        let bar = self.bar(
            split.traces.len() as u64,
            "eval  {bar:30} {pos}/{len} {msg}",
        );
        let mut right = 0;
        let mut cases = Vec::new();
        let on_done = |case: &eval::metrics::Case| {
            if eval::metrics::detected(case) {
                right += 1;
            }
            cases.push(case.clone());
            bar.inc(1);
            bar.set_message(format!("{right} right"));
        };
        match &self.heads {
            Some((h, _)) => evaluate::evaluate_head(
                &self.shared,
                &Arc::new(h.clone()),
                self.adapter(Role::Detector),
                &self.decision_system,
                Some(&self.feature_cache()),
                split,
                on_done,
            )?,
            None => evaluate::evaluate(
                &self.shared,
                &self.grammar,
                &self.detector_options(0),
                self.config.detector.max_turns,
                split,
                on_done,
            )?,
        };
        bar.finish_and_clear();
        let cases = self.gather_in_order(cases, whole, |c| &c.trace_id)?;
        let acc = evaluate::accuracy(&cases);
        if !self.leader() {
            return Ok(acc);
        }
        let cases: Vec<EvalCase> = cases
            .into_iter()
            .map(|case| EvalCase {
                step: self.state.step,
                policy: label.into(),
                case,
            })
            .collect();
        let cases_file = file.replace(".jsonl", "-cases.jsonl");
        run_log::append_all(&self.options.run_dir.join(cases_file), &cases)?;
        run_log::append(
            &self.options.run_dir.join(file),
            &EvalMetrics {
                step: self.state.step,
                split: split_name.to_owned(),
                detection_accuracy: acc.detection,
                localisation_accuracy: acc.localisation,
                avg_tool_calls: acc.avg_tool_calls,
                n: acc.n,
                policy: label.into(),
                false_positive_rate: acc.false_positive_rate,
            },
        )?;
        Ok(acc)
    }

    /// This rank's share of a split's traces (all of them for one process).
    pub(super) fn share(&self, split: &SplitTraces) -> SplitTraces {
        SplitTraces {
            db: split.db.clone(),
            traces: split
                .traces
                .iter()
                .enumerate()
                .filter(|(i, _)| self.ranks().owns(*i))
                .map(|(_, t)| t.clone())
                .collect(),
        }
    }
}
