//! Unit tests of the C ABI, called from Rust as C would call it (single-rank groups).

use super::*;
use crate::ops::dtype;
use boltccl::DType;
use std::ptr::{null, null_mut};

fn last() -> String {
    // SAFETY: `boltccl_last_error` never returns NULL and the string is NUL-terminated.
    unsafe { CStr::from_ptr(boltccl_last_error()) }.to_string_lossy().into_owned()
}

fn blank_config() -> boltccl_config {
    let mut cfg = std::mem::MaybeUninit::<boltccl_config>::uninit();
    // SAFETY: valid out pointer; `boltccl_config_init` writes every field.
    unsafe {
        boltccl_config_init(cfg.as_mut_ptr());
        cfg.assume_init()
    }
}

#[test]
fn config_size_is_checked() {
    let good = boltccl_config { world_size: 1, ..blank_config() };
    assert_eq!(good.size, std::mem::size_of::<boltccl_config>());
    let mut g = null_mut();
    for size in [0, good.size - 8, good.size + 8] {
        let wrong = boltccl_config { size, ..good };
        // SAFETY: valid config and out pointer.
        assert_eq!(unsafe { boltccl_init(&wrong, &mut g) }, boltccl_result::InvalidParameter);
        assert!(last().contains("boltccl_config_init"), "{}", last());
        assert!(g.is_null());
    }
    // SAFETY: NULL is ignored.
    unsafe { boltccl_config_init(null_mut()) };
}

fn one_rank() -> *mut boltccl_group {
    let cfg = boltccl_config { world_size: 1, ..blank_config() };
    let mut g = null_mut();
    // SAFETY: valid config and out pointer.
    assert_eq!(unsafe { boltccl_init(&cfg, &mut g) }, boltccl_result::Ok, "{}", last());
    assert!(!g.is_null());
    g
}

#[test]
fn result_codes_are_stable_and_described() {
    let numbers: Vec<u32> = boltccl_result::ALL.iter().map(|&c| c as u32).collect();
    assert_eq!(
        numbers,
        [0, 9000, 9001, 9002, 9100, 9101, 9102, 9103, 9104, 9105, 9106, 9107, 9108, 9109, 9110, 9111],
        "result codes are part of the ABI: never renumber"
    );
    for c in boltccl_result::ALL {
        // SAFETY: static NUL-terminated string.
        let s = unsafe { CStr::from_ptr(boltccl_result_str(c as u32)) }.to_str().unwrap();
        assert_ne!(s, "unknown result code", "{c:?}");
    }
    // SAFETY: as above.
    assert_eq!(unsafe { CStr::from_ptr(boltccl_result_str(77)) }.to_str().unwrap(), "unknown result code");
}

#[test]
fn dtype_numbers_match_the_core() {
    for d in DType::ALL {
        assert_eq!(dtype(d as u32).unwrap(), d);
    }
    assert_eq!(boltccl_dtype_value::BOLTCCL_BFLOAT16 as u32, DType::BF16 as u32);
    assert_eq!(boltccl_dtype_value::BOLTCCL_UINT64 as u32, DType::U64 as u32);
    assert_eq!(dtype(12), Err(boltccl_result::InvalidParameter));
    assert_eq!(dtype(u32::MAX), Err(boltccl_result::InvalidParameter));
}

#[test]
fn null_arguments_return_codes_and_leave_outputs_alone() {
    // SAFETY: every pointer is NULL or valid; NULLs are what is being tested.
    unsafe {
        assert_eq!(boltccl_init(null(), null_mut()), boltccl_result::NullParameter);
        assert!(last().contains("`out`"), "{}", last());
        assert_eq!(boltccl_barrier(null()), boltccl_result::NullParameter);
        assert_eq!(boltccl_all_sum(null(), null(), null_mut(), 0, 0), boltccl_result::NullParameter);
        assert_eq!(boltccl_rank(null()), -1);
        assert_eq!(boltccl_size(null()), -1);
        boltccl_group_free(null_mut());

        let bad = boltccl_config { rank: 3, world_size: 2, coordinator: c"127.0.0.1:1".as_ptr(), ..blank_config() };
        let sentinel = 0x10 as *mut boltccl_group;
        let mut out = sentinel;
        assert_eq!(boltccl_init(&bad, &mut out), boltccl_result::Config);
        assert!(last().contains("out of range"), "{}", last());
        assert_eq!(out, sentinel, "out written on failure");
        let neg = boltccl_config { rank: -1, ..bad };
        assert_eq!(boltccl_init(&neg, &mut out), boltccl_result::InvalidParameter);
        assert_eq!(out, sentinel);
    }
}

#[test]
fn single_rank_calls() {
    let g = one_rank();
    // SAFETY: `g` is live until freed at the end; buffers are valid for their lengths.
    unsafe {
        assert_eq!((boltccl_rank(g), boltccl_size(g)), (0, 1));
        let mut x = [1.5f32, 2.0, -3.0];
        let mut y = [0f32; 3];
        let xp = x.as_mut_ptr() as *mut c_void;
        assert_eq!(boltccl_all_sum(g, xp, xp, 3, 0), boltccl_result::Ok);
        assert_eq!(boltccl_all_max(g, xp, y.as_mut_ptr() as *mut c_void, 3, 0), boltccl_result::Ok);
        assert_eq!(y, x);
        assert_eq!(last(), "");
        // Partial overlap is refused, nothing written.
        let mut z = [7u8; 8];
        let zp = z.as_mut_ptr() as *mut c_void;
        assert_eq!(boltccl_all_min(g, zp, zp.add(1), 4, 8), boltccl_result::InvalidParameter);
        assert!(last().contains("overlap"), "{}", last());
        assert_eq!(z, [7u8; 8]);
        assert_eq!(boltccl_all_sum(g, xp, xp, 3, 42), boltccl_result::InvalidParameter);
        assert_eq!(boltccl_broadcast(g, xp, 3, 0, 1), boltccl_result::InvalidArgument);
        assert!(last().contains("out of range"), "{}", last());
        assert_eq!(boltccl_broadcast(g, xp, 3, 0, -2), boltccl_result::InvalidParameter);
        assert_eq!(boltccl_send(g, xp, 4, 0), boltccl_result::InvalidArgument);
        assert_eq!(boltccl_all_sum(g, xp, xp, usize::MAX / 2, 0), boltccl_result::InvalidParameter);
        // Zero elements: NULL buffers are fine.
        assert_eq!(boltccl_all_sum(g, null(), null_mut(), 0, 0), boltccl_result::Ok);

        let mut gathered = [0f32; 3];
        assert_eq!(boltccl_all_gather(g, xp, gathered.as_mut_ptr() as *mut c_void, 3, 0), boltccl_result::Ok);
        assert_eq!(gathered, x);
        assert_eq!(boltccl_reduce_scatter(g, xp, y.as_mut_ptr() as *mut c_void, 3, 0), boltccl_result::Ok);
        assert_eq!(y, x);
        assert_eq!(boltccl_barrier(g), boltccl_result::Ok);

        let mut sub = 0x10 as *mut boltccl_group;
        assert_eq!(boltccl_split(g, -1, 0, &mut sub), boltccl_result::Ok);
        assert!(sub.is_null());
        assert_eq!(boltccl_split(g, 5, 0, &mut sub), boltccl_result::Ok);
        assert_eq!(boltccl_size(sub), 1);

        boltccl_group_free(g);
        // The sub-group outlives its parent.
        assert_eq!(boltccl_all_sum(sub, xp, xp, 3, 0), boltccl_result::Ok);

        // Shrink: bad lists are refused; a group of one shrinks to itself, and the old group
        // is done. Abort poisons the group.
        let mut next = null_mut();
        assert_eq!(boltccl_group_shrink(sub, [-1].as_ptr(), 1, &mut next), boltccl_result::InvalidArgument);
        assert!(last().contains("negative"), "{}", last());
        assert_eq!(boltccl_group_shrink(sub, [0].as_ptr(), 1, &mut next), boltccl_result::InvalidArgument);
        assert!(last().contains("cannot exclude itself"), "{}", last());
        assert_eq!(boltccl_group_shrink(sub, null(), 1, &mut next), boltccl_result::NullParameter);
        assert!(next.is_null());
        let r = boltccl_group_shrink(sub, null(), 0, &mut next);
        assert_eq!(r, boltccl_result::Ok, "{}", last());
        assert_eq!(boltccl_size(next), 1);
        assert_eq!(boltccl_all_sum(next, xp, xp, 3, 0), boltccl_result::Ok);
        assert_ne!(boltccl_barrier(sub), boltccl_result::Ok);
        assert!(last().contains("shrunk"), "{}", last());
        // Grow: not below the group's size, strings required; to the same size it is a new
        // group of the same ranks.
        let (addr, key) = (c"127.0.0.1:0".as_ptr(), c"next".as_ptr());
        let mut grown = null_mut();
        assert_eq!(boltccl_group_grow(next, 0, addr, key, &mut grown), boltccl_result::InvalidArgument);
        assert!(last().contains("already has 1"), "{}", last());
        assert_eq!(boltccl_group_grow(next, 1, null(), key, &mut grown), boltccl_result::NullParameter);
        assert!(grown.is_null());
        assert_eq!(boltccl_group_grow(next, 1, addr, key, &mut grown), boltccl_result::Ok, "{}", last());
        assert_eq!(boltccl_size(grown), 1);
        assert_eq!(boltccl_all_sum(grown, xp, xp, 3, 0), boltccl_result::Ok);
        boltccl_group_free(grown);
        assert_eq!(boltccl_group_abort(next), boltccl_result::Ok);
        assert_eq!(boltccl_group_abort(next), boltccl_result::Ok);
        assert_eq!(boltccl_barrier(next), boltccl_result::Aborted);
        assert!(last().contains("abort()"), "{}", last());
        boltccl_group_free(next);
        boltccl_group_free(sub);
    }
}

#[test]
fn panics_become_a_code() {
    let r: boltccl_result = panic::boundary(|| panic!("boom"));
    assert_eq!(r, boltccl_result::Panic);
    assert!(last().contains("boom"), "{}", last());
    let r: c_int = panic::boundary(|| panic!("boom"));
    assert_eq!(r, -1);
}

#[test]
fn version_is_the_crate_version() {
    // SAFETY: static NUL-terminated string.
    assert_eq!(unsafe { CStr::from_ptr(boltccl_version()) }.to_str().unwrap(), boltccl::VERSION);
}

fn two_ranks_rank0(timeout_ms: u64) -> (*mut boltccl_group, std::thread::JoinHandle<usize>) {
    let port = boltccl::free_coordinator_port(std::net::Ipv4Addr::LOCALHOST.into()).unwrap();
    let coord = std::ffi::CString::new(format!("127.0.0.1:{port}")).unwrap();
    let coord1 = coord.clone();
    // Rank 1 joins, then leaves at once without making any call: its handle is dropped.
    let other = std::thread::spawn(move || {
        let cfg = boltccl_config { rank: 1, world_size: 2, coordinator: coord1.as_ptr(), timeout_ms, ..blank_config() };
        let mut g = null_mut();
        // SAFETY: valid config and out pointer.
        assert_eq!(unsafe { boltccl_init(&cfg, &mut g) }, boltccl_result::Ok);
        std::thread::sleep(std::time::Duration::from_millis(200));
        // SAFETY: made above, freed once.
        unsafe { boltccl_group_free(g) };
        1
    });
    let cfg = boltccl_config { rank: 0, world_size: 2, coordinator: coord.as_ptr(), timeout_ms, ..blank_config() };
    let mut g = null_mut();
    // SAFETY: valid config and out pointer.
    assert_eq!(unsafe { boltccl_init(&cfg, &mut g) }, boltccl_result::Ok, "{}", last());
    (g, other)
}

#[test]
fn async_calls_test_wait_and_free() {
    let g = one_rank();
    let mut x = [1.5f32; 64];
    let mut y = [0f32; 64];
    let mut req: *mut boltccl_request = null_mut();
    // SAFETY: live group, buffers outlive the request (waited below), valid out pointer.
    unsafe {
        assert_eq!(
            boltccl_all_sum_async(g, x.as_ptr().cast(), y.as_mut_ptr().cast(), 64, 0, &mut req),
            boltccl_result::Ok
        );
        assert_eq!(boltccl_wait(req), boltccl_result::Ok);
        let mut done = 0;
        assert_eq!(boltccl_test(req, &mut done), boltccl_result::Ok);
        assert_eq!(done, 1);
        boltccl_request_free(req);
        boltccl_request_free(null_mut());
        // Argument errors come back at start; `req` is left alone.
        let mut untouched = std::ptr::dangling_mut::<boltccl_request>();
        assert_eq!(
            boltccl_all_sum_async(g, x.as_ptr().cast(), x.as_mut_ptr().cast(), 64, 99, &mut untouched),
            boltccl_result::InvalidParameter
        );
        assert_eq!(untouched, std::ptr::dangling_mut::<boltccl_request>());
        assert_eq!(boltccl_barrier_async(g, null_mut()), boltccl_result::NullParameter);
        // Freeing an unwaited request waits for it.
        assert_eq!(boltccl_broadcast_async(g, x.as_mut_ptr().cast(), 64, 0, 0, &mut req), boltccl_result::Ok);
        boltccl_request_free(req);
        boltccl_group_free(g);
    }
    assert_eq!(y, [1.5f32; 64]);
}

#[test]
fn an_async_failure_comes_back_from_wait_with_its_message() {
    let (g, other) = two_ranks_rank0(5000);
    let mut x = [1f32; 16];
    let mut req: *mut boltccl_request = null_mut();
    let t = std::time::Instant::now();
    // SAFETY: live group; `x` outlives the request (waited and freed below).
    unsafe {
        assert_eq!(
            boltccl_all_sum_async(g, x.as_ptr().cast(), x.as_mut_ptr().cast(), 16, 0, &mut req),
            boltccl_result::Ok
        );
        let r = boltccl_wait(req);
        assert!(matches!(r, boltccl_result::PeerLost | boltccl_result::Aborted), "{r:?}: {}", last());
        assert!(last().contains("rank 1"), "{}", last());
        // The group is poisoned: a later blocking call fails with the same cause.
        assert_ne!(boltccl_barrier(g), boltccl_result::Ok);
        boltccl_request_free(req);
        boltccl_group_free(g);
    }
    assert!(t.elapsed() < std::time::Duration::from_secs(4), "named within moments");
    other.join().unwrap();
}
