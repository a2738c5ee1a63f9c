//! Conversations as token sequences built one message at a time.
//!
//! A learned policy's episode is one ChatML conversation. Building it incrementally (each
//! message encoded on its own, each reply kept as the exact token ids the model sampled) makes
//! the prompt of turn k a prefix of the prompt of turn k + 1, so generation can reuse its KV
//! cache across turns and training can score every reply of an episode with one forward pass.

use model::{ChatMessage, ChatTokenizer};
use serde::{Deserialize, Serialize};

use crate::{PolicyError, Result};

const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";

/// The ChatML framing of a model whose own chat template renders ChatML (SmolLM2, Qwen2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatFormat {
    pub im_start: u32,
    pub im_end: u32,
}

impl ChatFormat {
    /// Checks that the tokenizer has ChatML's special tokens and that its chat template renders
    /// a conversation exactly as ChatML does; other templates are refused with the difference.
    pub fn of(tokenizer: &ChatTokenizer) -> Result<ChatFormat> {
        let id = |t: &str| {
            tokenizer.token_to_id(t).ok_or_else(|| {
                PolicyError::ChatFormat(format!(
                    "the tokenizer has no `{t}` token; the learned policies need a ChatML model (SmolLM2, Qwen2)"
                ))
            })
        };
        let format = ChatFormat {
            im_start: id(IM_START)?,
            im_end: id(IM_END)?,
        };
        let messages = [
            ChatMessage::new("system", "S"),
            ChatMessage::new("user", "U"),
        ];
        let rendered = tokenizer.apply_chat_template(&messages, true)?;
        let expected = format!(
            "{IM_START}system\nS{IM_END}\n{IM_START}user\nU{IM_END}\n{IM_START}assistant\n"
        );
        if rendered != expected {
            return Err(PolicyError::ChatFormat(format!(
                "the model's chat template renders {rendered:?}, not ChatML {expected:?}"
            )));
        }
        Ok(format)
    }
}

/// One episode of a policy as tokens, with which of them the policy generated.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    pub tokens: Vec<u32>,
    /// True where the policy sampled the token; only these are trained.
    pub generated: Vec<bool>,
    /// For a generated token sampled under a constraint, the tokens that were allowed there;
    /// training renormalises the model's distribution over the same set.
    pub allowed: Vec<Option<Vec<u32>>>,
}

impl Conversation {
    pub fn new() -> Conversation {
        Conversation::default()
    }

    fn push_prompt(&mut self, ids: Vec<u32>) {
        self.generated.extend(std::iter::repeat_n(false, ids.len()));
        self.allowed.extend(std::iter::repeat_n(None, ids.len()));
        self.tokens.extend(ids);
    }

    /// Appends a whole `role` message (system, user, or a scripted assistant reply that is not
    /// trained).
    pub fn push_message(
        &mut self,
        tokenizer: &ChatTokenizer,
        role: &str,
        content: &str,
    ) -> Result<()> {
        let ids = tokenizer.encode(&format!("{IM_START}{role}\n{content}{IM_END}\n"), false)?;
        self.push_prompt(ids);
        Ok(())
    }

    /// Appends the header that starts the assistant's reply; generation continues from here.
    pub fn open_reply(&mut self, tokenizer: &ChatTokenizer) -> Result<()> {
        let ids = tokenizer.encode(&format!("{IM_START}assistant\n"), false)?;
        self.push_prompt(ids);
        Ok(())
    }

    /// Appends a reply the policy generated (its tokens as sampled, with the allowed set of
    /// each), then closes it: `<|im_end|>` if the reply did not end with it (not trained, the
    /// reply was cut), and the newline ChatML puts after every message.
    pub fn push_reply(
        &mut self,
        tokenizer: &ChatTokenizer,
        format: ChatFormat,
        tokens: &[u32],
        allowed: Vec<Option<Vec<u32>>>,
    ) -> Result<()> {
        debug_assert_eq!(tokens.len(), allowed.len());
        let mut tokens = tokens.to_vec();
        let mut allowed = allowed;
        // A reply ended by another stop token (e.g. <|endoftext|>) is closed as ChatML closes it.
        if let Some(&last) = tokens.last() {
            if last != format.im_end && tokenizer.eos_token_ids().contains(&last) {
                tokens.pop();
                allowed.pop();
            }
        }
        self.generated
            .extend(std::iter::repeat_n(true, tokens.len()));
        self.allowed.extend(allowed);
        let closed = tokens.last() == Some(&format.im_end);
        self.tokens.extend(tokens);
        if !closed {
            self.push_prompt(vec![format.im_end]);
        }
        self.push_prompt(tokenizer.encode("\n", false)?);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// How many tokens the policy generated.
    pub fn generated_count(&self) -> usize {
        self.generated.iter().filter(|g| **g).count()
    }

    /// Checks the three vectors line up and every generated token lies in its allowed set.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.tokens.len() != self.generated.len() || self.tokens.len() != self.allowed.len() {
            return Err(format!(
                "conversation vectors differ in length: {} tokens, {} flags, {} allowed sets",
                self.tokens.len(),
                self.generated.len(),
                self.allowed.len()
            ));
        }
        for (i, (tok, allowed)) in self.tokens.iter().zip(&self.allowed).enumerate() {
            if let Some(set) = allowed {
                if !self.generated[i] {
                    return Err(format!(
                        "token {i} has an allowed set but was not generated"
                    ));
                }
                if !set.contains(tok) {
                    return Err(format!("token {i} ({tok}) is outside its allowed set"));
                }
            }
        }
        Ok(())
    }
}
