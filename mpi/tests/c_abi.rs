//! The library as MLX sees it, from C: `tests/c/mlx_subset.c` is compiled against Open MPI's
//! own `mpi.h` (Debian's libopenmpi-dev), opens `libboltccl_mpi.so` with `dlopen` and calls
//! every function of the subset as MLX's mpi backend does. Each rank is a real process; the
//! tests start them directly (not through a launcher that would stop the survivors), so what
//! the survivors of a failure print and how they exit is the library's doing.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// `target/<profile>/`, where cargo put this package's cdylib.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn library() -> PathBuf {
    let lib = profile_dir().join("deps").join("libboltccl_mpi.so");
    assert!(lib.exists(), "{} is missing: cargo builds it with this package's tests", lib.display());
    lib
}

/// The C program, compiled once per test binary; `None` (outside CI) when Open MPI's header
/// is not installed.
fn program() -> Option<PathBuf> {
    static BUILT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let flags =
                Command::new("pkg-config").args(["--cflags", "ompi-c"]).output().ok().filter(|o| o.status.success());
            let Some(flags) = flags else {
                let why = "Open MPI's mpi.h (pkg-config ompi-c, Debian's libopenmpi-dev) is not installed";
                assert!(!in_ci(), "{why}, and CI is set: this test must run (scripts/test.sh installs it)");
                eprintln!("SKIPPED: {why}");
                return None;
            };
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mlx_subset.c");
            let out = profile_dir().join(format!("mlx_subset-{}", std::process::id()));
            let mut cc = Command::new("cc");
            cc.args(["-std=gnu11", "-O1", "-Wall", "-Werror", "-o"]).arg(&out).arg(&src);
            cc.args(String::from_utf8(flags.stdout).unwrap().split_whitespace()).arg("-ldl");
            let st = cc.status().expect("cc runs");
            assert!(st.success(), "compiling {} against Open MPI's mpi.h failed", src.display());
            Some(out)
        })
        .clone()
}

/// One rank's end: its exit code (None: killed by a signal) and its output.
struct Ended {
    code: Option<i32>,
    output: String,
}

/// Start `mode` as `n` rank processes with `env`.
fn spawn(n: usize, mode: &str, env: &[(&str, &str)]) -> Vec<Child> {
    let prog = program().expect("checked by the caller");
    let port = boltccl::free_coordinator_port(std::net::Ipv4Addr::LOCALHOST.into()).unwrap();
    (0..n)
        .map(|r| {
            Command::new(&prog)
                .arg(library())
                .arg(mode)
                .env("BOLTCCL_RANK", r.to_string())
                .env("BOLTCCL_WORLD_SIZE", n.to_string())
                .env("BOLTCCL_COORDINATOR", format!("127.0.0.1:{port}"))
                .env("BOLTCCL_JOB_KEY", "c-abi-test")
                .envs(env.iter().copied())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// The rank's end, if it has ended.
fn ended(c: &mut Child) -> Option<Ended> {
    let st = c.try_wait().unwrap()?;
    let mut output = String::new();
    c.stdout.take().unwrap().read_to_string(&mut output).unwrap();
    c.stderr.take().unwrap().read_to_string(&mut output).unwrap();
    Some(Ended { code: st.code(), output })
}

/// Wait for the first `wanted` ranks to end, at most `limit` from `start`; then kill the rest.
fn wait(
    mut children: Vec<Child>,
    wanted: usize,
    start: Instant,
    limit: Duration,
    what: &str,
) -> (Vec<Ended>, Duration) {
    let mut ends: Vec<Option<Ended>> = (0..children.len()).map(|_| None).collect();
    while ends[..wanted].iter().any(Option::is_none) {
        for (e, c) in ends.iter_mut().zip(&mut children).take(wanted) {
            if e.is_none() {
                *e = ended(c);
            }
        }
        if start.elapsed() > limit {
            for c in &mut children {
                let _ = c.kill();
                let _ = c.wait();
            }
            panic!("{what}: ranks still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = start.elapsed();
    for c in &mut children[wanted..] {
        let _ = c.kill();
        let _ = c.wait();
    }
    (ends.into_iter().take(wanted).map(Option::unwrap).collect(), took)
}

/// Run `mode` as `n` ranks with `env`; every rank must end within `limit`.
fn run(n: usize, mode: &str, env: &[(&str, &str)], limit: Duration) -> (Vec<Ended>, Duration) {
    let start = Instant::now();
    wait(spawn(n, mode, env), n, start, limit, &format!("`{mode}` at {n} ranks"))
}

#[test]
fn every_call_of_the_subset_works_as_mlx_makes_it() {
    if program().is_none() {
        return;
    }
    for n in [2, 3, 4] {
        let (ends, _) = run(n, "ok", &[], Duration::from_secs(60));
        for (r, e) in ends.iter().enumerate() {
            assert_eq!(e.code, Some(0), "rank {r} of {n}:\n{}", e.output);
            assert!(e.output.contains(&format!("rank {r}: ok")), "rank {r} of {n}:\n{}", e.output);
        }
    }
}

/// Each rank that ran `mode` ended with the fatal status, printing boltccl's error with `what`.
fn fatal_everywhere(ends: &[Ended], ranks: std::ops::Range<usize>, what: &str) {
    for r in ranks {
        let e = &ends[r];
        assert_eq!(e.code, Some(boltccl_mpi::FATAL_EXIT), "rank {r}:\n{}", e.output);
        assert!(
            e.output.contains("boltccl MPI: MPI_") && e.output.contains(what),
            "rank {r}, wanted {what:?}:\n{}",
            e.output
        );
    }
}

#[test]
fn calls_the_subset_cannot_serve_are_fatal_with_a_clear_error() {
    if program().is_none() {
        return;
    }
    let limit = Duration::from_secs(30);
    let (ends, _) = run(2, "any_source", &[], limit);
    fatal_everywhere(&ends, 0..2, "MPI_ANY_SOURCE");
    let (ends, _) = run(2, "bad_tag", &[], limit);
    fatal_everywhere(&ends, 0..1, "tag 5");
    fatal_everywhere(&ends, 1..2, "rank 0");
    // The receiver finds the size mismatch; the sender learns of it in its next call.
    let (ends, _) = run(2, "count_mismatch", &[], limit);
    fatal_everywhere(&ends, 0..2, "rank");
    assert!(ends[1].output.contains("mismatch"), "{}", ends[1].output);
}

#[test]
fn a_dead_or_stopped_rank_ends_every_process_within_the_deadline_naming_it() {
    if program().is_none() {
        return;
    }
    let deadline_ms = 3000;
    let env = [("BOLTCCL_TIMEOUT_MS", "3000")];
    // Killed: its links close, which the survivors notice at once.
    let (ends, took) = run(3, "die", &env, Duration::from_secs(30));
    assert_eq!(ends[2].code, None, "rank 2 was killed:\n{}", ends[2].output);
    fatal_everywhere(&ends, 0..2, "rank 2");
    assert!(took < Duration::from_millis(deadline_ms), "a killed rank took {took:?} to notice");
    // Stopped: its links stay open and silent, so the survivors' deadline names it. The
    // stopped rank never runs again; the test kills it once the survivors have ended.
    let start = Instant::now();
    let (ends, took) = wait(spawn(3, "stall", &env), 2, start, Duration::from_secs(60), "survivors of a stopped rank");
    fatal_everywhere(&ends, 0..2, "rank 2");
    assert!(ends.iter().all(|e| e.output.contains("timed out")), "{}", ends[0].output);
    assert!(took < Duration::from_millis(3 * deadline_ms), "a stopped rank took {took:?} to notice");
}
