//! The `tollgate` binary. It only parses arguments and dispatches: each subcommand lives in a
//! module of its own (see `cli`).

mod cli;
mod simulate;

/// mimalloc instead of glibc's malloc: the request path allocates per request (headers,
/// the limiter's per-request vectors, redis-rs commands and replies). Measured side by side
/// (wrk -t2 -c64 -d6s, decision mode, 100,000 API keys, 2 runs each): with the Redis store
/// 34.6k/35.0k requests/s against 31.3k/29.3k with glibc; with the memory store no
/// difference (74.8k/85.1k against 77.9k/81.2k). examples/redis_bench's client CPU per check:
/// 3.3-3.5 us against 3.5-4.7 us. Through tollgate-alloc rather than the `mimalloc` crate,
/// whose aligned calls miss mimalloc's fast path (that crate's documentation has figures).
#[global_allocator]
static GLOBAL: tollgate_alloc::Mimalloc = tollgate_alloc::Mimalloc;

fn main() -> std::process::ExitCode {
    no_huge_pages();
    cli::main()
}

/// Transparent huge pages off for this process, whatever the host's setting (the kernel
/// then gives none, `madvise` or not). mimalloc reserves one large arena; with THP a touched
/// 2 MiB stretch of it is resident whole, and khugepaged (which by default collapses a
/// stretch holding a single 4 KiB page) fills in more at moments of its own choosing.
/// Measured with `scripts/soak` (reloads every 10 s, 400 requests/s): 38-47 MB RSS with THP,
/// 18 of it in huge pages, against 16-20 MB with `MIMALLOC_ALLOW_THP=0` (which makes
/// mimalloc do this same call, but only when the variable is set); the hour-long soak
/// stepped up by 17 MB in 30 s with THP and had no step without. mimalloc's `no_thp`
/// feature (it no longer madvises its arena) is what is left if this call is refused.
fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        // Only memory is at stake: say so and go on.
        eprintln!("tollgate: could not turn transparent huge pages off ({e}); RSS may run higher");
    }
}
