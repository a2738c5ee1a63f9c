//! A step's rewards and updates: scoring each episode for both roles, the higher-order
//! reviews, and one PPO update per role (or the head's update).

use super::*;

impl Trainer {
    /// Phase 4: the rewards. Each investigation is scored on its own joint reward; the
    /// Injector's reward is its expected reward over the trace's investigations; an invalid
    /// injection gets the Injector's invalid-episode reward. Also records the Injector's
    /// history and the step's higher-order candidates.
    pub(super) fn score(
        &mut self,
        env: &mut Environment,
        step: u64,
        episodes: &[Episode],
    ) -> Result<Scored> {
        let per_trace = self.config.detector.samples_per_trace;
        let w = &self.config.reward;
        let mut samples_inj = Vec::new();
        let mut samples_det = Vec::new();
        let mut samples_head: Vec<HeadSample> = Vec::new();
        let (mut r_inj_sum, mut r_det_sum, mut detected, mut localised, mut calls) =
            (0.0, 0.0, 0usize, 0usize, 0usize);
        let mut r_joint_sum = 0.0;
        let mut new_failures: Vec<FailedInvestigation> = Vec::new();
        let mut new_head_failures: Vec<head::Failure> = Vec::new();
        let mut investigated = 0usize;
        let (mut healthy, mut healthy_flagged) = (0usize, 0usize);
        // With `keep_named`, every live trace is kept for the review, not only the misses.
        let keep_named = self.config.higher_order.keep_named;
        let mut chosen_types = Vec::new();
        let mut log = String::new();
        for (i, e) in episodes.iter().enumerate() {
            chosen_types.push(e.deficiency.clone());
            let manifest = e.manifest.as_ref().expect("checked above");
            let truth = environment::truth(manifest);
            let sites = &env.agent(&e.agent)?.sites;
            if e.injected.is_empty() {
                // Invalid: the injection never reached the Detector.
                let r_inj = reward::injector_reward(None, &truth, w);
                r_inj_sum += r_inj;
                r_joint_sum += r_inj;
                samples_inj.extend(injector_sample(e, r_inj));
                self.state.history.push((truth.id().to_owned(), false));
                continue;
            }
            // The Injector's reward is its expected reward over the trace's investigations;
            // each investigation is trained on its own joint reward.
            let k = e.injected.detections.len() as f64;
            let (mut r_inj, mut r_det_mean) = (0.0, 0.0);
            for (j, detection) in e.injected.detections.iter().enumerate() {
                let Detection {
                    answered: d,
                    conversation,
                    transcript,
                } = detection;
                let r_det = reward::detector_reward(d, &truth, sites, w);
                let r_inj_j = reward::injector_reward(Some(d), &truth, w);
                let line = serde_json::json!({
                    "step": step,
                    "episode": i,
                    "sample": j,
                    "truth": &truth,
                    "reward_detector": r_det,
                    "reward_injector": r_inj_j,
                    "transcript": transcript,
                });
                log.push_str(&line.to_string());
                log.push('\n');
                r_inj += r_inj_j / k;
                r_det_mean += r_det / k;
                investigated += 1;
                r_det_sum += r_det;
                calls += d.tool_calls;
                let correct = d.names(&truth);
                detected += usize::from(correct);
                localised += usize::from(
                    reward::loc_score(
                        d.verdict.as_ref().and_then(reward::Verdict::component),
                        &truth,
                        sites,
                        w,
                    ) >= w.loc_function,
                );
                if j == 0 {
                    self.state.history.push((truth.id().to_owned(), correct));
                    if let (Some((h, _)), Some(draw)) = (&self.heads, e.injected.draws.first()) {
                        new_head_failures.extend(
                            review_example(h, &draw.features, &truth, &e.agent, keep_named).0,
                        );
                    }
                    // One higher-order example per trace: its other investigations' failures
                    // would be near copies.
                    if let Some(f) =
                        higher_order::from_transcript(transcript, &truth, &self.keyword)
                    {
                        new_failures.push(f);
                    }
                }
                if let Some(draw) = e.injected.draws.get(j) {
                    samples_head.push(HeadSample {
                        features: draw.features.clone(),
                        action: draw.class,
                        old_log_prob: draw.log_prob,
                        reward: if w.joint { r_inj_j + r_det } else { r_det },
                        group: 1 + i as u64,
                    });
                }
                if conversation.generated_count() > 0 {
                    samples_det.push(Sample {
                        role: Role::Detector,
                        conversation: conversation.clone(),
                        reward: if w.joint { r_inj_j + r_det } else { r_det },
                        // One group per trace when it was investigated several times.
                        group: if per_trace > 1 { 1 + i as u64 } else { 0 },
                    });
                }
            }
            r_inj_sum += r_inj;
            let r_joint = if w.joint { r_inj + r_det_mean } else { r_inj };
            r_joint_sum += r_joint;
            samples_inj.extend(injector_sample(e, r_joint));
            // The clean run beside it, as a healthy trace: the Detector's reward alone (no
            // injection to credit), its own group, and a failure to review when the greedy
            // answer called it deficient.
            let truth = environment::healthy_truth();
            let group = 1 + (episodes.len() + i) as u64;
            for (j, detection) in e.healthy.detections.iter().enumerate() {
                let Detection {
                    answered: d,
                    conversation,
                    transcript,
                } = detection;
                let r_det = reward::detector_reward(d, &truth, sites, w);
                let line = serde_json::json!({
                    "step": step,
                    "episode": i,
                    "healthy": true,
                    "sample": j,
                    "truth": &truth,
                    "reward_detector": r_det,
                    "transcript": transcript,
                });
                log.push_str(&line.to_string());
                log.push('\n');
                if j == 0 {
                    healthy += 1;
                    if let (Some((h, _)), Some(draw)) = (&self.heads, e.healthy.draws.first()) {
                        let (example, named) =
                            review_example(h, &draw.features, &truth, &e.agent, keep_named);
                        healthy_flagged += usize::from(!named);
                        new_head_failures.extend(example);
                    } else {
                        healthy_flagged += usize::from(!d.names(&truth));
                    }
                }
                if let Some(draw) = e.healthy.draws.get(j) {
                    samples_head.push(HeadSample {
                        features: draw.features.clone(),
                        action: draw.class,
                        old_log_prob: draw.log_prob,
                        reward: r_det,
                        group,
                    });
                }
                if conversation.generated_count() > 0 {
                    samples_det.push(Sample {
                        role: Role::Detector,
                        conversation: conversation.clone(),
                        reward: r_det,
                        group: if per_trace > 1 { group } else { 0 },
                    });
                }
            }
        }
        // The Injector sees its last 16 outcomes.
        let keep = self.state.history.len().saturating_sub(16);
        self.state.history.drain(..keep);
        Ok(Scored {
            samples_inj,
            samples_det,
            samples_head,
            r_inj_sum,
            r_det_sum,
            r_joint_sum,
            detected,
            localised,
            calls,
            investigated,
            healthy,
            healthy_flagged,
            new_failures,
            new_head_failures,
            chosen_types,
            log,
        })
    }

    /// Every investigation of the step as JSON Lines, for reading what the Detector did (never
    /// read back).
    pub(super) fn write_investigations(&self, step: u64, log: &str) -> Result<()> {
        if !self.leader() {
            return Ok(());
        }
        let log_path = self
            .options
            .run_dir
            .join("live")
            .join("investigations")
            .join(format!("step-{step}.jsonl"));
        if let Some(dir) = log_path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| RlError::io(dir, e))?;
        }
        std::fs::write(&log_path, log).map_err(|e| RlError::io(&log_path, e))?;
        Ok(())
    }

    /// The higher-order reviews of earlier steps' failed investigations (when enabled), and
    /// this step's failures queued for later steps.
    pub(super) fn higher_order_reviews(
        &mut self,
        step: u64,
        new_failures: Vec<FailedInvestigation>,
    ) -> Result<Vec<Sample>> {
        let seed = self.config.run.seed;
        let mut reviews = Vec::new();
        // The whole-choice Detector reviews its failures in its head's update instead.
        if self.config.higher_order.enabled && self.heads.is_none() {
            let take = self
                .config
                .higher_order
                .per_step
                .min(self.state.failed.len());
            let chosen: Vec<FailedInvestigation> = self.state.failed.drain(..take).collect();
            // Each rank writes its share of the reviews; they are gathered in order.
            let mut mine: Vec<(usize, Sample)> = Vec::new();
            for (k, f) in chosen.iter().enumerate() {
                if !self.options.ranks.owns(k) {
                    continue;
                }
                let mut pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                let (conversation, reward) = higher_order::review(
                    &mut pm,
                    self.adapter(Role::Review),
                    f,
                    self.config.detector.temperature,
                    mix(seed, step, k as u64, Draw::Review),
                )?;
                mine.push((
                    k,
                    Sample {
                        role: Role::Review,
                        conversation,
                        reward,
                        // Reviews are measured against each other, not against investigations.
                        group: u64::MAX,
                    },
                ));
            }
            let all = self.gather_sorted(mine, |(k, _)| *k)?;
            reviews.extend(all.into_iter().map(|(_, s)| s));
            self.state.failed.extend(new_failures);
            let excess = self
                .state
                .failed
                .len()
                .saturating_sub(self.config.higher_order.buffer);
            self.state.failed.drain(..excess);
        }

        Ok(reviews)
    }

    /// Phase 5: PPO, role-alternating — the Injector's batch, then the Detector's — and the
    /// decision head's update (head mode).
    pub(super) fn update(
        &mut self,
        env: &mut Environment,
        step: u64,
        scored: &mut Scored,
        phases: &mut BTreeMap<String, f64>,
    ) -> Result<(Vec<ppo::PpoStats>, Option<HeadUpdate>)> {
        let (samples_inj, samples_det) = (&scored.samples_inj, &scored.samples_det);
        let ppo_cfg = self.config.ppo.clone();
        let mut stats = Vec::new();
        for (role, batch, entropy_coef) in [
            (Role::Injector, samples_inj, ppo_cfg.entropy_coef_injector),
            (Role::Detector, samples_det, ppo_cfg.entropy_coef_detector),
        ] {
            if batch.is_empty() {
                continue;
            }
            let lap = Instant::now();
            let name = self.adapter(role);
            let optimizer = self
                .optimizers
                .get_mut(name)
                .expect("one optimizer per adapter");
            let mut pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            stats.push(ppo::update(
                &mut pm.model,
                name,
                optimizer,
                batch,
                &ppo_cfg,
                entropy_coef,
                self.options.ranks.as_ref(),
            )?);
            let phase = match role {
                Role::Injector => "update_injector",
                _ => "update_detector",
            };
            phases.insert(phase.to_owned(), lap.elapsed().as_secs_f64());
        }
        let lap = Instant::now();
        let head_stats = self.update_head(
            env,
            step,
            std::mem::take(&mut scored.samples_head),
            std::mem::take(&mut scored.new_head_failures),
        )?;
        if head_stats.is_some() {
            phases.insert("update_head".to_owned(), lap.elapsed().as_secs_f64());
        }
        Ok((stats, head_stats))
    }

    /// The Detector's update of its decision head: the PPO step on the live samples, plus
    /// `head.replay` train-split traces decided afresh (`samples_per_trace` choices each),
    /// anchored at the warm-started head; then (with `higher_order.enabled`) the review of the
    /// live traces it has named wrongly so far ([`head::review`]). `None` when the Detector
    /// decides token by token.
    pub(super) fn update_head(
        &mut self,
        env: &Environment,
        step: u64,
        mut batch: Vec<HeadSample>,
        failures: Vec<head::Failure>,
    ) -> Result<Option<HeadUpdate>> {
        let Some((h, reference)) = &mut self.heads else {
            return Ok(None);
        };
        let seed = self.config.run.seed;
        let per_trace = self.config.detector.samples_per_trace;
        let temperature = self.config.detector.temperature;
        let w = &self.config.reward;
        let calls = detect::probes::LIBRARY.len();
        let take = self.config.head.replay.min(self.replay.len());
        for j in 0..take {
            let (t, x) = &self.replay
                [(mix(seed, step, j as u64, Draw::ReplayPick) % self.replay.len() as u64) as usize];
            let truth = t.truth.clone();
            let sites = t
                .agent
                .as_deref()
                .and_then(|a| env.agent(a).ok())
                .map(|a| a.sites.clone())
                .unwrap_or_default();
            for k in 0..per_trace {
                let d = h.decide(
                    x,
                    temperature,
                    unit(mix(
                        seed,
                        step,
                        (j * per_trace + k) as u64,
                        Draw::ReplaySample,
                    )),
                );
                // A replayed trace keeps its features, not its battery: its samples are placed
                // nowhere (the reward's localisation reads the component's sites, not `@at`).
                let r =
                    reward::detector_reward(&head_detection(h, &d, None, calls), &truth, &sites, w);
                batch.push(HeadSample {
                    features: x.clone(),
                    action: d.type_index,
                    old_log_prob: d.type_log_probs[d.type_index],
                    reward: r,
                    group: u64::MAX / 2 + j as u64,
                });
            }
        }
        let cfg = head::HeadPpo {
            lr: self.config.head.ppo_lr,
            epochs: self.config.ppo.epochs,
            clip: self.config.ppo.clip,
            kl_coef: self.config.ppo.kl_coef,
        };
        let stats = head::update(&mut h.type_model, &reference.type_model, &batch, &cfg);
        tracing::debug!(?stats, "decision head update");
        let ho = &self.config.higher_order;
        let review = if ho.enabled {
            let failed = &mut self.state.head_failures;
            failed.extend(failures);
            let excess = failed.len().saturating_sub(ho.buffer);
            failed.drain(..excess);
            let anchor: Vec<(&[f32], usize)> = self
                .replay
                .iter()
                .filter_map(|(t, x)| {
                    let class = h.types.iter().position(|c| c == t.truth.id())?;
                    Some((x.as_slice(), class))
                })
                .collect();
            let cfg = head::Review {
                lr: ho.lr,
                epochs: ho.epochs,
                l2: self.config.head.l2,
                weighting: ho.weighting,
                optimizer: ho.optimizer,
            };
            let r = head::review(&mut h.type_model, failed, &anchor, &cfg);
            tracing::info!(
                failures = r.failures,
                named_before = r.failures_top1_before,
                named_after = r.failures_top1_after,
                train_top1_after = r.anchor_top1_after,
                "higher-order review of the head's failures"
            );
            Some(r)
        } else {
            None
        };
        let every = self.config.head.recalibrate_every;
        let none_shift = if every > 0 && step % every == 0 && self.config.head.none_target > 0.0 {
            Some(self.recalibrate(step)?)
        } else {
            None
        };
        Ok(Some(HeadUpdate {
            ppo: stats,
            review,
            none_shift,
        }))
    }
}
