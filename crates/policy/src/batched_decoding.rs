//! Several investigations of the learned Detector decoded together: each investigation runs on
//! its own thread (its tools, its conversation) and, when it needs a reply, waits at a barrier;
//! once every investigation still running has asked, one of them decodes all the replies in one
//! batch through one KV cache with a row per investigation. A PPO step's generation is then
//! bound by the batch's throughput, not by one conversation's latency.
//!
//! Each row samples with its own seed, so a row's reply is the one it would have sampled
//! alone: batching changes the speed, not the investigations. An investigation that has
//! answered leaves the batch; its row stays in the cache but is
//! stopped at its first token from then on (a row cannot be dropped from a batch mid-run).

use std::sync::{Condvar, Mutex};

use model::{KvCache, SamplingParams};

use crate::grammar::ActionGrammar;
use crate::policy_model::SharedModel;
use crate::{PolicyError as Error, Result};

/// One row's request: its whole conversation so far, ending with an open reply.
struct Request {
    tokens: Vec<u32>,
    /// The reply's token budget (the answer turn has a larger one).
    max_new_tokens: usize,
    answer_only: bool,
    /// The sampler's seed for this reply: the row samples what it would have sampled alone.
    seed: u64,
}

struct State {
    active: Vec<bool>,
    pending: Vec<Option<Request>>,
    replies: Vec<Option<std::result::Result<Vec<u32>, String>>>,
    /// The last conversation each row sent (what a row that has left is fed again).
    last: Vec<Vec<u32>>,
    cache: Option<KvCache>,
    /// Batched decoding calls so far (for tests and logs).
    batches: usize,
}

/// The barrier and the batched decoder shared by the investigations of one batch.
pub struct TurnBatcher {
    shared: SharedModel,
    grammar: std::sync::Arc<ActionGrammar>,
    adapter: Option<String>,
    temperature: f32,
    state: Mutex<State>,
    done: Condvar,
}

impl TurnBatcher {
    /// A batch of `rows` investigations whose replies `adapter` writes at `temperature`.
    pub fn new(
        shared: SharedModel,
        grammar: std::sync::Arc<ActionGrammar>,
        adapter: Option<String>,
        temperature: f32,
        rows: usize,
    ) -> TurnBatcher {
        TurnBatcher {
            shared,
            grammar,
            adapter,
            temperature,
            state: Mutex::new(State {
                active: vec![true; rows],
                pending: (0..rows).map(|_| None).collect(),
                replies: vec![None; rows],
                last: vec![Vec::new(); rows],
                cache: None,
                batches: 0,
            }),
            done: Condvar::new(),
        }
    }

    /// Batched decoding calls made so far.
    pub fn batches(&self) -> usize {
        self.lock().batches
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `row`'s reply to `tokens` (its conversation, ending with an open reply): waits until
    /// every row still in the batch has asked, then one of them decodes all replies.
    pub fn reply(
        &self,
        row: usize,
        tokens: Vec<u32>,
        max_new_tokens: usize,
        answer_only: bool,
        seed: u64,
    ) -> Result<Vec<u32>> {
        let mut state = self.lock();
        if !state.active[row] {
            return Err(Error::Batch(format!("row {row} has left the batch")));
        }
        state.pending[row] = Some(Request {
            tokens,
            max_new_tokens,
            answer_only,
            seed,
        });
        state = self.run_if_ready(state);
        loop {
            if let Some(reply) = state.replies[row].take() {
                return reply.map_err(Error::Batch);
            }
            state = self.done.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// `row`'s investigation has ended: the batch no longer waits for it.
    pub fn leave(&self, row: usize) {
        let mut state = self.lock();
        state.active[row] = false;
        state.pending[row] = None;
        drop(self.run_if_ready(state));
    }

    /// Decodes the batch once every active row has a request (the caller holds the lock; the
    /// other rows wait on the condition variable meanwhile).
    fn run_if_ready<'a>(
        &'a self,
        mut state: std::sync::MutexGuard<'a, State>,
    ) -> std::sync::MutexGuard<'a, State> {
        let ready = (0..state.active.len())
            .filter(|&r| state.active[r])
            .all(|r| state.pending[r].is_some());
        let asked = state.pending.iter().any(Option::is_some);
        if !ready || !asked {
            return state;
        }
        let requests: Vec<Option<Request>> = state.pending.iter_mut().map(Option::take).collect();
        let outcome = self.decode(&mut state, &requests);
        for (r, request) in requests.iter().enumerate() {
            if request.is_some() {
                state.replies[r] = Some(match &outcome {
                    Ok(replies) => Ok(replies[r].clone()),
                    Err(e) => Err(e.clone()),
                });
            }
        }
        state.batches += 1;
        self.done.notify_all();
        state
    }

    /// One batched generation: rows with a request continue their conversations; the others
    /// (rows that have left) are fed their last conversation again and stopped at once.
    fn decode(
        &self,
        state: &mut State,
        requests: &[Option<Request>],
    ) -> std::result::Result<Vec<Vec<u32>>, String> {
        for (r, request) in requests.iter().enumerate() {
            if let Some(q) = request {
                state.last[r].clone_from(&q.tokens);
            }
        }
        // A row that left before it ever asked has no conversation: a single token stands in.
        let prompts: Vec<Vec<u32>> = state
            .last
            .iter()
            .map(|t| if t.is_empty() { vec![0] } else { t.clone() })
            .collect();
        let mut guard = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let pm = &mut *guard;
        let im_end = pm.format.im_end;
        let budget = requests
            .iter()
            .flatten()
            .map(|q| q.max_new_tokens)
            .max()
            .unwrap_or(1);
        let params = SamplingParams {
            max_new_tokens: budget + 1,
            temperature: self.temperature,
            row_seeds: requests
                .iter()
                .map(|q| q.as_ref().map_or(0, |q| q.seed))
                .collect(),
            stop_token_ids: Some(vec![im_end]),
            stop_sequences: vec!["\n".into()],
            ..SamplingParams::default()
        };
        let grammar = &self.grammar;
        // Each row under its own grammar and budget: a row at its budget is stopped with the
        // end token, which is then cut off, so that it ends as a length-limited reply would.
        let mut constraint = |r: usize, generated: &[u32]| match &requests[r] {
            None => Some(vec![im_end]),
            Some(q) if generated.len() >= q.max_new_tokens => Some(vec![im_end]),
            Some(q) => grammar.allowed_for(generated, q.answer_only),
        };
        let cache = state
            .cache
            .get_or_insert_with(|| KvCache::new(&pm.model, prompts.len()));
        let run = (|| -> Result<Vec<model::Generation>> {
            pm.model.set_active_adapter(self.adapter.as_deref())?;
            pm.model.set_training(false);
            Ok(pm.model.generate_with_cache(
                cache,
                &pm.tokenizer,
                &prompts,
                &params,
                Some(&mut constraint),
            )?)
        })();
        let generations = run.map_err(|e| e.to_string())?;
        Ok(generations
            .into_iter()
            .zip(requests)
            .map(|(g, q)| {
                let mut tokens = g.tokens;
                if let Some(q) = q {
                    if tokens.len() > q.max_new_tokens {
                        tokens.truncate(q.max_new_tokens);
                    }
                }
                tokens
            })
            .collect())
    }
}
