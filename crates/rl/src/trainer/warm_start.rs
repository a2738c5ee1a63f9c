//! The warm start: the battery's features of every train trace, the decision head's fit, its
//! out-of-fold errors and operating point (or, in token mode, SFT on the expert's
//! demonstrations).

use super::*;

/// The train split, how its head reads a trace (the terms it may read, its vocabulary) and its
/// inputs ([`Trainer::train_features`]).
pub(super) struct TrainFeatures {
    pub train: SplitTraces,
    pub reads: HeadReads,
    pub x: Vec<Vec<f32>>,
}

impl Trainer {
    /// Where the decision head's features are kept, beside the runs (`RUNS_DIR/.feature-cache`):
    /// the frozen model reads a trace the same way in every evaluation and every seed.
    pub(super) fn feature_cache(&self) -> PathBuf {
        self.options
            .run_dir
            .parent()
            .unwrap_or(&self.options.run_dir)
            .join(".feature-cache")
    }

    /// The Detector's feature reader (its adapter, the decision's system prompt, the cache).
    pub(super) fn head_reader(&self) -> Result<Arc<policy::decision::FeatureReader>> {
        head::reader(
            &self.shared,
            self.adapter(Role::Detector),
            &self.decision_system,
            Some(&self.feature_cache()),
        )
    }

    /// The probe battery's digests of every trace of `split`.
    fn batteries(split: &SplitTraces) -> Result<Vec<Vec<detect::probes::ProbeResult>>> {
        eval::classifier::battery(&split.db, &split.traces)
            .map_err(|e| RlError::Environment(e.to_string()))
    }

    /// The probe battery's features of every trace of `split` (decision head).
    pub(super) fn battery_features(
        &self,
        split: &SplitTraces,
        what: &str,
        reads: &HeadReads,
    ) -> Result<Vec<Vec<f32>>> {
        self.features_of(&Self::batteries(split)?, what, reads)
    }

    /// The head's input for each of `batteries`, read by the ranks in shares.
    fn features_of(
        &self,
        batteries: &[Vec<detect::probes::ProbeResult>],
        what: &str,
        reads: &HeadReads,
    ) -> Result<Vec<Vec<f32>>> {
        let bar = self.bar(
            batteries.len() as u64,
            &format!("read  {{bar:30}} {{pos}}/{{len}} {what} traces"),
        );
        let reader = self.head_reader()?;
        // Each rank reads its share of the traces; the features are gathered in order.
        let (indices, mine): (Vec<usize>, Vec<_>) = batteries
            .iter()
            .enumerate()
            .filter(|(i, _)| self.ranks().owns(*i))
            .map(|(i, b)| (i, b.clone()))
            .unzip();
        let x = head::features(&reader, &self.shared, &mine, reads, |i| {
            bar.set_position(i as u64)
        })?;
        bar.finish_and_clear();
        let all = self.gather_sorted(indices.into_iter().zip(x).collect(), |(i, _)| *i)?;
        if all.len() != batteries.len() {
            return Err(RlError::Environment(format!(
                "the ranks returned features for {} of {} traces",
                all.len(),
                batteries.len()
            )));
        }
        Ok(all.into_iter().map(|(_, x)| x).collect())
    }

    /// The train split with its features as the model reads them (not framed), for the
    /// head's fit and PPO's replay, and how the head reads a trace (`[head] term_frameworks`,
    /// `vocabulary_min_df`; the same on every call: the split's batteries decide them).
    pub(super) fn train_features(&self) -> Result<TrainFeatures> {
        let corpus = self.options.root.join(&self.config.eval.corpus);
        let train = evaluate::split_traces(
            &corpus,
            "train",
            self.config.sft.max_examples,
            &self.config.eval.leave_out,
        )?;
        let batteries = Self::batteries(&train)?;
        let reads = head::reads(&self.config.head, &train.traces, &batteries);
        let x = self.features_of(&batteries, "train", &reads)?;
        Ok(TrainFeatures { train, reads, x })
    }

    /// How the decision head is fitted once it exists (the warm start's reading of a trace
    /// says how many input values are terms).
    pub(super) fn head_fit_options(&self, log_every: usize) -> linear::FitOptions {
        let term_width = match &self.heads {
            Some((h, _)) => h.reads.term_width(),
            None => self.config.head.terms,
        };
        self.fit_options(log_every, term_width)
    }

    /// `term_width`: how many of the input's values are terms ([`HeadReads::term_width`]).
    fn fit_options(&self, log_every: usize, term_width: usize) -> linear::FitOptions {
        let h = &self.config.head;
        linear::FitOptions {
            l2: h.l2 as f32,
            lr: h.lr as f32,
            max_epochs: h.max_epochs,
            patience: h.patience,
            log_every,
            standardise: true,
            raw_tail: h.raw_terms(term_width),
        }
    }

    /// Warm start of the decision head: the language model reads every train trace's probe
    /// battery once, and a softmax over its features is fitted to the labels (types and
    /// `none`; components), its fit logged on train and validation epoch by epoch.
    pub(super) fn warm_start_head(&mut self) -> Result<()> {
        let started = Instant::now();
        let corpus = self.options.root.join(&self.config.eval.corpus);
        let TrainFeatures {
            train,
            reads,
            x: train_x,
        } = self.train_features()?;
        // `[head] frame`: every input from here on (fit, replay, live traces, reviews) is read
        // through its framework's frame, and the frames are saved with the head.
        let (frames, train_x) = head::framed_fit(self.config.head.frame, &train.traces, &train_x)?;
        let val = evaluate::split_traces(&corpus, "val", 0, &self.config.eval.leave_out).ok();
        let val_x = match &val {
            Some(v) => Some(head::framed_inputs(
                &v.traces,
                &self.battery_features(v, "val", &reads)?,
                &frames,
            )),
            None => None,
        };
        let options = self.fit_options(10, reads.term_width());
        let mut lines = Vec::new();
        let mut fitted = head::fit(
            &train.traces,
            &train_x,
            val.as_ref()
                .zip(val_x.as_ref())
                .map(|(v, x)| (v.traces.as_slice(), x.as_slice())),
            reads,
            &options,
            |l| {
                lines.push(StepMetrics {
                    step: 0,
                    phase: "sft-head".into(),
                    unix_ms: unix_ms(),
                    sft_loss: Some(l.train_nll),
                    epoch: Some(l.epoch),
                    answer_nll: Some(l.train_nll),
                    answer_top1: Some(l.train_top1),
                    answer_top5: Some(l.train_top5),
                    val_answer_nll: l.val_nll,
                    val_answer_top1: l.val_top1,
                    val_answer_top5: l.val_top5,
                    episodes: Some(train.traces.len()),
                    ..StepMetrics::default()
                })
            },
        )?;
        if let Some(last) = lines.last_mut() {
            last.seconds = Some(started.elapsed().as_secs_f64());
            tracing::info!(
                epochs = last.epoch,
                train_top1 = last.answer_top1,
                val_top1 = last.val_answer_top1,
                types = fitted.types.len(),
                "decision head fitted"
            );
        }
        self.log_metrics("metrics.jsonl", &lines)?;
        if !frames.is_empty() {
            tracing::info!(
                frameworks = ?frames.iter().map(|(name, f)| format!("{name} ({} traces)", f.traces)).collect::<Vec<_>>(),
                "decision head fitted on inputs read through each framework's frame"
            );
        }
        fitted.frames = frames;
        self.replay = train.traces.into_iter().zip(train_x).collect();
        self.heads = Some((fitted.clone(), fitted));
        if self.config.head.none_target > 0.0 {
            let point = self.operating_point()?;
            if let Some((h, reference)) = &mut self.heads {
                h.set_none_shift(point.shift);
                reference.set_none_shift(point.shift);
            }
        }
        self.state.warm_started = true;
        Ok(())
    }

    /// The train split read out of fold (cross-validation of the type head, `folds` folds
    /// split `by` trace or framework), computed once per split and kept for the operating
    /// point and the focus.
    pub(super) fn out_of_fold(
        &mut self,
        folds: usize,
        by: FoldsBy,
    ) -> Result<Arc<[head::OutOfFold]>> {
        if let Some((k, read)) = &self.out_of_fold {
            if *k == (folds, by) {
                return Ok(Arc::clone(read));
            }
        }
        let options = self.head_fit_options(0);
        let (train, x): (Vec<Labelled>, Vec<Vec<f32>>) = self.replay.iter().cloned().unzip();
        let read: Arc<[head::OutOfFold]> =
            head::out_of_fold(&train, &x, folds, by, &options)?.into();
        self.out_of_fold = Some(((folds, by), Arc::clone(&read)));
        Ok(read)
    }

    /// The decision's operating point (`[head] none_target`): the shift of `none`'s score set
    /// on the train split's out-of-fold readings, logged and written to `operating-point.json`
    /// in the run directory.
    pub(super) fn operating_point(&mut self) -> Result<head::NoneShift> {
        let read = self.out_of_fold(self.config.head.folds, self.config.head.folds_by)?;
        let point = head::none_shift(&read, self.config.head.none_target);
        let share = |a: usize, n: usize| a as f64 / n.max(1) as f64;
        tracing::info!(
            shift = point.shift,
            target = point.target,
            healthy_none = format!(
                "{:.3} -> {:.3} of {}",
                share(point.healthy_none_before, point.healthy),
                share(point.healthy_none_after, point.healthy),
                point.healthy
            ),
            deficient_named = format!(
                "{:.3} -> {:.3} of {}",
                share(point.deficient_named_before, point.deficient),
                share(point.deficient_named_after, point.deficient),
                point.deficient
            ),
            "operating point: `none` raised until the target share of healthy train traces (out of fold) is answered `none`"
        );
        self.write_record("operating-point.json", &point)?;
        Ok(point)
    }

    /// Sets the head's operating point again as the warm start did, cross-validated over the
    /// train split and every live trace the head has reviewed so far (their true types); the
    /// reference head keeps the warm start's. Returns the new shift.
    pub(super) fn recalibrate(&mut self, step: u64) -> Result<f32> {
        let Some((h, _)) = &self.heads else {
            return Ok(0.0);
        };
        let mut truths: Vec<&str> = Vec::new();
        let mut frameworks: Vec<Option<&str>> = Vec::new();
        let mut x: Vec<Vec<f32>> = Vec::new();
        for (t, f) in &self.replay {
            truths.push(t.truth.id());
            frameworks.push(t.agent.as_deref());
            x.push(f.clone());
        }
        for f in &self.state.head_failures {
            truths.push(&h.types[f.class]);
            frameworks.push(f.agent.as_deref());
            x.push(f.features.clone());
        }
        let fold_of = head::fold_assignment(
            &frameworks,
            self.config.head.folds,
            self.config.head.folds_by,
        );
        let read = head::out_of_fold_of(&truths, &x, &fold_of, &self.head_fit_options(0))?;
        let point = head::none_shift(&read, self.config.head.none_target);
        tracing::info!(
            step,
            shift = point.shift,
            healthy = point.healthy,
            healthy_none = point.healthy_none_after,
            deficient_named = format!("{} of {}", point.deficient_named_after, point.deficient),
            "operating point set again over the train split and the reviewed live traces"
        );
        if let Some((h, _)) = &mut self.heads {
            h.set_none_shift(point.shift);
        }
        Ok(point.shift)
    }

    /// Supervised warm start on the expert's demonstrations of the corpus's train split.
    pub(super) fn warm_start(&mut self) -> Result<()> {
        if self.config.detector.decision == DecisionMode::Head {
            return self.warm_start_head();
        }
        let corpus = self.options.root.join(&self.config.eval.corpus);
        let split = evaluate::split_traces(
            &corpus,
            "train",
            self.config.sft.max_examples,
            &self.config.eval.leave_out,
        )?;
        let split = evaluate::rekey(&split, &self.rank_file("demonstrations.sqlite"))?;
        let bar = self.bar(
            split.traces.len() as u64,
            "expert {bar:30} {pos}/{len} demonstrations",
        );
        let demos = evaluate::demonstrations(
            &self.shared,
            &self.grammar,
            &split,
            self.config.sft.max_probes,
            self.config.detector.observation_chars,
            self.config.sft.label_answers,
            |i| bar.set_position(i as u64),
        )?;
        bar.finish_and_clear();
        tracing::info!(
            demonstrations = demos.len(),
            traces = split.traces.len(),
            label_answers = self.config.sft.label_answers,
            "warm start"
        );
        if demos.is_empty() {
            return Err(RlError::Environment(format!(
                "{}: the expert's train-split investigations gave no demonstration the grammar can write",
                corpus.display()
            )));
        }
        let adapter = self.adapter(Role::Detector);
        let sft_opt = AdamWConfig {
            lr: self.config.sft.lr,
            weight_decay: self.config.ppo.weight_decay,
            ..AdamWConfig::default()
        };
        let batch = 4;
        let updates = self.config.sft.epochs * demos.len().div_ceil(batch);
        let bar = self.bar(updates as u64, "sft   {bar:30} {pos}/{len} {msg}");
        // A separate optimizer: the warm start's moments should not steer PPO's first steps.
        let vars = {
            let pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            pm.model.trainable_vars(adapter)?
        };
        let mut opt = AdamW::new(vars, sft_opt)?;
        let mut update = 0;
        for epoch in 0..self.config.sft.epochs {
            for chunk in demos.chunks(batch) {
                let started = Instant::now();
                let sft = {
                    let mut pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                    ppo::sft_step(
                        &mut pm.model,
                        adapter,
                        &mut opt,
                        chunk,
                        ppo::SftStep {
                            max_grad_norm: 1.0,
                            decision_weight: self.config.sft.decision_weight,
                            measure_kl: update % SFT_KL_EVERY == 0 || update + 1 == updates,
                        },
                        self.options.ranks.as_ref(),
                    )?
                };
                let loss = sft.nll;
                update += 1;
                let tokens: usize = chunk.iter().map(Conversation::len).sum();
                let secs = started.elapsed().as_secs_f64();
                self.log_metrics(
                    "metrics.jsonl",
                    &[StepMetrics {
                        step: 0,
                        phase: "sft".into(),
                        unix_ms: unix_ms(),
                        sft_loss: Some(loss),
                        kl: sft.kl,
                        episodes: Some(chunk.len()),
                        tokens_per_s: Some(tokens as f64 / secs.max(1e-9)),
                        seconds: Some(secs),
                        ..StepMetrics::default()
                    }],
                )?;
                bar.inc(1);
                bar.set_message(format!("epoch {} loss {loss:.3}", epoch + 1));
                tracing::debug!(update, loss, "sft update");
            }
        }
        bar.finish_and_clear();
        self.state.warm_started = true;
        Ok(())
    }

    /// The head's errors per type by cross-validation on the train split (`[injector] focus =
    /// "confusion"`), logged and written to `focus.json` in the run directory.
    pub(super) fn confusion_focus(&mut self) -> Result<BTreeMap<String, (usize, usize)>> {
        let read = self.out_of_fold(self.config.injector.focus_folds, FoldsBy::Trace)?;
        let errors = head::cross_validated_errors(&read);
        let (missed, total) = errors
            .values()
            .fold((0, 0), |(m, t), (e, n)| (m + e, t + n));
        let mut hardest: Vec<(&String, f64)> = errors
            .iter()
            .map(|(t, (e, n))| (t, *e as f64 / (*n).max(1) as f64))
            .collect();
        hardest.sort_by(|a, b| b.1.total_cmp(&a.1));
        tracing::info!(
            folds = self.config.injector.focus_folds,
            cv_top1 = 1.0 - missed as f64 / total.max(1) as f64,
            hardest = ?hardest.iter().take(8).map(|(t, r)| format!("{t} {r:.2}")).collect::<Vec<_>>(),
            "injector focus: the head's cross-validated errors per type"
        );
        self.write_record("focus.json", &errors)?;
        Ok(errors)
    }
}
