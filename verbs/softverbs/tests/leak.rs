//! Leak detection: objects not destroyed stay visible in the counters, while closing the
//! context still stops their receive threads. (Own test binary: it leaves objects behind.)

mod common;

use common::*;
use softverbs::*;
use verbs_abi::*;

#[test]
fn close_device_stops_threads_and_leaks_show_in_counters() {
    let _g = serial();
    let mut n = 0;
    // SAFETY: valid out pointer.
    let list = unsafe { ibv_get_device_list(&mut n) };
    assert!(n >= 1);
    assert_eq!(live_objects().device_lists, 1);
    // SAFETY: list from ibv_get_device_list, freed once.
    unsafe { ibv_free_device_list(list) };
    assert_eq!(live_objects().device_lists, 0);

    let c = Ctx::open();
    let cq = c.cq(8);
    let _qp = c.try_qp(cq, IBV_QPT_UC, 8).unwrap();
    let _qp2 = c.try_qp(cq, IBV_QPT_UC, 8).unwrap();
    assert_eq!(live_objects().rx_threads, 2);
    // Close without destroying the QPs, CQ and PD (a leak).
    // SAFETY: live context closed once; its children are deliberately leaked.
    assert_eq!(unsafe { ibv_close_device(c.ctx) }, 0);
    let after = live_objects();
    assert_eq!(after.rx_threads, 0, "closing the context joins its receive threads");
    assert_eq!(after.contexts, 0);
    assert_eq!((after.qps, after.cqs, after.pds), (2, 1, 1), "the leak is visible");
}
