//! A model's blame on a multi-agent chat log: the expert's two blame measurements (an overview
//! and the per-turn table, `detect::policies::blame`) as ordinary tool calls, then one choice
//! among the log's acting turns, made by the model (with an adapter: a trained checkpoint's
//! Detector) under a choice grammar, answered as `agent NAME step N`. The model decides; the
//! measurements are what it reads. Nothing here was trained for blame: a checkpoint's adapter
//! was fitted on deficiency types, so this is how far its reading carries to a new question.

use detect::policies::blame;
use detect::{Policy, View};
use model::{KvCache, SamplingParams};

use crate::chat::Conversation;
use crate::grammar::ChoiceGrammar;
use crate::{Result, SharedModel};

/// Characters of the per-turn table shown to the model (head and tail kept when longer).
const TABLE_CHARS: usize = 6_000;

/// The model's blame policy.
pub struct ModelBlame {
    shared: SharedModel,
    adapter: Option<String>,
    name: String,
}

impl ModelBlame {
    pub fn new(shared: SharedModel, adapter: Option<String>, name: impl Into<String>) -> Self {
        ModelBlame {
            shared,
            adapter,
            name: name.into(),
        }
    }

    /// The choice among `turns` (acting ones only) after reading `table`.
    fn choose(&self, table: &str, turns: &[blame::Turn]) -> Result<Option<blame::Turn>> {
        let acting: Vec<&blame::Turn> = turns
            .iter()
            .filter(|t| !blame::task_giver(&t.agent))
            .collect();
        if acting.is_empty() {
            return Ok(None);
        }
        let width = acting
            .iter()
            .map(|t| t.step.to_string().len())
            .max()
            .unwrap_or(1);
        let labels: Vec<String> = acting
            .iter()
            .map(|t| format!("step {:0width$}", t.step))
            .collect();
        let mut pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let mut c = Conversation::new();
        c.push_message(
            &pm.tokenizer,
            "system",
            "You are the Detector. A multi-agent chat log failed its task; name the turn that made the decisive mistake.",
        )?;
        let shown = clip(table, TABLE_CHARS);
        c.push_message(
            &pm.tokenizer,
            "user",
            &format!(
                "Per turn: failed (2 = failed execution, 1 = failure words), made_up (substitutes invented data), novel (new numbers), relied (of those, repeated later), carried (reaching the final answer), repeats (an execution identical to an earlier one).\n{shown}\nWhich turn made the decisive mistake? Answer `step N`."
            ),
        )?;
        c.open_reply(&pm.tokenizer)?;
        let grammar = ChoiceGrammar::new(&pm.tokenizer, &labels, pm.format.im_end)?;
        let params = SamplingParams {
            max_new_tokens: 16,
            temperature: 0.0,
            seed: 0,
            stop_token_ids: Some(vec![pm.format.im_end]),
            ..Default::default()
        };
        let mut cache = KvCache::new(&pm.model, 1);
        let adapter = self.adapter.clone();
        let reply = pm.reply(adapter.as_deref(), &mut cache, &c, &params, &|g| {
            grammar.allowed(g)
        })?;
        Ok(grammar.chosen(&reply).map(|i| acting[i].clone()))
    }
}

fn clip(text: &str, n: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= n {
        return text.to_string();
    }
    let head: String = chars[..n / 2].iter().collect();
    let tail: String = chars[chars.len() - n / 2..].iter().collect();
    format!("{head}\n[… {} chars cut …]\n{tail}", chars.len() - n)
}

impl Policy for ModelBlame {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn act(&mut self, view: &View<'_>) -> std::result::Result<String, String> {
        if !view.chatlog {
            return Err(format!(
                "{} blames chat logs; this trace is not one",
                self.name
            ));
        }
        let made = view.turns.len();
        if view.turns_left > 1 {
            if let Some(call) = blame::measurement(view, made) {
                return Ok(call);
            }
        }
        let table = blame::measured_table(view.turns);
        let turns = blame::parse_turns(table);
        match self.choose(table, &turns).map_err(|e| e.to_string())? {
            Some(t) => Ok(format!(
                "answer: agent {} step {} | chosen by the model from the per-turn table",
                t.agent, t.step
            )),
            None => Ok("answer: none | the per-turn table could not be read".into()),
        }
    }

    fn subagent(&self, _task: &str) -> std::result::Result<Box<dyn Policy>, String> {
        Err(format!("{} does not delegate", self.name))
    }
}
