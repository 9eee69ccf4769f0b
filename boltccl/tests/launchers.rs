//! Groups formed from launchers' variables alone (ranks as threads, each with its own
//! environment), with the ports the launcher hands to other programs already taken, as they
//! are when MLX's ring backend or torch's store runs in the same job. The real launchers run in
//! python/tests/test_launchers.py.

use boltccl::{Config, Group};
use std::collections::HashMap;
use std::net::TcpListener;

/// Form one group per environment, on threads, and check an all_sum on it.
fn all_sum_from(envs: Vec<HashMap<String, String>>) {
    let n = envs.len();
    let handles: Vec<_> = envs
        .into_iter()
        .map(|env| {
            std::thread::spawn(move || {
                let cfg = Config::from_lookup(|k| env.get(k).cloned()).expect("config from the launcher's variables");
                let g = Group::new(cfg).expect("group forms");
                let mut x = vec![g.rank() as f32 + 1.0; 1000];
                g.all_sum(&mut x).unwrap();
                x[0]
            })
        })
        .collect();
    let want = (n * (n + 1) / 2) as f32;
    for h in handles {
        assert_eq!(h.join().unwrap(), want);
    }
}

fn env(pairs: &[(&str, String)]) -> HashMap<String, String> {
    let mut m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    m.insert("BOLTCCL_INIT_TIMEOUT_MS".into(), "20000".into());
    m.insert("BOLTCCL_JOB_KEY".into(), "test".into());
    m
}

/// What `mlx.launch -n N` gives each rank: a ring hostfile of consecutive loopback ports. The
/// ports are held open here, as MLX's ring backend would hold them in the same processes:
/// neither the coordinator nor any data listener may need them.
#[test]
fn mlx_ring_hostfile_ports_are_never_bound() {
    for n in [2, 4] {
        let held: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        let hosts: Vec<Vec<String>> = held.iter().map(|l| vec![l.local_addr().unwrap().to_string()]).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hostfile.json");
        std::fs::write(&path, serde_json::to_string(&hosts).unwrap()).unwrap();
        let envs =
            (0..n).map(|r| env(&[("MLX_RANK", r.to_string()), ("MLX_HOSTFILE", path.display().to_string())])).collect();
        all_sum_from(envs);
    }
}

/// The bug as a new user met it: `mlx.launch -n 2` writes 127.0.0.1:32323 and :32324, and
/// rank 0's coordinator and data listener both took 127.0.0.1:32323.
#[test]
fn mlx_launch_default_hostfile_forms_a_group() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostfile.json");
    std::fs::write(&path, r#"[["127.0.0.1:32323"], ["127.0.0.1:32324"]]"#).unwrap();
    let envs =
        (0..2).map(|r| env(&[("MLX_RANK", r.to_string()), ("MLX_HOSTFILE", path.display().to_string())])).collect();
    all_sum_from(envs);
}

/// torchrun's variables, with torch's store holding MASTER_PORT.
#[test]
fn torchrun_variables_with_the_store_port_taken() {
    let store = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = store.local_addr().unwrap().port().to_string();
    let envs = (0..3)
        .map(|r| {
            env(&[
                ("TORCHELASTIC_RUN_ID", format!("test-{port}")),
                ("RANK", r.to_string()),
                ("LOCAL_RANK", r.to_string()),
                ("WORLD_SIZE", "3".into()),
                ("LOCAL_WORLD_SIZE", "3".into()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.clone()),
            ])
        })
        .collect();
    all_sum_from(envs);
}
