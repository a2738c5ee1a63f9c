//! Tokenizers for chat models: from a Hugging Face `tokenizer.json`, or rebuilt from the
//! vocabulary, merges and special tokens embedded in a GGUF file; plus the model's Jinja chat
//! template rendered with minijinja.

use crate::error::{ModelError, Result};
use candle_core::quantized::gguf_file;
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// GPT-4-style split used by Llama 3 (`llama-bpe`): digits in groups of up to three.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: like Llama 3's but single digits.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF `tokenizer.ggml.token_type` values.
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// One turn of a conversation, as chat templates expect it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A tokenizer plus what chat generation needs from the model's metadata.
#[derive(Clone)]
pub struct ChatTokenizer {
    tokenizer: Tokenizer,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    add_bos: bool,
    eos_token_ids: Vec<u32>,
}

impl std::fmt::Debug for ChatTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTokenizer")
            .field("vocab_size", &self.tokenizer.get_vocab_size(true))
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

fn md_string(md: &HashMap<String, gguf_file::Value>, key: &str) -> Option<String> {
    md.get(key).and_then(|v| v.to_string().ok()).cloned()
}

fn md_u32(md: &HashMap<String, gguf_file::Value>, key: &str) -> Option<u32> {
    md.get(key).and_then(|v| v.to_u32().ok())
}

impl ChatTokenizer {
    /// Reads the tokenizer embedded in a GGUF file.
    pub fn from_gguf(path: &Path) -> Result<Self> {
        let mut file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
        let content = gguf_file::Content::read(&mut file).map_err(|e| {
            ModelError::weight(path.display().to_string(), "<header>", e.to_string())
        })?;
        Self::from_gguf_content(&path.display().to_string(), &content)
    }

    /// Rebuilds a byte-level BPE tokenizer from GGUF metadata (`tokenizer.ggml.*`).
    pub fn from_gguf_content(origin: &str, content: &gguf_file::Content) -> Result<Self> {
        let md = &content.metadata;
        let model = md_string(md, "tokenizer.ggml.model").ok_or_else(|| {
            ModelError::config(origin, "tokenizer.ggml.model", "missing from GGUF metadata")
        })?;
        if model != "gpt2" {
            return Err(ModelError::config(
                origin,
                "tokenizer.ggml.model",
                format!("`{model}` tokenizers are not supported (only byte-level BPE, `gpt2`)"),
            ));
        }
        let list = |key: &str| -> Result<Vec<String>> {
            md.get(key)
                .ok_or_else(|| ModelError::config(origin, key, "missing from GGUF metadata"))?
                .to_vec()
                .map_err(|e| ModelError::config(origin, key, e.to_string()))?
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.to_string().cloned().map_err(|e| {
                        ModelError::config(origin, format!("{key}[{i}]"), e.to_string())
                    })
                })
                .collect()
        };
        let tokens = list("tokenizer.ggml.tokens")?;
        let merges_raw = list("tokenizer.ggml.merges")?;
        let token_types: Vec<i32> = match md.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()
                .map_err(|e| {
                    ModelError::config(origin, "tokenizer.ggml.token_type", e.to_string())
                })?
                .iter()
                .map(|t| {
                    t.to_i32()
                        .or_else(|_| t.to_u32().map(|x| x as i32))
                        .unwrap_or(1)
                })
                .collect(),
            None => vec![1; tokens.len()],
        };
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let merges = merges_raw
            .iter()
            .enumerate()
            .map(|(i, m)| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| {
                        ModelError::config(
                            origin,
                            format!("tokenizer.ggml.merges[{i}]"),
                            format!("`{m}` is not two space-separated symbols"),
                        )
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let pre = md_string(md, "tokenizer.ggml.pre").unwrap_or_else(|| "default".into());
        let split = |pattern: &str| -> Result<PreTokenizerWrapper> {
            Ok(Split::new(
                SplitPattern::Regex(pattern.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?
            .into())
        };
        let (pre_tokenizer, ignore_merges): (PreTokenizerWrapper, bool) = match pre.as_str() {
            "smollm" => (
                Sequence::new(vec![
                    Digits::new(true).into(),
                    ByteLevel::new(false, true, true).into(),
                ])
                .into(),
                false,
            ),
            "gpt2" | "default" => (ByteLevel::new(false, true, true).into(), false),
            "qwen2" => (
                Sequence::new(vec![split(QWEN2_SPLIT)?, ByteLevel::new(false, true, false).into()])
                    .into(),
                false,
            ),
            "llama-bpe" | "llama3" => (
                Sequence::new(vec![split(LLAMA3_SPLIT)?, ByteLevel::new(false, true, false).into()])
                    .into(),
                true,
            ),
            other => {
                return Err(ModelError::config(
                    origin,
                    "tokenizer.ggml.pre",
                    format!("pre-tokenizer `{other}` is not supported (supported: smollm, gpt2, default, qwen2, llama-bpe)"),
                ))
            }
        };
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(ignore_merges)
            .build()
            .map_err(|e| ModelError::Tokenizer(format!("{origin}: {e}")))?;
        let mut tokenizer = Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
        tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(&token_types)
            .filter(|(_, &ty)| ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED)
            .map(|(t, &ty)| AddedToken::from(t.clone(), ty == TOKEN_TYPE_CONTROL))
            .collect();
        tokenizer.add_special_tokens(&specials);
        let name_of = |key: &str| md_u32(md, key).and_then(|id| tokens.get(id as usize).cloned());
        let eos_id = md_u32(md, "tokenizer.ggml.eos_token_id");
        let mut eos_token_ids: Vec<u32> = eos_id.into_iter().collect();
        if let Some(eot) = md_u32(md, "tokenizer.ggml.eot_token_id") {
            if !eos_token_ids.contains(&eot) {
                eos_token_ids.push(eot);
            }
        }
        Ok(ChatTokenizer {
            tokenizer,
            chat_template: md_string(md, "tokenizer.chat_template"),
            bos_token: name_of("tokenizer.ggml.bos_token_id"),
            eos_token: name_of("tokenizer.ggml.eos_token_id"),
            add_bos: md
                .get("tokenizer.ggml.add_bos_token")
                .and_then(|v| v.to_bool().ok())
                .unwrap_or(false),
            eos_token_ids,
        })
    }

    /// Reads `tokenizer.json` and, when present, `tokenizer_config.json` (chat template,
    /// bos/eos names, `add_bos_token`) from a Hugging Face model directory.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&tok_path)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", tok_path.display())))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: serde_json::Value = if cfg_path.exists() {
            let text =
                std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?;
            serde_json::from_str(&text).map_err(|e| ModelError::Json {
                path: cfg_path.clone(),
                source: e,
            })?
        } else {
            serde_json::Value::Null
        };
        // Special tokens appear either as plain strings or as {"content": ...} objects.
        let token_name = |key: &str| match cfg.get(key) {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Object(o)) => o
                .get("content")
                .and_then(|c| c.as_str())
                .map(str::to_string),
            _ => None,
        };
        let chat_template = match cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(str::to_string),
            _ => None,
        };
        let eos_token = token_name("eos_token");
        let eos_token_ids = eos_token
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t))
            .into_iter()
            .collect();
        Ok(ChatTokenizer {
            chat_template,
            bos_token: token_name("bos_token"),
            eos_token,
            add_bos: cfg
                .get("add_bos_token")
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            eos_token_ids,
            tokenizer,
        })
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The Jinja chat template, if the model ships one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Token ids that end a turn (eos, and eot where the model has one).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Size of the vocabulary including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The id of a token string (special tokens included).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// Encodes `text`; special-token strings inside it (`<|im_start|>`) become their ids.
    /// With `add_bos`, the model's BOS is prepended when its metadata asks for one.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_bos && self.add_bos {
            if let Some(bos) = self.bos_token.as_deref().and_then(|b| self.token_to_id(b)) {
                ids.push(bos);
            }
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Decodes ids back to text, dropping special tokens when `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.tokenizer
            .decode(ids, skip_special)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))
    }

    /// Renders the chat template for `messages`; with `add_generation_prompt` the text ends
    /// where the assistant's reply begins. Fails clearly when the model has no template.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self
            .chat_template
            .as_deref()
            .ok_or_else(|| ModelError::ChatTemplate("the model ships no chat template".into()))?;
        let mut env = minijinja::Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template("chat", template)
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        let tmpl = env
            .get_template("chat")
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
        })
        .map_err(|e| ModelError::ChatTemplate(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny GGUF-style byte-level vocabulary: bytes as symbols, one merge, one special token.
    pub(crate) fn tiny_gguf_metadata() -> Vec<(String, gguf_file::Value)> {
        use gguf_file::Value as V;
        let mut tokens = vec!["<|endoftext|>".to_string(), "<|im_start|>".to_string()];
        for c in ["h", "e", "l", "o", "Ġ", "w", "r", "d", "he", "ll", "1", "2"] {
            tokens.push(c.to_string());
        }
        let mut types = vec![3i32, 3];
        types.extend(std::iter::repeat_n(1, tokens.len() - 2));
        vec![
            ("tokenizer.ggml.model".into(), V::String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), V::String("smollm".into())),
            (
                "tokenizer.ggml.tokens".into(),
                V::Array(tokens.into_iter().map(V::String).collect()),
            ),
            (
                "tokenizer.ggml.token_type".into(),
                V::Array(types.into_iter().map(V::I32).collect()),
            ),
            (
                "tokenizer.ggml.merges".into(),
                V::Array(vec![V::String("h e".into()), V::String("l l".into())]),
            ),
            ("tokenizer.ggml.eos_token_id".into(), V::U32(0)),
            (
                "tokenizer.chat_template".into(),
                V::String("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}".into()),
            ),
        ]
    }

    fn tiny() -> ChatTokenizer {
        let content = gguf_file::Content {
            magic: gguf_file::VersionedMagic::GgufV3,
            metadata: tiny_gguf_metadata().into_iter().collect(),
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        };
        ChatTokenizer::from_gguf_content("tiny.gguf", &content).unwrap()
    }

    #[test]
    fn gguf_tokenizer_applies_merges_specials_and_digit_split() {
        let tok = tiny();
        let ids = tok.encode("<|im_start|>hello world 12", false).unwrap();
        let pieces: Vec<String> = ids
            .iter()
            .map(|&i| tok.tokenizer().id_to_token(i).unwrap())
            .collect();
        assert_eq!(
            pieces,
            [
                "<|im_start|>",
                "he",
                "ll",
                "o",
                "Ġ",
                "w",
                "o",
                "r",
                "l",
                "d",
                "Ġ",
                "1",
                "2"
            ]
        );
        assert_eq!(tok.decode(&ids, true).unwrap(), "hello world 12");
        assert_eq!(tok.eos_token_ids(), &[0]);
    }

    #[test]
    fn renders_chat_template() {
        let tok = tiny();
        let text = tok
            .apply_chat_template(&[ChatMessage::new("user", "hello")], true)
            .unwrap();
        assert_eq!(text, "<|im_start|>user\nhello\n<|im_start|>assistant\n");
    }

    #[test]
    fn rejects_sentencepiece_gguf_by_field() {
        let mut md: HashMap<_, _> = tiny_gguf_metadata().into_iter().collect();
        md.insert(
            "tokenizer.ggml.model".into(),
            gguf_file::Value::String("llama".into()),
        );
        let content = gguf_file::Content {
            magic: gguf_file::VersionedMagic::GgufV3,
            metadata: md,
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        };
        let err = ChatTokenizer::from_gguf_content("x.gguf", &content)
            .unwrap_err()
            .to_string();
        assert!(err.contains("tokenizer.ggml.model"), "{err}");
    }
}
