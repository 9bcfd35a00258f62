//! The component's memory allocator: small blocks are kept for reuse in free lists by size,
//! in front of the system allocator (wasi-libc's `dlmalloc`).
//!
//! A batched call allocates and frees many small blocks: the strings the host lowers into
//! the component (a key, its rows, each state read's bytes), the JSON a state write or an
//! emitted row is serialized into. `dlmalloc`'s `malloc` and `free` were ~4% of the samples
//! of the `counter` component's run. A block of at most [`MAX_SMALL`] bytes goes back on its
//! size's list when freed and is taken from it by the next allocation of that size, a few
//! instructions each way.
//!
//! Bounded: the lists hold at most [`MAX_CACHED`] bytes in all; a block freed past that goes
//! back to the system allocator, so memory a call used in bulk is not all kept from other
//! sizes. A component is single-threaded (wasm32-wasip2 has no threads), so the lists need no
//! lock; [`SmallBlocks`] is only ever the global allocator of such a component.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr;

/// Largest block kept on a free list.
pub(crate) const MAX_SMALL: usize = 256;

/// Sizes are rounded up to a multiple of this, which is also the largest alignment served
/// from the lists (a larger one goes to the system allocator).
const GRAIN: usize = 8;

const CLASSES: usize = MAX_SMALL / GRAIN;

/// Most bytes the free lists hold together.
pub(crate) const MAX_CACHED: usize = 4 << 20;

/// The size class of `layout`, if its blocks are kept on a free list.
#[inline]
fn class(layout: Layout) -> Option<usize> {
    let size = layout.size();
    (size != 0 && size <= MAX_SMALL && layout.align() <= GRAIN).then(|| (size - 1) / GRAIN)
}

/// The layout a block of class `c` has in the system allocator.
#[inline]
fn class_layout(c: usize) -> Layout {
    // Sizes up to MAX_SMALL, aligned to GRAIN: always valid.
    unsafe { Layout::from_size_align_unchecked((c + 1) * GRAIN, GRAIN) }
}

struct Lists {
    /// Per class, the first free block; each free block starts with the next one's address.
    heads: [*mut u8; CLASSES],
    cached: usize,
}

/// Free lists by size in front of [`System`].
pub struct SmallBlocks {
    lists: UnsafeCell<Lists>,
}

// SAFETY: used as the global allocator of single-threaded components only (see the module
// docs); the tests use an instance from one thread.
unsafe impl Sync for SmallBlocks {}

impl SmallBlocks {
    pub const fn new() -> Self {
        Self {
            lists: UnsafeCell::new(Lists {
                heads: [ptr::null_mut(); CLASSES],
                cached: 0,
            }),
        }
    }

    /// Bytes held on the free lists.
    #[cfg(test)]
    fn cached(&self) -> usize {
        unsafe { (*self.lists.get()).cached }
    }
}

impl Default for SmallBlocks {
    fn default() -> Self {
        Self::new()
    }
}

unsafe impl GlobalAlloc for SmallBlocks {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(c) = class(layout) else {
            return unsafe { System.alloc(layout) };
        };
        let lists = unsafe { &mut *self.lists.get() };
        let head = lists.heads[c];
        if head.is_null() {
            return unsafe { System.alloc(class_layout(c)) };
        }
        // SAFETY: a free block of class `c` is at least GRAIN bytes, aligned to GRAIN, and
        // starts with the next free block's address.
        lists.heads[c] = unsafe { head.cast::<*mut u8>().read() };
        lists.cached -= class_layout(c).size();
        head
    }

    #[inline]
    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        let Some(c) = class(layout) else {
            return unsafe { System.dealloc(block, layout) };
        };
        let lists = unsafe { &mut *self.lists.get() };
        let size = class_layout(c).size();
        if lists.cached + size > MAX_CACHED {
            return unsafe { System.dealloc(block, class_layout(c)) };
        }
        unsafe { block.cast::<*mut u8>().write(lists.heads[c]) };
        lists.heads[c] = block;
        lists.cached += size;
    }

    #[inline]
    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class(layout), class(new_layout)) {
            // The block already has room for the new size.
            (Some(old), Some(new)) if old == new => block,
            (None, None) => unsafe { System.realloc(block, layout, new_size) },
            _ => {
                let moved = unsafe { self.alloc(new_layout) };
                if !moved.is_null() {
                    let n = layout.size().min(new_size);
                    unsafe {
                        ptr::copy_nonoverlapping(block, moved, n);
                        self.dealloc(block, layout);
                    }
                }
                moved
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn a_freed_small_block_serves_the_next_allocation_of_its_size() {
        let a = SmallBlocks::new();
        unsafe {
            let x = a.alloc(layout(20, 4));
            x.write_bytes(7, 20);
            a.dealloc(x, layout(20, 4));
            assert_eq!(a.cached(), 24);
            // 17 to 24 bytes share a class; 16 does not.
            let y = a.alloc(layout(17, 1));
            assert_eq!(y, x);
            assert_eq!(a.cached(), 0);
            let z = a.alloc(layout(16, 8));
            assert_ne!(z, x);
            a.dealloc(y, layout(17, 1));
            a.dealloc(z, layout(16, 8));
            assert_eq!(a.cached(), 40);
        }
    }

    #[test]
    fn large_and_overaligned_blocks_bypass_the_lists() {
        let a = SmallBlocks::new();
        unsafe {
            for l in [layout(MAX_SMALL + 1, 8), layout(64, 16), layout(4096, 4096)] {
                let x = a.alloc(l);
                assert!(!x.is_null());
                assert_eq!(x as usize % l.align(), 0);
                x.write_bytes(1, l.size());
                a.dealloc(x, l);
                assert_eq!(a.cached(), 0, "{l:?}");
            }
        }
    }

    #[test]
    fn the_lists_hold_at_most_their_bound() {
        let a = SmallBlocks::new();
        let l = layout(MAX_SMALL, 8);
        let n = MAX_CACHED / MAX_SMALL + 100;
        unsafe {
            let blocks: Vec<*mut u8> = (0..n).map(|_| a.alloc(l)).collect();
            for &b in &blocks {
                a.dealloc(b, l);
            }
            assert_eq!(a.cached(), MAX_CACHED);
            for _ in 0..n {
                let b = a.alloc(l);
                assert!(!b.is_null());
                System.dealloc(b, l);
            }
            assert_eq!(a.cached(), 0);
        }
    }

    #[test]
    fn realloc_keeps_the_bytes_across_classes_and_to_the_system() {
        let a = SmallBlocks::new();
        unsafe {
            let mut size = 1;
            let mut p = a.alloc(layout(size, 1));
            p.write(0);
            // Grows through every small class and past them, as a `Vec<u8>` pushing would.
            while size < 3 * MAX_SMALL {
                let new_size = size + 13;
                p = a.realloc(p, layout(size, 1), new_size);
                for i in size..new_size {
                    p.add(i).write(i as u8);
                }
                size = new_size;
                for i in 0..size {
                    assert_eq!(p.add(i).read(), i as u8, "byte {i} at size {size}");
                }
            }
            // And shrinks back into a class.
            p = a.realloc(p, layout(size, 1), 5);
            for i in 0..5 {
                assert_eq!(p.add(i).read(), i as u8);
            }
            // Within one class the block stays where it is.
            let same = a.realloc(p, layout(5, 1), 8);
            assert_eq!(same, p);
            a.dealloc(same, layout(8, 1));
        }
    }

    #[test]
    fn blocks_in_use_never_overlap() {
        let a = SmallBlocks::new();
        let mut live: Vec<(*mut u8, Layout, u8)> = Vec::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        unsafe {
            for step in 0..20_000 {
                let r = next();
                if r % 3 == 0 && !live.is_empty() {
                    let (p, l, fill) = live.swap_remove((r as usize / 3) % live.len());
                    for i in 0..l.size() {
                        assert_eq!(p.add(i).read(), fill, "step {step}");
                    }
                    a.dealloc(p, l);
                } else {
                    let size = 1 + (r as usize >> 8) % (MAX_SMALL + 64);
                    let l = layout(size, 1 << ((r >> 40) % 4));
                    let p = a.alloc(l);
                    assert_eq!(p as usize % l.align(), 0);
                    let fill = step as u8;
                    p.write_bytes(fill, size);
                    live.push((p, l, fill));
                }
            }
            for (p, l, fill) in live {
                for i in 0..l.size() {
                    assert_eq!(p.add(i).read(), fill);
                }
                a.dealloc(p, l);
            }
        }
    }
}
