//! The cluster launch files in `infra/`: the Kubeflow MPIJob manifest against the MPI
//! Operator's v2beta1 schema (the fields it defines, typed, unknown fields refused, so a
//! misspelt key fails here rather than at `kubectl apply`), and the launch it describes
//! against what `pathfinder train` needs; the Slurm batch script's syntax and launch.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

// The structs below are the schema: every field the operator defines is deserialised (and an
// unknown one refused), while the test asserts only those a launch depends on.

fn infra(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../infra")
        .join(rel)
}

#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MpiJob {
    api_version: String,
    kind: String,
    metadata: Metadata,
    spec: MpiJobSpec,
}

#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MpiJobSpec {
    #[serde(default = "one")]
    slots_per_worker: u32,
    #[serde(default)]
    run_policy: Option<RunPolicy>,
    #[serde(default)]
    mpi_implementation: Option<String>,
    #[serde(default)]
    ssh_auth_mount_path: Option<String>,
    #[serde(default)]
    launcher_creation_policy: Option<String>,
    mpi_replica_specs: BTreeMap<String, ReplicaSpec>,
}

fn one() -> u32 {
    1
}

#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RunPolicy {
    #[serde(default)]
    clean_pod_policy: Option<String>,
    #[serde(default)]
    backoff_limit: Option<u32>,
    #[serde(default)]
    ttl_seconds_after_finished: Option<u32>,
    #[serde(default)]
    active_deadline_seconds: Option<u64>,
    #[serde(default)]
    suspend: Option<bool>,
}

#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReplicaSpec {
    replicas: u32,
    #[serde(default)]
    restart_policy: Option<String>,
    template: PodTemplate,
}

#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodTemplate {
    #[serde(default)]
    metadata: Option<serde_yaml::Value>,
    spec: PodSpec,
}

/// The pod fields the manifest uses, typed; the rest of a PodSpec is refused here so that a
/// new field is added to this check deliberately.
#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodSpec {
    containers: Vec<Container>,
    #[serde(default)]
    volumes: Vec<serde_yaml::Value>,
}

#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Container {
    name: String,
    image: String,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    resources: Resources,
    #[serde(default)]
    volume_mounts: Vec<VolumeMount>,
}

#[allow(dead_code)]
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Resources {
    #[serde(default)]
    limits: BTreeMap<String, serde_yaml::Value>,
    #[serde(default)]
    requests: BTreeMap<String, serde_yaml::Value>,
}

#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct VolumeMount {
    name: String,
    mount_path: String,
}

#[test]
fn the_mpijob_manifest_follows_the_v2beta1_schema_and_launches_every_slot() {
    let path = infra("kubernetes/mpijob.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let job: MpiJob = serde_yaml::from_str(&text)
        .unwrap_or_else(|e| panic!("{}: not an MPIJob v2beta1: {e}", path.display()));
    assert_eq!(job.api_version, "kubeflow.org/v2beta1");
    assert_eq!(job.kind, "MPIJob");
    assert!(!job.metadata.name.is_empty());
    let spec = &job.spec;
    if let Some(i) = &spec.mpi_implementation {
        assert!(["OpenMPI", "Intel", "MPICH"].contains(&i.as_str()), "{i}");
    }
    if let Some(p) = spec
        .run_policy
        .as_ref()
        .and_then(|p| p.clean_pod_policy.as_deref())
    {
        assert!(
            ["None", "Running", "All"].contains(&p),
            "cleanPodPolicy {p}"
        );
    }
    let keys: Vec<&str> = spec.mpi_replica_specs.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["Launcher", "Worker"],
        "the operator's two replica types"
    );
    let launcher = &spec.mpi_replica_specs["Launcher"];
    let worker = &spec.mpi_replica_specs["Worker"];
    assert_eq!(launcher.replicas, 1, "one launcher");
    for r in [launcher, worker] {
        if let Some(p) = &r.restart_policy {
            assert!(["Always", "OnFailure", "Never", "ExitCode"].contains(&p.as_str()));
        }
        assert!(!r.template.spec.containers.is_empty());
        for c in &r.template.spec.containers {
            assert!(!c.name.is_empty() && !c.image.is_empty());
        }
    }

    // mpirun starts one rank per slot, and each rank runs `pathfinder train`.
    let cmd = &launcher.template.spec.containers[0].command;
    assert_eq!(cmd.first().map(String::as_str), Some("mpirun"));
    let n: u32 = cmd[cmd.iter().position(|a| a == "-n").expect("mpirun -n") + 1]
        .parse()
        .unwrap();
    assert_eq!(
        n,
        worker.replicas * spec.slots_per_worker,
        "ranks = workers x slots"
    );
    let train = cmd
        .iter()
        .position(|a| a == "train")
        .expect("pathfinder train");
    assert!(cmd[train - 1].ends_with("pathfinder"));
    for flag in ["--config", "--run", "--runs-dir"] {
        assert!(cmd[train..].iter().any(|a| a == flag), "train needs {flag}");
    }
    // The configuration it names exists in the repository.
    let config = &cmd[cmd.iter().position(|a| a == "--config").unwrap() + 1];
    assert!(Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(config)
        .is_file());

    // GPUs: one per slot when the workers ask for any; the runs directory on every worker.
    let w = &worker.template.spec.containers[0];
    if let Some(gpus) = w.resources.limits.get("nvidia.com/gpu") {
        assert_eq!(gpus.as_u64(), Some(u64::from(spec.slots_per_worker)));
    }
    let runs_dir = &cmd[cmd.iter().position(|a| a == "--runs-dir").unwrap() + 1];
    assert!(
        w.volume_mounts
            .iter()
            .any(|m| &m.mount_path == runs_dir && !m.name.is_empty()),
        "the workers mount {runs_dir}"
    );
    assert!(!worker.template.spec.volumes.is_empty());
}

#[test]
fn a_misspelt_manifest_field_is_refused() {
    let text = std::fs::read_to_string(infra("kubernetes/mpijob.yaml")).unwrap();
    let bad = text.replacen("  slotsPerWorker:", "  slotPerWorker:", 1);
    let err = serde_yaml::from_str::<MpiJob>(&bad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("slotPerWorker"), "{err}");
}

/// `bash -n` reads the script under `infra/` without a syntax error.
fn parses_as_bash(script: &str) {
    let out = std::process::Command::new("bash")
        .arg("-n")
        .arg(infra(script))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_slurm_script_parses_and_launches_ranks_through_pmix() {
    for script in ["slurm/train.sbatch", "slurm/single-node.sh"] {
        parses_as_bash(script);
    }
    let text = std::fs::read_to_string(infra("slurm/train.sbatch")).unwrap();
    assert!(text.contains("#SBATCH --ntasks-per-node="));
    assert!(text.contains("srun --mpi=pmix"));
    assert!(text.contains("train --root"));
}

/// A batch/v1 Job, the fields the corpus manifests use (the rest refused, as above).
#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Job {
    api_version: String,
    kind: String,
    metadata: Metadata,
    spec: JobSpec,
}

#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JobSpec {
    #[serde(default)]
    completion_mode: Option<String>,
    #[serde(default)]
    completions: Option<u32>,
    #[serde(default)]
    parallelism: Option<u32>,
    #[serde(default)]
    backoff_limit: Option<u32>,
    #[serde(default)]
    backoff_limit_per_index: Option<u32>,
    #[serde(default)]
    ttl_seconds_after_finished: Option<u32>,
    template: JobPodTemplate,
}

#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobPodTemplate {
    #[serde(default)]
    metadata: Option<serde_yaml::Value>,
    spec: JobPodSpec,
}

#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JobPodSpec {
    restart_policy: String,
    containers: Vec<Container>,
    #[serde(default)]
    volumes: Vec<serde_yaml::Value>,
}

fn job(rel: &str) -> Job {
    let path = infra(rel);
    let text = std::fs::read_to_string(&path).unwrap();
    let job: Job = serde_yaml::from_str(&text)
        .unwrap_or_else(|e| panic!("{}: not a batch/v1 Job: {e}", path.display()));
    assert_eq!(
        (job.api_version.as_str(), job.kind.as_str()),
        ("batch/v1", "Job")
    );
    // A Job's pods may not restart in place: Never or OnFailure.
    assert!(["Never", "OnFailure"].contains(&job.spec.template.spec.restart_policy.as_str()));
    job
}

/// The words of a container's command, `sh -c` scripts split on whitespace.
fn words(c: &Container) -> Vec<String> {
    c.command
        .iter()
        .chain(&c.args)
        .flat_map(|a| a.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .collect()
}

fn flag<'a>(words: &'a [String], name: &str) -> &'a str {
    let i = words
        .iter()
        .position(|w| w == name)
        .unwrap_or_else(|| panic!("{name} missing from {words:?}"));
    words[i + 1].trim_matches('"')
}

#[test]
fn the_corpus_jobs_shard_by_completion_index_and_merge_every_part() {
    let shards = job("kubernetes/corpus-shards.yaml");
    let spec = &shards.spec;
    assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
    let n = spec.completions.expect("completions: the shard count");
    assert!(spec.parallelism.unwrap_or(1) <= n);
    let c = &spec.template.spec.containers[0];
    let w = words(c);
    let generate = w
        .iter()
        .position(|a| a == "generate")
        .expect("corpus generate");
    assert_eq!(w[generate - 1], "corpus");
    assert!(w[generate - 2].ends_with("pathfinder"));
    // Index K (0-based) runs part K+1 of N, into a directory named for its part.
    let script = c.command.join(" ");
    assert!(script.contains("$((JOB_COMPLETION_INDEX + 1))"), "{script}");
    assert_eq!(flag(&w, "--shard"), format!("$i/{n}"));
    let out = flag(&w, "--out");
    assert!(out.ends_with(&format!("/$i-of-{n}")), "{out}");
    let shards_dir = out.trim_end_matches(&format!("/$i-of-{n}"));

    let merge = job("kubernetes/corpus-merge.yaml");
    let m = &merge.spec.template.spec.containers[0];
    let mw = words(m);
    let at = mw.iter().position(|a| a == "merge").expect("corpus merge");
    let dirs: Vec<&str> = mw[at + 1..]
        .iter()
        .take_while(|a| !a.starts_with("--"))
        .map(String::as_str)
        .collect();
    let expected: Vec<String> = (1..=n)
        .map(|i| format!("{shards_dir}/{i}-of-{n}"))
        .collect();
    assert_eq!(dirs, expected, "the merge names every part once");
    assert!(!flag(&mw, "--out").is_empty());
    // Both see the shards on the same volume.
    for container in [c, m] {
        assert!(
            container
                .volume_mounts
                .iter()
                .any(|v| shards_dir.starts_with(&v.mount_path)),
            "{} mounts {shards_dir}",
            container.name
        );
    }
    // The generate flags name real options of the binary.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_pathfinder"))
        .args(["corpus", "generate", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for f in w[generate + 1..].iter().filter(|a| a.starts_with("--")) {
        assert!(help.contains(f.as_str()), "corpus generate has no {f}");
    }
}

#[test]
fn the_slurm_corpus_array_parses_and_runs_one_shard_per_task() {
    for script in [
        "slurm/corpus.sbatch",
        "slurm/corpus-merge.sbatch",
        "slurm/corpus.sh",
        "kubernetes/corpus.sh",
    ] {
        parses_as_bash(script);
    }
    let array = std::fs::read_to_string(infra("slurm/corpus.sbatch")).unwrap();
    assert!(array.contains("#SBATCH --array=1-"));
    // As Slurm starts task 2 of an array 1-3: the command it runs (PATHFINDER=echo prints it).
    let run = |vars: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(infra("slurm/corpus.sbatch"))
            .args(["--tasks", "2"])
            .env("PATHFINDER", "echo")
            .env("SHARDS_DIR", "/shared/c0.shards")
            .env("SLURM_CPUS_PER_TASK", "4")
            .env_remove("SLURM_SUBMIT_DIR");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let ok = run(&[
        ("SLURM_ARRAY_TASK_ID", "2"),
        ("SLURM_ARRAY_TASK_COUNT", "3"),
        ("SLURM_ARRAY_TASK_MIN", "1"),
        ("SLURM_ARRAY_TASK_MAX", "3"),
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let printed = String::from_utf8_lossy(&ok.stdout);
    assert!(
        printed.contains(
            "corpus generate --shard 2/3 --out /shared/c0.shards/2-of-3 --jobs 4 --tasks 2"
        ),
        "{printed}"
    );
    // An array that does not start at 1 would leave part 1 unrun: refused.
    let gap = run(&[
        ("SLURM_ARRAY_TASK_ID", "3"),
        ("SLURM_ARRAY_TASK_COUNT", "2"),
        ("SLURM_ARRAY_TASK_MIN", "2"),
        ("SLURM_ARRAY_TASK_MAX", "3"),
    ]);
    assert_eq!(gap.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&gap.stderr).contains("1-N"));
    // The merge names every part of the array.
    let merge = std::process::Command::new("bash")
        .arg(infra("slurm/corpus-merge.sbatch"))
        .env("PATHFINDER", "echo")
        .env("SHARDS_DIR", "/shared/c0.shards")
        .env("OUT", "/shared/c0")
        .env("SHARDS", "3")
        .env_remove("SLURM_SUBMIT_DIR")
        .output()
        .unwrap();
    assert!(merge.status.success());
    assert_eq!(
        String::from_utf8_lossy(&merge.stdout).trim(),
        "corpus merge /shared/c0.shards/1-of-3 /shared/c0.shards/2-of-3 /shared/c0.shards/3-of-3 --out /shared/c0"
    );
    let submit = std::fs::read_to_string(infra("slurm/corpus.sh")).unwrap();
    assert!(submit.contains("--dependency=\"afterok:$array\""));
}
