//! Where the all_sum time goes: communication, or waiting for a slower rank.
//!
//! A rank's time inside `all_sum` has two parts. Until the last rank arrives, it is waiting
//! for peers that are still computing (load imbalance, or ranks sharing a core); nothing the
//! network or boltccl does can shorten that. From the last arrival on, it is the collective
//! itself. Telling them apart needs every rank's entry time on one clock: each rank logs
//! (enter, leave) of every call on its wall clock, the offsets of the ranks' clocks to rank
//! 0's are estimated NTP-style (the ping-pong with the smallest round trip), and rank 0 gathers
//! the logs once generation is over.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::comm::Comm;

/// Nanoseconds on this host's wall clock (the clock processes on one host share).
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// (enter, leave) of every call, in call order.
#[derive(Default)]
pub struct CallLog(Mutex<Vec<(u64, u64)>>);

impl CallLog {
    /// Record one call.
    pub fn push(&self, enter: u64, leave: u64) {
        self.0.lock().unwrap().push((enter, leave));
    }

    /// A copy of the calls so far.
    pub fn calls(&self) -> Vec<(u64, u64)> {
        self.0.lock().unwrap().clone()
    }
}

/// Ping-pong rounds per rank for the clock offsets (the fastest one is kept).
const PINGS: usize = 32;

/// On rank 0: each rank's clock minus rank 0's, in ns, and the largest error bound (half the
/// best round trip). Other ranks answer the pings and get `None`. Every rank must call this.
pub fn clock_offsets(comm: &dyn Comm) -> anyhow::Result<Option<(Vec<i64>, u64)>> {
    let (rank, size) = (comm.rank(), comm.size());
    if rank != 0 {
        for _ in 0..PINGS {
            let mut ping = [0u64];
            comm.recv_bytes(bytemuck::cast_slice_mut(&mut ping), 0)?;
            comm.send_bytes(bytemuck::bytes_of(&now_ns()), 0)?;
        }
        return Ok(None);
    }
    let mut offsets = vec![0i64; size];
    let mut bound = 0u64;
    for (peer, offset) in offsets.iter_mut().enumerate().skip(1) {
        let mut best = (u64::MAX, 0i64);
        for _ in 0..PINGS {
            let sent = now_ns();
            comm.send_bytes(bytemuck::bytes_of(&sent), peer)?;
            let mut theirs = [0u64];
            comm.recv_bytes(bytemuck::cast_slice_mut(&mut theirs), peer)?;
            let back = now_ns();
            let rtt = back.saturating_sub(sent);
            if rtt < best.0 {
                let mid = sent as i128 + (rtt / 2) as i128;
                best = (rtt, (theirs[0] as i128 - mid) as i64);
            }
        }
        *offset = best.1;
        bound = bound.max(best.0 / 2);
    }
    Ok(Some((offsets, bound)))
}

/// Rank 0's all_sum time over a window, split at the last rank's arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Split {
    /// Calls in the window.
    pub calls: usize,
    /// Rank 0's time in all_sum before the last rank entered the call (ns).
    pub waiting_ns: u64,
    /// Rank 0's time in all_sum after the last rank entered the call (ns).
    pub communicating_ns: u64,
}

/// Split rank 0's calls `first..` given every rank's log (`logs[r]`, all the same length) and
/// the clock offsets (`offsets[r]` = rank r's clock minus rank 0's).
pub fn split(logs: &[Vec<(u64, u64)>], offsets: &[i64], first: usize) -> Split {
    let mut s = Split::default();
    let Some(mine) = logs.first() else { return s };
    for (c, &(enter, leave)) in mine.iter().enumerate().skip(first) {
        let last = logs
            .iter()
            .zip(offsets)
            .map(|(log, &off)| (log[c].0 as i128 - off as i128).max(0) as u64)
            .max()
            .unwrap_or(enter)
            .clamp(enter, leave);
        s.calls += 1;
        s.waiting_ns += last - enter;
        s.communicating_ns += leave - last;
    }
    s
}

/// Gather every rank's `calls` (its [`CallLog`]) to rank 0 and split rank 0's calls from index
/// `first` on. Every rank must call this (after the same number of calls); rank 0 gets the
/// split and the clock error bound in ns, the others `None`.
pub fn gather_split(comm: &dyn Comm, calls: &[(u64, u64)], first: usize) -> anyhow::Result<Option<(Split, u64)>> {
    let offsets = clock_offsets(comm)?;
    let flat: Vec<u64> = calls.iter().flat_map(|&(a, b)| [a, b]).collect();
    let all = comm.all_gather_u64(&flat)?;
    let Some((offsets, bound)) = offsets else { return Ok(None) };
    let logs: Vec<Vec<(u64, u64)>> =
        all.chunks(flat.len().max(1)).map(|r| r.chunks(2).map(|p| (p[0], p[1])).collect()).collect();
    Ok(Some((split(&logs, &offsets, first), bound)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_charges_time_before_the_last_arrival_to_waiting() {
        // Rank 1's clock runs 1000 ns ahead. Call 0: rank 1 enters 300 ns after rank 0 (in rank
        // 0's time); call 1: rank 1 is first, so rank 0 waits for no one.
        let logs = vec![vec![(0, 500), (1000, 1100)], vec![(1300, 1500), (1900, 2100)]];
        let s = split(&logs, &[0, 1000], 0);
        assert_eq!(s, Split { calls: 2, waiting_ns: 300, communicating_ns: 200 + 100 });
        assert_eq!(split(&logs, &[0, 1000], 1), Split { calls: 1, waiting_ns: 0, communicating_ns: 100 });
    }

    #[test]
    fn split_clamps_clock_error_into_the_call() {
        // An offset error that puts the last arrival after rank 0 left counts as all waiting.
        let logs = vec![vec![(0, 100)], vec![(500, 600)]];
        assert_eq!(split(&logs, &[0, 0], 0), Split { calls: 1, waiting_ns: 100, communicating_ns: 0 });
    }
}
