//! The global allocator of tollgate's binaries: mimalloc, asked the way C asks it.
//!
//! The `mimalloc` crate's `GlobalAlloc` sends every allocation through `mi_malloc_aligned`,
//! whatever its alignment. mimalloc 3's aligned entry has a fast path only while the size
//! class's page has a block on its free list; when that list is empty (a page whose blocks
//! were freed again keeps them on a separate list until the plain `mi_malloc` path collects
//! them, which an aligned call never does) it falls to a generic path that, for a size that is
//! not a power of two, over-allocates `size + align - 1` from another size class and marks the
//! page as holding interior pointers, which slows every later free on it. On the gateway's
//! request path that was one allocation in five.
//!
//! Measured with callgrind on `tollgate serve` (decision mode, memory store, `wrk -t1 -c16`
//! over 100,000 API keys, 39,116 requests): 24 allocations per request cost 2,066 instructions
//! (10.1% of the request), 1,190 of them in the aligned generic path (192,705 calls). With
//! this allocator: 54 instead of 85
//! instructions per allocation (docs/benchmarks.md, "2026-12-02, evening").
//!
//! So a layout whose alignment is at most a word (every `Vec<u8>`, `String`, and `Box` of
//! pointers and integers: nearly all of them) goes to `mi_malloc` / `mi_zalloc` /
//! `mi_realloc`, which always return word-aligned blocks; a larger alignment still goes to
//! the aligned entries. Every block, however it was made, is freed with `mi_free`.

#![deny(unsafe_code)]

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;
use libmimalloc_sys as mi;

/// The largest alignment every mimalloc block has: one machine word. Blocks are carved from
/// pages whose first block is 16-byte aligned, at strides that are whole words.
const WORD: usize = core::mem::size_of::<usize>();

/// mimalloc as the global allocator (see the crate's documentation for why not the
/// `mimalloc` crate's own).
#[derive(Debug, Default, Clone, Copy)]
pub struct Mimalloc;

/// Whether `mi_malloc` of `size` bytes is aligned enough for `align`: a word at most, and no
/// more than the size (a Rust layout's size is a multiple of its alignment, so for a nonzero
/// size this only excludes alignments above a word).
#[inline]
fn word_aligned_is_enough(align: usize, size: usize) -> bool {
    align <= WORD && align <= size
}

// SAFETY (for the whole impl): every method forwards to mimalloc's C API, which is a complete
// allocator for any thread. `alloc`/`alloc_zeroed` return a block of at least `layout.size()`
// bytes aligned to `layout.align()`: through `mi_malloc`/`mi_zalloc` only when that alignment
// is at most a word (`word_aligned_is_enough`), which every mimalloc block is, otherwise
// through the `_aligned` entries that take the alignment. Null is returned on exhaustion, as
// `GlobalAlloc` requires. `dealloc` passes a pointer this allocator returned (the trait's
// precondition) to `mi_free`, which frees blocks of every entry point. `realloc` keeps the
// layout's alignment under the same rule, and mimalloc's realloc copies min(old, new) bytes
// and frees the old block only on success, as the trait requires.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if word_aligned_is_enough(layout.align(), layout.size()) {
            // SAFETY: see the impl's comment; `size` is nonzero (the trait's precondition).
            unsafe { mi::mi_malloc(layout.size()) as *mut u8 }
        } else {
            // SAFETY: see the impl's comment.
            unsafe { mi::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8 }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if word_aligned_is_enough(layout.align(), layout.size()) {
            // SAFETY: see the impl's comment.
            unsafe { mi::mi_zalloc(layout.size()) as *mut u8 }
        } else {
            // SAFETY: see the impl's comment.
            unsafe { mi::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8 }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the trait's precondition).
        unsafe { mi::mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if word_aligned_is_enough(layout.align(), new_size) {
            // SAFETY: `ptr` came from this allocator with `layout`; see the impl's comment.
            unsafe { mi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8 }
        } else {
            // SAFETY: as above, keeping the layout's alignment.
            unsafe {
                mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static GLOBAL: Mimalloc = Mimalloc;

    /// Every size and alignment a Rust layout can have (up to 8 KiB and 4 KiB) comes back
    /// aligned, writable over its whole size, zeroed when asked, and keeps its bytes across a
    /// realloc that grows or shrinks it.
    #[test]
    #[allow(unsafe_code)]
    fn every_layout_is_aligned_and_keeps_its_bytes() {
        let a = Mimalloc;
        let mut checked = 0;
        for align_log in 0..=12 {
            let align = 1usize << align_log;
            for size in (align..=8192).step_by(align).take(64) {
                let layout = Layout::from_size_align(size, align).expect("a valid layout");
                // SAFETY: a nonzero size; every block is freed with its own layout below.
                unsafe {
                    let z = a.alloc_zeroed(layout);
                    assert!(!z.is_null());
                    assert_eq!(z as usize % align, 0, "zeroed {size} / {align}");
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|b| *b == 0));
                    a.dealloc(z, layout);

                    let mut p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "{size} / {align}");
                    for i in 0..size {
                        *p.add(i) = (i % 251) as u8;
                    }
                    for grown in [align, size * 3, size / 2 + align] {
                        let new_size = grown - grown % align;
                        let q = a.realloc(p, layout, new_size);
                        assert!(!q.is_null());
                        assert_eq!(
                            q as usize % align,
                            0,
                            "realloc {size} -> {new_size} / {align}"
                        );
                        let kept = size.min(new_size);
                        assert!((0..kept).all(|i| *q.add(i) == (i % 251) as u8));
                        let moved = Layout::from_size_align(new_size, align).expect("valid");
                        p = a.realloc(q, moved, size);
                        assert!(!p.is_null());
                        assert_eq!(p as usize % align, 0);
                        for i in kept..size {
                            *p.add(i) = (i % 251) as u8;
                        }
                        assert!((0..size).all(|i| *p.add(i) == (i % 251) as u8));
                    }
                    a.dealloc(p, layout);
                }
                checked += 1;
            }
        }
        assert!(checked > 500, "{checked} layouts");
    }

    /// The global allocator in use: ordinary collections work through it.
    #[test]
    fn collections_allocate_through_it() {
        let v: Vec<String> = (0..10_000).map(|i| format!("key-{i}")).collect();
        let joined: usize = v.iter().map(String::len).sum();
        assert!(joined > 60_000);
        let mut m = std::collections::HashMap::new();
        for (i, s) in v.iter().enumerate() {
            m.insert(s.clone(), i);
        }
        assert_eq!(m.get("key-9999"), Some(&9999));
    }

    #[test]
    fn only_a_word_or_less_takes_the_unaligned_entry() {
        assert!(word_aligned_is_enough(1, 1));
        assert!(word_aligned_is_enough(8, 24));
        assert!(!word_aligned_is_enough(16, 48));
        assert!(!word_aligned_is_enough(8, 4));
        assert!(!word_aligned_is_enough(128, 128));
    }
}
