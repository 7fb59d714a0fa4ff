//! Regions whose pages live in Redis (far memory), for C:
//! `fl_map_redis(mm, urls, prefix, len, opts)` over one server or, with
//! several comma-separated URLs, a Redis Cluster. It only parses the C
//! strings and drives `faultline::store::{Redis, RedisCluster}`; the
//! behaviour (acknowledged write-back, eviction-policy check, retries) is
//! the library's, written in the header. No locks.

use crate::error::{guard, Failure};
use crate::manager::fl_manager;
use crate::region::{fl_map_options, fl_region, map_store};
use faultline::store::{Redis, RedisCluster, RedisOptions};
use std::ffi::{c_char, CStr};

/// A C string argument as UTF-8, or EINVAL naming it.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated (our contract).
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

fn refused(e: faultline::StoreError) -> Failure {
    let errno = match &e {
        faultline::StoreError::Refused { .. } => libc::EINVAL,
        _ => e.errno().unwrap_or(libc::ECONNREFUSED),
    };
    Failure::new(errno, e)
}

/// Maps `len` bytes whose pages are kept in Redis, one key per page under
/// `prefix` (missing keys read as zeros). `urls` is one server's URL
/// (`"redis://127.0.0.1:6379/"`) or a Redis Cluster's node URLs separated
/// by commas. A page's write-back counts once the server acknowledged it
/// (on a cluster, once a replica has it too); a server whose
/// `maxmemory-policy` may evict keys is refused (EINVAL); a fault waits up
/// to 5 s for an unreachable server, then its thread gets SIGBUS with the
/// cause in `fl_manager_take_error`. NULL on failure (`fl_last_error()`).
///
/// # Safety
/// `mm` is a live manager; `urls` and `prefix` are NUL-terminated strings;
/// `opts` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn fl_map_redis(
    mm: *mut fl_manager,
    urls: *const c_char,
    prefix: *const c_char,
    len: u64,
    opts: *const fl_map_options,
) -> *mut fl_region {
    enum Either {
        One(Redis),
        Many(RedisCluster),
    }
    let store = guard(
        |_| None,
        || {
            // SAFETY: the caller's contract: NUL-terminated strings.
            let (urls, prefix) = unsafe { (text(urls, "urls")?, text(prefix, "prefix")?) };
            let nodes: Vec<&str> = urls.split(',').map(str::trim).collect();
            let o = RedisOptions::new(prefix);
            Ok(Some(match nodes.as_slice() {
                [one] => Either::One(Redis::connect(one, o).map_err(refused)?),
                many => Either::Many(RedisCluster::connect(many, o).map_err(refused)?),
            }))
        },
    );
    match store {
        Some(Either::One(s)) => map_store(mm, s, len, opts),
        Some(Either::Many(s)) => map_store(mm, s, len, opts),
        None => std::ptr::null_mut(),
    }
}
