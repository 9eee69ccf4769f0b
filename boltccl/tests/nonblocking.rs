//! Non-blocking calls (ranks as threads): they run while the caller goes on, complete in the
//! order they were started (blocking calls included), keep deadlines, poisoning and the
//! dead-rank report, and a scope never returns while one still borrows its buffers.

use boltccl::{Config, Error, ErrorKind, Group, Op, ReduceOp};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn world(n: usize, timeout_ms: u64) -> Vec<Group> {
    Group::local_world_with(n, &Config { timeout: Duration::from_millis(timeout_ms), ..Config::default() })
}

fn on_threads<T: Send>(groups: Vec<Group>, f: impl Fn(usize, &Group) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = groups
            .iter()
            .enumerate()
            .map(|(r, g)| {
                s.spawn({
                    let f = &f;
                    move || f(r, g)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a rank thread panicked")).collect()
    })
}

#[test]
fn a_started_call_runs_while_the_caller_goes_on() {
    let out = on_threads(world(2, 5000), |r, g| {
        let mut x = vec![r as f32 + 1.0; 1 << 16];
        let mut seen_pending = false;
        g.scope(|s| {
            if r == 1 {
                std::thread::sleep(Duration::from_millis(300));
            }
            let req = s.all_sum(&mut x)?;
            if r == 0 {
                // Rank 1 has not joined yet: the call is in flight, and this thread is free.
                seen_pending = req.test().is_none();
            }
            req.wait()
        })
        .unwrap();
        (x[0], x[x.len() - 1], seen_pending)
    });
    assert_eq!(out[0], (3.0, 3.0, true));
    assert_eq!(out[1].0, 3.0);
}

#[test]
fn calls_complete_in_the_order_started_and_blocking_calls_wait_their_turn() {
    let out = on_threads(world(3, 5000), |r, g| {
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut bufs: Vec<Vec<u32>> = (0..8).map(|i| vec![(r * 10 + i) as u32; 1000 + i]).collect();
        let mut gathered = vec![0u32; 3];
        let bufs_ref = &mut bufs;
        g.scope(move |s| {
            for (i, b) in bufs_ref.iter_mut().enumerate() {
                let req = s.all_sum(b.as_mut_slice())?;
                let order = order.clone();
                req.on_complete(Box::new(move |_| order.lock().push(i)));
            }
            // A blocking call made while they are queued: it must come after the eight.
            g.all_gather(&[r as u32], &mut gathered)?;
            let done = order.lock().clone();
            Ok((done, gathered))
        })
        .map(|(done, gathered)| (bufs.iter().map(|b| b[0]).collect::<Vec<_>>(), done, gathered))
        .unwrap()
    });
    for (sums, done, gathered) in out {
        assert_eq!(done, (0..8).collect::<Vec<_>>(), "completed in start order, before the blocking call");
        assert_eq!(gathered, vec![0, 1, 2]);
        for (i, s) in sums.iter().enumerate() {
            assert_eq!(*s, (30 + 3 * i) as u32);
        }
    }
}

#[test]
fn a_blocking_call_after_started_ones_is_not_reordered() {
    // Rank 0 starts a broadcast and then makes a blocking all_sum; rank 1 makes both blocking.
    // If the blocking call overtook the queued one, the ranks would disagree (mismatch).
    for _ in 0..20 {
        let out = on_threads(world(2, 5000), |r, g| {
            let mut b = [r as u64 + 7; 64];
            let mut x = [1u64; 3];
            if r == 0 {
                g.scope(|s| {
                    let req = s.broadcast(&mut b, 1)?;
                    g.all_sum(&mut x)?;
                    req.wait()
                })
                .unwrap();
            } else {
                g.broadcast(&mut b, 1).unwrap();
                g.all_sum(&mut x).unwrap();
            }
            (b[0], x[0])
        });
        assert_eq!(out, vec![(8, 2), (8, 2)]);
    }
}

#[test]
fn a_failed_call_surfaces_at_wait_and_poisons_the_group() {
    let mut gs = world(2, 300);
    let _silent = gs.pop().unwrap();
    let g0 = gs.pop().unwrap();
    let mut x = [1f32; 8];
    let t = Instant::now();
    let e = g0.scope(|s| s.all_sum(&mut x)?.wait()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert_eq!(e.rank(), Some(1));
    assert!(t.elapsed() < Duration::from_secs(5));
    let again = g0.barrier().unwrap_err();
    assert!(matches!(&again, Error::Poisoned(inner) if inner.kind() == ErrorKind::Timeout), "{again}");
}

#[test]
fn an_unwaited_failure_is_the_scope_result_and_a_dead_rank_is_named() {
    let mut gs = world(2, 5000);
    let g1 = gs.pop().unwrap();
    let g0 = gs.pop().unwrap();
    let t = Instant::now();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(g1); // rank 1 leaves without calling
    });
    let mut x = [1f32; 8];
    let e = g0
        .scope(|s| {
            let _ = s.all_sum(&mut x)?;
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::PeerLost | ErrorKind::Aborted), "{e}");
    assert_eq!(e.rank(), Some(1));
    assert!(t.elapsed() < Duration::from_secs(4), "named at once, not at the deadline");
}

#[test]
fn argument_errors_come_back_at_start_and_leave_the_group_usable() {
    let out = on_threads(world(2, 5000), |_, g| {
        let mut out = vec![0f32; 5];
        let input = [1f32, 2.0];
        let e = g.scope(|s| s.all_gather(&input, &mut out).map(|_| ())).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let mut x = [1i32; 2];
        g.scope(|s| s.all_sum(&mut x)?.wait()).unwrap();
        x
    });
    assert_eq!(out, vec![[2, 2], [2, 2]]);
}

#[test]
fn a_scope_that_panics_still_waits_for_its_calls() {
    let out = on_threads(world(2, 5000), |r, g| {
        let mut x = vec![1u8; 1 << 20];
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            g.scope(|s| {
                let _req = s.all_sum(&mut x)?;
                if r == 0 {
                    panic!("user code failed");
                }
                Ok(())
            })
        }));
        // The panic came back only after the all_sum finished writing x.
        (caught.is_err(), x.iter().all(|&v| v == 2))
    });
    assert_eq!(out, vec![(true, true), (false, true)]);
}

#[test]
fn a_blocking_call_from_a_completion_function_is_refused_not_a_deadlock() {
    let out = on_threads(world(2, 5000), |r, g| {
        let mut x = [1u16; 4];
        let mut y = [1u16; 4];
        if r == 1 {
            // Joins late, so both of rank 0's calls are still queued when it adds the function.
            std::thread::sleep(Duration::from_millis(200));
            g.all_sum(&mut x).unwrap();
            g.all_sum(&mut y).unwrap();
            return None;
        }
        let got = Arc::new(Mutex::new(None));
        let slot = got.clone();
        // The group outlives its progress thread, which runs the function (Group::drop joins it).
        let gp = g as *const Group as usize;
        g.scope(|s| {
            let a = s.all_sum(&mut x)?;
            let b = s.all_sum(&mut y)?;
            a.on_complete(Box::new(move |_| {
                // SAFETY: see above.
                let g = unsafe { &*(gp as *const Group) };
                *slot.lock() = Some(g.barrier().map_err(|e| e.kind()));
            }));
            b.wait()
        })
        .unwrap();
        let r = got.lock().take();
        Some(r.expect("the function ran before the next call"))
    });
    assert_eq!(out[0], Some(Err(ErrorKind::InvalidArgument)));
    assert_eq!(out[1], None);
}

#[test]
fn dropping_a_group_finishes_its_started_calls() {
    let hs: Vec<_> = world(2, 5000)
        .into_iter()
        .map(|g| {
            std::thread::spawn(move || {
                let mut x = vec![3u64 + g.rank() as u64; 1 << 16];
                // SAFETY: `x` outlives the group, whose drop finishes the call.
                let r = unsafe {
                    g.start_unchecked(Op::AllReduce {
                        op: ReduceOp::Max,
                        dtype: boltccl::DType::U64,
                        input: None,
                        output: bytemuck::cast_slice_mut(x.as_mut_slice()),
                    })
                    .unwrap()
                };
                drop(g);
                (r.test().map(|r| r.is_ok()), x[0], x[x.len() - 1])
            })
        })
        .collect();
    for h in hs {
        assert_eq!(h.join().unwrap(), (Some(true), 4, 4));
    }
}
