//! Helpers for the fuzz corpus replay and the property tests: the committed
//! corpus, a seeded mutator (so a failure reproduces from its seed), and an
//! allocation counter for "bounded work" checks. Included with `#[path]`
//! by tests/fuzz_corpus.rs and tests/fuzz_properties.rs.

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};

use rand::{Rng, RngCore};

/// The files of fuzz/corpus/TARGET/, sorted by name.
pub fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    files.sort();
    files
}

/// One AFL-style mutation of `input`: flip bits, overwrite, insert or
/// delete bytes, duplicate or splice in a chunk of `other`, truncate, or
/// set an "interesting" value (0, 0xff, 0x7f, 0x80) at some offset.
pub fn mutate(rng: &mut impl RngCore, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.random_range(0..4) {
        if out.is_empty() {
            out.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..out.len());
        match rng.random_range(0..8) {
            0 => out[at] ^= 1 << rng.random_range(0..8),
            1 => out[at] = rng.random(),
            2 => {
                let n = rng.random_range(1..=8);
                for _ in 0..n {
                    out.insert(at, rng.random());
                }
            }
            3 => {
                let end = (at + rng.random_range(1..=16)).min(out.len());
                out.drain(at..end);
            }
            4 => {
                let end = (at + rng.random_range(1..=32)).min(out.len());
                let chunk = out[at..end].to_vec();
                let to = rng.random_range(0..=out.len());
                out.splice(to..to, chunk);
            }
            5 if !other.is_empty() => {
                let from = rng.random_range(0..other.len());
                let end = (from + rng.random_range(1..=64)).min(other.len());
                let to = rng.random_range(0..=out.len());
                out.splice(to..to, other[from..end].iter().copied());
            }
            6 => out.truncate(at),
            _ => out[at] = [0, 0xff, 0x7f, 0x80][rng.random_range(0..4)],
        }
    }
    out
}

/// A global allocator that counts, per thread, the bytes and blocks
/// allocated while [`measure`] runs (tests run on several threads).
pub struct CountingAlloc;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static BYTES: Cell<usize> = const { Cell::new(0) };
    static BLOCKS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters are thread-local cells with const initializers, which never
// allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract is passed on as it is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on as it is.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: the caller's contract is passed on as it is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn count(bytes: usize) {
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = BYTES.try_with(|b| b.set(b.get() + bytes));
            let _ = BLOCKS.try_with(|b| b.set(b.get() + 1));
        }
    });
}

/// What `f` allocated on this thread: (bytes, blocks), reallocations
/// counted at their new size. Needs `CountingAlloc` as the global allocator.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    BYTES.with(|b| b.set(0));
    BLOCKS.with(|b| b.set(0));
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    (out, BYTES.with(Cell::get), BLOCKS.with(Cell::get))
}
