//! [`Op`]: one call on byte buffers, as the bindings and the non-blocking forms hand it over —
//! its argument checks, and how it runs on a group's links.

use super::*;

/// One call on byte buffers, as the bindings and the non-blocking forms hand it over:
/// checked (`Op::check`) before it is run or queued.
#[derive(Debug)]
pub enum Op<'a> {
    /// Reduce `output` across ranks with `op`; `input: None` means `output` holds the input.
    AllReduce {
        /// The reduction.
        op: ReduceOp,
        /// Element type.
        dtype: DType,
        /// Input, or `None` for in place.
        input: Option<&'a [u8]>,
        /// Output (and input when in place).
        output: &'a mut [u8],
    },
    /// `output` gets every rank's `input`, in rank order.
    AllGather {
        /// Element type.
        dtype: DType,
        /// This rank's block.
        input: &'a [u8],
        /// `size` blocks.
        output: &'a mut [u8],
    },
    /// `input` holds `size` blocks; this rank gets block `rank` reduced with `op`.
    ReduceScatter {
        /// The reduction.
        op: ReduceOp,
        /// Element type.
        dtype: DType,
        /// `size` blocks.
        input: &'a [u8],
        /// This rank's block.
        output: &'a mut [u8],
    },
    /// Every rank's `buf` gets `root`'s.
    Broadcast {
        /// Element type.
        dtype: DType,
        /// The buffer.
        buf: &'a mut [u8],
        /// The sending rank.
        root: usize,
    },
    /// Send `buf` to `peer`.
    Send {
        /// Element type.
        dtype: DType,
        /// The data.
        buf: &'a [u8],
        /// The receiving rank.
        peer: usize,
    },
    /// Receive into `buf` from `peer`.
    Recv {
        /// Element type.
        dtype: DType,
        /// Where the data lands.
        buf: &'a mut [u8],
        /// The sending rank.
        peer: usize,
    },
    /// Wait for every rank.
    Barrier,
    /// `input` holds `size` equal parts; part q goes to rank q, and `output` gets part `rank`
    /// of every rank's input, in rank order.
    AllToAll {
        /// Element type.
        dtype: DType,
        /// `size` parts, one per rank.
        input: &'a [u8],
        /// `size` parts, one from each rank.
        output: &'a mut [u8],
    },
    /// Like `AllToAll` with a count per peer: `input` holds `send_counts[q]` elements for each
    /// rank q in turn, `output` gets `recv_counts[q]` from each. What rank q sends this rank
    /// must be what this rank expects from q.
    AllToAllV {
        /// Element type.
        dtype: DType,
        /// The parts for ranks 0, 1, ..., back to back.
        input: &'a [u8],
        /// Elements for each rank.
        send_counts: &'a [usize],
        /// The parts from ranks 0, 1, ..., back to back.
        output: &'a mut [u8],
        /// Elements from each rank.
        recv_counts: &'a [usize],
    },
    /// The root's `output` gets every rank's `input`, in rank order; other ranks' `output` is
    /// not used (it may be empty).
    Gather {
        /// Element type.
        dtype: DType,
        /// This rank's block.
        input: &'a [u8],
        /// On the root, `size` blocks.
        output: &'a mut [u8],
        /// The receiving rank.
        root: usize,
    },
    /// Rank q's `output` gets block q of the root's `input`; other ranks' `input` is not used
    /// (it may be empty).
    Scatter {
        /// Element type.
        dtype: DType,
        /// On the root, `size` blocks.
        input: &'a [u8],
        /// This rank's block.
        output: &'a mut [u8],
        /// The sending rank.
        root: usize,
    },
    /// The root's `output` gets every rank's input reduced with `op`, with the bits the same
    /// all-reduce gives; other ranks' `output` is not changed.
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// Element type.
        dtype: DType,
        /// Input, or `None` when `output` holds it.
        input: Option<&'a [u8]>,
        /// The root's result (and the input when `input` is `None`).
        output: &'a mut [u8],
        /// The receiving rank.
        root: usize,
    },
}

fn whole(what: &str, len: usize, dtype: DType) -> Result<()> {
    if len % dtype.size() != 0 {
        return Err(Error::invalid(format!("{what} is {len} bytes, not a whole number of {dtype} elements")));
    }
    Ok(())
}

/// Fail unless `whole` (named `what`) is `size` blocks of `block` (named `per`) bytes.
fn blocks(size: usize, what: &str, whole: usize, per: &str, block: usize, dtype: DType) -> Result<()> {
    let e = dtype.size();
    if whole != block * size {
        return Err(Error::invalid(format!(
            "{what} has {} elements but needs size × {per} = {size} × {} = {}",
            whole / e,
            block / e,
            block * size / e
        )));
    }
    Ok(())
}

impl Op<'_> {
    /// The argument checks, made before anything is sent: a failure leaves the group usable.
    pub(super) fn check(&self, g: &Core) -> Result<()> {
        match self {
            Op::AllReduce { dtype, input, output, .. } => {
                whole("the buffer", output.len(), *dtype)?;
                if let Some(i) = input {
                    if i.len() != output.len() {
                        return Err(Error::invalid(format!(
                            "input has {} elements but output has {}: they must be the same length",
                            i.len() / dtype.size(),
                            output.len() / dtype.size()
                        )));
                    }
                }
                Ok(())
            }
            Op::AllGather { dtype, input, output } => {
                whole("the input", input.len(), *dtype)?;
                blocks(g.size(), "all_gather output", output.len(), "input", input.len(), *dtype)
            }
            Op::ReduceScatter { dtype, input, output, .. } => {
                whole("the output", output.len(), *dtype)?;
                blocks(g.size(), "reduce_scatter input", input.len(), "output", output.len(), *dtype)
            }
            Op::Broadcast { dtype, buf, root } => {
                whole("the buffer", buf.len(), *dtype)?;
                g.check_rank("root", *root)
            }
            Op::Send { dtype, buf, peer } => {
                whole("the buffer", buf.len(), *dtype)?;
                g.check_peer(*peer)
            }
            Op::Recv { dtype, buf, peer } => {
                whole("the buffer", buf.len(), *dtype)?;
                g.check_peer(*peer)
            }
            Op::Barrier => Ok(()),
            Op::AllToAll { .. } | Op::AllToAllV { .. } | Op::Gather { .. } | Op::Scatter { .. } | Op::Reduce { .. } => {
                self.check_rooted_and_all_to_all(g)
            }
        }
    }

    /// Run the (checked) call on `g`'s links.
    pub(crate) fn run(self, g: &Core, turn: Turn) -> Result<()> {
        match self {
            Op::AllReduce { op, dtype, input, output } => {
                let plan = select::all_reduce(output.len(), &g.cabling, g.me, &g.shared.cfg);
                let call = Call::new(Collective::AllReduce, dtype, op, output.len());
                g.run(call, turn, |comm, scratch| {
                    if comm.size() == 1 {
                        if let Some(i) = input {
                            output.copy_from_slice(i);
                        }
                        return Ok(());
                    }
                    match &plan {
                        AllReducePlan::OneStep => one_step::all_reduce(comm, scratch, op, dtype, input, output),
                        AllReducePlan::Doubling => doubling::all_reduce(comm, scratch, op, dtype, input, output),
                        AllReducePlan::Ring => ring::all_reduce(comm, scratch, op, dtype, input, output),
                        AllReducePlan::Direct => direct::all_reduce(comm, scratch, op, dtype, input, output),
                        AllReducePlan::Hosts(plan) => hosts::all_reduce(comm, scratch, plan, op, dtype, input, output),
                    }
                })
            }
            Op::AllGather { dtype, input, output } => {
                let plan = select::gather(output.len(), &g.cabling, &g.shared.cfg);
                g.run(Call::new(Collective::AllGather, dtype, ReduceOp::Sum, input.len()), turn, |comm, _| match plan {
                    GatherPlan::Ring => ring_ops::all_gather(comm, input, output, dtype.size()),
                    GatherPlan::Direct => direct::all_gather(comm, input, output),
                })
            }
            Op::ReduceScatter { op, dtype, input, output } => {
                let plan = select::gather(input.len(), &g.cabling, &g.shared.cfg);
                g.run(Call::new(Collective::ReduceScatter, dtype, op, output.len()), turn, |comm, scratch| match plan {
                    GatherPlan::Ring => ring_ops::reduce_scatter(comm, scratch, op, dtype, input, output),
                    GatherPlan::Direct => direct::reduce_scatter(comm, scratch, op, dtype, input, output),
                })
            }
            Op::Broadcast { dtype, buf, root } => {
                let plan = select::broadcast(buf.len(), &g.cabling, &g.shared.cfg);
                let call = Call { root, ..Call::new(Collective::Broadcast, dtype, ReduceOp::Sum, buf.len()) };
                g.run(call, turn, |comm, _| match plan {
                    _ if comm.size() == 1 => Ok(()),
                    BroadcastPlan::Ring => ring_ops::broadcast(comm, buf, root, dtype.size()),
                    BroadcastPlan::Direct => direct::broadcast(comm, buf, root, dtype.size()),
                    BroadcastPlan::FromRoot => direct::broadcast_from_root(comm, buf, root),
                })
            }
            Op::Send { dtype, buf, peer } => {
                let call = Call {
                    p2p: Some((peer, true)),
                    ..Call::new(Collective::SendRecv, dtype, ReduceOp::Sum, buf.len())
                };
                g.run(call, turn, |comm, _| p2p::send(comm, buf, peer))
            }
            Op::Recv { dtype, buf, peer } => {
                let call = Call {
                    p2p: Some((peer, false)),
                    ..Call::new(Collective::SendRecv, dtype, ReduceOp::Sum, buf.len())
                };
                g.run(call, turn, |comm, _| p2p::recv(comm, buf, peer))
            }
            Op::Barrier => g.run(Call::new(Collective::Barrier, DType::U8, ReduceOp::Sum, 0), turn, |comm, _| {
                one_step::barrier(comm)
            }),
            op @ (Op::AllToAll { .. }
            | Op::AllToAllV { .. }
            | Op::Gather { .. }
            | Op::Scatter { .. }
            | Op::Reduce { .. }) => op.run_rooted_and_all_to_all(g, turn),
        }
    }
}

/// Byte offsets of parts of `counts` elements of `e` bytes laid back to back; `None` on
/// overflow.
fn layout(counts: &[usize], e: usize) -> Option<Vec<std::ops::Range<usize>>> {
    let mut at = 0usize;
    counts
        .iter()
        .map(|&n| {
            let end = at.checked_add(n.checked_mul(e)?)?;
            let r = at..end;
            at = end;
            Some(r)
        })
        .collect()
}

impl Op<'_> {
    /// The argument checks of all-to-all, gather, scatter and reduce.
    fn check_rooted_and_all_to_all(&self, g: &Core) -> Result<()> {
        let p = g.size();
        match self {
            Op::AllToAll { dtype, input, output } => {
                whole("the input", input.len(), *dtype)?;
                if input.len() % (p * dtype.size()) != 0 {
                    return Err(Error::invalid(format!(
                        "all_to_all input has {} elements, not a multiple of the group's {p} ranks: \
                         give every rank a part of the same length",
                        input.len() / dtype.size()
                    )));
                }
                blocks(p, "all_to_all output", output.len(), "part", input.len() / p, *dtype)
            }
            Op::AllToAllV { dtype, input, send_counts, output, recv_counts } => {
                for (what, counts, buf, len) in
                    [("send", send_counts, "input", input.len()), ("receive", recv_counts, "output", output.len())]
                {
                    if counts.len() != p {
                        return Err(Error::invalid(format!(
                            "all_to_all_v has {} {what} counts but the group has {p} ranks: give one per rank",
                            counts.len()
                        )));
                    }
                    let total =
                        layout(counts, dtype.size()).and_then(|r| r.last().map(|r| r.end)).unwrap_or(usize::MAX);
                    if total != len {
                        whole(&format!("the {buf}"), len, *dtype)?;
                        return Err(Error::invalid(format!(
                            "all_to_all_v {buf} has {} elements but the {what} counts add up to {}: \
                             make them agree",
                            len / dtype.size(),
                            counts.iter().fold(0usize, |a, &n| a.saturating_add(n))
                        )));
                    }
                }
                let me = g.me;
                if send_counts[me] != recv_counts[me] {
                    return Err(Error::invalid(format!(
                        "all_to_all_v: rank {me} sends itself {} elements but expects {} from itself: \
                         its send and receive counts at index {me} must be equal",
                        send_counts[me], recv_counts[me]
                    )));
                }
                Ok(())
            }
            Op::Gather { dtype, input, output, root } => {
                whole("the input", input.len(), *dtype)?;
                g.check_rank("root", *root)?;
                if g.me == *root {
                    blocks(p, "gather output", output.len(), "input", input.len(), *dtype)?;
                }
                Ok(())
            }
            Op::Scatter { dtype, input, output, root } => {
                whole("the output", output.len(), *dtype)?;
                g.check_rank("root", *root)?;
                if g.me == *root {
                    blocks(p, "scatter input", input.len(), "output", output.len(), *dtype)?;
                }
                Ok(())
            }
            Op::Reduce { dtype, input, output, root, .. } => {
                whole("the buffer", output.len(), *dtype)?;
                if let Some(i) = input {
                    if i.len() != output.len() {
                        return Err(Error::invalid(format!(
                            "reduce input has {} elements but output has {}: they must be the same length",
                            i.len() / dtype.size(),
                            output.len() / dtype.size()
                        )));
                    }
                }
                g.check_rank("root", *root)
            }
            _ => Ok(()),
        }
    }

    /// Run a (checked) all-to-all, gather, scatter or reduce.
    fn run_rooted_and_all_to_all(self, g: &Core, turn: Turn) -> Result<()> {
        match self {
            Op::AllToAll { dtype, input, output } => {
                let pairwise =
                    select::all_to_all(Some(input.len()), &g.cabling, &g.shared.cfg) == AllToAllPlan::Pairwise;
                let call = Call::new(Collective::AllToAll, dtype, ReduceOp::Sum, input.len());
                g.run(call, turn, |comm, _| all_to_all::all_to_all_equal(comm, input, output, pairwise))
            }
            Op::AllToAllV { dtype, input, send_counts, output, recv_counts } => {
                let plan = select::all_to_all(None, &g.cabling, &g.shared.cfg);
                let e = dtype.size();
                let send = layout(send_counts, e).ok_or_else(|| Error::Internal("checked counts overflow".into()))?;
                let recv = layout(recv_counts, e).ok_or_else(|| Error::Internal("checked counts overflow".into()))?;
                let call = Call::new(Collective::AllToAllV, dtype, ReduceOp::Sum, input.len());
                g.run(call, turn, |comm, _| {
                    let counts = all_to_all::Counts { send: send_counts, recv: recv_counts };
                    let pairwise = plan == AllToAllPlan::Pairwise;
                    all_to_all::all_to_all(comm, input, &send, output, &recv, Some(counts), pairwise)
                })
            }
            Op::Gather { dtype, input, output, root } => {
                let call = Call { root, ..Call::new(Collective::Gather, dtype, ReduceOp::Sum, input.len()) };
                g.run(call, turn, |comm, _| match comm.size() {
                    1 => {
                        output.copy_from_slice(input);
                        Ok(())
                    }
                    _ => rooted::gather(comm, input, output, root),
                })
            }
            Op::Scatter { dtype, input, output, root } => {
                let call = Call { root, ..Call::new(Collective::Scatter, dtype, ReduceOp::Sum, output.len()) };
                g.run(call, turn, |comm, _| match comm.size() {
                    1 => {
                        output.copy_from_slice(input);
                        Ok(())
                    }
                    _ => rooted::scatter(comm, input, output, root),
                })
            }
            Op::Reduce { op, dtype, input, output, root } => {
                let plan = select::reduce(output.len(), &g.cabling, g.me, &g.shared.cfg);
                let call = Call { root, ..Call::new(Collective::Reduce, dtype, op, output.len()) };
                g.run(call, turn, |comm, scratch| {
                    if comm.size() == 1 {
                        if let Some(i) = input {
                            output.copy_from_slice(i);
                        }
                        return Ok(());
                    }
                    rooted::reduce(comm, scratch, &plan, op, dtype, input, output, root)
                })
            }
            _ => Err(Error::Internal("not an all-to-all or rooted call".into())),
        }
    }
}
