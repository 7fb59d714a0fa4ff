//! Frames: the pool of populated memory faultline owns ([`pool`]), the buddy
//! allocator over its pages ([`buddy`]), the frame allocator with per-CPU
//! lists in front of it ([`alloc`]), and the split of the pool mapping into
//! several pools (NUMA nodes, tiers), each with its own allocator ([`pools`]),
//! and the ledger of frames given back to the kernel ([`balloon`]), and the
//! slots holding dead copies of pages the copy fill model put into regions
//! ([`stale`]).
//!
//! Every frame is in exactly one place at a time:
//! `free (buddy + per-CPU lists) + in flight (owned by one worker) +
//! mapped (in a region) + ballooned = pool pages`. The allocator tracks the first term and
//! the sum of the other two; regions track the third; a `Frame` value is the
//! second.

mod alloc;
mod balloon;
mod buddy;
mod pool;
mod pools;
mod stale;

#[cfg_attr(not(feature = "bench-internals"), allow(unused_imports))]
pub use alloc::{AllocConfig, FrameAlloc, FrameAllocator};
pub use balloon::{Balloon, Ledger};
pub use pool::{Frame, PartSpec, Pool, PoolError, PoolId, HUGE_ORDER, PAGES_PER_HUGE};
pub use pools::FramePools;
