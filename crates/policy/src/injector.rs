//! The Injector's choice: given an agent, its components and the run's recent history, the
//! model picks one of the engine's valid injections (deficiency type and template variant)
//! under a grammar that admits nothing else, so even a small model always makes a valid choice.

use model::{KvCache, SamplingParams};
use serde::{Deserialize, Serialize};

use crate::chat::Conversation;
use crate::detector::PolicyModel;
use crate::grammar::ChoiceGrammar;
use crate::{prompt, PolicyError, Result};

/// One injection the engine can apply to the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectionOption {
    pub deficiency: String,
    pub variant: String,
}

impl InjectionOption {
    pub fn text(&self) -> String {
        format!("{} {}", self.deficiency, self.variant)
    }
}

/// What the Injector chose and the conversation that records how.
#[derive(Debug, Clone)]
pub struct InjectorChoice {
    pub index: usize,
    pub conversation: Conversation,
}

/// Asks the model (with `adapter`) to choose among `options` for `agent`.
#[allow(clippy::too_many_arguments)]
pub fn choose_injection(
    pm: &mut PolicyModel,
    adapter: Option<&str>,
    agent: &str,
    components: &[String],
    history: &str,
    options: &[InjectionOption],
    temperature: f32,
    seed: u64,
) -> Result<InjectorChoice> {
    let texts: Vec<String> = options.iter().map(InjectionOption::text).collect();
    let grammar = ChoiceGrammar::new(&pm.tokenizer, &texts, pm.format.im_end)?;
    let mut conversation = Conversation::new();
    conversation.push_message(&pm.tokenizer, "system", &prompt::injector_system())?;
    conversation.push_message(
        &pm.tokenizer,
        "user",
        &prompt::injector_task(agent, components, history),
    )?;
    conversation.open_reply(&pm.tokenizer)?;
    let longest = texts.iter().map(|t| t.len()).max().unwrap_or(0);
    let params = SamplingParams {
        // Each token covers at least one byte; the end token comes after.
        max_new_tokens: longest + 2,
        temperature,
        seed,
        stop_token_ids: Some(vec![pm.format.im_end]),
        ..SamplingParams::default()
    };
    let mut cache = KvCache::new(&pm.model, 1);
    let reply = pm.reply(adapter, &mut cache, &conversation, &params, &|g| {
        grammar.allowed(g)
    })?;
    let index = grammar.chosen(&reply).ok_or_else(|| {
        PolicyError::Grammar(format!(
            "the constrained reply {reply:?} spells no option; the grammar and sampler disagree"
        ))
    })?;
    let allowed = grammar.allowed_sets(&reply);
    conversation.push_reply(&pm.tokenizer, pm.format, &reply, allowed)?;
    Ok(InjectorChoice {
        index,
        conversation,
    })
}

/// Rebuilds the allowed sets of an Injector conversation for `options` (training re-scores
/// the reply under the same grammar it was sampled with).
pub fn injector_grammar(pm: &PolicyModel, options: &[InjectionOption]) -> Result<ChoiceGrammar> {
    let texts: Vec<String> = options.iter().map(InjectionOption::text).collect();
    ChoiceGrammar::new(&pm.tokenizer, &texts, pm.format.im_end)
}

/// Free-form injection (for models able to write patches): continues the Injector's
/// conversation with the code its choice targets and asks for a unified diff, sampled without
/// a grammar; the engine applies it or rejects it with the reason. Returns the diff text.
#[allow(clippy::too_many_arguments)]
pub fn write_diff(
    pm: &mut PolicyModel,
    adapter: Option<&str>,
    conversation: &mut Conversation,
    file: &str,
    code: &str,
    deficiency: &str,
    max_tokens: usize,
    temperature: f32,
    seed: u64,
) -> Result<String> {
    conversation.push_message(
        &pm.tokenizer,
        "user",
        &prompt::diff_request(file, code, deficiency),
    )?;
    conversation.open_reply(&pm.tokenizer)?;
    let params = SamplingParams {
        max_new_tokens: max_tokens,
        temperature,
        seed,
        stop_token_ids: Some(vec![pm.format.im_end]),
        ..SamplingParams::default()
    };
    let mut cache = KvCache::new(&pm.model, 1);
    let reply = pm.reply(adapter, &mut cache, conversation, &params, &|_| None)?;
    let text_tokens: Vec<u32> = reply
        .iter()
        .copied()
        .filter(|t| *t != pm.format.im_end)
        .collect();
    let text = pm.tokenizer.decode(&text_tokens, true)?;
    let allowed = vec![None; reply.len()];
    conversation.push_reply(&pm.tokenizer, pm.format, &reply, allowed)?;
    Ok(text)
}
