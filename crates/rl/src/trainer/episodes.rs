//! A step's episodes: the Injector's proposals, the live runs, and the Detector's
//! investigations of each valid trace as it arrives.

use super::*;

impl Trainer {
    /// Phase 1: the Injector chooses `injections_per_step` (type, site, variant) options, one
    /// agent after another, and (in diff mode) writes each diff; each choice is planned as an
    /// episode.
    pub(super) fn propose(&mut self, env: &mut Environment, step: u64) -> Result<Proposed> {
        let seed = self.config.run.seed;
        let n = self.config.run.injections_per_step;
        let agents = self.config.run.agents.clone();
        let injector = self.adapter(Role::Injector);
        let history = history_line(&self.state.history);
        let diff_mode = self.config.injector.mode == InjectorMode::Diff;
        // Each rank proposes its share of the step's episodes (every rank for one process):
        // first every choice, then (free-form mode) every diff, decoded together.
        let mut chosen = Vec::with_capacity(n);
        for i in (0..n).filter(|i| self.options.ranks.owns(*i)) {
            let agent = agents[((step - 1) as usize * n + i) % agents.len()].clone();
            let mut options = env.options(&agent, diff_mode)?;
            if let Some(errors) = &self.focus {
                let u = unit(mix(seed, step, i as u64, Draw::Focus));
                let floor = self.config.injector.focus_floor;
                match self.config.injector.focus {
                    InjectorFocus::Coverage => {
                        let weights: Vec<f64> = options
                            .iter()
                            .map(|o| {
                                let learned = env.prior().train_count(&agent, o)
                                    + self
                                        .state
                                        .planted
                                        .get(&template_key(&agent, o))
                                        .copied()
                                        .unwrap_or(0);
                                head::coverage_weight(errors, &o.deficiency, floor, learned)
                            })
                            .collect();
                        if let Some(k) = head::draw(&weights, u) {
                            options = vec![options[k].clone()];
                        }
                    }
                    _ => {
                        let mut offered: Vec<&str> =
                            options.iter().map(|o| o.deficiency.as_str()).collect();
                        offered.sort_unstable();
                        offered.dedup();
                        if let Some(ty) =
                            head::focus_type(&offered, errors, floor, u).map(str::to_owned)
                        {
                            options.retain(|o| o.deficiency == ty);
                        }
                    }
                }
            }
            let offered = options.len();
            let info = env.agent(&agent)?;
            let choice = {
                let mut pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                policy::choose_injection(
                    &mut pm,
                    Some(injector),
                    &agent,
                    &info.components,
                    &history,
                    &options,
                    self.config.detector.temperature,
                    mix(seed, step, i as u64, Draw::InjectorChoice),
                )?
            };
            let option = options[choice.index].clone();
            // (file, code, type with its name) of the template the free-form diff rewrites.
            let target = if diff_mode {
                let edit = &env.template(&agent, &option)?.edits[0];
                let name = env
                    .catalog()
                    .get(&option.deficiency)
                    .map_or(String::new(), |d| format!(" ({})", d.name));
                Some((
                    edit.file.clone(),
                    edit.find.clone(),
                    format!("{}{name}", option.deficiency),
                ))
            } else {
                None
            };
            chosen.push((i, agent, option, choice, target, offered));
        }
        let mut diffs: Vec<Option<String>> = vec![None; chosen.len()];
        if diff_mode && !chosen.is_empty() {
            let mut proposals: Vec<(&mut Conversation, policy::DiffRequest<'_>)> = chosen
                .iter_mut()
                .filter_map(|(i, _, _, choice, target, _)| {
                    let (file, code, deficiency) = target.as_ref()?;
                    Some((
                        &mut choice.conversation,
                        policy::DiffRequest {
                            file,
                            code,
                            deficiency,
                            seed: mix(seed, step, *i as u64, Draw::FreeDiff),
                        },
                    ))
                })
                .collect();
            let mut pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            let texts = policy::write_diffs(
                &mut pm,
                Some(injector),
                &mut proposals,
                self.config.injector.max_diff_tokens,
                self.config.detector.temperature,
            )?;
            diffs = texts.into_iter().map(Some).collect();
        }
        let mut episodes = Vec::with_capacity(n);
        let mut planned = Vec::with_capacity(n);
        for (i, agent, option, choice, _, offered) in chosen {
            let key = template_key(&agent, &option);
            planned.push(env.plan_new(
                &format!("s{step:05}i{i:02}"),
                &agent,
                &option,
                mix(seed, step, i as u64, Draw::Task),
                |task| self.state.planted_tasks.contains(&format!("{key}/{task}")),
            )?);
            episodes.push(Episode {
                index: i,
                agent,
                deficiency: option.deficiency.clone(),
                injector: choice.conversation,
                offered,
                manifest: None,
                injected: Investigations::default(),
                healthy: Investigations::default(),
            });
        }

        Ok(Proposed {
            episodes,
            planned,
            diffs,
        })
    }

    /// Phases 2 and 3: the agents run the planned episodes on a worker thread, and the
    /// Detector investigates each valid trace as it arrives (through the decision head, or
    /// `samples_per_trace` sampled investigations); then up to `run.healthy_per_step` of the
    /// clean runs beside them are investigated as healthy traces — the first in step order
    /// whose (agent, task) the run has not shown yet, chosen over every rank's episodes.
    /// Returns those (agent, task) pairs, the same on every rank.
    pub(super) fn run_and_investigate(
        &self,
        env: &mut Environment,
        step: u64,
        proposed: &mut Proposed,
    ) -> Result<Vec<(String, String)>> {
        let Proposed {
            episodes,
            planned,
            diffs,
        } = proposed;
        let stores = self.live_dir().join("stores");
        std::fs::create_dir_all(&stores).map_err(|e| RlError::io(&stores, e))?;
        let store_path = stores.join(format!("step-{step}.sqlite"));
        evaluate::remove_store(&store_path)?;
        let mut store = traces::Store::open(&store_path)
            .map_err(|e| RlError::Environment(format!("{}: {e}", store_path.display())))?;
        let max_turns = match self.heads {
            Some(_) => detect::probes::battery_turns(),
            None => self.config.detector.max_turns,
        };
        let detector = detect::Detector::new(
            store_path.clone(),
            evaluate::learned_config(max_turns),
            false,
        )
        .map_err(|e| RlError::Environment(e.to_string()))?;
        let out = env.out().to_owned();
        let n = self.config.run.injections_per_step;
        // This rank's valid episodes with a clean run to show: (step index, local index, path).
        let mut candidates: Vec<(usize, usize, PathBuf)> = Vec::new();
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let worker_result: Result<()> = std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel();
            let env_ref = &*env;
            let planned_ref = &*planned;
            let diffs_ref = &*diffs;
            // `jobs` workers take the planned episodes in order; the first failure stops new
            // ones from starting. Each episode's randomness is its own (seeded by its index),
            // so the order they finish in changes nothing.
            let jobs = env_ref.jobs().min(planned_ref.len()).max(1);
            for _ in 0..jobs {
                let tx = tx.clone();
                let (next, stop) = (&next, &stop);
                scope.spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(p) = planned_ref.get(i) else {
                            break;
                        };
                        let r = match &diffs_ref[i] {
                            Some(d) => env_ref.run_diff(p, d),
                            None => env_ref.run(p),
                        };
                        let clean = r.as_ref().ok().and_then(|m| env_ref.clean_trace(m));
                        if r.is_err() {
                            stop.store(true, Ordering::SeqCst);
                        }
                        if tx.send((i, r, clean)).is_err() {
                            stop.store(true, Ordering::SeqCst);
                            break;
                        }
                    }
                });
            }
            drop(tx);
            let mut first_error = None;
            for (i, manifest, clean) in rx {
                let manifest = match manifest {
                    Ok(m) => m,
                    Err(e) => {
                        first_error.get_or_insert(e);
                        continue;
                    }
                };
                if first_error.is_some() {
                    continue;
                }
                // Kept beside the episode for inspection (the corpus layout).
                let record = corpus::manifest_path(&out, &manifest.id);
                let json = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
                std::fs::write(&record, json).map_err(|e| RlError::io(&record, e))?;
                if manifest.validation.valid {
                    let index = episodes[i].index;
                    let trace_id = format!("t{step:05}{index:02}");
                    environment::import(&mut store, &out, &manifest, &trace_id)?;
                    episodes[i].injected =
                        self.investigate(&detector, &trace_id, &manifest.agent, step, index)?;
                    if let Some(clean) = clean {
                        candidates.push((index, i, clean));
                    }
                }
                episodes[i].manifest = Some(manifest);
            }
            first_error.map_or(Ok(()), Err)
        });
        worker_result?;
        // In step order, whichever episode finished first.
        candidates.sort_by_key(|(index, _, _)| *index);
        if let Some(e) = episodes.iter().find(|e| e.manifest.is_none()) {
            return Err(RlError::Environment(format!(
                "episode {} of step {step} did not run",
                e.index
            )));
        }

        // The healthy traces, chosen in step order over every rank's candidates.
        let pairs_of = |c: &[(usize, usize, PathBuf)]| -> Vec<(usize, (String, String))> {
            c.iter()
                .map(|(index, i, _)| {
                    let m = episodes[*i].manifest.as_ref().expect("checked above");
                    (*index, (m.agent.clone(), m.task.clone()))
                })
                .collect()
        };
        let offered = self.gather_sorted(pairs_of(&candidates), |(index, _)| *index)?;
        let mut chosen: Vec<(usize, (String, String))> = Vec::new();
        for (index, pair) in offered {
            if chosen.len() < self.config.run.healthy_per_step
                && !self.state.healthy_seen.contains(&pair)
                && !chosen.iter().any(|(_, p)| *p == pair)
            {
                chosen.push((index, pair));
            }
        }
        for (index, i, clean) in &candidates {
            if !chosen.iter().any(|(c, _)| c == index) {
                continue;
            }
            let manifest = episodes[*i].manifest.clone().expect("checked above");
            // Its randomness is drawn after the step's injected traces' (n + index).
            let trace_id = format!("h{step:05}{index:02}");
            environment::import_healthy(&mut store, clean, &manifest, &trace_id)?;
            episodes[*i].healthy =
                self.investigate(&detector, &trace_id, &manifest.agent, step, n + index)?;
        }
        drop(store);
        Ok(chosen.into_iter().map(|(_, pair)| pair).collect())
    }

    /// Every rank's episodes of a step, in step order, on every rank (the identity for one
    /// process). Each rank has run and investigated its own share; rewards, reviews and the
    /// update then see the whole step.
    pub(super) fn gather_episodes(&self, mine: Vec<Episode>) -> Result<Vec<Episode>> {
        if self.ranks().world() == 1 {
            return Ok(mine);
        }
        let all = self.gather_sorted(mine, |e| e.index)?;
        let n = self.config.run.injections_per_step;
        if all.len() != n || all.iter().enumerate().any(|(i, e)| e.index != i) {
            return Err(RlError::Environment(format!(
                "the ranks returned {} episodes for a step of {n}",
                all.len()
            )));
        }
        Ok(all)
    }

    /// `samples_per_trace` investigations of a live trace by the learned Detector, token by
    /// token through the grammar, each with its own generated conversation. Several run at
    /// once, each on its own thread, and their replies are decoded together as the rows of
    /// one batch ([`TurnBatcher`]); one alone decodes through its own cache.
    pub(super) fn investigate_tokens(
        &self,
        detector: &detect::Detector,
        trace_id: &str,
        step: u64,
        i: usize,
    ) -> Result<Vec<Detection>> {
        let seed = self.config.run.seed;
        let per_trace = self.config.detector.samples_per_trace;
        let options: Vec<DetectorOptions> = (0..per_trace)
            .map(|k| {
                self.detector_options(mix(
                    seed,
                    step,
                    (i * per_trace + k) as u64,
                    Draw::Investigation,
                ))
            })
            .collect();
        policy::investigate_many(
            detector,
            trace_id,
            &self.shared,
            &self.grammar,
            &options,
            per_trace > 1,
        )
        .into_iter()
        .map(|done| {
            let (transcript, conversation) = done.map_err(RlError::Environment)?;
            let answered = Answered {
                verdict: transcript.deficiency_verdict().cloned(),
                tool_calls: eval::store_eval::tool_calls(&transcript),
            };
            Ok(Detection {
                answered,
                conversation,
                transcript,
            })
        })
        .collect()
    }

    /// A live trace's investigations: through the decision head when the run has one (with
    /// each choice's features, class and log-probability), else token by token. `i` places
    /// the investigation's randomness among the step's; `agent` is the trace's framework.
    pub(super) fn investigate(
        &self,
        detector: &detect::Detector,
        trace_id: &str,
        agent: &str,
        step: u64,
        i: usize,
    ) -> Result<Investigations> {
        match &self.heads {
            Some((h, _)) => self.investigate_head(detector, h, trace_id, agent, step, i),
            None => Ok(Investigations {
                detections: self.investigate_tokens(detector, trace_id, step, i)?,
                draws: Vec::new(),
            }),
        }
    }

    /// One investigation of a live trace with the probe battery and the decision head, then
    /// `samples_per_trace` choices sampled from the head's distribution over the same
    /// features (the battery is deterministic; only the choice is random). Returns each
    /// choice's detection and its (features, class, log-probability); a framed head's
    /// features are read through the frame of `agent`, the trace's framework.
    pub(super) fn investigate_head(
        &self,
        detector: &detect::Detector,
        h: &DecisionHead,
        trace_id: &str,
        agent: &str,
        step: u64,
        i: usize,
    ) -> Result<Investigations> {
        let seed = self.config.run.seed;
        let per_trace = self.config.detector.samples_per_trace;
        let temperature = self.config.detector.temperature;
        let sink: head::Sink = Arc::new(Mutex::new(None));
        let reader = self.head_reader()?;
        let mut in_frame = h.clone();
        in_frame.set_frame(h.frame_for(Some(agent)))?;
        let policy = policy::decision::policy(
            Arc::clone(&self.shared),
            Arc::new(in_frame),
            reader,
            temperature,
            unit(mix(seed, step, (i * per_trace) as u64, Draw::Investigation)),
            Some(Arc::clone(&sink)),
        );
        let transcript = detector
            .investigate(trace_id, policy)
            .map_err(|e| RlError::Environment(format!("investigating {trace_id}: {e}")))?;
        let investigated = sink
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| {
                RlError::Environment(format!(
                    "investigating {trace_id}: the probe battery ended without a decision ({})",
                    transcript.outcome.describe()
                ))
            })?;
        let calls = eval::store_eval::tool_calls(&transcript);
        let mut detections = Vec::with_capacity(per_trace);
        let mut draws = Vec::with_capacity(per_trace);
        for k in 0..per_trace {
            let d = if k == 0 {
                investigated.choice.clone()
            } else {
                h.decide_framed(
                    &investigated.features,
                    temperature,
                    unit(mix(
                        seed,
                        step,
                        (i * per_trace + k) as u64,
                        Draw::Investigation,
                    )),
                )
            };
            detections.push(Detection {
                answered: head_detection(h, &d, investigated.failing_function.as_deref(), calls),
                conversation: Conversation::new(),
                transcript: transcript.clone(),
            });
            draws.push(HeadDraw {
                features: investigated.features.clone(),
                class: d.type_index,
                log_prob: d.type_log_probs[d.type_index],
            });
        }
        Ok(Investigations { detections, draws })
    }
}
