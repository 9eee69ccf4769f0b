//! Going on after a rank dies: every surviving rank shrinks the group to the survivors
//! ([`boltccl::Group::shrink`], over the links they already have) and loads its new shard for
//! the smaller world from the same mapped file, then the engine goes on.
//!
//! Each rank does this where the failure found it: rank 0's worker in the request it was
//! running (or in an idle heartbeat), a follower in the broadcast it was waiting in or in the
//! decode step it was running; the failed collective reaches every survivor within moments
//! (boltccl names the dead rank everywhere), so they all arrive at `shrink` well inside its
//! deadline. The survivors then tell each other their rank at start-up, so that every one
//! knows who was lost, in the numbering the job was started with, and whether rank 0, the
//! only one serving HTTP, is still there: when it is not, the others leave.

use std::time::{Duration, Instant};

use anyhow::Context;

use crate::comm::{Comm, SingleRank};
use crate::loader::WeightSource;
use crate::model::{LoadOptions, Model, WeightMode};
use crate::shard::ShardPlan;

/// The ranks this process runs with.
pub enum Link {
    /// No group: one process, nothing to lose.
    Single(SingleRank),
    /// A boltccl group (replaced by its shrunk successor after a death).
    Group(boltccl::Group),
}

/// What the last [`Cluster::shrink`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// The ranks lost, numbered as when the job started.
    pub ranks: Vec<usize>,
    /// Ranks left.
    pub size: usize,
    /// How long the shrink took.
    pub took: Duration,
}

impl Lost {
    /// "rank 2" or "ranks 1 and 2".
    pub fn names(&self) -> String {
        match self.ranks.as_slice() {
            [] => "no rank".into(),
            [r] => format!("rank {r}"),
            rs => {
                let s: Vec<String> = rs.iter().map(usize::to_string).collect();
                let (last, first) = s.split_last().map(|(l, f)| (l.clone(), f.join(", "))).unwrap_or_default();
                format!("ranks {first} and {last}")
            }
        }
    }
}

/// The rank a failed collective blames (in the current group), when `e` is boltccl's error
/// naming one: a rank that died, stalled, aborted or disagreed.
pub fn blamed(e: &anyhow::Error) -> Option<usize> {
    e.chain().find_map(|c| c.downcast_ref::<boltccl::Error>()).and_then(boltccl::Error::rank)
}

/// One rank's part of the cluster: its link to the others, its shard, and the mapped file it
/// was cut from (kept, so that a new shard can be cut from it).
pub struct Cluster {
    weights: Box<dyn WeightSource>,
    link: Link,
    /// `None` only between a shrink and the re-shard that follows it.
    model: Option<Model>,
    /// The current members' ranks at start-up, in the current rank order.
    members: Vec<usize>,
}

impl Cluster {
    /// Loads this rank's shard of `weights` for `link`'s world.
    pub fn new(weights: Box<dyn WeightSource>, link: Link) -> anyhow::Result<Self> {
        let size = match &link {
            Link::Single(c) => c.size(),
            Link::Group(g) => g.size(),
        };
        let mut c = Cluster { weights, link, model: None, members: (0..size).collect() };
        c.reshard()?;
        Ok(c)
    }

    /// The link, as the engine uses it.
    pub fn comm(&self) -> &dyn Comm {
        match &self.link {
            Link::Single(c) => c,
            Link::Group(g) => g,
        }
    }

    /// The boltccl group, when there is one.
    pub fn group(&self) -> Option<&boltccl::Group> {
        match &self.link {
            Link::Single(_) => None,
            Link::Group(g) => Some(g),
        }
    }

    /// This rank's shard.
    pub fn model(&self) -> &Model {
        self.model.as_ref().expect("a shard is loaded outside a heal")
    }

    /// This rank's rank at start-up.
    pub fn first_rank(&self) -> usize {
        self.members[self.comm().rank()]
    }

    /// After the engine failed with `e`: when `e` is a lost rank (a boltccl error that names
    /// one), shrink the group to the ranks still there. Fails when `e` is something else, when
    /// the shrink fails (every survivor then fails: no two groups), or when rank 0, which
    /// serves HTTP, is not among the survivors. The shard is dropped: [`Cluster::reshard`]
    /// must follow.
    pub fn shrink(&mut self, e: &anyhow::Error) -> anyhow::Result<Lost> {
        let Link::Group(g) = &self.link else { anyhow::bail!("a single rank has nothing to heal") };
        let Some(blamed) = blamed(e) else { anyhow::bail!("not a lost rank, nothing to heal") };
        let t = Instant::now();
        let first = self.members.get(blamed).copied().unwrap_or(blamed);
        let next = g.shrink().with_context(|| {
            format!("healing after rank {first} was lost: the survivors could not agree on a group")
        })?;
        // Every survivor learns who the others were at start-up (and so who is gone).
        let me = self.first_rank() as u64;
        let survivors: Vec<usize> = next
            .all_gather_u64(&[me])
            .context("healing: telling the survivors who is who")?
            .into_iter()
            .map(|r| r as usize)
            .collect();
        let took = t.elapsed();
        let ranks: Vec<usize> = self.members.iter().copied().filter(|r| !survivors.contains(r)).collect();
        let lost = Lost { ranks, size: survivors.len(), took };
        self.model = None;
        self.link = Link::Group(next);
        self.members = survivors;
        anyhow::ensure!(
            self.members.first() == Some(&0),
            "rank 0, which served HTTP, is gone ({} lost): nothing left to follow, so this rank leaves (restart the \
             job to serve again)",
            lost.names()
        );
        Ok(lost)
    }

    /// Every member, after rank 0 said [`super::engine::Command::Grow`] (rank 0 after it said
    /// so): forms the larger group with the newcomer ([`boltccl::Group::grow`]) and cuts the
    /// shard for it. The members then agree, over the old group, that every one of them formed
    /// the new one: if any failed (the newcomer never came, or died on the way), all keep the
    /// old group and shard, and this returns `Ok(Err(why))`. Returns how long the grow took;
    /// an error when the old group broke.
    pub fn grow(&mut self, size: usize, coordinator: &str, key: &str) -> anyhow::Result<Result<Duration, String>> {
        let Link::Group(g) = &self.link else { anyhow::bail!("a single rank cannot grow") };
        let t = Instant::now();
        let formed = g.grow(size, coordinator, key);
        let ok = u64::from(formed.is_ok());
        let all_ok =
            g.all_gather_u64(&[ok]).context("agreeing whether the grown group formed")?.iter().all(|&o| o == 1);
        let next = match formed {
            Ok(next) if all_ok => next,
            Ok(_) => return Ok(Err("another rank could not form the grown group".into())),
            Err(e) => return Ok(Err(e.to_string())),
        };
        let me = self.first_rank() as u64;
        let ids = next.all_gather_u64(&[me]).context("telling the grown group who is who")?;
        self.link = Link::Group(next);
        self.members = ids.into_iter().map(|r| r as usize).collect();
        let took = t.elapsed();
        self.reshard()?;
        Ok(Ok(took))
    }

    /// A newcomer ([`super::join`]): forms the group the ticket names, learns who the others
    /// are and loads its shard.
    pub fn join(weights: Box<dyn WeightSource>, group: boltccl::Group, id: usize) -> anyhow::Result<Self> {
        let ids = group.all_gather_u64(&[id as u64]).context("learning who the other ranks are")?;
        let mut c = Cluster { weights, link: Link::Group(group), model: None, members: Vec::new() };
        c.members = ids.into_iter().map(|r| r as usize).collect();
        c.reshard()?;
        Ok(c)
    }

    /// The next newcomer's name: the smallest start-up rank not among the members (the first
    /// lost rank it replaces).
    pub fn next_id(&self) -> usize {
        (0..).find(|r| !self.members.contains(r)).expect("a free name")
    }

    /// Cuts this rank's shard for the current world from the mapped file (only this rank's
    /// rows are read, as at start-up). Returns how long it took.
    pub fn reshard(&mut self) -> anyhow::Result<Duration> {
        let t = Instant::now();
        self.model = None; // the old shard goes first: never two in memory
        let comm = self.comm();
        let plan = ShardPlan::new(self.weights.config(), comm.rank(), comm.size())?;
        let model = Model::load_with(self.weights.as_ref(), plan, LoadOptions { weights: WeightMode::Q8 })
            .context("loading the shard for the smaller group")?;
        self.model = Some(model);
        Ok(t.elapsed())
    }
}
