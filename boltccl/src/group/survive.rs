//! Groups that survive a lost rank: [`Group::abort`] from any thread, [`Group::shrink`] to the
//! ranks still there over the links they have (see `Transport::shrink`), and [`Group::grow`]
//! back to full size with replacement processes.

use super::*;

impl Shared {
    /// If [`Group::abort`] was raised, tell the other ranks (once; the transport's abort is
    /// idempotent) — when the links are free, else the call holding them does it.
    pub(super) fn tell_abort(&self) {
        if self.retired.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if let Some(e) = self.abort.error() {
            if let Some(mut t) = self.transport.try_lock() {
                t.abort(&e);
            }
        }
    }
}

impl Group {
    /// Abort the group: callable from any thread (a signal handler included) while a call is
    /// blocked or in flight on another; never blocks, and a second call does nothing.
    ///
    /// The call in flight returns [`Error::Aborted`] naming this rank at once, the other ranks
    /// learn within moments (their calls fail naming this rank), and the group is poisoned:
    /// later calls return [`Error::Poisoned`]. [`Group::shrink`] makes a working group again.
    /// Groups split from this one share its links and are aborted with it.
    pub fn abort(&self) {
        let rank = self.core.members[self.core.me];
        let e = Error::Aborted { rank, reason: format!("rank {rank} called abort()") };
        // Not the poison: setting it could wait for a thread this one interrupted (a signal
        // handler). Calls read the abort right after the poison.
        if self.core.shared.abort.raise(e) {
            self.core.shared.tell_abort();
        }
    }

    /// Go on without the ranks that are lost: the survivors (the ranks that call `shrink`
    /// within `BOLTCCL_TIMEOUT_MS`) agree on who is there and each gets a new group of them,
    /// ranks renumbered densely in this group's order. Works on a poisoned group (after a rank
    /// died, or [`Group::abort`]) and on a healthy one.
    ///
    /// The links among the survivors are reused — TCP connections, shared-memory rings and RDMA
    /// queue pairs — with no coordinator, no new connection and no new queue pair; what the
    /// failed calls left on them is dropped. (An RDMA link whose queue pair had to be moved to
    /// the error state, to stop zero-copy sends after a failure, cannot be kept: the shrink
    /// gets [`Error::InvalidArgument`] saying so.) A rank that is alive but does not call `shrink`
    /// in time is left out, and its own `shrink` then fails saying so. Ranks that fail during
    /// the shrink make it fail (within the deadline, on every survivor) rather than give two
    /// different groups: call `shrink` again.
    ///
    /// The new group takes over the links: this group, and every group split from it or it
    /// from, is done (its calls return [`Error::Poisoned`]).
    pub fn shrink(&self) -> Result<Group> {
        self.shrink_excluding(&[])
    }

    /// [`Group::shrink`], leaving out the ranks `exclude` (ranks of this group) whatever they
    /// do. Every survivor must pass the same list.
    pub fn shrink_excluding(&self, exclude: &[usize]) -> Result<Group> {
        let core = &self.core;
        for &r in exclude {
            core.check_rank("excluded rank", r)?;
        }
        if exclude.contains(&core.me) {
            return Err(Error::invalid(format!("rank {} cannot exclude itself from the group it shrinks", core.me)));
        }
        // Started calls end first (at once, on a poisoned group).
        self.queue.wait_idle()?;
        let _st = core.state.try_lock().ok_or(Error::Busy)?;
        let shared = &core.shared;
        let candidates: Vec<usize> =
            core.members.iter().enumerate().filter(|(g, _)| !exclude.contains(g)).map(|(_, &t)| t).collect();
        let started = std::time::Instant::now();
        let survivors = {
            let mut t = shared.transport.lock();
            match t.shrink(&candidates, shared.cfg.timeout) {
                Ok(s) => s,
                Err(e) => {
                    let _ = shared.poison.set(e.clone());
                    return Err(e);
                }
            }
        };
        shared.retired.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = shared.poison.set(Error::invalid("this group was shrunk: use the group that shrink() returned"));
        let members: Vec<usize> = core.members.iter().copied().filter(|t| survivors.contains(t)).collect();
        let me = members
            .iter()
            .position(|&t| t == core.members[core.me])
            .ok_or_else(|| Error::Internal("shrink lost this rank".into()))?;
        tracing::debug!(rank = me, size = members.len(), took = ?started.elapsed(), "shrink: new group");
        let next = Arc::new(Shared {
            transport: shared.transport.clone(),
            poison: OnceLock::new(),
            abort: Arc::new(AbortSignal::new().map_err(|e| Error::local_io("abort signal", e))?),
            retired: Default::default(),
            generation: shared.generation + 1,
            interrupt: Mutex::new(shared.interrupt.lock().clone()),
            cfg: shared.cfg.clone(),
            cabling: shared.cabling.clone(),
            kinds: shared.kinds.clone(),
        });
        let size = members.len();
        Ok(Group::from_core(Core {
            cabling: next.cabling.subset(&members),
            chunk: chunk_of(&next, &members, me),
            id: mix(core.id, next.generation, u32::MAX),
            shared: next,
            members,
            me,
            state: Mutex::new(State::new(size)),
        }))
    }

    /// Form a group of `size` ranks with replacement processes, through the normal bootstrap:
    /// this group's ranks keep their order as ranks `0..self.size()` and the newcomers, started
    /// with `BOLTCCL_RANK` `self.size()..size`, `BOLTCCL_WORLD_SIZE=size`, and the same
    /// `coordinator` and `job_key`, take the rest. New rank 0 (a rank of this group) listens on
    /// `coordinator`; a fresh `job_key` per generation keeps a straggler of an older one out.
    ///
    /// Every member of this group calls it. The new group takes this group's settings
    /// (backend, deadlines, chunking) and makes every link anew (TCP connections, shared-memory
    /// segments, RDMA queue pairs): joining reuses the processes and whatever they hold (a
    /// loaded model, a job's state), not the links. This group is left as it is: drop it when
    /// the new one is formed. A group formed from an RDMA device matrix
    /// (`BOLTCCL_IBV_DEVICES`) gets [`Error::InvalidArgument`]: the matrix names ranks, so form
    /// the new group with [`Group::new`] and a matrix for the new numbering.
    pub fn grow(&self, size: usize, coordinator: &str, job_key: &str) -> Result<Group> {
        if size < self.size() {
            return Err(Error::invalid(format!(
                "grow to {size} ranks: this group already has {}; shrink() leaves ranks out",
                self.size()
            )));
        }
        let cfg = self.config();
        if cfg.ibv_devices.is_some() {
            return Err(Error::invalid(
                "grow: this group's RDMA device matrix (BOLTCCL_IBV_DEVICES) names ranks by their old numbers; \
                 form the new group with Group::new and a matrix for the new numbering",
            ));
        }
        Group::new(Config {
            rank: self.rank(),
            world_size: size,
            coordinator: Some(coordinator.to_string()),
            job_key: Some(job_key.to_string()),
            // Both were given per rank of the old numbering; the bootstrap finds them anew.
            hosts: None,
            local_world_size: None,
            ..cfg.clone()
        })
    }
}
