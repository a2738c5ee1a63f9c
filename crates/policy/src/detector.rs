//! The learned Detector: a `detect::Policy` whose turns a model with a LoRA adapter writes under
//! the action grammar, recording the episode's tokens for training.

use std::sync::{Arc, Mutex};

use detect::{Policy, View};
use model::{KvCache, SamplingParams};

use crate::batched_decoding::TurnBatcher;
use crate::chat::Conversation;
use crate::grammar::ActionGrammar;
pub use crate::policy_model::{PolicyModel, SharedModel};
use crate::prompt;
use crate::Result;

/// How the learned Detector samples and what it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectorOptions {
    /// The adapter that writes the turns (`None`: the bare base model, a zero-shot policy).
    pub adapter: Option<String>,
    /// 0 is greedy (evaluation); 1 samples the model's own distribution (training).
    pub temperature: f32,
    pub max_action_tokens: usize,
    /// Characters of each observation the policy reads.
    pub observation_chars: usize,
    pub seed: u64,
}

impl Default for DetectorOptions {
    fn default() -> Self {
        DetectorOptions {
            adapter: None,
            temperature: 0.0,
            max_action_tokens: 160,
            observation_chars: 400,
            seed: 0,
        }
    }
}

/// One investigation's worth of the learned Detector.
pub struct LearnedDetector {
    shared: SharedModel,
    options: DetectorOptions,
    grammar: Arc<ActionGrammar>,
    conversation: Conversation,
    cache: Option<KvCache>,
    /// Replies decoded together with other investigations' (a row of a [`TurnBatcher`])
    /// instead of through the policy's own cache.
    batch: Option<(Arc<TurnBatcher>, usize)>,
    turns: usize,
    /// Where the episode's conversation is left for the trainer after every turn.
    sink: Option<Arc<Mutex<Conversation>>>,
}

impl LearnedDetector {
    pub fn new(
        shared: SharedModel,
        grammar: Arc<ActionGrammar>,
        options: DetectorOptions,
    ) -> LearnedDetector {
        LearnedDetector {
            shared,
            options,
            grammar,
            conversation: Conversation::new(),
            cache: None,
            batch: None,
            turns: 0,
            sink: None,
        }
    }

    /// Decodes this investigation's replies as `row` of `batcher`, together with the other
    /// rows' (the batcher's adapter and temperature apply). The row leaves the batch when the
    /// policy is dropped, at the end of its investigation.
    pub fn in_batch(mut self, batcher: Arc<TurnBatcher>, row: usize) -> LearnedDetector {
        self.batch = Some((batcher, row));
        self
    }

    /// Records the episode's conversation into `sink` as it grows.
    pub fn with_sink(mut self, sink: Arc<Mutex<Conversation>>) -> LearnedDetector {
        self.sink = Some(sink);
        self
    }

    fn turn(&mut self, view: &View<'_>) -> Result<String> {
        let mut guard = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let pm = &mut *guard;
        if self.conversation.is_empty() {
            self.conversation.push_message(
                &pm.tokenizer,
                "system",
                &prompt::detector_system(view.chatlog),
            )?;
            self.conversation.push_message(
                &pm.tokenizer,
                "user",
                &prompt::detector_task(view.trace_id),
            )?;
        } else if let Some(last) = view.turns.last() {
            self.conversation.push_message(
                &pm.tokenizer,
                "user",
                &prompt::observation(&last.observation, self.options.observation_chars),
            )?;
        }
        self.conversation.open_reply(&pm.tokenizer)?;
        let answer_only = view.turns_left <= 1;
        let params = SamplingParams {
            max_new_tokens: if answer_only {
                self.options
                    .max_action_tokens
                    .max(self.grammar.answer_budget(8))
            } else {
                self.options.max_action_tokens
            },
            temperature: self.options.temperature,
            seed: self
                .options
                .seed
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(self.turns as u64),
            stop_token_ids: Some(vec![pm.format.im_end]),
            // One call per reply, on one line: a small model otherwise runs on into a second
            // call (or a copy of its instructions), which the environment rejects.
            stop_sequences: vec!["\n".into()],
            ..SamplingParams::default()
        };
        let reply = match &self.batch {
            Some((batcher, row)) => {
                // The batch decodes under the model's lock: release it while waiting.
                drop(guard);
                let reply = batcher.reply(
                    *row,
                    self.conversation.tokens.clone(),
                    params.max_new_tokens,
                    answer_only,
                    params.seed,
                )?;
                guard = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                reply
            }
            None => {
                let cache = self
                    .cache
                    .get_or_insert_with(|| KvCache::new(&guard.model, 1));
                let grammar = Arc::clone(&self.grammar);
                guard.reply(
                    self.options.adapter.as_deref(),
                    cache,
                    &self.conversation,
                    &params,
                    &|g| grammar.allowed_for(g, answer_only),
                )?
            }
        };
        let pm = &mut *guard;
        let allowed = self.grammar.allowed_sets_for(&reply, answer_only);
        let text_tokens: Vec<u32> = reply
            .iter()
            .copied()
            .filter(|t| *t != pm.format.im_end)
            .collect();
        let text = pm.tokenizer.decode(&text_tokens, true)?;
        let text = text.split('\n').next().unwrap_or_default().to_owned();
        self.conversation
            .push_reply(&pm.tokenizer, pm.format, &reply, allowed)?;
        self.turns += 1;
        if let Some(sink) = &self.sink {
            *sink.lock().unwrap_or_else(|p| p.into_inner()) = self.conversation.clone();
        }
        Ok(text)
    }
}

impl Drop for LearnedDetector {
    fn drop(&mut self) {
        if let Some((batcher, row)) = &self.batch {
            batcher.leave(*row);
        }
    }
}

impl Policy for LearnedDetector {
    fn name(&self) -> String {
        match &self.options.adapter {
            Some(a) => format!("learned:{a}"),
            None => "learned:base".into(),
        }
    }

    fn act(&mut self, view: &View<'_>) -> std::result::Result<String, String> {
        self.turn(view).map_err(|e| e.to_string())
    }

    fn subagent(&self, _task: &str) -> std::result::Result<Box<dyn Policy>, String> {
        // The grammar never writes `delegate:`; a call here means the protocol changed.
        Err("the learned Detector does not delegate".into())
    }
}

/// Investigates `trace_id` once per entry of `options` with the learned Detector: one after
/// another, each through its own cache, or (`batched`) all at once, each on its own thread
/// with the replies decoded together by a [`TurnBatcher`] (the first entry's adapter and
/// temperature apply to the batch). Returns each investigation's transcript and
/// conversation, in the order of `options`.
pub fn investigate_many(
    detector: &detect::Detector,
    trace_id: &str,
    shared: &SharedModel,
    grammar: &Arc<ActionGrammar>,
    options: &[DetectorOptions],
    batched: bool,
) -> Vec<std::result::Result<(detect::Transcript, Conversation), String>> {
    let batcher = (batched && !options.is_empty()).then(|| {
        Arc::new(TurnBatcher::new(
            Arc::clone(shared),
            Arc::clone(grammar),
            options[0].adapter.clone(),
            options[0].temperature,
            options.len(),
        ))
    });
    let investigate = |k: usize, options: &DetectorOptions| {
        let sink = Arc::new(Mutex::new(Conversation::new()));
        let mut policy =
            LearnedDetector::new(Arc::clone(shared), Arc::clone(grammar), options.clone())
                .with_sink(Arc::clone(&sink));
        if let Some(b) = &batcher {
            policy = policy.in_batch(Arc::clone(b), k);
        }
        let transcript = detector
            .investigate(trace_id, Box::new(policy))
            .map_err(|e| format!("investigating {trace_id}: {e}"))?;
        let conversation = sink.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Ok((transcript, conversation))
    };
    if batcher.is_none() {
        return options
            .iter()
            .enumerate()
            .map(|(k, o)| investigate(k, o))
            .collect();
    }
    std::thread::scope(|scope| {
        let running: Vec<_> = options
            .iter()
            .enumerate()
            .map(|(k, o)| {
                let investigate = &investigate;
                scope.spawn(move || investigate(k, o))
            })
            .collect();
        running
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(format!(
                        "investigating {trace_id}: an investigation's thread panicked"
                    ))
                })
            })
            .collect()
    })
}
