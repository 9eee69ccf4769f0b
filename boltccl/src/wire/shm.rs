//! The shared-memory hello (`crate::transport::shm`): what a local rank sends with its inbox's
//! two file descriptors over a Unix socket, in a fixed little-endian layout.

use crate::error::{Error, Result};

/// What a rank says with its inbox: which job and rank it is, and where a word of its memory
/// holding the job id is, for the peer to check it can pull from this process.
#[derive(Clone, Copy)]
pub(crate) struct Hello {
    pub(crate) job: u64,
    pub(crate) rank: u32,
    pub(crate) pid: u32,
    pub(crate) probe: u64,
}

/// Bytes of an encoded hello.
pub(crate) const HELLO_LEN: usize = 24;

impl Hello {
    /// The bytes a peer is sent.
    pub(crate) fn encode(&self) -> [u8; HELLO_LEN] {
        let mut msg = [0u8; HELLO_LEN];
        msg[..8].copy_from_slice(&self.job.to_le_bytes());
        msg[8..12].copy_from_slice(&self.rank.to_le_bytes());
        msg[12..16].copy_from_slice(&self.pid.to_le_bytes());
        msg[16..].copy_from_slice(&self.probe.to_le_bytes());
        msg
    }

    /// The hello in `msg` (any bytes decode: [`Hello::check`] says whether they belong).
    pub(crate) fn decode(msg: &[u8; HELLO_LEN]) -> Hello {
        Hello {
            job: u64::from_le_bytes(msg[..8].try_into().expect("8 bytes")),
            rank: u32::from_le_bytes(msg[8..12].try_into().expect("4 bytes")),
            pid: u32::from_le_bytes(msg[12..16].try_into().expect("4 bytes")),
            probe: u64::from_le_bytes(msg[16..].try_into().expect("8 bytes")),
        }
    }

    /// Fail unless the hello is from rank `q` of job `job`.
    pub(crate) fn check(self, job: u64, q: usize) -> Result<()> {
        if self.job != job || self.rank as usize != q {
            return Err(Error::Protocol {
                from: format!("rank {q}"),
                detail: format!(
                    "shared-memory hello for job {:#x} rank {} (expected job {job:#x} rank {q})",
                    self.job, self.rank
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_names_a_stranger() {
        let h = Hello { job: 0x1234_5678_9abc, rank: 3, pid: 77, probe: 0xdead_beef };
        let back = Hello::decode(&h.encode());
        assert_eq!((back.job, back.rank, back.pid, back.probe), (h.job, h.rank, h.pid, h.probe));
        assert!(back.check(h.job, 3).is_ok());
        assert!(back.check(h.job, 2).is_err(), "another rank");
        assert!(back.check(h.job + 1, 3).is_err(), "another job");
    }
}
