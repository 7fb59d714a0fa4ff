//! Frames: the pool of populated memory faultline owns ([`pool`]) and the
//! allocator that hands out its frames ([`alloc`]).
//!
//! Every frame is in exactly one place at a time:
//! `free (allocator) + in flight (owned by one worker) + mapped (in a region)
//! = pool pages`. The allocator tracks the first term; regions track the
//! third; a `Frame` value is the second.

pub mod alloc;
pub mod pool;

pub use alloc::{FrameAllocator, LockedAllocator};
pub use pool::{Frame, Pool, PoolError, HUGE_ORDER, PAGES_PER_HUGE};
