//! The Injector's choice: given an agent, its components and the run's recent history, the
//! model picks one of the engine's valid injections (deficiency type and template variant)
//! under a grammar that admits nothing else, so even a small model always makes a valid choice.

use model::{KvCache, SamplingParams};
use serde::{Deserialize, Serialize};

use crate::chat::Conversation;
use crate::grammar::ChoiceGrammar;
use crate::policy_model::PolicyModel;
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

/// Asks the model (with `adapter`) to choose among `options` for `agent`. With one option
/// there is nothing to choose: the model is not run, and the reply is recorded as a message the
/// policy did not generate (so training finds nothing in it to learn from).
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
    let mut conversation = Conversation::new();
    conversation.push_message(&pm.tokenizer, "system", &prompt::injector_system())?;
    conversation.push_message(
        &pm.tokenizer,
        "user",
        &prompt::injector_task(agent, components, history),
    )?;
    if let [only] = texts.as_slice() {
        conversation.push_message(&pm.tokenizer, "assistant", &format!(" {only}"))?;
        return Ok(InjectorChoice {
            index: 0,
            conversation,
        });
    }
    let grammar = ChoiceGrammar::new(&pm.tokenizer, &texts, pm.format.im_end)?;
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

/// What one free-form proposal asks for: the code its choice targets and the type to plant.
pub struct DiffRequest<'a> {
    pub file: &'a str,
    pub code: &'a str,
    /// The catalog id, with its name (`P11 (temperature out of range)`).
    pub deficiency: &'a str,
    /// The sampler's seed: the diff is the one this proposal would have sampled alone.
    pub seed: u64,
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
    let request = DiffRequest {
        file,
        code,
        deficiency,
        seed,
    };
    let mut texts = write_diffs(
        pm,
        adapter,
        &mut [(conversation, request)],
        max_tokens,
        temperature,
    )?;
    Ok(texts.remove(0))
}

/// [`write_diff`] for several proposals at once: their diffs are decoded together, a row of
/// one batch each, so a step's proposals cost one generation rather than one each. Returns
/// the diffs in the order of `proposals`.
pub fn write_diffs(
    pm: &mut PolicyModel,
    adapter: Option<&str>,
    proposals: &mut [(&mut Conversation, DiffRequest<'_>)],
    max_tokens: usize,
    temperature: f32,
) -> Result<Vec<String>> {
    if proposals.is_empty() {
        return Ok(Vec::new());
    }
    for (conversation, q) in proposals.iter_mut() {
        conversation.push_message(
            &pm.tokenizer,
            "user",
            &prompt::diff_request(q.file, q.code, q.deficiency),
        )?;
        conversation.open_reply(&pm.tokenizer)?;
    }
    let params = SamplingParams {
        max_new_tokens: max_tokens,
        temperature,
        row_seeds: proposals.iter().map(|(_, q)| q.seed).collect(),
        stop_token_ids: Some(vec![pm.format.im_end]),
        ..SamplingParams::default()
    };
    pm.model.set_active_adapter(adapter)?;
    pm.model.set_training(false);
    let prompts: Vec<Vec<u32>> = proposals.iter().map(|(c, _)| c.tokens.clone()).collect();
    let mut cache = KvCache::new(&pm.model, prompts.len());
    let generations =
        pm.model
            .generate_with_cache(&mut cache, &pm.tokenizer, &prompts, &params, None)?;
    let mut texts = Vec::with_capacity(proposals.len());
    for ((conversation, _), generation) in proposals.iter_mut().zip(generations) {
        let reply = generation.tokens;
        let text_tokens: Vec<u32> = reply
            .iter()
            .copied()
            .filter(|t| *t != pm.format.im_end)
            .collect();
        texts.push(pm.tokenizer.decode(&text_tokens, true)?);
        let allowed = vec![None; reply.len()];
        conversation.push_reply(&pm.tokenizer, pm.format, &reply, allowed)?;
    }
    Ok(texts)
}
