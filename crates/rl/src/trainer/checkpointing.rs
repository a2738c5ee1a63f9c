//! Saving a step's adapters, optimiser states and trainer state, and the fingerprint that
//! ties a checkpoint to its model.

use super::*;

impl Trainer {
    /// Writes a checkpoint (rank 0), after checking that every rank holds the same weights:
    /// a fingerprint of each rank's adapters, optimizer moments, heads and state is gathered,
    /// and ranks that differ stop the run rather than train on diverged copies.
    pub(super) fn save(&self) -> Result<PathBuf> {
        let pm = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        // One process has nothing to compare: the fingerprint is a pass over every weight.
        let fingerprint = if self.ranks().world() > 1 {
            let mine = self.fingerprint(&pm.model)?;
            let all = collective::gather_json(self.ranks(), &mine).map_err(collective_err)?;
            if let Some(r) = all.iter().position(|f| *f != mine) {
                return Err(RlError::Environment(format!(
                    "data-parallel ranks diverged at step {}: rank {r}'s weights differ from rank {}'s (fingerprints {} and {mine})",
                    self.state.step,
                    self.ranks().rank(),
                    all[r]
                )));
            }
            Some(mine)
        } else {
            None
        };
        let dir = checkpoint::step_dir(&self.options.run_dir, self.state.step);
        if !self.leader() {
            return Ok(dir);
        }
        let adapters: Vec<(&str, &AdamW)> = self
            .optimizers
            .iter()
            .map(|(n, o)| (n.as_str(), o))
            .collect();
        let heads = self
            .heads
            .as_ref()
            .map(|(h, r)| (self.adapter(Role::Detector), h, r));
        let blame = self
            .blamer
            .as_ref()
            .map(|b| (self.adapter(Role::Detector), &b.head, &b.reference));
        let dir = checkpoint::save(
            &self.options.run_dir,
            &pm.model,
            &adapters,
            heads,
            blame,
            &self.state,
            &self.config_text,
        )?;
        if let Some(fingerprint) = fingerprint {
            tracing::info!(
                step = self.state.step,
                world = self.ranks().world(),
                fingerprint,
                "checkpoint: every rank holds the same weights"
            );
        }
        Ok(dir)
    }

    /// FNV-1a over the bits of everything a rank's update changes: the adapters' trainable
    /// parameters, the optimizers' moments, the decision heads and the trainer's state.
    pub(super) fn fingerprint(&self, model: &model::Model) -> Result<String> {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
            }
        };
        let tensor_bits = |t: &model::Tensor| -> Result<Vec<u8>> {
            let v = t
                .flatten_all()
                .and_then(|t| t.to_dtype(DType::F32))
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(model::ModelError::from)?;
            Ok(v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect())
        };
        for (name, opt) in &self.optimizers {
            for var in model.trainable_vars(name)? {
                eat(&tensor_bits(var.as_tensor())?);
            }
            let st = opt.state();
            for t in st.m.iter().chain(&st.v) {
                eat(&tensor_bits(t)?);
            }
        }
        if let Some((h1, h2)) = &self.heads {
            for head in [h1, h2] {
                eat(&serde_json::to_vec(head).map_err(|e| RlError::Sample(e.to_string()))?);
            }
        }
        if let Some(b) = &self.blamer {
            for head in [&b.head, &b.reference] {
                eat(&serde_json::to_vec(head).map_err(|e| RlError::Sample(e.to_string()))?);
            }
        }
        eat(&serde_json::to_vec(&self.state).map_err(|e| RlError::Sample(e.to_string()))?);
        Ok(format!("{h:016x}"))
    }
}
