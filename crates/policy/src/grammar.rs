//! Constrained decoding: token tries over a closed set of strings, the Detector's action
//! grammar and the Injector's choice grammar.
//!
//! Each grammar answers one question, "which tokens may come next after these generated
//! tokens?", as a pure function of the tokens. Generation asks it at every step (through
//! `model::TokenConstraint`) and training asks it again for every generated position, so the
//! sampled and the trained distribution are renormalised over the same sets.

use std::collections::BTreeMap;

use model::ChatTokenizer;

use crate::{PolicyError, Result};

/// A trie over token sequences: which sequences a prefix can still become.
#[derive(Debug, Clone, Default)]
pub struct TokenTrie {
    /// Node 0 is the root.
    children: Vec<BTreeMap<u32, usize>>,
    /// The index of the sequence that ends at a node.
    terminal: Vec<Option<usize>>,
    /// Tokens in the longest sequence.
    longest: usize,
}

/// Where a prefix stands in a trie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Walk {
    /// The prefix is a proper prefix of some sequences: these tokens may follow.
    Partial(Vec<u32>),
    /// The prefix starts with the whole sequence `index`, followed by `consumed..` of the input.
    Complete { index: usize, consumed: usize },
    /// The prefix leaves the trie.
    Outside,
}

impl TokenTrie {
    /// A trie of `sequences`. No sequence may be empty or a proper prefix of another (the walk
    /// must know where a sequence ends).
    pub fn new(sequences: &[Vec<u32>]) -> Result<TokenTrie> {
        let mut trie = TokenTrie {
            children: vec![BTreeMap::new()],
            terminal: vec![None],
            longest: sequences.iter().map(Vec::len).max().unwrap_or(0),
        };
        for (index, seq) in sequences.iter().enumerate() {
            if seq.is_empty() {
                return Err(PolicyError::Grammar(format!("choice {index} is empty")));
            }
            let mut node = 0;
            for &tok in seq {
                if trie.terminal[node].is_some() {
                    return Err(PolicyError::Grammar(format!(
                        "choice {index} extends another choice; no choice may be a prefix of another"
                    )));
                }
                node = match trie.children[node].get(&tok) {
                    Some(&n) => n,
                    None => {
                        trie.children.push(BTreeMap::new());
                        trie.terminal.push(None);
                        let n = trie.children.len() - 1;
                        trie.children[node].insert(tok, n);
                        n
                    }
                };
            }
            if !trie.children[node].is_empty() || trie.terminal[node].is_some() {
                return Err(PolicyError::Grammar(format!(
                    "choice {index} is a prefix of another choice or repeats one"
                )));
            }
            trie.terminal[node] = Some(index);
        }
        if sequences.is_empty() {
            return Err(PolicyError::Grammar("no choices".into()));
        }
        Ok(trie)
    }

    /// Tokens in the longest sequence.
    pub fn longest(&self) -> usize {
        self.longest
    }

    /// Follows `tokens` from the root.
    pub fn walk(&self, tokens: &[u32]) -> Walk {
        let mut node = 0;
        for (i, tok) in tokens.iter().enumerate() {
            if let Some(index) = self.terminal[node] {
                return Walk::Complete { index, consumed: i };
            }
            match self.children[node].get(tok) {
                Some(&n) => node = n,
                None => return Walk::Outside,
            }
        }
        match self.terminal[node] {
            Some(index) => Walk::Complete {
                index,
                consumed: tokens.len(),
            },
            None => Walk::Partial(self.children[node].keys().copied().collect()),
        }
    }
}

/// The Detector's reply grammar: `sql:` or `bash:` followed by free text, or `answer:`
/// followed by exactly one valid ` ID COMPONENT`, ` |` and free evidence. History and delegation
/// are left out of the learned policy's action set (see the crate's README in ARCHITECTURE.md).
#[derive(Debug, Clone)]
pub struct ActionGrammar {
    heads: TokenTrie,
    head_names: Vec<&'static str>,
    answers: TokenTrie,
    /// `ID COMPONENT` of each answer, in trie order.
    answer_texts: Vec<String>,
    separator: Vec<u32>,
    /// The tokens of `answer:`, forced on the last turn of an episode.
    answer_head: Vec<u32>,
}

/// The tool names the learned Detector may call.
pub const LEARNED_TOOLS: [&str; 3] = ["sql", "bash", "answer"];

impl ActionGrammar {
    /// Every deficiency id of `catalog` with every component of its vocabulary is a valid
    /// answer: the catalog's usual components are a hint, not a limit, because the ground truth
    /// is the component of the code the injection touched.
    pub fn new(
        tokenizer: &ChatTokenizer,
        catalog: &taxonomy::Catalog,
        tools: &[&'static str],
    ) -> Result<ActionGrammar> {
        let head_names: Vec<&'static str> = tools.to_vec();
        if !head_names.contains(&"answer") {
            return Err(PolicyError::Grammar(
                "the Detector must be able to answer".into(),
            ));
        }
        let heads = head_names
            .iter()
            .map(|h| tokenizer.encode(&format!("{h}:"), false))
            .collect::<model::Result<Vec<_>>>()?;
        let mut answer_texts = Vec::new();
        for d in catalog.deficiencies() {
            for c in catalog.components() {
                answer_texts.push(format!("{} {}", d.id, c.id));
            }
        }
        let answers = answer_texts
            .iter()
            .map(|a| tokenizer.encode(&format!(" {a}"), false))
            .collect::<model::Result<Vec<_>>>()?;
        let answer_head =
            heads[head_names.iter().position(|h| *h == "answer").unwrap_or(0)].clone();
        Ok(ActionGrammar {
            answer_head,
            heads: TokenTrie::new(&heads)?,
            head_names,
            answers: TokenTrie::new(&answers)?,
            answer_texts,
            separator: tokenizer.encode(" |", false)?,
        })
    }

    /// The tokens allowed after `generated` (`None`: any token).
    pub fn allowed(&self, generated: &[u32]) -> Option<Vec<u32>> {
        let (head, rest) = match self.heads.walk(generated) {
            Walk::Partial(next) => return Some(next),
            Walk::Outside => return None,
            Walk::Complete { index, consumed } => (self.head_names[index], &generated[consumed..]),
        };
        if head != "answer" {
            return None;
        }
        let rest = match self.answers.walk(rest) {
            Walk::Partial(next) => return Some(next),
            Walk::Outside => return None,
            Walk::Complete { consumed, .. } => &rest[consumed..],
        };
        if rest.len() < self.separator.len() {
            if rest == &self.separator[..rest.len()] {
                return Some(vec![self.separator[rest.len()]]);
            }
            return None;
        }
        None
    }

    /// The allowed set of every position of a reply, as generation saw them.
    pub fn allowed_sets(&self, reply: &[u32]) -> Vec<Option<Vec<u32>>> {
        (0..reply.len())
            .map(|i| self.allowed(&reply[..i]))
            .collect()
    }

    /// As [`ActionGrammar::allowed`], but with `answer_only` the reply must be an answer (the
    /// episode's last turn: a tool call there could never be followed by a verdict).
    pub fn allowed_for(&self, generated: &[u32], answer_only: bool) -> Option<Vec<u32>> {
        if answer_only && generated.len() < self.answer_head.len() {
            return Some(vec![self.answer_head[generated.len()]]);
        }
        self.allowed(generated)
    }

    /// Tokens enough for the longest answer head, ` ID COMPONENT` and separator, plus
    /// `evidence` tokens: a forced answer given fewer could be cut before it is valid.
    pub fn answer_budget(&self, evidence: usize) -> usize {
        self.answer_head.len() + self.answers.longest() + self.separator.len() + evidence
    }

    /// As [`ActionGrammar::allowed_sets`] for [`ActionGrammar::allowed_for`].
    pub fn allowed_sets_for(&self, reply: &[u32], answer_only: bool) -> Vec<Option<Vec<u32>>> {
        (0..reply.len())
            .map(|i| self.allowed_for(&reply[..i], answer_only))
            .collect()
    }

    /// The tokens of `head:` (e.g. `sql:`), for writing demonstrations in the grammar's own
    /// tokenisation.
    pub fn head_tokens(&self, tokenizer: &ChatTokenizer, head: &str) -> Result<Vec<u32>> {
        Ok(tokenizer.encode(&format!("{head}:"), false)?)
    }

    /// The tokens of a valid answer ` ID COMPONENT` followed by the separator, or `None` when
    /// the pair is not in the grammar.
    pub fn answer_tokens(
        &self,
        tokenizer: &ChatTokenizer,
        id: &str,
        component: &str,
    ) -> Result<Option<Vec<u32>>> {
        let text = format!("{id} {component}");
        if !self.answer_texts.contains(&text) {
            return Ok(None);
        }
        let mut ids = tokenizer.encode(&format!(" {text}"), false)?;
        ids.extend(&self.separator);
        Ok(Some(ids))
    }
}

/// A choice among a closed list of strings, ended by a fixed token (the Injector's grammar).
#[derive(Debug, Clone)]
pub struct ChoiceGrammar {
    trie: TokenTrie,
    end: u32,
}

impl ChoiceGrammar {
    pub fn new(tokenizer: &ChatTokenizer, choices: &[String], end: u32) -> Result<ChoiceGrammar> {
        let seqs = choices
            .iter()
            .map(|c| tokenizer.encode(&format!(" {c}"), false))
            .collect::<model::Result<Vec<_>>>()?;
        Ok(ChoiceGrammar {
            trie: TokenTrie::new(&seqs)?,
            end,
        })
    }

    /// Tokens allowed after `generated`: the trie, then the end token, then nothing else.
    pub fn allowed(&self, generated: &[u32]) -> Option<Vec<u32>> {
        match self.trie.walk(generated) {
            Walk::Partial(next) => Some(next),
            Walk::Complete { consumed, .. } if consumed == generated.len() => Some(vec![self.end]),
            _ => Some(vec![self.end]),
        }
    }

    /// Which choice `generated` spells, if it spells one completely.
    pub fn chosen(&self, generated: &[u32]) -> Option<usize> {
        match self.trie.walk(generated) {
            Walk::Complete { index, .. } => Some(index),
            _ => None,
        }
    }

    pub fn allowed_sets(&self, reply: &[u32]) -> Vec<Option<Vec<u32>>> {
        (0..reply.len())
            .map(|i| self.allowed(&reply[..i]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trie_walks_prefixes_and_rejects_prefix_choices() {
        let t = TokenTrie::new(&[vec![1, 2], vec![1, 3, 4], vec![5]]).unwrap();
        assert_eq!(t.walk(&[]), Walk::Partial(vec![1, 5]));
        assert_eq!(t.walk(&[1]), Walk::Partial(vec![2, 3]));
        assert_eq!(
            t.walk(&[1, 3, 4, 9]),
            Walk::Complete {
                index: 1,
                consumed: 3
            }
        );
        assert_eq!(t.walk(&[7]), Walk::Outside);
        assert!(TokenTrie::new(&[vec![1], vec![1, 2]]).is_err());
        assert!(TokenTrie::new(&[vec![1, 2], vec![1]]).is_err());
        assert!(TokenTrie::new(&[vec![]]).is_err());
        assert!(TokenTrie::new(&[]).is_err());
    }
}
