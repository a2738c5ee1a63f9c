//! The decoder: embeddings, `num_layers` pre-norm blocks (grouped-query attention with RoPE,
//! SwiGLU MLP), final RMSNorm and LM head, with LoRA adapters on every linear projection.
//!
//! Two code paths share the weights: the training path uses only operations candle can
//! differentiate (softmax as exp/sum, RMSNorm as sqr/mean/sqrt, RoPE as rotate-half), and the
//! inference path (generation) uses candle's fused kernels, which record no gradient. A unit test
//! checks the two agree.

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::lora::{Adapter, LoraConfig, Projection};
use candle_core::{DType, Device, Tensor, Var, D};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Additive attention bias for masked positions: large but finite so fully masked rows
/// (padding queries) stay finite instead of turning into NaN.
const MASKED: f32 = -1e9;

/// A frozen dense projection `y = x·Wᵀ + b` with `W` of shape `(out, in)`.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub(crate) weight: Tensor,
    pub(crate) bias: Option<Tensor>,
}

impl Linear {
    /// `x·Wᵀ + b`; `inference` (no gradient wanted) lets a product of a few rows take the
    /// decoding path of [`crate::frozen::inference_matmul`].
    fn forward(&self, x: &Tensor, inference: bool) -> Result<Tensor> {
        let y = if inference {
            crate::frozen::inference_matmul(x, &self.weight)?
        } else {
            crate::frozen::frozen_matmul(x, &self.weight)?
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub(crate) attn_norm: Tensor,
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
    pub(crate) mlp_norm: Tensor,
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

impl Block {
    pub(crate) fn linear(&self, p: Projection) -> &Linear {
        match p {
            Projection::Q => &self.q,
            Projection::K => &self.k,
            Projection::V => &self.v,
            Projection::O => &self.o,
            Projection::Gate => &self.gate,
            Projection::Up => &self.up,
            Projection::Down => &self.down,
        }
    }

    fn linear_mut(&mut self, p: Projection) -> &mut Linear {
        match p {
            Projection::Q => &mut self.q,
            Projection::K => &mut self.k,
            Projection::V => &mut self.v,
            Projection::O => &mut self.o,
            Projection::Gate => &mut self.gate,
            Projection::Up => &mut self.up,
            Projection::Down => &mut self.down,
        }
    }
}

/// Keys and values of one layer for the tokens already seen: `(batch, kv_heads, len, head_dim)`.
#[derive(Debug, Clone)]
pub(crate) struct LayerKv {
    pub(crate) k: Tensor,
    pub(crate) v: Tensor,
}

/// Which implementation of the attention softmax, RMSNorm, RoPE, SwiGLU and the LoRA
/// projections a pass uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kernels {
    /// candle's fused kernels: the fastest, but they record no gradient (inference).
    Inference,
    /// [`crate::ops`]: fused, with their own backward (CPU, f32 and f64).
    Differentiable,
    /// Compositions of candle's differentiable primitives (bf16, CUDA).
    Composed,
}

/// How a forward pass runs: which adapter, which kernels, whether dropout is on.
#[derive(Clone, Copy)]
pub(crate) struct PassOptions<'a> {
    pub(crate) adapter: Option<&'a Adapter>,
    /// Fused kernels (no gradients) for inference.
    pub(crate) fused: bool,
    /// Apply LoRA dropout.
    pub(crate) dropout: bool,
}

/// A causal decoder over frozen base weights plus any number of named LoRA adapters.
///
/// Adapters share the base: `forward_train_with(.., Some("injector"))` and
/// `forward_train_with(.., Some("detector"))` read the same frozen tensors, and `None` gives the
/// base model (the reference policy for a KL penalty).
pub struct Model {
    pub(crate) config: ModelConfig,
    pub(crate) device: Device,
    pub(crate) dtype: DType,
    pub(crate) embed: Tensor,
    pub(crate) blocks: Vec<Block>,
    pub(crate) final_norm: Tensor,
    /// `None` when the embeddings are tied.
    pub(crate) lm_head: Option<Tensor>,
    pub(crate) inv_freq: Vec<f32>,
    pub(crate) adapters: BTreeMap<String, Adapter>,
    pub(crate) active: Option<String>,
    pub(crate) training: bool,
    /// Whether the training path uses [`crate::ops`]' fused kernels where they exist (the
    /// default) or candle's compositions (for comparisons: the bench, the tests).
    pub(crate) fused_training: bool,
    /// Where the weights came from, for adapter_config.json's `base_model_name_or_path`.
    pub(crate) source: String,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.config)
            .field("dtype", &self.dtype)
            .field("adapters", &self.adapters.keys().collect::<Vec<_>>())
            .field("active", &self.active)
            .finish()
    }
}

impl Model {
    /// Builds a model from tensors named as in Hugging Face checkpoints
    /// (`model.layers.0.self_attn.q_proj.weight`, ...), converting them to `dtype` on `device`.
    /// `origin` names the source in errors.
    pub fn from_hf_tensors(
        config: ModelConfig,
        mut tensors: HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
        origin: &str,
    ) -> Result<Self> {
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::F64) {
            return Err(ModelError::InvalidArgument(format!(
                "dtype {dtype:?} is not supported (use f32 or bf16)"
            )));
        }
        let c = &config;
        let mut take = |name: &str, shape: &[usize]| -> Result<Tensor> {
            let t = tensors
                .remove(name)
                .ok_or_else(|| ModelError::weight(origin, name, "missing"))?;
            if t.dims() != shape {
                return Err(ModelError::weight(
                    origin,
                    name,
                    format!("shape {:?}, expected {shape:?}", t.dims()),
                ));
            }
            Ok(t.to_device(device)?.to_dtype(dtype)?)
        };
        let q_out = c.num_heads * c.head_dim;
        let kv_out = c.num_kv_heads * c.head_dim;
        let h = c.hidden_size;
        let embed = take("model.embed_tokens.weight", &[c.vocab_size, h])?;
        let mut blocks = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = format!("model.layers.{i}");
            let mut lin = |name: &str, out: usize, inp: usize, bias: bool| -> Result<Linear> {
                Ok(Linear {
                    weight: take(&format!("{p}.{name}.weight"), &[out, inp])?,
                    bias: if bias {
                        Some(take(&format!("{p}.{name}.bias"), &[out])?)
                    } else {
                        None
                    },
                })
            };
            let q = lin("self_attn.q_proj", q_out, h, c.qkv_bias)?;
            let k = lin("self_attn.k_proj", kv_out, h, c.qkv_bias)?;
            let v = lin("self_attn.v_proj", kv_out, h, c.qkv_bias)?;
            let o = lin("self_attn.o_proj", h, q_out, c.o_bias)?;
            let gate = lin("mlp.gate_proj", c.intermediate_size, h, false)?;
            let up = lin("mlp.up_proj", c.intermediate_size, h, false)?;
            let down = lin("mlp.down_proj", h, c.intermediate_size, false)?;
            blocks.push(Block {
                attn_norm: take(&format!("{p}.input_layernorm.weight"), &[h])?,
                q,
                k,
                v,
                o,
                mlp_norm: take(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate,
                up,
                down,
            });
        }
        let final_norm = take("model.norm.weight", &[h])?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(take("lm_head.weight", &[c.vocab_size, h])?)
        };
        let inv_freq = config.inv_freq();
        Ok(Model {
            config,
            device: device.clone(),
            dtype,
            embed,
            blocks,
            final_norm,
            lm_head,
            inv_freq,
            adapters: BTreeMap::new(),
            active: None,
            training: false,
            fused_training: true,
            source: origin.to_string(),
        })
    }

    /// A model with random weights (normal, std 1/sqrt(fan_in); norms 1 + noise), for tests and examples
    /// that must not download anything. Deterministic in `seed`.
    pub fn random(config: ModelConfig, dtype: DType, device: &Device, seed: u64) -> Result<Self> {
        let tensors = random_hf_tensors(&config, seed)?;
        Self::from_hf_tensors(config, tensors, dtype, device, "random")
    }

    /// The architecture.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The device all weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The dtype of the frozen weights and activations (LoRA factors are always f32).
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// All frozen base weights under their Hugging Face names (tied LM head omitted).
    pub fn hf_tensors(&self) -> HashMap<String, Tensor> {
        let mut out = HashMap::new();
        out.insert("model.embed_tokens.weight".into(), self.embed.clone());
        for (i, b) in self.blocks.iter().enumerate() {
            let p = format!("model.layers.{i}");
            out.insert(format!("{p}.input_layernorm.weight"), b.attn_norm.clone());
            out.insert(
                format!("{p}.post_attention_layernorm.weight"),
                b.mlp_norm.clone(),
            );
            for proj in Projection::ALL {
                let lin = b.linear(proj);
                out.insert(
                    format!("{p}.{}.weight", proj.module_path()),
                    lin.weight.clone(),
                );
                if let Some(bias) = &lin.bias {
                    out.insert(format!("{p}.{}.bias", proj.module_path()), bias.clone());
                }
            }
        }
        out.insert("model.norm.weight".into(), self.final_norm.clone());
        if let Some(h) = &self.lm_head {
            out.insert("lm_head.weight".into(), h.clone());
        }
        out
    }

    /// `(in, out)` of every projection (identical across layers).
    fn projection_shapes(&self) -> HashMap<Projection, (usize, usize)> {
        Projection::ALL
            .into_iter()
            .map(|p| {
                let (out, inp) = self.blocks[0]
                    .linear(p)
                    .weight
                    .dims2()
                    .expect("projection weights are 2-D");
                (p, (inp, out))
            })
            .collect()
    }

    /// Adds a fresh adapter (A random, B zero: the model's output is unchanged until trained).
    pub fn add_adapter(&mut self, name: &str, config: LoraConfig, seed: u64) -> Result<()> {
        if self.adapters.contains_key(name) {
            return Err(ModelError::adapter(name, "already exists"));
        }
        let shapes = self.projection_shapes();
        let adapter = Adapter::init(
            name,
            config,
            self.config.num_layers,
            &shapes,
            seed,
            self.param_dtype(),
            &self.device,
        )?;
        self.adapters.insert(name.to_string(), adapter);
        Ok(())
    }

    /// Loads a PEFT adapter directory under `name`.
    pub fn load_adapter(&mut self, name: &str, dir: &Path) -> Result<()> {
        if self.adapters.contains_key(name) {
            return Err(ModelError::adapter(name, "already exists"));
        }
        let shapes = self.projection_shapes();
        let adapter = Adapter::load_peft(
            name,
            dir,
            self.config.num_layers,
            &shapes,
            self.param_dtype(),
            &self.device,
        )?;
        self.adapters.insert(name.to_string(), adapter);
        Ok(())
    }

    /// Saves adapter `name` in PEFT's format into `dir`.
    pub fn save_adapter(&self, name: &str, dir: &Path) -> Result<()> {
        self.adapter_or_err(name)?.save_peft(dir, &self.source)
    }

    /// Removes adapter `name` (deactivating it if active) and returns it.
    pub fn remove_adapter(&mut self, name: &str) -> Result<Adapter> {
        let a = self
            .adapters
            .remove(name)
            .ok_or_else(|| ModelError::adapter(name, "no such adapter"))?;
        if self.active.as_deref() == Some(name) {
            self.active = None;
        }
        Ok(a)
    }

    /// The adapter called `name`.
    pub fn adapter(&self, name: &str) -> Option<&Adapter> {
        self.adapters.get(name)
    }

    /// Names of all adapters.
    pub fn adapter_names(&self) -> Vec<&str> {
        self.adapters.keys().map(String::as_str).collect()
    }

    pub(crate) fn adapter_or_err(&self, name: &str) -> Result<&Adapter> {
        self.adapters
            .get(name)
            .ok_or_else(|| ModelError::adapter(name, "no such adapter"))
    }

    /// Chooses the adapter used by [`Model::forward_train`], [`Model::token_logprobs`] and
    /// generation; `None` runs the bare base model.
    pub fn set_active_adapter(&mut self, name: Option<&str>) -> Result<()> {
        if let Some(n) = name {
            self.adapter_or_err(n)?;
        }
        self.active = name.map(str::to_string);
        Ok(())
    }

    /// The active adapter's name.
    pub fn active_adapter(&self) -> Option<&str> {
        self.active.as_deref()
    }

    /// Training mode turns LoRA dropout on in the training path. Off by default.
    pub fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    /// Whether the training path runs the fused kernels of [`crate::ops`] (on by default;
    /// they exist for f32 and f64 on the CPU) or the compositions of candle's differentiable
    /// primitives they replace. Both compute the same function and gradient; the switch lets
    /// a benchmark or a test compare them in one process.
    pub fn set_fused_training_kernels(&mut self, on: bool) {
        self.fused_training = on;
    }

    /// Adds a zero-initialised scalar value head to adapter `name`.
    pub fn add_value_head(&mut self, name: &str) -> Result<()> {
        let hidden = self.config.hidden_size;
        let device = self.device.clone();
        let dtype = self.param_dtype();
        self.adapters
            .get_mut(name)
            .ok_or_else(|| ModelError::adapter(name, "no such adapter"))?
            .add_value_head(hidden, dtype, &device)
    }

    /// Dtype of trainable parameters: f32, or f64 for f64 models (used by gradient checks).
    pub fn param_dtype(&self) -> DType {
        if self.dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        }
    }

    /// The parameters an optimizer may update for adapter `name`: its LoRA factors and value
    /// head. The base weights are plain tensors, never variables, so they cannot be trained.
    pub fn trainable_vars(&self, name: &str) -> Result<Vec<Var>> {
        Ok(self.adapter_or_err(name)?.trainable_vars())
    }

    /// Folds adapter `name` into the base weights (`W += scale·B·A`) and removes it. Other
    /// adapters keep working but now sit on the merged base.
    pub fn merge_adapter(&mut self, name: &str) -> Result<()> {
        let adapter = self.remove_adapter(name)?;
        let scale = adapter.config.scale();
        for ((layer, proj), pair) in &adapter.pairs {
            let lin = self.blocks[*layer].linear_mut(*proj);
            let delta = (pair.b.as_tensor().matmul(pair.a.as_tensor())? * scale)?;
            let merged = (lin.weight.to_dtype(delta.dtype())? + delta)?.to_dtype(self.dtype)?;
            lin.weight = merged;
        }
        Ok(())
    }

    /// Full-sequence forward pass with the active adapter, differentiable with respect to the
    /// adapter's parameters.
    ///
    /// `input_ids`: `(batch, seq)` u32; `attention_mask`: `(batch, seq)` with 1 for real tokens
    /// and 0 for padding (left or right). Positions count only real tokens, as in Hugging Face.
    /// Returns `(logits (batch, seq, vocab), last_hidden (batch, seq, hidden))`, both in the
    /// model's dtype; `last_hidden` is after the final norm (the value head's input).
    pub fn forward_train(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        self.forward_train_with(input_ids, attention_mask, self.active.as_deref())
    }

    /// [`Model::forward_train`] with an explicit adapter (`None` = base model), leaving the
    /// active adapter alone; use it for the reference policy of a KL term.
    pub fn forward_train_with(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        adapter: Option<&str>,
    ) -> Result<(Tensor, Tensor)> {
        let hidden = self.hidden_train_with(input_ids, attention_mask, adapter)?;
        let (b, t, _) = hidden.dims3()?;
        let logits = self
            .logits(&hidden.reshape((b * t, self.config.hidden_size))?)?
            .reshape((b, t, self.config.vocab_size))?;
        Ok((logits, hidden))
    }

    /// The final-normed hidden states `(batch, seq, hidden)` of [`Model::forward_train_with`],
    /// without the LM head. A loss that scores a few positions of a long sequence takes their
    /// rows and calls [`Model::logits`] on those alone: the head is a vocabulary-wide product
    /// per row, and its log-softmax several tensors as wide.
    pub fn hidden_train_with(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        adapter: Option<&str>,
    ) -> Result<Tensor> {
        let adapter = adapter.map(|n| self.adapter_or_err(n)).transpose()?;
        let mask = self.check_batch(input_ids, attention_mask)?;
        let (b, t) = input_ids.dims2()?;
        // A token's position counts the real tokens before it, so left padding does not shift
        // positions; padding itself gets the position of the next real token (unused).
        let positions: Vec<Vec<u32>> = mask
            .iter()
            .map(|row| {
                let mut seen = 0u32;
                row.iter()
                    .map(|&m| {
                        let p = seen;
                        seen += m as u32;
                        p
                    })
                    .collect()
            })
            .collect();
        let bias = self.attention_bias(&mask, 0, t)?;
        let opts = PassOptions {
            adapter,
            fused: false,
            dropout: self.training,
        };
        let flat_ids = input_ids.flatten_all()?.to_dtype(DType::U32)?;
        let hidden = self.forward_hidden(&flat_ids, b, t, &positions, &bias, None, opts)?;
        Ok(hidden.reshape((b, t, self.config.hidden_size))?)
    }

    /// Validates shapes and token ids; returns the mask as host rows of 0/1.
    fn check_batch(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Vec<Vec<u8>>> {
        let (b, t) = input_ids.dims2().map_err(|_| {
            ModelError::InvalidArgument(format!(
                "input_ids must be (batch, seq), got {:?}",
                input_ids.dims()
            ))
        })?;
        if b == 0 || t == 0 {
            return Err(ModelError::InvalidArgument("empty batch".into()));
        }
        if attention_mask.dims() != input_ids.dims() {
            return Err(ModelError::InvalidArgument(format!(
                "attention_mask {:?} does not match input_ids {:?}",
                attention_mask.dims(),
                input_ids.dims()
            )));
        }
        let ids: Vec<Vec<u32>> = input_ids.to_dtype(DType::U32)?.to_vec2()?;
        let vocab = self.config.vocab_size as u32;
        for (r, row) in ids.iter().enumerate() {
            if let Some((c, id)) = row.iter().enumerate().find(|(_, &id)| id >= vocab) {
                return Err(ModelError::InvalidArgument(format!(
                    "input_ids[{r}][{c}] = {id} is outside the vocabulary of {vocab}"
                )));
            }
        }
        let mask: Vec<Vec<u8>> = attention_mask
            .to_dtype(DType::F32)?
            .to_vec2::<f32>()?
            .into_iter()
            .map(|row| row.into_iter().map(|m| (m > 0.5) as u8).collect())
            .collect();
        Ok(mask)
    }

    /// `(batch, 1, queries, keys)` additive bias: causal over key columns, padding keys masked.
    /// Query `i` sits at key column `past + i`; `key_mask` already covers the queries' columns.
    pub(crate) fn attention_bias(
        &self,
        key_mask: &[Vec<u8>],
        past: usize,
        queries: usize,
    ) -> Result<Tensor> {
        let b = key_mask.len();
        let keys = key_mask[0].len();
        let mut data = vec![0f32; b * queries * keys];
        for (r, row) in key_mask.iter().enumerate() {
            for i in 0..queries {
                let base = (r * queries + i) * keys;
                let own = past + i;
                for (j, &m) in row.iter().enumerate() {
                    // A padding query attends to itself only, so its (unused) row stays
                    // well-conditioned instead of a softmax over all-masked scores.
                    let allowed = if row[own] == 0 {
                        j == own
                    } else {
                        j <= own && m == 1
                    };
                    if !allowed {
                        data[base + j] = MASKED;
                    }
                }
            }
        }
        let score_dtype = self.score_dtype();
        Ok(Tensor::from_vec(data, (b, 1, queries, keys), &self.device)?.to_dtype(score_dtype)?)
    }

    /// Attention scores and norms are computed in f32 (f64 for f64 models) even for bf16.
    fn score_dtype(&self) -> DType {
        if self.dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        }
    }

    /// `(cos, sin)` of shape `(batch, seq, head_dim/2)` for per-row positions.
    pub(crate) fn rope_tables(&self, positions: &[Vec<u32>]) -> Result<(Tensor, Tensor)> {
        let b = positions.len();
        let t = positions[0].len();
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(b * t * half);
        let mut sin = Vec::with_capacity(b * t * half);
        for row in positions {
            for &p in row {
                for &f in &self.inv_freq {
                    let angle = p as f32 * f;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        let cos = Tensor::from_vec(cos, (b, t, half), &self.device)?.to_dtype(self.dtype)?;
        let sin = Tensor::from_vec(sin, (b, t, half), &self.device)?.to_dtype(self.dtype)?;
        Ok((cos, sin))
    }

    /// Runs the blocks on flattened `ids` (`batch*seq`) and returns the final-normed hidden
    /// states `(batch*seq, hidden)`. With `cache`, keys/values are appended to it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward_hidden(
        &self,
        flat_ids: &Tensor,
        b: usize,
        t: usize,
        positions: &[Vec<u32>],
        bias: &Tensor,
        mut cache: Option<&mut Vec<Option<LayerKv>>>,
        opts: PassOptions<'_>,
    ) -> Result<Tensor> {
        let (cos, sin) = self.rope_tables(positions)?;
        let (cos, sin) = if self.kernels(opts) != Kernels::Composed {
            (cos, sin)
        } else {
            // Full-width tables for the rotate-half formulation: (b, 1, t, head_dim).
            (
                Tensor::cat(&[&cos, &cos], D::Minus1)?.unsqueeze(1)?,
                Tensor::cat(&[&sin, &sin], D::Minus1)?.unsqueeze(1)?,
            )
        };
        let mut x = self.embed.index_select(flat_ids, 0)?;
        for (layer, block) in self.blocks.iter().enumerate() {
            let layer_cache = cache.as_deref_mut().map(|c| &mut c[layer]);
            x = self.block_forward(layer, block, &x, b, t, &cos, &sin, bias, layer_cache, opts)?;
        }
        self.rms_norm(&x, &self.final_norm, self.kernels(opts))
    }

    /// The final-normed hidden states `(seq, hidden)` of one sequence through the fused
    /// inference kernels with `adapter` (`None`: the base), without a cache or gradients: the
    /// features a decision head reads from a whole conversation.
    pub fn hidden(&self, ids: &[u32], adapter: Option<&str>) -> Result<Tensor> {
        let adapter = adapter.map(|n| self.adapter_or_err(n)).transpose()?;
        let t = ids.len();
        if t == 0 {
            return Err(ModelError::InvalidArgument("empty sequence".into()));
        }
        let vocab = self.config.vocab_size as u32;
        if let Some((i, bad)) = ids.iter().enumerate().find(|(_, &id)| id >= vocab) {
            return Err(ModelError::InvalidArgument(format!(
                "token {i} = {bad} is outside the vocabulary of {vocab}"
            )));
        }
        let positions = vec![(0..t as u32).collect::<Vec<u32>>()];
        let bias = self.attention_bias(&[vec![1u8; t]], 0, t)?;
        let flat = Tensor::from_slice(ids, t, &self.device)?;
        let opts = PassOptions {
            adapter,
            fused: true,
            dropout: false,
        };
        self.forward_hidden(&flat, 1, t, &positions, &bias, None, opts)
    }

    /// Next-token logits `(rows, vocab)` for final-normed hidden states `(rows, hidden)`.
    /// Differentiable in `hidden`; the head itself is frozen.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(crate::frozen::frozen_matmul(hidden, self.lm_head_weight())?)
    }

    /// [`Model::logits`] for decoding, where no gradient is wanted: a few rows take the
    /// decoding path of [`crate::frozen::inference_matmul`].
    pub(crate) fn decode_logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(crate::frozen::inference_matmul(
            hidden,
            self.lm_head_weight(),
        )?)
    }

    /// The LM head's `(vocab, hidden)` weight: its own, or the embeddings when tied.
    pub(crate) fn lm_head_weight(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Whether a pass that wants gradients runs [`crate::ops`]: switched on, and on a device
    /// and dtype the kernels exist for (the CPU in f32 or f64); otherwise compositions run.
    pub fn fused_training_kernels(&self) -> bool {
        self.fused_training && crate::ops::available(&self.device, self.dtype)
    }

    /// The kernels a pass with `opts` runs: inference kernels when no gradient is wanted,
    /// otherwise this crate's fused ones where they exist, else compositions.
    pub(crate) fn kernels(&self, opts: PassOptions<'_>) -> Kernels {
        if opts.fused {
            Kernels::Inference
        } else if self.fused_training_kernels() {
            Kernels::Differentiable
        } else {
            Kernels::Composed
        }
    }

    fn rms_norm(&self, x: &Tensor, weight: &Tensor, kernels: Kernels) -> Result<Tensor> {
        let eps = self.config.rms_norm_eps;
        match kernels {
            Kernels::Inference => {
                return Ok(candle_nn::ops::rms_norm(
                    &x.contiguous()?,
                    weight,
                    eps as f32,
                )?)
            }
            Kernels::Differentiable => return Ok(crate::ops::rms_norm(x, weight, eps)?),
            Kernels::Composed => {}
        }
        let xf = x.to_dtype(self.score_dtype())?;
        let mean_sq = xf.sqr()?.mean_keepdim(D::Minus1)?;
        let inv = (mean_sq + eps)?.sqrt()?.recip()?;
        Ok(xf
            .broadcast_mul(&inv)?
            .to_dtype(self.dtype)?
            .broadcast_mul(weight)?)
    }

    fn project(
        &self,
        layer: usize,
        proj: Projection,
        lin: &Linear,
        x: &Tensor,
        opts: PassOptions<'_>,
    ) -> Result<Tensor> {
        let pair = opts.adapter.and_then(|a| Some((a, a.pair(layer, proj)?)));
        let Some((adapter, pair)) = pair else {
            return lin.forward(x, opts.fused);
        };
        let p = adapter.config.dropout;
        let dropout = opts.dropout && p > 0.0;
        if !dropout && self.kernels(opts) == Kernels::Differentiable {
            return Ok(crate::ops::lora_linear(
                x,
                &lin.weight,
                lin.bias.as_ref(),
                pair.a.as_tensor(),
                pair.b.as_tensor(),
                adapter.config.scale(),
            )?);
        }
        let y = lin.forward(x, opts.fused)?;
        let (a, b) = if opts.fused {
            (pair.a.as_tensor().detach(), pair.b.as_tensor().detach())
        } else {
            (pair.a.as_tensor().clone(), pair.b.as_tensor().clone())
        };
        let (a, b) = (a.to_dtype(self.dtype)?, b.to_dtype(self.dtype)?);
        let input = if dropout {
            candle_nn::ops::dropout(x, p as f32)?
        } else {
            x.clone()
        };
        let delta = input.matmul(&a.t()?)?.matmul(&b.t()?)?;
        Ok((y + (delta * adapter.config.scale())?)?)
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, fused: bool) -> Result<Tensor> {
        if fused {
            return Ok(candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin)?);
        }
        let half = self.config.head_dim / 2;
        let x1 = x.narrow(D::Minus1, 0, half)?;
        let x2 = x.narrow(D::Minus1, half, half)?;
        let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
        Ok((x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?)?)
    }

    /// `softmax(scores + bias)` over the keys: `scores` is `(batch, kv_heads, rep·queries,
    /// keys)`, `bias` is `(batch, 1, queries, keys)`.
    fn masked_softmax(&self, scores: &Tensor, bias: &Tensor, kernels: Kernels) -> Result<Tensor> {
        if kernels == Kernels::Differentiable {
            return Ok(crate::ops::masked_softmax(scores, bias)?);
        }
        let (b, kv, rows, keys) = scores.dims4()?;
        let queries = bias.dim(2)?;
        let unfolded = scores.reshape((b, kv * rows / queries, queries, keys))?;
        let scores = unfolded.broadcast_add(bias)?;
        let probs = if kernels == Kernels::Inference {
            candle_nn::ops::softmax_last_dim(&scores)?
        } else {
            // The max is a constant shift (softmax is invariant to it), so it is detached.
            let max = scores.max_keepdim(D::Minus1)?.detach();
            let e = scores.broadcast_sub(&max)?.exp()?;
            e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?
        };
        Ok(probs.reshape((b, kv, rows, keys))?)
    }

    #[allow(clippy::too_many_arguments)]
    fn block_forward(
        &self,
        layer: usize,
        block: &Block,
        x: &Tensor,
        b: usize,
        t: usize,
        cos: &Tensor,
        sin: &Tensor,
        bias: &Tensor,
        cache: Option<&mut Option<LayerKv>>,
        opts: PassOptions<'_>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let kernels = self.kernels(opts);
        let h = self.rms_norm(x, &block.attn_norm, kernels)?;
        let q = self.project(layer, Projection::Q, &block.q, &h, opts)?;
        let k = self.project(layer, Projection::K, &block.k, &h, opts)?;
        let v = self.project(layer, Projection::V, &block.v, &h, opts)?;
        let q = q.reshape((b, t, nh, hd))?;
        let k = k.reshape((b, t, nkv, hd))?;
        let v = v.reshape((b, t, nkv, hd))?.transpose(1, 2)?.contiguous()?;
        let rep = nh / nkv;
        // Grouped-query attention without copying keys: fold the query heads that share a
        // key/value head into the sequence axis, `q` as (b, kv_heads, rep·t, d). Scaling q (not
        // the scores) keeps one fewer (batch, heads, t, t) tensor alive for backward.
        let scale = 1.0 / (hd as f64).sqrt();
        let (q, k) = if kernels == Kernels::Differentiable {
            // Rotated from where the projection left them, (b, t, heads, d), straight into the
            // attention layout, q scaled and folded on the way: one node each.
            (
                crate::ops::rope_to_heads(&q, cos, sin, scale, nkv)?,
                crate::ops::rope_to_heads(&k, cos, sin, 1.0, nkv)?,
            )
        } else {
            let fused = kernels == Kernels::Inference;
            let q = self.rope(&q.transpose(1, 2)?, cos, sin, fused)?;
            (
                (q.contiguous()?.reshape((b, nkv, rep * t, hd))? * scale)?,
                self.rope(&k.transpose(1, 2)?, cos, sin, fused)?
                    .contiguous()?,
            )
        };
        let (k, v) = match cache {
            Some(slot) => {
                let (k, v) = match slot.take() {
                    Some(prev) => (
                        Tensor::cat(&[&prev.k, &k], 2)?,
                        Tensor::cat(&[&prev.v, &v], 2)?,
                    ),
                    None => (k, v),
                };
                *slot = Some(LayerKv {
                    k: k.clone(),
                    v: v.clone(),
                });
                (k, v)
            }
            None => (k, v),
        };
        // Scores stay folded, (b, kv_heads, rep·t, keys): the same memory as (b, heads, t,
        // keys), and each reshape would be one more graph node with its own gradient buffer.
        let scores = q.matmul(&k.t()?)?.to_dtype(self.score_dtype())?;
        let probs = self
            .masked_softmax(&scores, bias, kernels)?
            .to_dtype(self.dtype)?;
        let attn = probs.matmul(&v)?.reshape((b, nh, t, hd))?;
        let attn = attn.transpose(1, 2)?.reshape((b * t, nh * hd))?;
        let attn = self.project(layer, Projection::O, &block.o, &attn, opts)?;
        let x = (x + attn)?;
        let h = self.rms_norm(&x, &block.mlp_norm, kernels)?;
        let gate = self.project(layer, Projection::Gate, &block.gate, &h, opts)?;
        let up = self.project(layer, Projection::Up, &block.up, &h, opts)?;
        let act = if kernels == Kernels::Differentiable {
            crate::ops::swiglu(&gate, &up)?
        } else {
            (candle_nn::ops::silu(&gate)? * up)?
        };
        let down = self.project(layer, Projection::Down, &block.down, &act, opts)?;
        Ok((x + down)?)
    }
}

/// Random Hugging Face-named weights for `config`.
pub fn random_hf_tensors(config: &ModelConfig, seed: u64) -> Result<HashMap<String, Tensor>> {
    use rand::SeedableRng;
    use rand_distr::Distribution;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let normal = rand_distr::StandardNormal;
    let dev = Device::Cpu;
    // Scale like a trained network (std 1/sqrt(fan_in)) so logits are O(1) and tests that
    // compare them are sharp.
    let mut rand_t = |shape: &[usize], mean: f32| -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let std = match shape {
            [_, fan_in] => 1.0 / (*fan_in as f32).sqrt(),
            _ => 0.1,
        };
        let data: Vec<f32> = (0..n)
            .map(|_| {
                let z: f32 = normal.sample(&mut rng);
                mean + std * z
            })
            .collect();
        Ok(Tensor::from_vec(data, shape, &dev)?)
    };
    let c = config;
    let h = c.hidden_size;
    let q_out = c.num_heads * c.head_dim;
    let kv_out = c.num_kv_heads * c.head_dim;
    let mut out = HashMap::new();
    out.insert(
        "model.embed_tokens.weight".to_string(),
        rand_t(&[c.vocab_size, h], 0.0)?,
    );
    for i in 0..c.num_layers {
        let p = format!("model.layers.{i}");
        out.insert(format!("{p}.input_layernorm.weight"), rand_t(&[h], 1.0)?);
        out.insert(
            format!("{p}.post_attention_layernorm.weight"),
            rand_t(&[h], 1.0)?,
        );
        let shapes = [
            ("self_attn.q_proj", q_out, h, c.qkv_bias),
            ("self_attn.k_proj", kv_out, h, c.qkv_bias),
            ("self_attn.v_proj", kv_out, h, c.qkv_bias),
            ("self_attn.o_proj", h, q_out, c.o_bias),
            ("mlp.gate_proj", c.intermediate_size, h, false),
            ("mlp.up_proj", c.intermediate_size, h, false),
            ("mlp.down_proj", h, c.intermediate_size, false),
        ];
        for (name, o, inp, bias) in shapes {
            out.insert(format!("{p}.{name}.weight"), rand_t(&[o, inp], 0.0)?);
            if bias {
                out.insert(format!("{p}.{name}.bias"), rand_t(&[o], 0.0)?);
            }
        }
    }
    out.insert("model.norm.weight".to_string(), rand_t(&[h], 1.0)?);
    if !c.tie_word_embeddings {
        out.insert(
            "lm_head.weight".to_string(),
            rand_t(&[c.vocab_size, h], 0.0)?,
        );
    }
    Ok(out)
}
