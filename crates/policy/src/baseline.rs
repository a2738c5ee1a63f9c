//! The one-prompt baselines' Detector: the trace as text (rendered by the caller — the whole
//! trace for zero-shot, the retrieved chunks for RAG; see the `baselines` crate), cut to fit
//! the prompt budget, in one prompt to the bare base model with the catalog of deficiency
//! types, which answers `answer: ID COMPONENT | evidence` under the answer-only action grammar,
//! so its one reply is always a valid verdict.

use std::sync::{Arc, Mutex};

use detect::{Policy, View};
use model::{KvCache, SamplingParams};

use crate::chat::Conversation;
use crate::grammar::ActionGrammar;
use crate::{PolicyError, PolicyModel, Result, SharedModel};

/// What the one-prompt baselines read and how much they may write.
#[derive(Debug, Clone, PartialEq)]
pub struct BaselineOptions {
    /// Tokens of the whole prompt (system, trace and question) at most; the trace text is cut
    /// to fit. Also bounded by the model's context less `max_answer_tokens`.
    pub max_prompt_tokens: usize,
    /// Tokens of the reply at most (the answer and its evidence).
    pub max_answer_tokens: usize,
    /// Characters of one span's input, output or error in the caller's rendering.
    pub field_chars: usize,
}

impl Default for BaselineOptions {
    fn default() -> Self {
        BaselineOptions {
            max_prompt_tokens: 1536,
            max_answer_tokens: 40,
            field_chars: 200,
        }
    }
}

/// The tools a one-prompt baseline may call: it can only answer.
pub const ANSWER_ONLY: [&str; 1] = ["answer"];

/// The question after the trace.
pub fn question() -> &'static str {
    "Which deficiency of the agent's code caused this run to fail, and in which component? Reply `answer: ID COMPONENT | EVIDENCE`."
}

/// The baselines' system prompt: the task, every deficiency type as `ID name`, and the
/// component vocabulary — 818 SmolLM2 tokens, which leave a trace about 635 tokens of the
/// default budget (`baselines/tests/smollm2.rs`). Without the catalog a model could only
/// guess at bare ids.
pub fn system_prompt(catalog: &taxonomy::Catalog) -> String {
    let mut s = String::from(
        "You are the Detector. An AI agent run failed because of one deficiency in the agent's code. Read its trace and name the deficiency type and the component it lives in.\nDeficiency types:\n",
    );
    for d in catalog.deficiencies() {
        s.push_str(&format!("{} {}\n", d.id, d.name));
    }
    let components: Vec<&str> = catalog.components().iter().map(|c| c.id.as_str()).collect();
    s.push_str(&format!("Components: {}\n", components.join(", ")));
    s
}

/// A one-prompt Detector: reads the given trace text and answers at once. The zero-shot
/// baseline gives it the whole trace; the RAG baseline the retrieved chunks.
pub struct OnePromptDetector {
    shared: SharedModel,
    grammar: Arc<ActionGrammar>,
    options: BaselineOptions,
    name: String,
    /// The system prompt ([`system_prompt`]).
    system: Arc<str>,
    /// The trace as the prompt shows it (before cutting to the token budget).
    context: String,
    /// The system message's keys and values, computed once and shared by every trace.
    prefix: Option<PrefixCache>,
}

/// The keys and values of a baseline's system message (the same for every trace), shared by
/// the detectors of one run so it is pre-filled once; empty until the first answer.
pub type PrefixCache = Arc<Mutex<Option<KvCache>>>;

impl OnePromptDetector {
    /// `grammar` must allow only `answer` (built with [`ANSWER_ONLY`]) and
    /// `options.max_answer_tokens` should be at least `grammar.answer_budget(..)`, or a reply
    /// can be cut before its verdict is complete; `name` is the policy's name in transcripts
    /// (`zero-shot`, `rag`); `system` is usually [`system_prompt`].
    pub fn new(
        shared: SharedModel,
        grammar: Arc<ActionGrammar>,
        options: BaselineOptions,
        name: impl Into<String>,
        system: Arc<str>,
        context: String,
    ) -> OnePromptDetector {
        OnePromptDetector {
            shared,
            grammar,
            options,
            name: name.into(),
            system,
            context,
            prefix: None,
        }
    }

    /// Shares `prefix` (start it as `Arc::new(Mutex::new(None))`) among detectors with the same
    /// model and system prompt: the system message is pre-filled once, not once per trace.
    pub fn with_prefix_cache(mut self, prefix: PrefixCache) -> OnePromptDetector {
        self.prefix = Some(prefix);
        self
    }

    /// A cache holding the system message's keys and values (from the shared prefix when
    /// there is one), to continue with the rest of the prompt.
    fn start_cache(&self, pm: &mut PolicyModel) -> Result<KvCache> {
        let Some(prefix) = &self.prefix else {
            return Ok(KvCache::new(&pm.model, 1));
        };
        let mut guard = prefix.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            let mut system = Conversation::new();
            system.push_message(&pm.tokenizer, "system", &self.system)?;
            pm.model.set_active_adapter(None)?;
            pm.model.set_training(false);
            let mut cache = KvCache::new(&pm.model, 1);
            pm.model
                .feed(&mut cache, std::slice::from_ref(&system.tokens))?;
            *guard = Some(cache);
        }
        Ok(guard.clone().unwrap_or_else(|| KvCache::new(&pm.model, 1)))
    }

    fn answer(&mut self, view: &View<'_>) -> Result<String> {
        let mut guard = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let pm = &mut *guard;
        let system = &*self.system;
        let head = format!("Trace '{}':\n", view.trace_id);
        let budget = trace_budget(pm, system, view.trace_id, &self.options)?;
        // A few tokens of slack: the trace's first and last tokens may merge with their
        // neighbours differently than when counted alone.
        let trace = fit_tokens(
            &pm.tokenizer,
            &self.context,
            budget.saturating_sub(4).max(1),
        )?;
        let mut conversation = Conversation::new();
        conversation.push_message(&pm.tokenizer, "system", system)?;
        conversation.push_message(
            &pm.tokenizer,
            "user",
            &format!("{head}{trace}\n{}", question()),
        )?;
        conversation.open_reply(&pm.tokenizer)?;
        let params = SamplingParams {
            max_new_tokens: self.options.max_answer_tokens,
            temperature: 0.0,
            stop_token_ids: Some(vec![pm.format.im_end]),
            ..SamplingParams::default()
        };
        let mut cache = self.start_cache(pm)?;
        let grammar = Arc::clone(&self.grammar);
        let reply = pm.reply(None, &mut cache, &conversation, &params, &|g| {
            grammar.allowed(g)
        })?;
        let text_tokens: Vec<u32> = reply
            .iter()
            .copied()
            .filter(|t| *t != pm.format.im_end)
            .collect();
        let text = pm.tokenizer.decode(&text_tokens, true)?;
        Ok(complete_answer(&text))
    }
}

/// Tokens left for the trace text in a prompt with `system` for trace `trace_id`: the
/// smaller of `options.max_prompt_tokens` and the model's context less the reply, minus the
/// prompt without the trace. An error, naming the figures, when nothing is left.
pub fn trace_budget(
    pm: &PolicyModel,
    system: &str,
    trace_id: &str,
    options: &BaselineOptions,
) -> Result<usize> {
    let fixed = {
        let mut c = Conversation::new();
        c.push_message(&pm.tokenizer, "system", system)?;
        c.push_message(
            &pm.tokenizer,
            "user",
            &format!("Trace '{trace_id}':\n\n{}", question()),
        )?;
        c.open_reply(&pm.tokenizer)?;
        c.len()
    };
    let context = pm.model.config().max_position_embeddings;
    let limit = options
        .max_prompt_tokens
        .min(context.saturating_sub(options.max_answer_tokens));
    limit.checked_sub(fixed).filter(|b| *b > 0).ok_or_else(|| {
        PolicyError::Prompt(format!(
            "the prompt without the trace takes {fixed} tokens; the limit is {limit} (max_prompt_tokens {}, model context {context} less {} for the reply)",
            options.max_prompt_tokens, options.max_answer_tokens
        ))
    })
}

/// The reply as a verdict the Detector accepts: the grammar guarantees `answer: ID COMPONENT |`
/// when the reply was long enough; evidence the model left empty is said to be empty.
fn complete_answer(text: &str) -> String {
    let text = text.trim();
    match text.split_once('|') {
        Some((head, evidence)) if evidence.trim().is_empty() => {
            format!("{} | (no evidence given)", head.trim_end())
        }
        Some(_) => text.to_string(),
        // Cut short before the separator (max_answer_tokens too small): the Detector reports
        // it as malformed rather than this code inventing an answer.
        None => text.to_string(),
    }
}

/// `text` cut so that it takes at most `budget` tokens: its beginning and its end (where a
/// failing run usually shows its error) are kept, at character boundaries, with a note in
/// place of the middle. Text that fits is returned unchanged; a budget too small for even
/// the note gives an empty string.
pub fn fit_tokens(tokenizer: &model::ChatTokenizer, text: &str, budget: usize) -> Result<String> {
    let chars: Vec<char> = text.chars().collect();
    let total = chars.len();
    let mut keep = total;
    let mut candidate = text.to_string();
    for _ in 0..16 {
        let n = tokenizer.encode(&candidate, false)?.len();
        if n <= budget {
            return Ok(candidate);
        }
        // Shrink in proportion, a little more than needed, and leave room for the note.
        keep = (((keep as f64) * (budget as f64 / n as f64) * 0.95) as usize).saturating_sub(16);
        if keep == 0 {
            break;
        }
        let head = keep / 2;
        let tail = keep - head;
        let mut s: String = chars[..head].iter().collect();
        s.push_str(&format!("\n[… {} chars cut …]\n", total - keep));
        s.extend(&chars[total - tail..]);
        candidate = s;
    }
    Ok(String::new())
}

impl Policy for OnePromptDetector {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn act(&mut self, view: &View<'_>) -> std::result::Result<String, String> {
        if !view.turns.is_empty() {
            // One prompt, one answer: a second turn means the answer was refused.
            return Err(format!(
                "the {} baseline answers once; its answer was not accepted: {}",
                self.name,
                view.turns
                    .last()
                    .map(|t| t.observation.text.clone())
                    .unwrap_or_default()
            ));
        }
        self.answer(view).map_err(|e| e.to_string())
    }

    fn subagent(&self, _task: &str) -> std::result::Result<Box<dyn Policy>, String> {
        Err(format!("the {} baseline does not delegate", self.name))
    }
}
