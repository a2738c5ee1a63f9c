//! The ranks of a data-parallel job and the few collectives the trainer needs.
//!
//! A job is `world` processes with ranks `0..world`; rank and world come from the launcher
//! (`mpirun`, or Slurm's `srun` through PMIx), never from a protocol of our own. One process
//! alone is [`Single`], which needs nothing installed; [`from_launcher`] returns MPI ranks when
//! the binary was built with the `mpi` feature and started by a launcher, and refuses a
//! multi-rank launch it cannot join rather than running N copies that each think they are
//! alone.
//!
//! Every collective gives every rank the same bytes: sums are reduced to rank 0 and broadcast
//! from it, so ranks that start from identical weights and apply the same optimizer to the
//! same summed gradients stay bit-identical.

use std::fmt::Debug;

#[cfg(feature = "mpi")]
mod mpi_ranks;
#[cfg(feature = "mpi")]
pub use mpi_ranks::MpiRanks;

#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    #[error("{0}")]
    Launch(String),
    #[error("collective `{op}` on rank {rank}: {reason}")]
    Op {
        op: &'static str,
        rank: usize,
        reason: String,
    },
}

pub type Result<T, E = CollectiveError> = std::result::Result<T, E>;

/// The collectives of one rank. Every rank must call the same collectives in the same order
/// with buffers of the same length (as with MPI itself); a rank that skips one hangs the job.
pub trait Collective: Debug {
    /// This process's rank, `0..world`.
    fn rank(&self) -> usize;
    /// How many ranks the job has.
    fn world(&self) -> usize;
    /// Element-wise sum over the ranks, in place; every rank ends with the same values.
    fn sum_f32(&self, values: &mut [f32]) -> Result<()>;
    /// [`Collective::sum_f32`] for `f64`.
    fn sum_f64(&self, values: &mut [f64]) -> Result<()>;
    /// Every rank's bytes, in rank order, on every rank.
    fn gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Waits until every rank has reached it.
    fn barrier(&self) -> Result<()>;
    /// Ends every rank of the job with `code`: a rank that fails must not leave the others
    /// waiting in a collective it will never join.
    fn abort(&self, code: i32) -> !;

    /// Rank 0 writes the run's files; the others only compute.
    fn is_leader(&self) -> bool {
        self.rank() == 0
    }
    /// Whether item `index` of a list shared by every rank is this rank's to compute
    /// (round-robin, so that a list's cost spreads evenly whatever its order).
    fn owns(&self, index: usize) -> bool {
        index % self.world() == self.rank()
    }
}

/// One process alone: every collective is the identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct Single;

impl Collective for Single {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn sum_f32(&self, _: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn sum_f64(&self, _: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// What the environment says about a launch: which launcher started this process as which
/// rank of how many. `None` when no launcher variable is set (a plain process).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub launcher: &'static str,
    pub rank: usize,
    pub world: usize,
    /// The rank among this node's ranks (which GPU to take), when the launcher says.
    pub local_rank: Option<usize>,
}

/// Reads a launch from environment variables: Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`),
/// Slurm's `srun` (`SLURM_PROCID`/`SLURM_STEP_NUM_TASKS`) and PMIx (`PMIX_RANK`/`PMIX_SIZE`). A variable that is set but not a number is an error.
pub fn launch_from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
    let num = |name: &str| -> Result<Option<usize>> {
        match var(name) {
            None => Ok(None),
            Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| {
                CollectiveError::Launch(format!(
                    "environment variable {name}={v:?} is not a non-negative integer"
                ))
            }),
        }
    };
    let found = if let (Some(rank), Some(world)) =
        (num("OMPI_COMM_WORLD_RANK")?, num("OMPI_COMM_WORLD_SIZE")?)
    {
        Some(Launch {
            launcher: "mpirun",
            rank,
            world,
            local_rank: num("OMPI_COMM_WORLD_LOCAL_RANK")?,
        })
    } else if let (Some(rank), Some(world)) =
        // The step's task count, not SLURM_NTASKS: a batch script's own commands see the
        // job's task count but are one process, not a rank of a step.
        (num("SLURM_PROCID")?, num("SLURM_STEP_NUM_TASKS")?)
    {
        Some(Launch {
            launcher: "srun",
            rank,
            world,
            local_rank: num("SLURM_LOCALID")?,
        })
    } else if let (Some(rank), Some(world)) = (num("PMIX_RANK")?, num("PMIX_SIZE")?) {
        Some(Launch {
            launcher: "pmix",
            rank,
            world,
            local_rank: None,
        })
    } else {
        None
    };
    if let Some(l) = &found {
        if l.world == 0 || l.rank >= l.world {
            return Err(CollectiveError::Launch(format!(
                "{} says rank {} of {}: the rank must be below the world size",
                l.launcher, l.rank, l.world
            )));
        }
    }
    Ok(found)
}

/// The ranks this process belongs to, from its launcher: [`Single`] for a plain process (or a
/// launch of one rank), MPI ranks for a multi-rank launch when built with the `mpi` feature,
/// and an error for a multi-rank launch without it.
pub fn from_launcher() -> Result<Box<dyn Collective>> {
    let launch = launch_from_env(|k| std::env::var(k).ok())?;
    match launch {
        None => Ok(Box::new(Single)),
        Some(l) if l.world == 1 => Ok(Box::new(Single)),
        Some(l) => join(l),
    }
}

#[cfg(feature = "mpi")]
fn join(l: Launch) -> Result<Box<dyn Collective>> {
    let ranks = MpiRanks::initialize()?;
    if ranks.world() != l.world || ranks.rank() != l.rank {
        return Err(CollectiveError::Launch(format!(
            "{} says rank {} of {}, MPI says rank {} of {}: the job was launched without MPI's wiring (with srun, pass --mpi=pmix)",
            l.launcher,
            l.rank,
            l.world,
            ranks.rank(),
            ranks.world()
        )));
    }
    tracing::info!(
        rank = l.rank,
        world = l.world,
        launcher = l.launcher,
        "data-parallel: joined the job over MPI"
    );
    Ok(Box::new(ranks))
}

#[cfg(not(feature = "mpi"))]
fn join(l: Launch) -> Result<Box<dyn Collective>> {
    Err(CollectiveError::Launch(format!(
        "{} started this process as rank {} of {}, but this pathfinder was built without the `mpi` feature and cannot join the others; build it with `cargo build --release -p pathfinder --features mpi` (Open MPI's libopenmpi-dev and libclang-dev installed)",
        l.launcher, l.rank, l.world
    )))
}

/// The local rank among this node's ranks, from the launcher (0 for a plain process): which
/// GPU a rank takes when a node has several.
pub fn local_rank() -> usize {
    launch_from_env(|k| std::env::var(k).ok())
        .ok()
        .flatten()
        .and_then(|l| l.local_rank)
        .unwrap_or(0)
}

/// Gathers one serialisable value per rank (as JSON), in rank order. For the few, small,
/// per-step exchanges the trainer makes (episodes, verdicts); gradients go through the sums.
pub fn gather_json<T>(c: &dyn Collective, mine: &T) -> Result<Vec<T>>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let op_err = |reason: String| CollectiveError::Op {
        op: "gather",
        rank: c.rank(),
        reason,
    };
    let bytes = serde_json::to_vec(mine).map_err(|e| op_err(e.to_string()))?;
    c.gather_bytes(&bytes)?
        .into_iter()
        .enumerate()
        .map(|(r, b)| {
            serde_json::from_slice(&b).map_err(|e| op_err(format!("rank {r}'s value: {e}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn launches_are_read_from_each_launchers_variables() {
        assert_eq!(launch_from_env(env(&[])).unwrap(), None);
        let l = launch_from_env(env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (l.launcher, l.rank, l.world, l.local_rank),
            ("mpirun", 1, 2, Some(1))
        );
        let l = launch_from_env(env(&[("SLURM_PROCID", "3"), ("SLURM_STEP_NUM_TASKS", "4")]))
            .unwrap()
            .unwrap();
        assert_eq!((l.launcher, l.rank, l.world), ("srun", 3, 4));
        // A batch script's own command is one process, not a rank.
        assert_eq!(
            launch_from_env(env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")])).unwrap(),
            None
        );
    }

    #[test]
    fn a_bad_launch_is_refused_with_the_variable() {
        let e = launch_from_env(env(&[("SLURM_PROCID", "x"), ("SLURM_STEP_NUM_TASKS", "2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SLURM_PROCID") && e.contains("\"x\""), "{e}");
        let e = launch_from_env(env(&[("SLURM_PROCID", "2"), ("SLURM_STEP_NUM_TASKS", "2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 2 of 2"), "{e}");
    }

    #[test]
    fn a_single_process_owns_everything_and_gathers_itself() {
        let s = Single;
        assert!((0..5).all(|i| s.owns(i)));
        assert_eq!(s.gather_bytes(b"abc").unwrap(), vec![b"abc".to_vec()]);
        let mut v = [1.5f32, 2.0];
        s.sum_f32(&mut v).unwrap();
        assert_eq!(v, [1.5, 2.0]);
    }
}
