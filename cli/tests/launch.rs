//! The `boltccl` command: launching local and (through a stand-in ssh) remote ranks, failure
//! reporting, and the benchmark's output, JSON and plot.

use std::process::Command;
use std::time::{Duration, Instant};

fn boltccl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_boltccl"))
}

fn text(o: &std::process::Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn launch_prefixes_output_and_sets_the_environment() {
    let o = boltccl()
        .args([
            "launch",
            "-n",
            "3",
            "--",
            "sh",
            "-c",
            "echo rank=$BOLTCCL_RANK size=$BOLTCCL_WORLD_SIZE key=${#BOLTCCL_JOB_KEY}",
        ])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    for r in 0..3 {
        assert!(out.contains(&format!("[{r}] rank={r} size=3 key=32")), "{out}");
    }
}

#[test]
fn a_failing_rank_stops_the_others_and_is_reported() {
    let t = Instant::now();
    let o = boltccl()
        .args([
            "launch",
            "-n",
            "3",
            "--",
            "sh",
            "-c",
            "if [ $BOLTCCL_RANK = 1 ]; then echo boom >&2; exit 3; fi; sleep 60",
        ])
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(t.elapsed() < Duration::from_secs(20), "the others were not stopped");
    assert!(err.contains("rank 1 failed (exit code 3)") && err.contains("boom"), "{err}");
}

#[test]
fn with_keep_going_the_others_run_on_after_a_rank_fails() {
    let t = Instant::now();
    let o = boltccl()
        .args([
            "launch",
            "-n",
            "3",
            "--keep-going",
            "--",
            "sh",
            "-c",
            "if [ $BOLTCCL_RANK = 1 ]; then echo boom >&2; exit 3; fi; sleep 1; echo rank $BOLTCCL_RANK finished",
        ])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{out}\n{err}");
    assert!(err.contains("rank 1 failed (exit code 3); the others go on"), "{err}");
    for r in [0, 2] {
        assert!(out.contains(&format!("[{r}] rank {r} finished")), "rank {r} was stopped:\n{out}\n{err}");
    }
    assert!(t.elapsed() < Duration::from_secs(20), "{err}");
}

#[test]
fn hostfile_launch_runs_a_real_collective_through_ssh() {
    let dir = tempfile::tempdir().unwrap();
    // Stand-in for ssh: drop the options and the host name, run the command here.
    let ssh = dir.path().join("fake-ssh");
    std::fs::write(&ssh, "#!/bin/sh\nshift 3\nexec sh -c \"$1\"\n").unwrap();
    std::fs::set_permissions(&ssh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let hosts = dir.path().join("hosts.json");
    std::fs::write(&hosts, r#"[{"ssh": "mac1", "ips": ["127.0.0.1"]}, {"ssh": "mac2", "ips": ["127.0.0.1"]}]"#)
        .unwrap();
    let port = boltccl::free_coordinator_port(std::net::Ipv4Addr::LOCALHOST.into()).unwrap().to_string();
    let o = boltccl()
        .env("BOLTCCL_SSH", &ssh)
        .args(["launch", "--hostfile", hosts.to_str().unwrap(), "--port", &port, "--timeout-s", "60", "--"])
        .arg(env!("CARGO_BIN_EXE_boltccl"))
        .args(["bench", "--ops", "all-sum", "--sizes", "4,4K", "--budget-s", "0.01"])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("[0] # boltccl bench: 2 ranks"), "{out}");
    assert!(out.lines().filter(|l| l.contains("all_sum") && l.trim_end().ends_with("ok")).count() == 2, "{out}");
}

#[test]
fn bench_checks_every_op_and_writes_json_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let (json, svg) = (dir.path().join("r.jsonl"), dir.path().join("r.svg"));
    let o = boltccl()
        .args(["bench", "-n", "3", "--sizes", "4,1K,300K", "--budget-s", "0.01", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let recs: Vec<serde_json::Value> =
        std::fs::read_to_string(&json).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(recs.len(), 5 * 3, "one record per op and size");
    for r in &recs {
        assert_eq!(r["correct"], true, "{r}");
        assert_eq!(r["n"], 3);
        assert!(r["median_us"].as_f64().unwrap() > 0.0);
        let factor = r["busbw_gbps"].as_f64().unwrap() / r["algbw_gbps"].as_f64().unwrap();
        let want = match r["op"].as_str().unwrap() {
            "all_sum" => 4.0 / 3.0,
            "all_gather" | "reduce_scatter" => 2.0 / 3.0,
            _ => 1.0,
        };
        assert!((factor - want).abs() < 1e-9, "{r}");
    }
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("all_gather") && svg.contains("busbw"), "not a plot");
}

#[test]
fn launch_points_mlx_at_libboltccl_mpi_beside_it_unless_told_otherwise() {
    // An installed layout: bin/boltccl and lib/libboltccl_mpi.so (scripts/install-c.sh).
    let prefix = tempfile::tempdir().unwrap();
    let (bin, lib) = (prefix.path().join("bin"), prefix.path().join("lib"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&lib).unwrap();
    let exe = bin.join("boltccl");
    std::fs::copy(env!("CARGO_BIN_EXE_boltccl"), &exe).unwrap();
    let name = format!("{}boltccl_mpi{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    let show = ["launch", "-n", "2", "--", "sh", "-c", "echo libname=$MLX_MPI_LIBNAME"];
    let run = |env: Option<&str>, extra: &[&str]| {
        let mut c = Command::new(&exe);
        c.args(&show[..3]).args(extra).args(&show[3..]).env_remove("MLX_MPI_LIBNAME");
        if let Some(v) = env {
            c.env("MLX_MPI_LIBNAME", v);
        }
        let o = c.output().unwrap();
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}\n{err}");
        out
    };
    // No library: nothing is set.
    assert_eq!(run(None, &[]).matches("libname=\n").count(), 2);
    std::fs::write(lib.join(&name), b"").unwrap();
    let found = format!("libname={}\n", bin.join("../lib").join(&name).display());
    assert_eq!(run(None, &[]).matches(&found).count(), 2, "{found}");
    // The caller's choice wins, from the environment or from --env.
    assert_eq!(run(Some("/mine.so"), &[]).matches("libname=/mine.so\n").count(), 2);
    assert_eq!(run(None, &["--env", "MLX_MPI_LIBNAME=/env.so"]).matches("libname=/env.so\n").count(), 2);
}

#[test]
#[cfg(target_os = "linux")]
fn launch_pins_ranks_to_cores_when_they_take_every_core() {
    let cores = std::thread::available_parallelism().unwrap().get();
    let allowed_under = |taskset: Option<usize>, n: usize, extra: &[&str]| -> Vec<String> {
        let mut c = match taskset {
            // The launcher itself confined to one core, as `taskset` or a cpuset does.
            Some(core) => {
                let mut c = Command::new("taskset");
                c.args(["-c", &core.to_string()]).arg(env!("CARGO_BIN_EXE_boltccl"));
                c
            }
            None => boltccl(),
        };
        let o = c
            .args(["launch", "-n", &n.to_string()])
            .args(extra)
            .args(["--", "sh", "-c", "grep Cpus_allowed_list /proc/self/status"])
            .output()
            .unwrap();
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}\n{err}");
        let mut lines: Vec<String> = out.lines().map(|l| l.split_whitespace().last().unwrap().to_string()).collect();
        lines.sort();
        lines
    };
    let allowed = |n: usize, extra: &[&str]| -> Vec<String> { allowed_under(None, n, extra) };
    // A rank per core: rank r on core r.
    assert_eq!(allowed(cores, &[]), (0..cores).map(|c| c.to_string()).collect::<Vec<_>>());
    // Fewer ranks than cores, or --no-bind: every rank may use every core.
    let all = allowed(1, &[]);
    assert_eq!(all.len(), 1);
    if cores > 1 {
        assert_ne!(all[0], "0", "one rank of {cores} cores was pinned");
    }
    assert!(allowed(cores, &["--no-bind"]).iter().all(|l| *l == all[0]));
    // Confined to its last core, the launcher keeps its ranks there (not on core 0 and up).
    let last = (cores - 1).to_string();
    assert_eq!(allowed_under(Some(cores - 1), 2, &[]), [last.clone(), last]);
}
