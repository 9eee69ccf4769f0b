//! `boltccl doctor`: print what this node (or a set of nodes) can do for RDMA and what to fix.

mod checks;

use boltccl::Shape;
use checks::{self as doctor, Severity};
use std::path::PathBuf;

/// Arguments of `boltccl doctor`.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Print this node's report as JSON (what `--hosts` collects over ssh).
    #[arg(long)]
    json: bool,
    /// Verbs library to check instead of the default (or BOLTCCL_IBV_LIBRARY).
    #[arg(long)]
    library: Option<PathBuf>,
    /// Explain an errno seen in an RDMA error message (e.g. 22, 60, 16).
    #[arg(long)]
    explain: Option<i32>,
    /// Check these hosts over ssh (comma-separated, in rank order) and write the hostfile and
    /// device matrix.
    #[arg(long, value_delimiter = ',')]
    hosts: Vec<String>,
    /// Where `--hosts` writes hostfile.json and devices.json.
    #[arg(long, default_value = ".")]
    out: PathBuf,
}

/// Run `doctor`; returns the process exit code (1 when something is broken).
pub fn run(a: DoctorArgs) -> i32 {
    if let Some(e) = a.explain {
        // Field reports come from Macs, where 60 is ETIMEDOUT (it is ENOSTR on Linux).
        let name =
            if e == 60 { "ETIMEDOUT on macOS".to_string() } else { std::io::Error::from_raw_os_error(e).to_string() };
        println!("errno {e} ({name}):");
        for line in boltccl::probe::explain_errno(e) {
            println!("- {line}");
        }
        return 0;
    }
    let library = a.library.or_else(|| std::env::var_os(boltccl::config::IBV_LIBRARY).map(PathBuf::from));
    if a.hosts.is_empty() {
        let r = doctor::check_local(library.as_deref(), &doctor::run_command);
        if a.json {
            println!("{}", serde_json::to_string(&r).expect("report serialises"));
        } else {
            println!("{} ({} {}), boltccl {}", r.host, r.os, r.os_version, r.version);
            for f in &r.findings {
                println!("{f}");
            }
        }
        return i32::from(r.findings.iter().any(|f| f.severity == Severity::Error));
    }
    let mut reports = Vec::new();
    let mut broken = false;
    for r in doctor::gather(&a.hosts, &doctor::run_command) {
        match r {
            Ok(r) => {
                println!("== {} ({} {})", r.host, r.os, r.os_version);
                for f in r.findings.iter().filter(|f| f.severity != Severity::Ok) {
                    println!("{f}");
                }
                broken |= r.findings.iter().any(|f| f.severity == Severity::Error);
                reports.push(r);
            }
            Err(e) => {
                println!("[FAIL] {e}");
                broken = true;
            }
        }
    }
    if reports.len() != a.hosts.len() {
        return 1;
    }
    for f in doctor::check_versions(&reports) {
        broken |= f.severity == Severity::Error;
        println!("{f}");
    }
    let (matrix, shape) = doctor::infer_matrix(&reports);
    match shape {
        Shape::AllPairs => println!("[ok  ] cabling: full mesh"),
        Shape::Ring => println!("[ok  ] cabling: ring (in the order given)"),
        Shape::Partial => println!(
            "[WARN] cabling: neither a mesh nor a ring in this host order; uncabled pairs will use TCP\n       fix: \
             give each cable its own IPv4 subnet (e.g. a /30) on both ends, or reorder --hosts to follow the ring"
        ),
    }
    // What the library will run on this cabling, with the default settings.
    let cabling = boltccl::Cabling::from_links(matrix.cabled());
    let cfg = boltccl::Config { world_size: reports.len(), ..boltccl::Config::default() };
    let pick = |c, bytes| boltccl::select_algorithm(c, bytes, &cabling, &cfg).name();
    println!(
        "       algorithms: all_sum up to {} B {}, larger {}; large all_gather {}",
        cfg.mesh_max_bytes,
        pick(boltccl::Collective::AllReduce, cfg.mesh_max_bytes),
        pick(boltccl::Collective::AllReduce, 64 << 20),
        pick(boltccl::Collective::AllGather, 64 << 20)
    );
    let hostfile: Vec<_> = a.hosts.iter().map(|h| serde_json::json!({"ssh": h, "ips": []})).collect();
    let (hf, dm) = (a.out.join("hostfile.json"), a.out.join("devices.json"));
    let written = std::fs::write(&hf, serde_json::to_string_pretty(&hostfile).expect("json"))
        .and_then(|_| std::fs::write(&dm, doctor::matrix_json(&matrix)));
    match written {
        Ok(()) => println!("wrote {} and {} (set BOLTCCL_IBV_DEVICES={})", hf.display(), dm.display(), dm.display()),
        Err(e) => {
            println!("[FAIL] cannot write into {}: {e}", a.out.display());
            broken = true;
        }
    }
    i32::from(broken)
}
