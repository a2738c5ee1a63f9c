//! The model the policies share: weights with their LoRA adapters, the tokenizer and the chat
//! format, behind one lock per process. The learned Detector, the Injector, the decision head
//! and the turn batcher all reply through it.

use std::path::Path;
use std::sync::{Arc, Mutex};

use model::{ChatTokenizer, DType, Device, KvCache, Model, SamplingParams};

use crate::chat::{ChatFormat, Conversation};
use crate::Result;

/// A model with its tokenizer and chat format; shared by the policies of one process.
pub struct PolicyModel {
    pub model: Model,
    pub tokenizer: ChatTokenizer,
    pub format: ChatFormat,
    /// Where the base weights came from (recorded in adapter files).
    pub base_name: String,
}

pub type SharedModel = Arc<Mutex<PolicyModel>>;

impl PolicyModel {
    /// Loads a GGUF file or a Hugging Face directory and checks its chat format.
    pub fn load(path: &Path, dtype: DType, device: &Device) -> Result<PolicyModel> {
        let loaded = model::load(path, dtype, device)?;
        PolicyModel::new(loaded.model, loaded.tokenizer, path.display().to_string())
    }

    pub fn new(model: Model, tokenizer: ChatTokenizer, base_name: String) -> Result<PolicyModel> {
        let format = ChatFormat::of(&tokenizer)?;
        Ok(PolicyModel {
            model,
            tokenizer,
            format,
            base_name,
        })
    }

    /// Samples one reply to `conversation` (which must end with an open reply) with `adapter`
    /// under `allowed`, continuing `cache`; returns the reply's tokens.
    pub fn reply(
        &mut self,
        adapter: Option<&str>,
        cache: &mut KvCache,
        conversation: &Conversation,
        params: &SamplingParams,
        allowed: &dyn Fn(&[u32]) -> Option<Vec<u32>>,
    ) -> Result<Vec<u32>> {
        self.model.set_active_adapter(adapter)?;
        self.model.set_training(false);
        let mut constraint = |_row: usize, generated: &[u32]| allowed(generated);
        let mut out = self.model.generate_with_cache(
            cache,
            &self.tokenizer,
            std::slice::from_ref(&conversation.tokens),
            params,
            Some(&mut constraint),
        )?;
        Ok(out.remove(0).tokens)
    }
}
