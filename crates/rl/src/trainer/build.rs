//! Building a trainer: the model and fresh adapters, or a run's newest checkpoint with
//! `--resume` (its adapters, heads, optimizer moments and state).

use super::*;

impl Trainer {
    /// Loads the model and prepares fresh adapters (or the run's newest checkpoint with
    /// `resume`).
    pub fn new(config_text: &str, config_path: &Path, options: TrainOptions) -> Result<Trainer> {
        let config = RunConfig::parse(config_text, config_path)?;
        let dtype = match config.model.dtype.as_str() {
            "bf16" => DType::BF16,
            _ => DType::F32,
        };
        // A rank takes its node's GPU by its local rank (GPU 0 for one process).
        let device = Device::cuda_if_available(collective::local_rank())?;
        let pm = PolicyModel::load(&config.model_path()?, dtype, &device)?;
        Trainer::with_model(config, config_text, options, pm)
    }

    /// [`Trainer::new`] with a model already in memory (tests use a tiny random one).
    pub fn with_model(
        config: RunConfig,
        config_text: &str,
        options: TrainOptions,
        mut pm: PolicyModel,
    ) -> Result<Trainer> {
        let run_config = options.run_dir.join("config.toml");
        let latest = checkpoint::latest(&options.run_dir)?;
        if options.resume {
            let stored =
                std::fs::read_to_string(&run_config).map_err(|e| RlError::io(&run_config, e))?;
            let mut a = RunConfig::parse(&stored, &run_config)?;
            let mut b = config.clone();
            // A resumed run may be extended; everything else must match.
            a.run.steps = 0;
            b.run.steps = 0;
            if a != b {
                return Err(RlError::Config {
                    path: run_config,
                    reason: "the run was started with another configuration (only run.steps may change on --resume)".into(),
                });
            }
        } else if latest.is_some() {
            return Err(RlError::Config {
                path: options.run_dir.clone(),
                reason: "this run already has checkpoints; pass --resume to continue it or choose another --run".into(),
            });
        }
        // Every rank has read what it checks before rank 0 writes.
        options.ranks.barrier().map_err(collective_err)?;
        let leader = options.ranks.is_leader();
        std::fs::create_dir_all(&options.run_dir).map_err(|e| RlError::io(&options.run_dir, e))?;
        if leader {
            std::fs::write(&run_config, config_text).map_err(|e| RlError::io(&run_config, e))?;
        }
        if latest.is_none() && leader {
            // Lines of an attempt that died before its first checkpoint are redone.
            for file in run_log::RUN_LOGS {
                let p = options.run_dir.join(file);
                if p.exists() {
                    std::fs::remove_file(&p).map_err(|e| RlError::io(&p, e))?;
                }
            }
        }

        let lora = LoraConfig {
            rank: config.lora.rank,
            alpha: config.lora.alpha,
            dropout: config.lora.dropout,
            target_modules: config
                .lora
                .targets
                .iter()
                .map(|t| {
                    Projection::from_peft_name(t).ok_or_else(|| RlError::Config {
                        path: run_config.clone(),
                        reason: format!("field `lora.targets`: unknown projection `{t}`"),
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            use_rslora: false,
        };
        let names = adapter_names(config.run.topology);
        let mut optimizers = BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            if pm.model.adapter(name).is_none() {
                pm.model.add_adapter(
                    name,
                    lora.clone(),
                    mix(config.run.seed, 0, i as u64, Draw::AdapterInit),
                )?;
                pm.model.add_value_head(name)?;
            }
        }
        let mut heads = None;
        let mut blamer = None;
        let mut state = TrainerState {
            seed: config.run.seed,
            rng_scheme: RNG_SCHEME.into(),
            ..TrainerState::default()
        };
        if options.resume {
            if let Some((step, dir)) = &latest {
                for name in &names {
                    checkpoint::load_adapter(&mut pm.model, dir, name)?;
                }
                if config.detector.decision == DecisionMode::Head {
                    let detector = adapter_names(config.run.topology)[0];
                    heads = head::load(dir, detector)?;
                }
                blamer = checkpoint::load_blame(dir, adapter_names(config.run.topology)[0])?.map(
                    |(head, reference)| blame::Blamer {
                        head,
                        reference,
                        logs: None,
                    },
                );
                state = checkpoint::read_state(dir)?;
                if options.ranks.is_leader() {
                    for file in run_log::RUN_LOGS {
                        run_log::truncate_after(&options.run_dir.join(file), *step)?;
                    }
                }
                tracing::info!(step, "resuming from {}", dir.display());
            }
        }
        for name in &names {
            let mut opt = AdamW::new(
                pm.model.trainable_vars(name)?,
                AdamWConfig {
                    lr: config.ppo.lr,
                    weight_decay: config.ppo.weight_decay,
                    ..AdamWConfig::default()
                },
            )?;
            if let (true, Some((_, dir))) = (options.resume, &latest) {
                checkpoint::load_optimizer(dir, name, &mut opt)?;
            }
            optimizers.insert(name.to_string(), opt);
        }
        let catalog = taxonomy::Catalog::embedded().map_err(|e| RlError::Model(e.to_string()))?;
        let grammar = Arc::new(ActionGrammar::new(
            &pm.tokenizer,
            &catalog,
            &policy::grammar::LEARNED_TOOLS,
        )?);
        Ok(Trainer {
            decision_system: Arc::new(policy::decision::system_prompt(&catalog)),
            config,
            config_text: config_text.to_owned(),
            options,
            shared: Arc::new(Mutex::new(pm)),
            grammar,
            optimizers,
            state,
            keyword: KeywordPolicy::new().map_err(RlError::Environment)?,
            heads,
            replay: Vec::new(),
            out_of_fold: None,
            focus: None,
            blamer,
        })
    }
}
