//! `boltccl bench`: an nccl-tests-style sweep of the collectives.
//!
//! Per size: a warm-up, rank 0's time estimate shared so every rank runs the same number of
//! timed iterations (each timed on its own), the median per rank, and the slowest rank's
//! median reported: a collective is done when its slowest rank is. algbw = size / time;
//! busbw = algbw × the nccl-tests factor (2(n-1)/n for all_sum, (n-1)/n for all_gather,
//! reduce_scatter, all_to_all, gather and scatter, 1 for broadcast, reduce and send/recv). The same protocol as the peers' scripts in
//! `shared/bench/peers`, so the figures compare directly.

use boltccl::{Collective, Group, LinkKind};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// A benchmarked operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// In-place all_sum of the buffer.
    AllSum,
    /// all_gather into a buffer of `size` bytes (each rank contributes size/n).
    AllGather,
    /// reduce_scatter of a `size`-byte buffer (each rank keeps size/n).
    ReduceScatter,
    /// broadcast of the buffer from rank 0.
    Broadcast,
    /// send to the next rank and receive from the previous one (even ranks send first).
    Sendrecv,
    /// all_to_all of a `size`-byte buffer (size/n to each rank) into another.
    AllToAll,
    /// gather to rank 0 of size/n from each rank into a `size`-byte buffer.
    Gather,
    /// scatter from rank 0 of a `size`-byte buffer, size/n to each rank.
    Scatter,
    /// in-place sum of the buffer to rank 0.
    Reduce,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllSum => "all_sum",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
            Op::Sendrecv => "sendrecv",
            Op::AllToAll => "all_to_all",
            Op::Gather => "gather",
            Op::Scatter => "scatter",
            Op::Reduce => "reduce",
        }
    }

    fn collective(self) -> Collective {
        match self {
            Op::AllSum => Collective::AllReduce,
            Op::AllGather => Collective::AllGather,
            Op::ReduceScatter => Collective::ReduceScatter,
            Op::Broadcast => Collective::Broadcast,
            Op::Sendrecv => Collective::SendRecv,
            Op::AllToAll => Collective::AllToAll,
            Op::Gather => Collective::Gather,
            Op::Scatter => Collective::Scatter,
            Op::Reduce => Collective::Reduce,
        }
    }

    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::AllSum => 2.0 * (n - 1.0) / n,
            Op::AllGather | Op::ReduceScatter | Op::AllToAll | Op::Gather | Op::Scatter => (n - 1.0) / n,
            Op::Broadcast | Op::Sendrecv | Op::Reduce => 1.0,
        }
    }
}

/// How the benchmark's buffers are paged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pages {
    /// Buffers of 4 MiB or more are advised onto transparent huge pages (`MADV_HUGEPAGE`), as
    /// numpy does for its arrays (and so the peers' mpi4py harness).
    Huge,
    /// Ordinary pages, as a torch tensor or a Rust `Vec` gets by default.
    Small,
}

/// Buffers from this size up are advised onto huge pages under [`Pages::Huge`] (numpy's
/// threshold).
const HUGE_FROM: usize = 4 << 20;

/// Options of `boltccl bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Launch this many local ranks that run the benchmark (without it, run as one rank of
    /// a job started by `boltccl launch`, mpirun, ...).
    #[arg(short = 'n', long)]
    pub ranks: Option<usize>,
    /// Operations to measure (all-to-all, gather, scatter and reduce too, when named).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "all-sum,all-gather,reduce-scatter,broadcast,sendrecv"
    )]
    pub ops: Vec<Op>,
    /// Smallest size (bytes; K, M, G suffixes allowed).
    #[arg(short = 'b', long, default_value = "4")]
    pub min_bytes: String,
    /// Largest size.
    #[arg(short = 'e', long, default_value = "256M")]
    pub max_bytes: String,
    /// Size multiplication factor between steps.
    #[arg(short = 'f', long, default_value_t = 4)]
    pub factor: usize,
    /// Explicit comma-separated sizes (overrides -b/-e/-f).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<String>,
    /// Timed seconds per size (10 to 10000 iterations).
    #[arg(long, default_value_t = 0.5)]
    pub budget_s: f64,
    /// Timed iterations per size, instead of a time budget (slow links, long runs).
    #[arg(long)]
    pub iters: Option<usize>,
    /// Warm-up iterations per size (default: 50 up to 64 KiB, 10 up to 1 MiB, 3 above).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Paging of the buffers: shared-memory transfers of large buffers run up to twice as fast
    /// on huge pages (Linux; elsewhere both are ordinary pages).
    #[arg(long, value_enum, default_value = "huge")]
    pub pages: Pages,
    /// Skip the correctness check.
    #[arg(long)]
    pub no_check: bool,
    /// Append one JSON record per (op, size) to this file (rank 0).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw bus bandwidth and latency against size into this SVG file (rank 0).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Name used in JSON records (for side-by-side reports).
    #[arg(long, default_value = "boltccl")]
    pub label: String,
    /// Round number recorded in JSON records.
    #[arg(long, default_value_t = 1)]
    pub round: u32,
}

/// One measured row.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    peer: String,
    op: &'static str,
    n: usize,
    bytes: usize,
    iters: usize,
    median_us: f64,
    algbw_gbps: f64,
    busbw_gbps: f64,
    correct: Option<bool>,
    round: u32,
    algo: String,
    pages: Pages,
    peak_rss_mib: f64,
    user_buffers_mib: f64,
}

impl Record {
    pub(crate) fn op(&self) -> &'static str {
        self.op
    }
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
    pub(crate) fn busbw(&self) -> f64 {
        self.busbw_gbps
    }
    pub(crate) fn median_us(&self) -> f64 {
        self.median_us
    }
    pub(crate) fn ranks(&self) -> usize {
        self.n
    }
}

/// Parse `4`, `1K`, `64M`, `1G` (powers of two).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1usize << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().map(|v| v * mult).map_err(|_| format!("not a size: {s:?} (examples: 4, 64K, 16M)"))
}

fn sizes(a: &BenchArgs) -> Result<Vec<usize>, String> {
    if !a.sizes.is_empty() {
        return a.sizes.iter().map(|s| parse_size(s)).collect();
    }
    let (lo, hi) = (parse_size(&a.min_bytes)?, parse_size(&a.max_bytes)?);
    if a.factor < 2 || lo == 0 || lo > hi {
        return Err("need 0 < min-bytes <= max-bytes and factor >= 2".into());
    }
    let mut v = vec![];
    let mut s = lo;
    while s <= hi {
        v.push(s);
        s = s.saturating_mul(a.factor);
    }
    Ok(v)
}

fn human(b: usize) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|k| k.parse::<f64>().ok()))
        .map(|kib| kib / 1024.0)
        .unwrap_or(f64::NAN)
}

/// Entry point: launch ranks, or run as a rank.
pub fn run(args: &BenchArgs) -> i32 {
    if let (Some(n), true) = (args.ranks, std::env::var(boltccl::config::RANK).is_err()) {
        let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "boltccl".into());
        let mut command = vec![exe];
        command.extend(std::env::args().skip(1));
        return boltccl_launch::run(&boltccl_launch::Job::local(n, command));
    }
    match bench(args) {
        Ok(true) => 0,
        Ok(false) => {
            eprintln!("boltccl bench: a correctness check failed");
            1
        }
        Err(e) => {
            eprintln!("boltccl bench: {e}");
            1
        }
    }
}

/// The two float32 buffers every measurement uses, sized for the largest one, allocated once.
struct Buffers {
    a: F32Buf,
    b: F32Buf,
    /// User buffer memory touched so far (pages never written are not resident).
    touched: usize,
}

/// A float32 buffer in a mapping of its own, so that how it is paged can be chosen.
struct F32Buf(memmap2::MmapMut);

impl F32Buf {
    fn new(elems: usize, pages: Pages) -> std::io::Result<F32Buf> {
        let map = memmap2::MmapOptions::new().len(elems.max(1) * 4).map_anon()?;
        #[cfg(target_os = "linux")]
        if pages == Pages::Huge && map.len() >= HUGE_FROM {
            map.advise(memmap2::Advice::HugePage)?;
        }
        #[cfg(not(target_os = "linux"))]
        let _ = pages;
        Ok(F32Buf(map))
    }

    fn as_mut(&mut self) -> &mut [f32] {
        // A mapping is page-aligned and its length a multiple of 4: the cast cannot fail.
        bytemuck::cast_slice_mut(&mut self.0[..])
    }
}

/// Whether `op`'s buffer of `count` elements is made of one block per rank.
fn blocked(op: Op) -> bool {
    matches!(op, Op::AllGather | Op::ReduceScatter | Op::AllToAll | Op::Gather | Op::Scatter)
}

/// Elements a row of `size` bytes moves: whole float32 elements, divisible among `n` ranks
/// where the operation needs it.
fn elements(op: Op, size: usize, n: usize) -> usize {
    let unit = if blocked(op) { 4 * n } else { 4 };
    (size.div_ceil(unit) * unit / 4).max(if unit == 4 { 1 } else { n })
}

/// One call of `op` on `count` elements (for all_gather, reduce_scatter, gather and scatter,
/// `count` is the larger buffer; the root is rank 0).
fn call(g: &Group, op: Op, count: usize, a: &mut [f32], b: &mut [f32]) -> boltccl::Result<()> {
    let (rank, n) = (g.rank(), g.size());
    match op {
        Op::AllSum => g.all_sum(&mut a[..count]),
        Op::AllGather => g.all_gather(&a[..count / n], &mut b[..count]),
        Op::ReduceScatter => g.reduce_scatter(&a[..count], &mut b[..count / n]),
        Op::Broadcast => g.broadcast(&mut a[..count], 0),
        Op::Sendrecv if n == 1 => Ok(()),
        Op::Sendrecv => {
            let (to, from) = ((rank + 1) % n, (rank + n - 1) % n);
            if rank % 2 == 0 {
                g.send(&a[..count], to)?;
                g.recv(&mut b[..count], from)
            } else {
                g.recv(&mut b[..count], from)?;
                g.send(&a[..count], to)
            }
        }
        Op::AllToAll => g.all_to_all(&a[..count], &mut b[..count]),
        Op::Gather => g.gather(&a[..count / n], if rank == 0 { &mut b[..count] } else { &mut [] }, 0),
        Op::Scatter => g.scatter(if rank == 0 { &a[..count] } else { &[] }, &mut b[..count / n], 0),
        Op::Reduce => g.reduce(&mut a[..count], boltccl::ReduceOp::Sum, 0),
    }
}

/// Warm up, agree on an iteration count (rank 0's estimate, or `--iters`), time every call:
/// (iterations, the slowest rank's median in microseconds).
fn time(g: &Group, args: &BenchArgs, op: Op, count: usize, bufs: &mut Buffers) -> boltccl::Result<(usize, f64)> {
    let size = count * 4;
    let warm = args.warmup.unwrap_or(match size {
        s if s <= 64 << 10 => 50,
        s if s <= 1 << 20 => 10,
        _ => 3,
    });
    let t = Instant::now();
    for _ in 0..warm {
        call(g, op, count, bufs.a.as_mut(), bufs.b.as_mut())?;
    }
    let iters = match args.iters {
        Some(n) => n.max(1),
        None => {
            let mut est = [if g.rank() == 0 { t.elapsed().as_secs_f64() / warm.max(1) as f64 } else { 0.0 }];
            g.all_max(&mut est)?;
            ((args.budget_s / est[0].max(1e-9)) as usize).clamp(10, 10_000)
        }
    };
    let mut lat = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        call(g, op, count, bufs.a.as_mut(), bufs.b.as_mut())?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    let mut med = [lat[iters / 2]];
    g.all_max(&mut med)?;
    Ok((iters, med[0]))
}

/// How the group's pairs are linked, e.g. "6 pairs over shared memory" (counted on every rank).
fn links(g: &Group) -> boltccl::Result<String> {
    const KINDS: [LinkKind; 3] = [LinkKind::SharedMemory, LinkKind::Rdma, LinkKind::Tcp];
    let mut counts = [0u32; 3];
    for p in (0..g.size()).filter(|&p| p != g.rank()) {
        let kind = g.link_kind(p)?;
        if let Some(i) = KINDS.iter().position(|&k| k == kind) {
            counts[i] += 1;
        }
    }
    g.all_sum(&mut counts)?;
    let parts: Vec<String> = KINDS
        .iter()
        .zip(counts)
        .filter(|(_, c)| *c > 0)
        .map(|(k, c)| format!("{} pair{} over {}", c / 2, if c / 2 == 1 { "" } else { "s" }, k.name()))
        .collect();
    Ok(if parts.is_empty() { "none (one rank)".into() } else { parts.join(", ") })
}

fn print_header(g: &Group, args: &BenchArgs, links: &str) {
    let cfg = g.config();
    println!(
        "# boltccl bench: {} ranks, float32, BOLTCCL_ALGO {}, chunk {}, budget {} s per size, busy-poll {}",
        g.size(),
        cfg.algo.name(),
        human(g.chunk_bytes()),
        args.budget_s,
        cfg.spin.map(|d| format!("{} us", d.as_micros())).unwrap_or_else(|| "auto".into())
    );
    println!("# links: {links}");
    println!(
        "# buffers: {} (transparent huge pages: {})",
        match args.pages {
            Pages::Huge =>
                "advised onto huge pages from 4 MiB, as numpy's arrays are (--pages small: as a torch tensor's)",
            Pages::Small => "ordinary pages, as a torch tensor's (--pages huge: as numpy's arrays)",
        },
        boltccl::probe::transparent_huge_pages().unwrap_or_else(|| "none on this system".into())
    );
    println!(
        "# {:>10}  {:<15} {:<7} {:>12} {:>12} {:>12} {:>7}  check",
        "size", "op", "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "iters"
    );
}

fn print_row(rec: &Record) {
    println!(
        "  {:>10}  {:<15} {:<7} {:>12.1} {:>12.4} {:>12.4} {:>7}  {}",
        human(rec.bytes),
        rec.op,
        rec.algo,
        rec.median_us,
        rec.algbw_gbps,
        rec.busbw_gbps,
        rec.iters,
        match rec.correct {
            Some(true) => "ok",
            Some(false) => "WRONG",
            None => "-",
        }
    );
}

fn append_json(path: &std::path::Path, rec: &Record) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(f, "{}", serde_json::to_string(rec).expect("serialisable")).map_err(|e| e.to_string())
}

fn bench(args: &BenchArgs) -> Result<bool, String> {
    let sizes = sizes(args)?;
    let g = boltccl::init().map_err(|e| e.to_string())?;
    let (rank, n) = (g.rank(), g.size());
    let largest = *sizes.iter().max().unwrap_or(&4);
    let elems = largest.div_ceil(4 * n) * n;
    let buf =
        || F32Buf::new(elems, args.pages).map_err(|e| format!("cannot map {} bytes for the buffers: {e}", elems * 4));
    let mut bufs = Buffers { a: buf()?, b: buf()?, touched: 0 };
    let links = links(&g).map_err(|e| e.to_string())?;
    if rank == 0 {
        print_header(&g, args, &links);
    }
    let mut records = Vec::new();
    let mut all_ok = true;
    for &op in &args.ops {
        for &size in &sizes {
            let count = elements(op, size, n);
            let (iters, median_us) = time(&g, args, op, count, &mut bufs).map_err(|e| e.to_string())?;
            let correct = if args.no_check {
                None
            } else {
                Some(check(&g, op, count, bufs.a.as_mut(), bufs.b.as_mut()).map_err(|e| e.to_string())?)
            };
            all_ok &= correct != Some(false);
            let bytes = count * 4;
            bufs.touched = bufs.touched.max(match op {
                Op::AllSum | Op::Broadcast | Op::Reduce => bytes,
                Op::AllGather | Op::ReduceScatter | Op::Gather | Op::Scatter => bytes + bytes / n,
                Op::Sendrecv | Op::AllToAll => 2 * bytes,
            });
            let algbw = bytes as f64 / (median_us * 1e-6) / 1e9;
            let rec = Record {
                peer: args.label.clone(),
                op: op.name(),
                n,
                bytes,
                iters,
                median_us,
                algbw_gbps: algbw,
                busbw_gbps: algbw * op.bus_factor(n),
                correct,
                round: args.round,
                algo: g.algorithm(op.collective(), bytes).name().into(),
                pages: args.pages,
                peak_rss_mib: peak_rss_mib(),
                user_buffers_mib: bufs.touched as f64 / (1 << 20) as f64,
            };
            if rank == 0 {
                print_row(&rec);
                if let Some(path) = &args.json {
                    append_json(path, &rec)?;
                }
            }
            records.push(rec);
        }
    }
    let mut peak = [peak_rss_mib()];
    g.all_max(&mut peak).map_err(|e| e.to_string())?;
    if rank == 0 {
        let user_mib = bufs.touched as f64 / (1 << 20) as f64;
        println!(
            "# memory: peak RSS of the largest rank {:.0} MiB, of which user buffers touched {:.0} MiB: \
             everything else (library, scratch, program) at most {:.0} MiB",
            peak[0],
            user_mib,
            (peak[0] - user_mib).max(0.0)
        );
        if let Some(path) = &args.plot {
            crate::plot::draw(path, &records).map_err(|e| format!("plot {}: {e}", path.display()))?;
            println!("# plot written to {}", path.display());
        }
    }
    g.barrier().map_err(|e| e.to_string())?;
    Ok(all_ok)
}

/// Rank `rank`'s element `i` in the check: different for every rank and index (so swapped or
/// misplaced blocks show), small enough that sums of any number of ranks stay exact in float32.
fn value(rank: usize, i: usize) -> f32 {
    ((rank * 131 + i * 7) % 1021) as f32
}

/// One call with inputs that depend on rank and index, every element compared with the answer
/// computed here; true when every rank saw the right answer.
fn check(g: &Group, op: Op, count: usize, a: &mut [f32], b: &mut [f32]) -> boltccl::Result<bool> {
    fill(op, g.rank(), g.size(), count, a, b);
    call(g, op, count, a, b)?;
    let ok = verify(op, g.rank(), g.size(), count, a, b);
    let mut flag = [ok as u8];
    g.all_min(&mut flag)?;
    Ok(flag[0] == 1)
}

/// The check's inputs for rank `rank` of `n`: every rank's and index's value different; the
/// buffers a call only writes are filled with -1. Only what the call uses is touched, so the
/// memory report counts the user buffers right.
fn fill(op: Op, rank: usize, n: usize, count: usize, a: &mut [f32], b: &mut [f32]) {
    let m = count / n;
    let fill = |buf: &mut [f32], who: usize| buf.iter_mut().enumerate().for_each(|(i, x)| *x = value(who, i));
    match op {
        Op::AllGather | Op::Gather => fill(&mut a[..m], rank),
        Op::Broadcast if rank != 0 => a[..count].fill(-1.0),
        Op::Scatter if rank != 0 => {}
        _ => fill(&mut a[..count], rank),
    }
    match op {
        Op::AllGather | Op::Sendrecv | Op::AllToAll => b[..count].fill(-1.0),
        Op::Gather if rank == 0 => b[..count].fill(-1.0),
        Op::ReduceScatter | Op::Scatter => b[..m].fill(-1.0),
        Op::AllSum | Op::Broadcast | Op::Reduce | Op::Gather => {}
    }
}

/// Whether rank `rank` of `n` holds the right answer of `op` on the inputs of [`fill`], every
/// element compared.
fn verify(op: Op, rank: usize, n: usize, count: usize, a: &[f32], b: &[f32]) -> bool {
    let sum = |i: usize| (0..n).map(|q| value(q, i)).sum::<f32>();
    let m = count / n;
    match op {
        Op::AllSum => a[..count].iter().enumerate().all(|(i, &x)| x == sum(i)),
        Op::AllGather => b[..count].iter().enumerate().all(|(i, &x)| x == value(i / m.max(1), i % m.max(1))),
        Op::ReduceScatter => b[..m].iter().enumerate().all(|(i, &x)| x == sum(rank * m + i)),
        Op::Broadcast => a[..count].iter().enumerate().all(|(i, &x)| x == value(0, i)),
        Op::Sendrecv if n == 1 => true,
        Op::Sendrecv => b[..count].iter().enumerate().all(|(i, &x)| x == value((rank + n - 1) % n, i)),
        // Block q of the output is block `rank` of rank q's input.
        Op::AllToAll => b[..count].iter().enumerate().all(|(i, &x)| x == value(i / m, rank * m + i % m)),
        Op::Gather if rank != 0 => true,
        Op::Gather => b[..count].iter().enumerate().all(|(i, &x)| x == value(i / m, i % m)),
        Op::Scatter => b[..m].iter().enumerate().all(|(i, &x)| x == value(0, rank * m + i)),
        // The root holds the sum; the other ranks' buffers are as they were.
        Op::Reduce if rank != 0 => a[..count].iter().enumerate().all(|(i, &x)| x == value(rank, i)),
        Op::Reduce => a[..count].iter().enumerate().all(|(i, &x)| x == sum(i)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPS: [Op; 9] = [
        Op::AllSum,
        Op::AllGather,
        Op::ReduceScatter,
        Op::Broadcast,
        Op::Sendrecv,
        Op::AllToAll,
        Op::Gather,
        Op::Scatter,
        Op::Reduce,
    ];

    /// Each rank's correct answer of `op`, computed here (not by boltccl): (a, b).
    fn answers(op: Op, n: usize, count: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
        let m = count / n;
        (0..n)
            .map(|rank| {
                let (mut a, mut b) = (vec![0.0; count], vec![0.0; count]);
                fill(op, rank, n, count, &mut a, &mut b);
                let sum = |i: usize| (0..n).map(|q| value(q, i)).sum::<f32>();
                match op {
                    Op::AllSum => (0..count).for_each(|i| a[i] = sum(i)),
                    Op::AllGather => (0..count).for_each(|i| b[i] = value(i / m, i % m)),
                    Op::ReduceScatter => (0..m).for_each(|i| b[i] = sum(rank * m + i)),
                    Op::Broadcast => (0..count).for_each(|i| a[i] = value(0, i)),
                    Op::Sendrecv => (0..count).for_each(|i| b[i] = value((rank + n - 1) % n, i)),
                    Op::AllToAll => (0..count).for_each(|i| b[i] = value(i / m, rank * m + i % m)),
                    Op::Gather if rank == 0 => (0..count).for_each(|i| b[i] = value(i / m, i % m)),
                    Op::Gather => {}
                    Op::Scatter => (0..m).for_each(|i| b[i] = value(0, rank * m + i)),
                    Op::Reduce if rank == 0 => (0..count).for_each(|i| a[i] = sum(i)),
                    Op::Reduce => {}
                }
                (a, b)
            })
            .collect()
    }

    /// The check passes the right answers and catches every kind of misplaced data: two
    /// blocks swapped, one rank's block in another's place, a reduce_scatter block from the
    /// wrong index, a broadcast from the wrong root, a message from the wrong neighbour, two
    /// elements swapped.
    #[test]
    fn the_check_catches_misplaced_blocks() {
        let (n, count) = (4, 64);
        let m = count / n;
        for op in OPS {
            let good = answers(op, n, count);
            for (rank, (a, b)) in good.iter().enumerate() {
                assert!(verify(op, rank, n, count, a, b), "{}: the right answer was refused", op.name());
            }
            let wrong: Vec<(&str, usize, Vec<f32>, Vec<f32>)> = match op {
                Op::AllSum => {
                    let (mut a, b) = good[1].clone();
                    a.swap(3, 4);
                    vec![("two elements swapped", 1, a, b)]
                }
                Op::AllGather => {
                    let (a, mut b) = good[2].clone();
                    let (x, y) = b.split_at_mut(2 * m);
                    x[..m].swap_with_slice(&mut y[..m]); // blocks 0 and 2
                    let (a2, mut b2) = good[0].clone();
                    b2.copy_within(m..2 * m, 3 * m); // block 1 where block 3 belongs
                    vec![("blocks 0 and 2 swapped", 2, a, b), ("block 1 also in block 3's place", 0, a2, b2)]
                }
                Op::ReduceScatter => {
                    let (a, _) = good[1].clone();
                    let b = good[2].1.clone();
                    vec![("rank 2's block on rank 1", 1, a, b)]
                }
                Op::Broadcast => {
                    let (mut a, b) = good[3].clone();
                    fill(Op::AllSum, 1, n, count, &mut a, &mut vec![0.0; count]); // rank 1's data
                    vec![("the data of rank 1, not the root's", 3, a, b)]
                }
                Op::Sendrecv => {
                    let (a, mut b) = good[2].clone();
                    (0..count).for_each(|i| b[i] = value(3, i)); // from the next rank, not the previous
                    vec![("a message from the wrong neighbour", 2, a, b)]
                }
                Op::AllToAll => {
                    let (a, mut b) = good[1].clone();
                    (0..m).for_each(|i| b[2 * m + i] = value(2, 2 * m + i)); // rank 2's own part
                    let (a2, mut b2) = good[3].clone();
                    let (x, y) = b2.split_at_mut(m);
                    x.swap_with_slice(&mut y[..m]); // the parts of ranks 0 and 1 swapped
                    vec![("rank 2's own part, not the one for rank 1", 1, a, b), ("two parts swapped", 3, a2, b2)]
                }
                Op::Gather => {
                    let (a, mut b) = good[0].clone();
                    b.copy_within(m..2 * m, 3 * m); // block 1 where block 3 belongs
                    vec![("block 1 also in block 3's place", 0, a, b)]
                }
                Op::Scatter => {
                    let (a, _) = good[1].clone();
                    let b = good[2].1.clone();
                    vec![("rank 2's block on rank 1", 1, a, b)]
                }
                Op::Reduce => {
                    let (mut a, b) = good[0].clone();
                    a.swap(3, 4);
                    let (mut a2, b2) = good[2].clone();
                    (0..count).for_each(|i| a2[i] = (0..n).map(|q| value(q, i)).sum::<f32>()); // the sum, off the root
                    vec![("two elements swapped", 0, a, b), ("a non-root rank's buffer changed", 2, a2, b2)]
                }
            };
            for (what, rank, a, b) in wrong {
                assert!(!verify(op, rank, n, count, &a, &b), "{}: {what} passed the check", op.name());
            }
        }
    }

    /// And the whole check, through a real 3-rank group, passes every operation.
    #[test]
    fn the_check_passes_real_calls() {
        let groups = Group::local_world(3);
        let hs: Vec<_> = groups
            .into_iter()
            .map(|g| {
                std::thread::spawn(move || {
                    let count = 3 * 1000;
                    let (mut a, mut b) = (vec![0.0f32; count], vec![0.0f32; count]);
                    OPS.iter().all(|&op| check(&g, op, count, &mut a, &mut b).unwrap())
                })
            })
            .collect();
        assert!(hs.into_iter().all(|h| h.join().unwrap()));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4").unwrap(), 4);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert!(parse_size("lots").is_err());
    }
}
