//! MPI ranks (the `mpi` feature): Open MPI through the `mpi` crate.

use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Count;

use crate::{Collective, CollectiveError, Result};

/// This process's place among the job's MPI ranks. MPI is finalised when it is dropped.
pub struct MpiRanks {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    // Dropped last: finalises MPI.
    _universe: Universe,
}

impl std::fmt::Debug for MpiRanks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MpiRanks {{ rank: {}, world: {} }}",
            self.rank, self.size
        )
    }
}

impl MpiRanks {
    /// Initialises MPI (once per process) and joins `MPI_COMM_WORLD`.
    pub fn initialize() -> Result<MpiRanks> {
        let universe = mpi::initialize().ok_or_else(|| {
            CollectiveError::Launch("MPI was already initialised in this process".into())
        })?;
        let world = universe.world();
        let rank = usize::try_from(world.rank()).unwrap_or(0);
        let size = usize::try_from(world.size()).unwrap_or(1);
        Ok(MpiRanks {
            world,
            rank,
            size,
            _universe: universe,
        })
    }

    /// Sum to rank 0, then broadcast from it: every rank gets rank 0's bytes, so the result
    /// is identical everywhere whatever order the reduction added in.
    fn sum<T>(&self, values: &mut [T]) -> Result<()>
    where
        T: Equivalence + Copy + Default,
    {
        let root = self.world.process_at_rank(0);
        if self.rank == 0 {
            let mut total = vec![T::default(); values.len()];
            root.reduce_into_root(&values[..], &mut total[..], SystemOperation::sum());
            values.copy_from_slice(&total);
        } else {
            root.reduce_into(&values[..], SystemOperation::sum());
        }
        root.broadcast_into(values);
        Ok(())
    }
}

impl Collective for MpiRanks {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.size
    }
    fn sum_f32(&self, values: &mut [f32]) -> Result<()> {
        self.sum(values)
    }
    fn sum_f64(&self, values: &mut [f64]) -> Result<()> {
        self.sum(values)
    }
    fn gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let len = Count::try_from(mine.len()).map_err(|_| CollectiveError::Op {
            op: "gather",
            rank: self.rank,
            reason: format!("{} bytes is more than one MPI message holds", mine.len()),
        })?;
        let mut counts: Vec<Count> = vec![0; self.size];
        self.world.all_gather_into(&len, &mut counts[..]);
        let mut displs = Vec::with_capacity(self.size);
        let mut at: Count = 0;
        for c in &counts {
            displs.push(at);
            at = at.checked_add(*c).ok_or_else(|| CollectiveError::Op {
                op: "gather",
                rank: self.rank,
                reason: "the ranks' values together exceed one MPI message".into(),
            })?;
        }
        let mut all = vec![0u8; at as usize];
        {
            let mut partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            self.world.all_gather_varcount_into(mine, &mut partition);
        }
        Ok(counts
            .iter()
            .zip(&displs)
            .map(|(c, d)| all[*d as usize..(*d + *c) as usize].to_vec())
            .collect())
    }
    fn barrier(&self) -> Result<()> {
        self.world.barrier();
        Ok(())
    }
    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}
