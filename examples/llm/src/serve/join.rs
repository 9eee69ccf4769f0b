//! A replacement rank joining a healed server: `boltccl-llm serve --model F --join
//! http://RANK0:PORT`, started with the job's `BOLTCCL_JOB_KEY`.
//!
//! The newcomer asks rank 0 over HTTP (`POST /boltccl/join`, proving it holds the job key);
//! rank 0's worker takes the request between two generations, picks a fresh coordinator port
//! and generation, tells its followers ([`super::engine::Command::Grow`]) and answers with a
//! [`Ticket`]. Then every rank, the newcomer included, forms the larger group with the normal
//! bootstrap ([`boltccl::Group::grow`]; the newcomer [`boltccl::Group::new`]) under a key
//! derived from the job key and the generation, so a straggler of an older generation is
//! refused, and cuts its shard for the new size from the mapped file.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// How long a newcomer waits for rank 0's answer (it comes between two generations).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(120);

/// What rank 0 answers a newcomer: where and as whom to join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    /// The newcomer's rank in the new group (the last one).
    pub rank: usize,
    /// The new group's size.
    pub size: usize,
    /// Where the new group's rank 0 listens (`host:port`).
    pub coordinator: String,
    /// Which re-formation of the job this is (the group's key is derived from it).
    pub generation: u64,
    /// The newcomer's name in the logs: ranks are named by their rank at start-up, and a
    /// newcomer after the first lost one it replaces (the smallest name not in use).
    pub id: usize,
}

/// A newcomer's request, as the HTTP side hands it to rank 0's worker.
pub struct Request {
    /// Where the worker sends the ticket (or why there is none).
    pub reply: tokio::sync::oneshot::Sender<Result<Ticket, String>>,
}

/// What a newcomer sends to show it belongs to the job: a hash of the job key, never the key.
pub fn proof(job_key: &str) -> String {
    let h = Sha256::new().chain_update(b"boltccl-llm serve join\0").chain_update(job_key.as_bytes()).finalize();
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key of the group formed at `generation`.
pub fn generation_key(job_key: &str, generation: u64) -> String {
    format!("{job_key}/serve-generation-{generation}")
}

/// The newcomer's side: asks the server at `url` (`http://host:port`) for a ticket.
pub fn ask(url: &str, job_key: &str) -> anyhow::Result<Ticket> {
    let hostport = url
        .strip_prefix("http://")
        .with_context(|| format!("--join {url}: expected http://HOST:PORT of rank 0's server"))?
        .trim_end_matches('/');
    let addr = hostport
        .to_socket_addrs()
        .with_context(|| format!("--join {url}: resolving {hostport}"))?
        .next()
        .with_context(|| format!("--join {url}: {hostport} has no address"))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .with_context(|| format!("--join: connecting to rank 0's server at {addr}"))?;
    s.set_read_timeout(Some(ANSWER_WITHIN))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    let body = serde_json::json!({ "proof": proof(job_key) }).to_string();
    write!(
        s,
        "POST /boltccl/join HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).context("--join: reading rank 0's answer")?;
    let status: u16 = answer.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    if status != 200 {
        bail!("rank 0 refused the join (HTTP {status}): {body}");
    }
    serde_json::from_str(body).with_context(|| format!("--join: rank 0's answer is not a ticket: {body}"))
}

/// Where a new group led by rank 0 (which led the job from the start) listens: the host of the
/// job's coordinator, as the job gave it, with `port`. Every member derives it the same way.
pub fn coordinator_at(group: &boltccl::Group, port: u16) -> anyhow::Result<String> {
    Ok(format!("{}:{port}", job_host(group)?))
}

/// Rank 0: a port free now on the job coordinator's host, for the next group.
pub fn free_port(group: &boltccl::Group) -> anyhow::Result<u16> {
    let ip = host_ip(&job_host(group)?)?;
    boltccl::free_coordinator_port(ip).context("finding a free port for the new group")
}

/// The address `host` (an IP, `[v6]`, or a name) stands for: the first the resolver gives.
fn host_ip(host: &str) -> anyhow::Result<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    let mut addrs = (host.trim_start_matches('[').trim_end_matches(']'), 0)
        .to_socket_addrs()
        .with_context(|| format!("the job coordinator's host {host} does not resolve (a join needs its address)"))?;
    let first = addrs.next().with_context(|| format!("the job coordinator's host {host} has no address"))?;
    Ok(first.ip())
}

/// The host part of the job's coordinator address (`[..]` kept around an IPv6 address).
fn job_host(group: &boltccl::Group) -> anyhow::Result<String> {
    let first = group.config().coordinator.clone().context("the job has no coordinator address")?;
    let (host, _) = first.rsplit_once(':').with_context(|| format!("coordinator {first} has no port"))?;
    Ok(host.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coordinator_host_may_be_an_address_or_a_name() {
        assert_eq!(host_ip("127.0.0.1").unwrap().to_string(), "127.0.0.1");
        assert_eq!(host_ip("[::1]").unwrap().to_string(), "::1");
        assert!(host_ip("localhost").unwrap().is_loopback());
        let e = host_ip("no-such-host.invalid").unwrap_err();
        assert!(format!("{e:#}").contains("no-such-host.invalid does not resolve"), "{e:#}");
    }

    #[test]
    fn the_proof_and_the_keys_depend_on_the_job_key() {
        assert_eq!(proof("k"), proof("k"));
        assert_ne!(proof("k"), proof("k2"));
        assert_eq!(proof("k").len(), 64);
        assert!(!proof("secret").contains("secret"));
        assert_ne!(generation_key("k", 1), generation_key("k", 2));
    }
}
