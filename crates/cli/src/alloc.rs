//! The binary's global allocator: `std::alloc::System`, plus transparent huge pages for big
//! allocations.
//!
//! A million-entry flow table and conntrack are hundreds of megabytes; touched at random, every
//! lookup would also miss the TLB with 4 KiB pages (one page walk per DRAM access, which costs
//! ~540 ns instead of ~300 ns per random read on this VM). The kernel here runs THP in `madvise`
//! mode, so a region gets 2 MiB pages only when asked. This allocator asks: every allocation of
//! at least [`HUGE_MIN`] bytes is aligned to 2 MiB, rounded up to whole 2 MiB pages and passed to
//! `madvise(MADV_HUGEPAGE)` before anyone touches it. The core crates stay free of syscalls; only
//! this binary decides. [`set_enabled`]`(false)` (the `--no-huge-pages` flag) turns the advice
//! off for allocations made afterwards, so both settings can be measured in one session.
//!
//! It also counts allocations per thread ([`spillway_rt::host::allocs`]), so the DPU process
//! can report how often its forwarding thread allocates.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use spillway_rt::host::allocs;

/// Allocations of at least this many bytes get huge-page advice: one 2 MiB huge page.
pub const HUGE_MIN: usize = 2 << 20;

static ENABLED: AtomicBool = AtomicBool::new(true);
static ADVISED_BYTES: AtomicUsize = AtomicUsize::new(0);
static ADVICE_FAILURES: AtomicUsize = AtomicUsize::new(0);

/// Turn huge-page advice on or off for later allocations.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether later allocations get huge-page advice.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Bytes advised so far (cumulative, including since-freed regions) and failed `madvise` calls.
pub fn advised() -> (usize, usize) {
    (
        ADVISED_BYTES.load(Ordering::Relaxed),
        ADVICE_FAILURES.load(Ordering::Relaxed),
    )
}

/// `System` with `madvise(MADV_HUGEPAGE)` on allocations of at least [`HUGE_MIN`] bytes.
#[derive(Debug)]
pub struct HugePageAlloc;

/// The layout actually requested from `System` for `layout`: big ones are 2 MiB aligned and
/// rounded up to 2 MiB. A pure function of `layout`, so `dealloc` recomputes the same one.
#[inline]
fn adjusted(layout: Layout) -> Layout {
    if layout.size() < HUGE_MIN {
        return layout;
    }
    let size = layout.size().next_multiple_of(HUGE_MIN);
    Layout::from_size_align(size, layout.align().max(HUGE_MIN)).unwrap_or(layout)
}

fn advise(ptr: *mut u8, layout: Layout) {
    if ptr.is_null() || layout.size() < HUGE_MIN || !enabled() {
        return;
    }
    // SAFETY: `ptr..ptr + layout.size()` is a live allocation just returned by `System` for
    // `layout`; `madvise` with MADV_HUGEPAGE only changes how the kernel backs those pages and
    // never invalidates their contents. The start is 2 MiB aligned (see `adjusted`), hence page
    // aligned as madvise requires.
    let rc = unsafe { libc::madvise(ptr.cast(), layout.size(), libc::MADV_HUGEPAGE) };
    if rc == 0 {
        ADVISED_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
    } else {
        ADVICE_FAILURES.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with one layout per allocation (`adjusted` is a pure
// function of the caller's layout, used for both alloc and dealloc), and the adjusted layout is
// at least as large and as aligned as the caller's, so the returned block satisfies `layout`.
unsafe impl GlobalAlloc for HugePageAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        allocs::note();
        let l = adjusted(layout);
        // SAFETY: `l` has non-zero size because `layout` does (GlobalAlloc's contract).
        let p = unsafe { System.alloc(l) };
        advise(p, l);
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        allocs::note();
        let l = adjusted(layout);
        // SAFETY: as in `alloc`.
        let p = unsafe { System.alloc_zeroed(l) };
        advise(p, l);
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc`/`alloc_zeroed`/`realloc` of this allocator with
        // `layout`, which requested `adjusted(layout)` from `System`.
        unsafe { System.dealloc(ptr, adjusted(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = Layout::from_size_align(new_size, layout.align())
            .expect("GlobalAlloc::realloc's contract: new_size fits the alignment");
        if layout.size() < HUGE_MIN && new_size < HUGE_MIN {
            allocs::note();
            // SAFETY: small in and out: the layouts are unadjusted, exactly what `System` saw.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // Crossing into or within the huge range: allocate, copy, free, so the new block gets
        // its alignment and advice.
        // SAFETY: `new_layout` has non-zero size (`new_size > 0` by the contract).
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct, and at least `min(old, new)` bytes long.
            unsafe { core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            // SAFETY: `ptr` was allocated by this allocator with `layout`.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}

/// `AnonHugePages` of this process in bytes, from `/proc/self/smaps_rollup` (None if unreadable).
pub fn anon_huge_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = text.lines().find(|l| l.starts_with("AnonHugePages:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The kernel's THP mode, the bracketed word of `/sys/kernel/mm/transparent_hugepage/enabled`.
pub fn thp_mode() -> String {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|t| {
            let (_, rest) = t.split_once('[')?;
            let (mode, _) = rest.split_once(']')?;
            Some(mode.to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}
