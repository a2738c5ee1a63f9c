//! Rank coordination of a data-parallel run: which rank writes, each rank's scratch files, and
//! how a rank's share of a list rejoins the whole.

use super::*;

impl Trainer {
    /// Whether this process writes the run's files (rank 0 of a data-parallel job).
    pub(super) fn leader(&self) -> bool {
        self.options.ranks.is_leader()
    }

    pub(super) fn ranks(&self) -> &dyn Collective {
        self.options.ranks.as_ref()
    }

    /// A scratch file of this rank in the run directory: `name` for rank 0, `name` with the
    /// rank before its extension for the others (ranks never share a store being written).
    pub(super) fn rank_file(&self, name: &str) -> PathBuf {
        let rank = self.ranks().rank();
        let dir = &self.options.run_dir;
        if rank == 0 {
            return dir.join(name);
        }
        match name.rsplit_once('.') {
            Some((stem, ext)) => dir.join(format!("{stem}.rank{rank}.{ext}")),
            None => dir.join(format!("{name}.rank{rank}")),
        }
    }

    /// Where this rank's live episodes run and their stores are written.
    pub(super) fn live_dir(&self) -> PathBuf {
        let live = self.options.run_dir.join("live");
        match self.ranks().rank() {
            0 => live,
            r => live.join(format!("rank-{r}")),
        }
    }

    /// Every rank's `items` (one per trace of its [`Trainer::share`] of `split`), in the order
    /// of `split`'s traces.
    pub(super) fn gather_in_order<T>(
        &self,
        items: Vec<T>,
        split: &SplitTraces,
        trace_id: impl Fn(&T) -> &str,
    ) -> Result<Vec<T>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        if self.ranks().world() == 1 {
            return Ok(items);
        }
        let order: BTreeMap<&str, usize> = split
            .traces
            .iter()
            .enumerate()
            .map(|(i, t)| (t.trace_id.as_str(), i))
            .collect();
        self.gather_sorted(items, |t| {
            order.get(trace_id(t)).copied().unwrap_or(usize::MAX)
        })
    }

    /// Every rank's `items`, on every rank, ordered by `key` (the identity for one process):
    /// how a rank's share of a list rejoins the whole.
    pub(super) fn gather_sorted<T, K: Ord>(
        &self,
        items: Vec<T>,
        key: impl Fn(&T) -> K,
    ) -> Result<Vec<T>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        if self.ranks().world() == 1 {
            return Ok(items);
        }
        let mut all: Vec<T> = collective::gather_json(self.ranks(), &items)
            .map_err(collective_err)?
            .into_iter()
            .flatten()
            .collect();
        all.sort_by_key(|t| key(t));
        Ok(all)
    }
}

pub(super) fn collective_err(e: collective::CollectiveError) -> RlError {
    RlError::Environment(e.to_string())
}
