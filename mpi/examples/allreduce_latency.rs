//! The MPI layer's own cost: a 4-byte float `MPI_Allreduce` through this library, timed the way
//! `boltccl bench` times `all_sum` (each call on its own, the slowest rank's median), so that
//! the two figures side by side show what the layer adds (handle decoding, the world lock).
//!
//!   boltccl launch -n 2 -- target/release/examples/allreduce_latency [ITERATIONS]

use boltccl_mpi::abi::{ompi_mpi_comm_world, ompi_mpi_float, ompi_mpi_op_max, ompi_mpi_op_sum, Handle, MPI_IN_PLACE};
use boltccl_mpi::{MPI_Allreduce, MPI_Comm_rank, MPI_Finalize, MPI_Init};
use std::ffi::c_void;
use std::time::Instant;

fn main() {
    let iters: usize = std::env::args().nth(1).map_or(20_000, |s| s.parse().expect("ITERATIONS is a number"));
    let world = &ompi_mpi_comm_world as *const _ as Handle;
    let float = &ompi_mpi_float as *const _ as Handle;
    let (sum, max) = (&ompi_mpi_op_sum as *const _ as Handle, &ompi_mpi_op_max as *const _ as Handle);
    let mut rank = 0;
    // SAFETY: the library's own handles and live buffers of one float each, as MPI requires.
    unsafe {
        MPI_Init(std::ptr::null_mut(), std::ptr::null_mut());
        MPI_Comm_rank(world, &mut rank);
    }
    let x = [1.0f32];
    let mut y = [0.0f32];
    let mut times = Vec::with_capacity(iters);
    for i in 0..iters + 1000 {
        let t = Instant::now();
        // SAFETY: as above.
        unsafe { MPI_Allreduce(x.as_ptr() as *const c_void, y.as_mut_ptr() as *mut c_void, 1, float, sum, world) };
        if i >= 1000 {
            times.push(t.elapsed().as_secs_f32() * 1e6);
        }
    }
    times.sort_by(f32::total_cmp);
    let mut median = [times[times.len() / 2]];
    // SAFETY: as above.
    unsafe {
        MPI_Allreduce(MPI_IN_PLACE, median.as_mut_ptr() as *mut c_void, 1, float, max, world);
        MPI_Finalize();
    }
    if rank == 0 {
        println!("MPI_Allreduce float32 4 B: {:.2} us (slowest rank's median of {iters})", median[0]);
    }
}
